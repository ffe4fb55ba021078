"""Engine-level behaviour: stages, operations, exemptions, the decision's shape."""

from __future__ import annotations

import dataclasses
from typing import Any

import jsonpatch
import pytest

from gpu_admission.admission.engine import evaluate, short_warning
from gpu_admission.core.decision import Decision, Mode, Violation
from gpu_admission.policy.model import RULE_IDS, default_policy
from gpu_admission.rules import RULES
from tests.builders import make_container, make_pod
from tests.policy_helpers import DEFAULT_ENV, env_of, facts, pools_policy, rules_of, run

CUDA121 = "nvidia/cuda:12.1.1-runtime-ubuntu22.04"


def test_typical_inference_pod_exact_patch() -> None:
    pod = make_pod(containers=[make_container(image=CUDA121)])
    decision, after = run(pod)
    assert decision == Decision(
        allowed=True, gpu=True, workload="inference", workload_reason="default",
        cuda_version="12.1", cuda_source=f"image {CUDA121} (spec.containers[0])",
        patch=(
            {"op": "add", "path": "/spec/schedulerName", "value": "gpu-aware-scheduler"},
            {"op": "add", "path": "/spec/nodeSelector",
             "value": {"gpu-admission.io/cuda-version": "12.1"}},
            {"op": "add", "path": "/spec/containers/0/env", "value": DEFAULT_ENV},
            {"op": "add", "path": "/metadata/annotations",
             "value": {"gpu-admission.io/mutated": "env,nodeSelector,schedulerName"}},
        ),
        changes=("spec.schedulerName", "spec.nodeSelector", "spec.containers[0].env",
                 "metadata.annotations"),
        # issue 33: no Node objects given, so the decision says it assumed the policy's pools
        placement="no GPU nodes visible: assumed the policy's declared pools and defaults "
                  "(spec.nodePools, spec.memoryLimits); no declared pool selected: "
                  "spec.memoryLimits defaults")
    assert after["metadata"]["annotations"] == {
        "gpu-admission.io/mutated": "env,nodeSelector,schedulerName"}


def test_decision_is_frozen() -> None:
    decision = evaluate(make_pod(), facts(), default_policy())
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.allowed = False  # type: ignore[misc]


@pytest.mark.parametrize("obj", [
    pytest.param({"apiVersion": "v1", "kind": "ConfigMap", "data": {}}, id="configmap"),
    pytest.param({"apiVersion": "apps/v1", "kind": "Deployment",
                  "spec": {"template": make_pod()}}, id="deployment"),
    pytest.param({"kind": "Pod"}, id="pod-without-spec"),
])
def test_non_gpu_or_non_pod_allowed_without_patch(obj: dict[str, Any]) -> None:
    decision = evaluate(obj, facts(), default_policy())
    assert decision == Decision(allowed=True)


@pytest.mark.parametrize("obj", [
    pytest.param({"kind": "Pod", "metadata": {}, "spec": {"containers": "nope"}},
                 id="containers-not-a-list"),
    pytest.param(make_pod(containers=[make_container(gpu=None, env=[
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}])]), id="cpu-pod-already-void"),
])
def test_cpu_pod_with_nothing_for_the_guard_gets_only_the_scheduler(obj: dict[str, Any]) -> None:
    """Changed on purpose (issue 32): these pods used to get no patch; with the default
    spec.scheduling.cpuPods: gpu-aware a CPU pod goes to the GPU-aware scheduler, and the guard
    has nothing to add."""
    decision = evaluate(obj, facts(), default_policy())
    assert decision == Decision(
        allowed=True, changes=("spec.schedulerName", "metadata.annotations"),
        patch=({"op": "add", "path": "/spec/schedulerName", "value": "gpu-aware-scheduler"},
               {"op": "add", "path": "/metadata/annotations",
                "value": {"gpu-admission.io/mutated": "schedulerName"}}))


@pytest.mark.parametrize("operation", ["DELETE", "CONNECT"])
def test_delete_and_connect_allowed(operation: str) -> None:
    pod = make_pod(owner_kind="PyTorchJob",
                   containers=[make_container(resource="nvidia.com/gpu.shared")])
    assert evaluate(pod, facts(operation=operation), default_policy()) == Decision(allowed=True)


# --- validate stage and UPDATE: never a patch ----------------------------------------
VALIDATE = [
    pytest.param(make_pod(), True, [], id="unmutated-pod-not-denied"),
    pytest.param(make_pod(owner_kind="PyTorchJob",
                          node_selector={"nvidia.com/gpu.sharing-strategy": "time-slicing"}),
                 False, [("no-training-on-shared-gpu", "enforce")],
                 id="training-routed-to-time-sliced-pool-by-another-webhook"),
    pytest.param(make_pod(containers=[make_container(
        env=[{"name": "NVIDIA_MEM_LIMIT_MB", "value": "64000"}])]),
                 False, [("memory-limit", "enforce")], id="limit-raised-by-another-webhook"),
    pytest.param(make_pod(scheduler_name="volcano"), True, [("scheduler-name", "warn")],
                 id="other-scheduler-warns"),
]


@pytest.mark.parametrize(("pod", "allowed", "violations"), VALIDATE)
@pytest.mark.parametrize(("stage", "operation"), [("validate", "CREATE"), ("mutate", "UPDATE"),
                                                  ("validate", "UPDATE")],
                         ids=["validate-create", "mutate-update", "validate-update"])
