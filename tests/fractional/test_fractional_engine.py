"""Fractional GPUs through the engine (``evaluate``): who becomes fractional, the exact patch,
idempotence under a new request UID, the share chain, the bad-input table and the guard's
fractional exception. The wire (TLS webhook, ``evaluate`` CLI) is in test_fractional_e2e.py."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
import yaml

from gpu_admission.admission.engine import evaluate
from gpu_admission.admission.pod import analyse_gpu_pod
from gpu_admission.core.decision import Decision, RequestFacts
from gpu_admission.facts.fractional import requested_share_mib
from gpu_admission.policy.model import PolicyError, policy_from_yaml
from gpu_admission.rules.memory import WAY_OUT
from tests.builders import make_container, make_pod
from tests.compile_support import check
from tests.fractional.support import (
    BAD_INPUT,
    BAD_INPUT_IDS,
    CM,
    POLICY_FILE,
    SHARE,
    UID,
    VLLM,
    memory_env,
    policy,
    ref,
    training_pod,
    vllm_patch,
    vllm_pod,
)
from tests.policy_helpers import NOT_SHARED, REQ, rules_of


def decide(pod: dict[str, Any], uid: str = UID, stage: str = "mutate",
           pol: Any = None) -> Decision:
    before = copy.deepcopy(pod)
    decision = evaluate(pod, RequestFacts("ml-serving", uid=uid, stage=stage),  # type: ignore[arg-type]
                        pol or policy())
    assert pod == before
    return decision


def patched(pod: dict[str, Any], decision: Decision) -> dict[str, Any]:
    out: dict[str, Any] = jsonpatch.apply_patch(pod, list(decision.patch), in_place=False)
    return out


def test_inference_pod_on_a_fractional_pool_gets_the_exact_patch() -> None:
    pod = vllm_pod()
    decision = decide(pod)
    assert decision.allowed and decision.violations == ()
    assert list(decision.patch) == vllm_patch()
    assert decision.changes == ("spec.schedulerName", "spec.nodeSelector",
                                "spec.containers[0].resources", "spec.containers[0].env",
                                "spec.containers[0].args", "metadata.annotations")
    out = patched(pod, decision)
    kubernetes_validate.validate(out, "1.30", strict=True)
    assert out["spec"]["containers"][0]["resources"] == {
        "limits": {"gpu-admission.io/gpu-memory": SHARE},
        "requests": {"gpu-admission.io/gpu-memory": SHARE}}
    assert requested_share_mib(out) == 16000  # what ResourceQuota counts
    # the extender's view of the output: the same share and the recorded ConfigMap
    facts = analyse_gpu_pod(out, policy())
    assert facts is not None and facts.fraction is not None
    assert (facts.fraction.share_mib, facts.fraction.configmap) == (16000, CM)


@pytest.mark.parametrize("stage", ["mutate", "validate"])
def test_own_output_under_a_new_request_uid_changes_nothing(stage: str) -> None:
    pod = vllm_pod()
    out = patched(pod, decide(pod))
    again = decide(out, uid="5d1b7e0a-0000-4000-8000-000000000002", stage=stage)
    assert (again.allowed, again.patch, again.violations) == (True, (), ())
    # as the API server stores it: quantities canonical (16000 -> "16k")
    stored = copy.deepcopy(out)
    for section in ("requests", "limits"):
        stored["spec"]["containers"][0]["resources"][section]["gpu-admission.io/gpu-memory"] = "16k"
    assert decide(stored, uid="another-request").patch == ()


def test_training_pod_on_the_fractional_pool_keeps_its_whole_gpu() -> None:
    pod = training_pod()
    decision = decide(pod)
    assert decision.allowed, decision.violations
    out = patched(pod, decision)
    container = out["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert "env" not in container  # no memory caps, no ConfigMap reference
    assert "gpu-admission.io/gpu-memory" not in out["metadata"].get("annotations", {})
    assert out["spec"]["affinity"]["nodeAffinity"][REQ]["nodeSelectorTerms"] == [
        {"matchExpressions": [NOT_SHARED]}]
    assert decide(out, uid="other").patch == ()


@pytest.mark.parametrize(("pod", "why"), [
    (make_pod("two", namespace="ml-serving", containers=[make_container("m", VLLM, gpu=2)]),
     "two GPUs"),
    (make_pod("mig", namespace="ml-serving", containers=[make_container(
        "m", VLLM, resource="nvidia.com/mig-1g.10gb")]), "MIG"),
], ids=["two-gpus", "mig"])
def test_whole_device_pods_are_not_fractional(pod: dict[str, Any], why: str) -> None:
    decision = decide(pod)
    assert decision.allowed, why
    out = patched(pod, decision)
    assert "gpu-admission.io/gpu-memory" not in str(out), why


@pytest.mark.parametrize(("annotations", "env", "share", "fraction", "source"), [
    (None, [{"name": "NVIDIA_MEM_LIMIT_MB", "value": "8000"}], "8000", "0.173", "own env"),
    ({"gpu-admission.io/gpu-memory": "4096"}, None, "4096", "0.088", "annotation"),
    ({"gpu-admission.io/gpu-memory": " 45044 "}, None, "45044", "0.977", "the largest share"),
], ids=["own-lower-env", "annotation", "largest-share"])
def test_the_share_chain(annotations: dict[str, str] | None, env: list[dict[str, Any]] | None,
                         share: str, fraction: str, source: str) -> None:
    pod = vllm_pod(containers=[make_container("vllm", VLLM, env=env)], annotations=annotations)
    decision = decide(pod)
    assert decision.allowed, decision.violations
    out = patched(pod, decision)
    container = out["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"gpu-admission.io/gpu-memory": share}
    assert container["resources"]["requests"] == {"gpu-admission.io/gpu-memory": share}
    assert container["env"] == [*memory_env(share, fraction), ref()], source
    assert out["metadata"]["annotations"]["gpu-admission.io/gpu-memory"] == share
    assert decide(out, uid="other").patch == ()


def test_explicit_ask_without_a_pool_uses_the_largest_fractional_card() -> None:
    pod = make_pod("nb", namespace="ml-serving",
                   annotations={"gpu-admission.io/gpu-memory": "2048"},
                   labels={"gpu-admission.io/cuda-version": "12.8"},  # no pool has 12.8
                   containers=[make_container("nb", "jupyter/base-notebook")])
    decision = decide(pod)
    assert decision.allowed, decision.violations
    out = patched(pod, decision)
    assert out["spec"]["containers"][0]["env"][1] == {"name": "GPU_MEMORY_FRACTION",
                                                      "value": "0.044"}  # 2048 / 46068


def test_init_and_app_container_share_one_gpu() -> None:
    pod = vllm_pod(init_containers=[make_container("warm", VLLM)])
    decision = decide(pod)
    assert decision.allowed, decision.violations
    out = patched(pod, decision)
    for kind in ("containers", "initContainers"):
        container = out["spec"][kind][0]
        assert container["resources"]["limits"] == {"gpu-admission.io/gpu-memory": SHARE}
        assert container["env"][-1] == ref()
    assert requested_share_mib(out) == 16000  # max(sum app, max init): counted once


DELETE = object()


def _policy_text(**changes: Any) -> str:
    doc = yaml.safe_load(POLICY_FILE.read_text())
    for dotted, value in changes.items():
        node = doc
        *parents, last = dotted.split(".")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    return yaml.safe_dump(doc)


@pytest.mark.parametrize(("pod", "expected"), BAD_INPUT, ids=BAD_INPUT_IDS)
def test_bad_input_is_denied_naming_the_field(pod: dict[str, Any],
                                              expected: list[tuple[str, str, str]]) -> None:
    decision = decide(pod)
    assert not decision.allowed and decision.patch == ()
    assert [(v.rule, v.path, v.message) for v in decision.violations] == expected


@pytest.mark.parametrize("pod", [
    make_pod("ask", namespace="ml-serving", annotations={"gpu-admission.io/gpu-memory": "4096"},
             containers=[make_container("m", VLLM)]),
    make_pod("bad-ask", namespace="ml-serving", annotations={"gpu-admission.io/gpu-memory": "x"},
             containers=[make_container("m", VLLM)]),
    make_pod("resource", namespace="ml-serving", containers=[make_container(
        "m", VLLM, resource="gpu-admission.io/gpu-memory", gpu=4096)]),
    vllm_pod(),
], ids=["annotation", "bad-annotation", "resource-only", "plain"])
@pytest.mark.parametrize("stage", ["mutate", "validate"])
def test_without_fractional_pools_nothing_is_fractional(pod: dict[str, Any], stage: str) -> None:
    """A policy without fractional pools: the annotation and the resource mean nothing, and
    the engine decides exactly as the compiled policies (which refuse fractional pools)."""
    facts = RequestFacts("ml-serving", uid=UID, stage=stage)  # type: ignore[arg-type]
    decision, _ = check("default", pod, facts)
    assert "gpu-configmap" not in str(decision.patch)
    assert not any(v.rule == "memory-limit" for v in decision.violations)


def test_policy_without_scheduler_cannot_serve_fractions() -> None:
    pol = policy_from_yaml(_policy_text(**{"spec.schedulerName": None}))
    decision = decide(vllm_pod(), pol=pol)
    assert [(v.rule, v.path) for v in decision.violations] == [
        ("gpu-visible-devices", "spec.schedulerName")]


def test_fractional_pool_without_memory_is_a_policy_error() -> None:
    with pytest.raises(PolicyError) as info:
        policy_from_yaml(_policy_text(**{"spec.nodePools.0.memoryMiB": DELETE}), "p.yaml")
    assert str(info.value) == "p.yaml: spec.nodePools[0].memoryMiB: required field is missing"


USER_REFS = {
    "value-uuid": {"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-8a7b6c5d"},
    "value-all": {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
    "own-configmap": ref("my-gpus"),
    "prefixed-but-not-recorded": ref("gpu-admission-gpu-stolen"),
    "optional-true": {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {
        "name": CM, "key": "NVIDIA_VISIBLE_DEVICES", "optional": True}}},
    "other-key": {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {
        "name": CM, "key": "GPU", "optional": False}}},
    "secret": {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"secretKeyRef": {
        "name": CM, "key": "NVIDIA_VISIBLE_DEVICES"}}},
    "field-ref": {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['gpu']"}}},
}


@pytest.mark.parametrize("recorded", [False, True], ids=["no-annotation", "recorded-name"])
@pytest.mark.parametrize("entry", list(USER_REFS.values()), ids=list(USER_REFS))
@pytest.mark.parametrize("stage", ["mutate", "validate"])
def test_user_set_visible_devices_is_refused(entry: dict[str, Any], recorded: bool,
                                             stage: str) -> None:
    annotations = {"gpu-admission.io/gpu-configmap": CM} if recorded else None
    pod = vllm_pod(annotations=annotations,
                   containers=[make_container("vllm", VLLM, env=[entry])])
    decision = decide(pod, uid="fresh-uid", stage=stage)
    assert not decision.allowed
    assert ("gpu-visible-devices", "spec.containers[0].env[0]") in [
        (v.rule, v.path) for v in decision.violations]


def test_forged_output_naming_another_configmap_still_needs_the_bind() -> None:
    """A pod may copy our output form with a recorded name of its choice; the webhook keeps
    the name (it cannot tell) but insists on the GPU-aware scheduler, whose bind checks the
    ConfigMap's ownership; scheduling around it is refused."""
    pod = vllm_pod()
    out = patched(pod, decide(pod))
    out["spec"]["schedulerName"] = "default-scheduler"
    out["spec"]["nodeName"] = "node-3"
    # mutate: default-scheduler would be replaced by ours; validate: the final pod is judged
    for stage, paths in (("mutate", ["spec.nodeName"]),
                         ("validate", ["spec.nodeName", "spec.schedulerName"])):
        decision = decide(out, uid="new", stage=stage)
        assert [v.path for v in decision.violations
                if v.rule == "gpu-visible-devices"] == paths, stage
        assert not decision.allowed


