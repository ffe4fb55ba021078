"""Pods of other GPU-sharing systems (issue 22) through the compiled policies, the engine
as the oracle: KAI-Scheduler pods before and after KAI's webhook, HAMi pods, with the
systems not declared (the compiled policies decide them exactly as the engine), and with
them declared (the compiled policies leave them to the webhook, which decides them in full).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_admission.admission.engine import evaluate
from gpu_admission.compile.compiler import CompileFailure, compile_policy
from gpu_admission.compile.evaluator import admit
from gpu_admission.compile.offline import as_admitted
from gpu_admission.core.decision import RequestFacts
from gpu_admission.policy.model import default_policy, policy_from_dict
from tests.compile_support import check, pods, request_facts

IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"
KAI_CM = "kai-job-abcdefg-shared-gpu"


def kai_pod(annotations: dict[str, str], *, env: list[dict[str, Any]] | None = None,
            gpu: bool = False, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A KAI-Scheduler pod as its docs write it (schedulerName kai-scheduler, queue label);
    ``env``: what KAI's webhook adds to the fraction container."""
    main: dict[str, Any] = {"name": "main", "image": IMAGE}
    if env is not None:
        main["env"] = env
    if gpu:
        main["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "kai", "namespace": "team-a",
                         "labels": {"kai.scheduler/queue": "team-a", **(labels or {})},
                         "annotations": dict(annotations)},
            "spec": {"schedulerName": "kai-scheduler",
                     "containers": [main, {"name": "sidecar", "image": "busybox"}]}}


def kai_env(name: str = f"{KAI_CM}-0") -> list[dict[str, Any]]:
    return [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {
        "name": name, "key": "NVIDIA_VISIBLE_DEVICES"}}}]


def hami_pod(resources: dict[str, str], *, labels: dict[str, str] | None = None,
             init: bool = False) -> dict[str, Any]:
    """A HAMi vGPU pod as HAMi's examples write it (nvidia.com/gpu plus gpumem/gpucores)."""
    container = {"name": "cuda", "image": IMAGE, "resources": {"limits": dict(resources)}}
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "busybox"}]}
    if init:
        spec["initContainers"] = [container]
    else:
        spec["containers"].insert(0, container)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "hami", "namespace": "team-a", "labels": dict(labels or {})},
            "spec": spec}


TRAINING = {"gpu-admission.io/workload": "training"}
PODS = {
    "kai-fraction-before-kai-webhook": kai_pod({"gpu-fraction": "0.5"}),
    "kai-memory-before-kai-webhook": kai_pod({"gpu-memory": "3000"}),
    "kai-fraction-after-kai-webhook": kai_pod(
        {"gpu-fraction": "0.25", "runai/shared-gpu-configmap": KAI_CM}, env=kai_env()),
    "kai-long-fraction-value": kai_pod({"gpu-fraction": "0.1234567890123456789012345"}),
    "kai-with-a-gpu-request": kai_pod({"gpu-memory": "2048"}, gpu=True),
    "kai-borrowed-annotations-user-configmap": kai_pod(
        {"gpu-fraction": "0.5"}, env=kai_env("my-own-configmap")),
    "kai-training": kai_pod({"gpu-fraction": "0.5"}, labels=TRAINING),
    "hami-gpumem": hami_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}),
    "hami-gpumem-canonical-3k": hami_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3k"}),
    "hami-percentage-and-cores": hami_pod({"nvidia.com/gpu": "1",
                                           "nvidia.com/gpumem-percentage": "50",
                                           "nvidia.com/gpucores": "30"}),
    "hami-gpumem-only": hami_pod({"nvidia.com/gpumem": "4096"}),
    "hami-zero-gpumem-is-not-hami": hami_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "0"}),
    "hami-init-container": hami_pod({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"},
                                    init=True),
    "hami-training": hami_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"},
                              labels=TRAINING),
}


@pytest.mark.parametrize("policy", ["default", "modes"])
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
@pytest.mark.parametrize("name", list(PODS))
def test_undeclared_systems_compiled_like_the_engine(policy: str, operation: str,
                                                     name: str) -> None:
    expected, _ = check(policy, copy.deepcopy(PODS[name]),
                        RequestFacts(namespace="team-a", operation=operation))
    rules = {v.rule for v in expected.violations}
    if name != "hami-zero-gpumem-is-not-hami" and (operation == "CREATE" or expected.gpu):
        assert "other-sharing-system" in rules  # never silently voided
    if name == "kai-borrowed-annotations-user-configmap" and operation == "CREATE":
        assert "gpu-visible-devices" in rules  # annotations unlock nothing


def _with_other(pod: dict[str, Any], what: int) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    if what == 0:
        pod["metadata"].setdefault("annotations", {})["gpu-fraction"] = "0.5"
    elif what == 1:
        pod["metadata"].setdefault("annotations", {})["gpu-memory"] = "x1"
    else:
        container = pod["spec"]["containers"][-1]
        resources = container.setdefault("resources", {})
        resources.setdefault("limits", {})["nvidia.com/gpumem"] = ["0", "3k", "512"][what - 2]
    return pod


SETTINGS = settings(max_examples=120, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(pod=pods(), what=st.integers(0, 4), facts=request_facts())
def test_generated_other_system_pods(pod: dict[str, Any], what: int,
                                     facts: RequestFacts) -> None:
    check("modes" if what % 2 else "default", _with_other(pod, what), facts)


DECLARED = policy_from_dict({"apiVersion": "gpu-admission.io/v1alpha1",
                             "kind": "GPUSharingPolicy", "metadata": {"name": "declared"},
                             "spec": {"otherSharingSystems": ["kai", "hami"]}})


def test_declared_systems_stay_with_the_webhook_for_their_pods_only() -> None:
    with pytest.raises(CompileFailure, match=r"other-sharing-system: spec\.otherSharingSystems"):
        compile_policy(DECLARED)
    compiled = compile_policy(DECLARED, partial=True)
    assert compiled.stays["other-sharing-system"].field == "spec.otherSharingSystems"
    facts = RequestFacts(namespace="team-a")
    for name, written in PODS.items():
        outcome = admit(compiled.objects, as_admitted(copy.deepcopy(written)), facts)
        # the compiled policies skip it (matchConditions; a zero HAMi quantity too: the
        # webhook then decides it in full, as the engine does); the webhook decides it
        assert outcome.decision.patch == () and outcome.decision.violations == (), name
    # an ordinary GPU pod is still decided by the compiled policies, as the engine does
    plain = as_admitted({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": "p", "namespace": "team-a"},
                         "spec": {"containers": [{"name": "c", "image": IMAGE, "resources": {
                             "limits": {"nvidia.com/gpu": "1"}}}]}})
    outcome = admit(compiled.objects, plain, facts)
    assert outcome.decision.patch == evaluate(plain, facts, DECLARED).patch != ()


def test_default_policy_has_no_other_systems() -> None:
    assert default_policy().spec.other_sharing_systems == []