def test_validate_and_update_never_patch(pod: dict[str, Any], allowed: bool,
                                         violations: list[tuple[str, str]], stage: str,
                                         operation: str) -> None:
    decision, _ = run(pod, request=facts(stage=stage, operation=operation))
    assert decision.patch == () and decision.changes == ()
    assert decision.allowed is allowed
    assert rules_of(decision) == violations


def test_validate_stage_on_mutated_pod_is_clean() -> None:
    pod = make_pod(containers=[make_container(image=CUDA121)])
    mutated = jsonpatch.apply_patch(pod, list(evaluate(pod, facts(), default_policy()).patch))
    decision = evaluate(mutated, facts(stage="validate"), default_policy())
    assert decision.allowed and decision.violations == () and decision.patch == ()


# --- exemptions -----------------------------------------------------------------------
SHARED_TRAINING = make_pod(owner_kind="PyTorchJob",
                           containers=[make_container(resource="nvidia.com/gpu.shared")])


@pytest.mark.parametrize(("request_kw", "exempt"), [
    ({"namespace": "gpu-operator"}, "namespace gpu-operator"),
    ({"user": "system:serviceaccount:ci:deployer"}, "user system:serviceaccount:ci:deployer"),
    ({"groups": ("system:authenticated", "gpu-admins")}, "group gpu-admins"),
    ({"namespace": "kube-system", "user": "system:serviceaccount:ci:deployer"},
     "namespace kube-system"),
], ids=["namespace", "user", "group", "namespace-first"])
def test_exemptions(request_kw: dict[str, Any], exempt: str) -> None:
    decision, _ = run(SHARED_TRAINING, pools_policy(), facts(**request_kw))
    assert decision.allowed and decision.patch == () and decision.violations == ()
    assert decision.exempt == exempt
    assert decision.gpu and decision.workload == "training"


@pytest.mark.parametrize("pod", [
    pytest.param(make_pod(owner_kind="PyTorchJob", labels={"gpu-admission.io/exempt": "true"},
                          containers=[make_container(resource="nvidia.com/gpu.shared")]),
                 id="label"),
    pytest.param(make_pod(owner_kind="PyTorchJob",
                          annotations={"gpu-admission.io/exempt": "true",
                                       "gpu-admission.io/mutated": "env"},
                          containers=[make_container(resource="nvidia.com/gpu.shared")]),
                 id="annotation"),
    pytest.param(make_pod(namespace="kube-system", owner_kind="PyTorchJob",
                          containers=[make_container(resource="nvidia.com/gpu.shared")]),
                 id="metadata-namespace-is-not-the-request-namespace"),
])
def test_pod_cannot_exempt_itself(pod: dict[str, Any]) -> None:
    decision, _ = run(pod, pools_policy(), facts(namespace="team-a"))
    assert not decision.allowed and decision.exempt == ""


def test_non_gpu_pod_in_exempt_namespace() -> None:
    pod = make_pod(containers=[make_container(gpu=None)])  # the GPU-access guard skips it too
    assert evaluate(pod, facts(namespace="kube-system"), default_policy()) == Decision(
        allowed=True, exempt="namespace kube-system")


# --- annotation and warnings ----------------------------------------------------------
def test_mutated_annotation_merges_and_stays_stable() -> None:
    pod = make_pod(annotations={"gpu-admission.io/mutated": "env"}, scheduler_name="",
                   node_selector={"gpu-admission.io/cuda-version": "12.4"},
                   containers=[make_container(env=DEFAULT_ENV)])
    decision, after = run(pod)
    assert after["metadata"]["annotations"]["gpu-admission.io/mutated"] == "env,schedulerName"
    assert env_of(after) == DEFAULT_ENV
    assert [op["path"] for op in decision.patch] == [
        "/spec/schedulerName", "/metadata/annotations/gpu-admission.io~1mutated"]


def test_no_change_no_annotation() -> None:
    pod = make_pod(owner_kind="PyTorchJob", scheduler_name="gpu-aware-scheduler",
                   affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                       "nodeSelectorTerms": [{"matchExpressions": [
                           {"key": "nvidia.com/gpu.sharing-strategy", "operator": "NotIn",
                            "values": ["time-slicing", "mps"]}]}]}}})
    decision, _ = run(pod)
    assert decision.allowed and decision.patch == () and decision.changes == ()


@pytest.mark.parametrize(("message", "expected"), [
    ("short", "r: short"),
    ("multi\nline\ttext", "r: multi line text"),
    ("x" * 200, "r: " + "x" * 114 + "..."),
], ids=["short", "newlines", "truncated"])
def test_short_warning(message: str, expected: str) -> None:
    warning = short_warning(Violation("r", "p", message, Mode.WARN))
    assert warning == expected and len(warning) <= 120


def test_duplicate_warnings_collapsed() -> None:
    env = [{"name": "NVIDIA_MEM_LIMIT_MB", "valueFrom": {"secretKeyRef": {"name": "s",
                                                                        "key": "k"}}}]
    pod = make_pod(containers=[make_container("a", env=env), make_container("b", env=env)])
    decision, _ = run(pod)
    assert len(decision.violations) == 2 and len(decision.warnings) == 1


def test_every_rule_id_has_a_policy_mode() -> None:
    """The rule ids the rules may report are exactly the keys of spec.rules."""
    reported = [rule_id for rule in RULES for rule_id in rule.ids]
    assert sorted(reported) == sorted(RULE_IDS)
    assert len(set(reported)) == len(reported)