def test_validate_does_not_deny_a_pod_merely_lacking_the_mutation() -> None:
    decision = decide(vllm_pod(), stage="validate")
    assert (decision.allowed, decision.violations) == (True, ())


@pytest.mark.parametrize(("value", "ok"), [("16000m", True), ("8g", True), ("1024", True),
                                           ("16001m", False), ("0", False), ("lots", False)])
def test_hami_per_device_limit_cannot_lift_the_cap(value: str, ok: bool) -> None:
    pod = vllm_pod(containers=[make_container("vllm", VLLM, env=[
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": value}])])
    decision = decide(pod)
    assert decision.allowed is ok
    if not ok:
        assert rules_of(decision) == [("memory-limit", "enforce")]
        assert "CUDA_DEVICE_MEMORY_LIMIT_0" in decision.violations[0].message


def test_higher_own_memory_limit_than_the_share_is_denied() -> None:
    pod = vllm_pod(annotations={"gpu-admission.io/gpu-memory": "4096"},
                   containers=[make_container("vllm", VLLM, env=[
                       {"name": "NVIDIA_MEM_LIMIT_MB", "value": "8000"}])])
    decision = decide(pod)
    assert [(v.rule, v.message) for v in decision.violations] == [
        ("memory-limit", "NVIDIA_MEM_LIMIT_MB='8000' exceeds the GPU memory allowed on a shared "
         "GPU (annotation gpu-admission.io/gpu-memory): must be <= 4096 (MiB); " + WAY_OUT)]


@pytest.mark.parametrize(("where", "value"), [
    ("env", "9" * 5000), ("annotation", "9" * 5000), ("resource", "9" * 5000),
    ("annotation", "٤٠٩٦"),  # Arabic-Indic digits: str.isdigit() but not an ASCII count
], ids=["env-huge", "annotation-huge", "resource-huge", "annotation-unicode-digits"])
def test_hostile_numbers_are_refused_not_raised(where: str, value: str) -> None:
    env = [{"name": "NVIDIA_MEM_LIMIT_MB", "value": value}] if where == "env" else None
    container = make_container("vllm", VLLM, env=env)
    if where == "resource":
        container["resources"]["limits"]["gpu-admission.io/gpu-memory"] = value
    annotations = {"gpu-admission.io/gpu-memory": value} if where == "annotation" else None
    decision = decide(vllm_pod(containers=[container], annotations=annotations))
    assert not decision.allowed
    assert {v.rule for v in decision.violations} == {"memory-limit"}


def test_update_of_a_bound_fractional_pod_is_allowed() -> None:
    """After bind the pod has spec.nodeName; UPDATEs (labels, finalizers) are not re-judged
    for the bind bypass (only CREATE can choose how a pod gets its GPU)."""
    pod = vllm_pod()
    out = patched(pod, decide(pod))
    out["spec"]["nodeName"] = "node-3"
    out["metadata"]["labels"] = {"new": "label"}
    for stage in ("mutate", "validate"):
        decision = evaluate(out, RequestFacts("ml-serving", operation="UPDATE", uid="u",
                                              stage=stage), policy())
        assert (decision.allowed, decision.patch, decision.violations) == (True, (), ()), stage
