"""Issue 32, "CPU pods on GPU nodes": pods without a GPU in opted-in namespaces go to the
GPU-aware scheduler (``spec.scheduling.cpuPods: gpu-aware``, the default), under the
conditions GPU pods do (``schedulerName`` empty or ``default-scheduler``, no ``nodeName``),
except DaemonSet pods; through the engine, ``evaluate`` and the webhook over TLS.

The compiled policies (guard half and GPU half) are held to the same table in
``tests/compile/test_cpu_pods_compiled.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from gpu_admission.core.decision import Decision
from gpu_admission.policy.model import PolicyError, default_policy_text, policy_from_dict
from tests.builders import make_container, make_pod, make_review, patch_ops
from tests.policy_helpers import facts, policy_with, run
from tests.server_support import serving

BUSYBOX = "busybox:1.36"
VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
SCHEDULER = {"op": "add", "path": "/spec/schedulerName", "value": "gpu-aware-scheduler"}


def cpu(name: str = "app", env: list[Any] | None = None) -> dict[str, Any]:
    return make_container(name, BUSYBOX, gpu=None, env=env)


def clean_cpu_pod(**kw: Any) -> dict[str, Any]:
    """A CPU pod the GPU-access guard has nothing to say about (its container says void)."""
    kw.setdefault("containers", [cpu(env=[VOID])])
    return make_pod("web", **kw)


def routed(mutated: str = "schedulerName") -> tuple[dict[str, Any], ...]:
    return (SCHEDULER, {"op": "add", "path": "/metadata/annotations",
                        "value": {"gpu-admission.io/mutated": mutated}})


KAI_POD = make_pod("kai", containers=[cpu(env=[VOID])], annotations={"gpu-fraction": "0.5"})

# (id, pod, policy spec overrides, expected patch); every row through tests.policy_helpers.run
# (purity, and a second pass over the patched pod gives an empty patch: idempotent)
TABLE: list[tuple[str, dict[str, Any], dict[str, Any], tuple[dict[str, Any], ...]]] = [
    ("empty-scheduler-name-routed", clean_cpu_pod(), {}, routed()),
    ("explicit-empty-string-routed", clean_cpu_pod(scheduler_name=""), {}, routed()),
    ("default-scheduler-routed", clean_cpu_pod(scheduler_name="default-scheduler"), {},
     routed()),
    ("other-scheduler-kept", clean_cpu_pod(scheduler_name="my-scheduler"), {}, ()),
    ("volcano-kept", clean_cpu_pod(scheduler_name="volcano",
                                   owner_kind="Job", owner_api_version="batch.volcano.sh/v1alpha1"),
     {}, ()),
    ("already-gpu-aware-untouched", clean_cpu_pod(scheduler_name="gpu-aware-scheduler"), {}, ()),
    ("policy-cpu-pods-default-untouched", clean_cpu_pod(), {"scheduling": {"cpuPods": "default"}},
     ()),
    ("policy-scheduler-name-null-untouched", clean_cpu_pod(), {"schedulerName": None}, ()),
    ("policy-other-scheduler-name", clean_cpu_pod(), {"schedulerName": "packer"},
     ({"op": "add", "path": "/spec/schedulerName", "value": "packer"},
      routed()[1])),
    ("init-containers-routed", clean_cpu_pod(init_containers=[cpu("init", env=[VOID])]), {},
     routed()),
    ("deployment-pod-routed", clean_cpu_pod(owner_kind="ReplicaSet", owner_api_version="apps/v1"),
     {}, routed()),
    ("daemonset-pod-untouched", clean_cpu_pod(owner_kind="DaemonSet", owner_api_version="apps/v1"),
     {}, ()),
    ("node-name-preset-untouched", clean_cpu_pod(nodeName="node-1"), {}, ()),
    ("static-mirror-pod-untouched", clean_cpu_pod(
        nodeName="node-1", annotations={"kubernetes.io/config.mirror": "abc",
                                        "kubernetes.io/config.source": "file"},
        owner_kind="Node", owner_api_version="v1"), {}, ()),
    ("zero-gpu-request-is-a-cpu-pod", clean_cpu_pod(containers=[make_container(
        "app", BUSYBOX, gpu=0, env=[VOID])]), {}, routed()),
    ("other-sharing-system-pod-untouched", KAI_POD, {}, ()),
    ("hami-resource-at-zero-untouched", clean_cpu_pod(containers=[make_container(
        "app", BUSYBOX, resource="nvidia.com/gpumem", gpu=0, env=[VOID])]), {}, ()),
    ("with-void-upsert", make_pod("web", containers=[cpu()]), {},
     (SCHEDULER, {"op": "add", "path": "/spec/containers/0/env", "value": [VOID]},
      {"op": "add", "path": "/metadata/annotations",
       "value": {"gpu-admission.io/mutated": "env,schedulerName"}})),
    ("earlier-annotation-merged", clean_cpu_pod(annotations={"gpu-admission.io/mutated": "env"}),
     {}, (SCHEDULER, {"op": "add", "path": "/metadata/annotations/gpu-admission.io~1mutated",
                      "value": "env,schedulerName"})),
]


@pytest.mark.parametrize(("pod", "spec", "patch"), [t[1:] for t in TABLE],
                         ids=[t[0] for t in TABLE])
def test_cpu_pod_routing_table(pod: dict[str, Any], spec: dict[str, Any],
                               patch: tuple[dict[str, Any], ...]) -> None:
    policy = policy_with(**spec) if spec else None
    decision, after = run(pod, policy)
    assert decision.gpu is False
    if pod is KAI_POD:  # rule other-sharing-system refuses it (undeclared KAI): no patch
        assert decision.patch == ()
        return
    assert decision.allowed and decision.violations == ()
    assert decision.patch == patch
    if patch:
        assert after["spec"]["schedulerName"] == patch[0]["value"]


@pytest.mark.parametrize("request_facts", [
    pytest.param(facts(stage="validate"), id="validate-stage"),
    pytest.param(facts(operation="UPDATE"), id="update"),
    pytest.param(facts(namespace="kube-system"), id="exempt-namespace"),
    pytest.param(facts(user="system:serviceaccount:ops:deployer"), id="exempt-user"),
])
def test_no_routing_outside_a_mutated_pod_creation(request_facts: Any) -> None:
    policy = policy_with(exemptions={"namespaces": ["kube-system"],
                                     "users": ["system:serviceaccount:ops:deployer"]})
    decision, _ = run(clean_cpu_pod(), policy, request_facts)
    assert decision.patch == () and decision.allowed


def test_gpu_pods_are_routed_whatever_cpu_pods() -> None:
    """cpuPods: default changes nothing for GPU pods (rule scheduler-name)."""
    decision, _ = run(make_pod(containers=[make_container()]),
                      policy_with(scheduling={"cpuPods": "default"}))
    assert decision.gpu and decision.patch[0] == SCHEDULER


def test_a_denied_cpu_pod_gets_no_scheduler() -> None:
    pod = make_pod(containers=[cpu(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])])
    decision, _ = run(pod)
    assert not decision.allowed and decision.patch == ()


@pytest.mark.parametrize(("value", "message"), [
    pytest.param("packed", "spec.scheduling.cpuPods: expected 'gpu-aware' or 'default', "
                           'got "packed"', id="unknown-value"),
    pytest.param(True, "spec.scheduling.cpuPods: expected 'gpu-aware' or 'default', got true",
                 id="boolean"),
])
def test_bad_cpu_pods_value_names_the_field_and_the_allowed_values(value: Any,
                                                                   message: str) -> None:
    doc = yaml.safe_load(default_policy_text())
    doc["spec"]["scheduling"]["cpuPods"] = value
    with pytest.raises(PolicyError) as err:
        policy_from_dict(doc)
    assert str(err.value) == message


def test_the_builtin_policy_routes_cpu_pods() -> None:
    doc = yaml.safe_load(default_policy_text())
    assert doc["spec"]["scheduling"] == {"cpuPods": "gpu-aware"}
    del doc["spec"]["scheduling"]
    assert policy_from_dict(doc).spec.scheduling.cpu_pods == "gpu-aware"  # the model default


def evaluate_cpu_workloads(tmp_path: Path, *options: str) -> list[dict[str, Any]]:
    """``gpu-admission evaluate [options] -o json`` on a CPU Deployment and a DaemonSet."""
    template = {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [cpu(env=[VOID])]}}
    docs = [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
             "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": template}},
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
             "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": template}}]
    manifests = tmp_path / "cpu.yaml"
    manifests.write_text(yaml.safe_dump_all(docs))
    proc = subprocess.run([sys.executable, "-m", "gpu_admission", "evaluate", *options, "-f",
                           str(manifests), "-o", "json"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return [orjson.loads(line) for line in proc.stdout.splitlines()]


def test_evaluate_cli_routes_a_cpu_deployment_and_keeps_a_daemonset(tmp_path: Path) -> None:
    deployment, daemonset = evaluate_cpu_workloads(tmp_path)
    assert deployment["patch"] == list(routed())
    assert daemonset["patch"] == []


# ------------------------------------------------------------------------- the webhook
async def test_webhook_routes_a_cpu_pod_exact_json(tmp_path: Path) -> None:
    pod = clean_cpu_pod()
    async with serving(tmp_path) as srv:
        status, body, _ = await srv.post("/mutate", make_review(pod, uid="u-cpu"))
        assert status == 200
        response = body["response"]
        assert patch_ops(response) == list(routed())
        assert body == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                        "response": {"uid": "u-cpu", "allowed": True, "patchType": "JSONPatch",
                                     "patch": response["patch"],
                                     "auditAnnotations": {
                                         "decision": "allowed",
                                         "patch": "spec.schedulerName; metadata.annotations"}}}
        # the API server reinvokes on the patched pod: nothing more to do
        patched = {**pod, "spec": {**pod["spec"], "schedulerName": "gpu-aware-scheduler"},
                   "metadata": {**pod["metadata"],
                                "annotations": {"gpu-admission.io/mutated": "schedulerName"}}}
        status, body, _ = await srv.post("/mutate", make_review(patched, uid="u-again"))
        assert (status, body["response"]) == (200, {
            "uid": "u-again", "allowed": True, "auditAnnotations": {"decision": "allowed"}})


@pytest.mark.parametrize(("pod", "policy"), [
    pytest.param(clean_cpu_pod(scheduler_name="volcano"), None, id="other-scheduler"),
    pytest.param(clean_cpu_pod(owner_kind="DaemonSet", owner_api_version="apps/v1"), None,
                 id="daemonset"),
    pytest.param(clean_cpu_pod(), {"cpuPods": "default"}, id="policy-cpu-pods-default"),
])
async def test_webhook_leaves_a_cpu_pod_alone_exact_json(tmp_path: Path, pod: dict[str, Any],
                                                         policy: dict[str, Any] | None) -> None:
    overrides: dict[str, Any] = {}
    if policy is not None:
        doc = yaml.safe_load(default_policy_text())
        doc["spec"]["scheduling"] = policy
        path = tmp_path / "policy.yaml"
        path.write_text(yaml.safe_dump(doc))
        overrides["policy_path"] = path
    async with serving(tmp_path, **overrides) as srv:
        status, body, _ = await srv.post("/mutate", make_review(pod, uid="u-kept"))
    assert (status, body) == (200, {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": "u-kept", "allowed": True,
                     "auditAnnotations": {"decision": "allowed"}}})


def test_decision_shape() -> None:
    decision, _ = run(clean_cpu_pod())
    assert decision == Decision(allowed=True, gpu=False, patch=routed(),
                                changes=("spec.schedulerName", "metadata.annotations"))
