"""The rules, table-driven through ``engine.evaluate`` (the interface the webhook calls)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_admission.admission.engine import evaluate
from gpu_admission.core.decision import Mode
from tests.builders import make_container, make_pod
from tests.policy_helpers import (
    DEFAULT_ENV,
    NOT_SHARED,
    REQ,
    env_of,
    facts,
    policy_with,
    pools_policy,
    rules_of,
    run,
)

TRITON = "nvcr.io/nvidia/tritonserver:24.05-py3"  # CUDA 12.4
CUDA121 = "nvidia/cuda:12.1.1-runtime-ubuntu22.04"


def _required_terms(pod: dict[str, Any]) -> list[Any]:
    return list(pod["spec"].get("affinity", {}).get("nodeAffinity", {})
                .get(REQ, {}).get("nodeSelectorTerms", []))


# --- GPU detection ---------------------------------------------------------------------
GPU_DETECTION = [
    pytest.param(make_pod(containers=[make_container(gpu=None)]), False, id="no-resources"),
    pytest.param(make_pod(containers=[{"name": "c", "image": "x", "resources": {}}]), False,
                 id="empty-resources"),
    pytest.param(make_pod(containers=[{"name": "c", "image": "x",
                                       "resources": {"limits": None}}]), False, id="null-limits"),
    pytest.param(make_pod(containers=[make_container(gpu=0)]), False, id="zero-int"),
    pytest.param(make_pod(containers=[make_container(gpu="0")]), False, id="zero-string"),
    pytest.param(make_pod(containers=[make_container(resource="cpu", gpu="2")]), False,
                 id="cpu-only"),
    pytest.param(make_pod(containers=[make_container(gpu=1)]), True, id="limit-int"),
    pytest.param(make_pod(containers=[make_container(gpu="1")]), True, id="limit-string"),
    pytest.param(make_pod(containers=[make_container(requests_only=True)]), True,
                 id="requests-without-limits"),
    pytest.param(make_pod(containers=[make_container(resource="nvidia.com/gpu.shared")]), True,
                 id="shared-resource"),
    pytest.param(make_pod(containers=[make_container(resource="nvidia.com/mig-1g.5gb")]), True,
                 id="mig-resource"),
    pytest.param(make_pod(containers=[make_container(gpu=None)],
                          init_containers=[make_container("init")]), True, id="init-container"),
    pytest.param(make_pod(containers=[make_container(gpu=None)],
                          ephemeralContainers=[make_container("debug")]), False,
                 id="ephemeral-ignored"),
    pytest.param(make_pod(containers=[make_container(resource="amd.com/gpu")]), False,
                 id="other-vendor"),
]


@pytest.mark.parametrize(("pod", "gpu"), GPU_DETECTION)
def test_gpu_detection(pod: dict[str, Any], gpu: bool) -> None:
    decision, _ = run(pod)
    assert decision.gpu is gpu
    assert decision.allowed
    if not gpu:  # the GPU-access guard (NVIDIA_VISIBLE_DEVICES=void) and, since issue 32,
        # the GPU-aware scheduler (spec.scheduling.cpuPods: gpu-aware); nothing else
        assert decision.workload is None and decision.cuda_version is None
        assert "spec.schedulerName" in decision.changes
        assert all(c.endswith(".env") or c in ("metadata.annotations", "spec.schedulerName")
                   for c in decision.changes)


def test_quantity_int_and_string_give_the_same_patch() -> None:
    a, _ = run(make_pod(containers=[make_container(gpu=1)]))
    b, _ = run(make_pod(containers=[make_container(gpu="1")]))
    assert a.patch == b.patch and a.patch


def test_only_gpu_containers_get_memory_env() -> None:
    pod = make_pod(containers=[make_container("sidecar", image="envoy:1", gpu=None),
                               make_container("model")],
                   init_containers=[make_container("fetch", gpu=None),
                                    make_container("warmup")])
    _, after = run(pod)
    void = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]  # the GPU-access guard's
    assert env_of(after, 0) == void
    assert env_of(after, 1) == DEFAULT_ENV
    assert env_of(after, 0, "initContainers") == void
    assert env_of(after, 1, "initContainers") == DEFAULT_ENV


# --- workload classification ----------------------------------------------------------
CLASSIFY = [
    pytest.param({"labels": {"gpu-admission.io/workload": "training"}}, "training",
                 "label gpu-admission.io/workload", id="label-training"),
    pytest.param({"labels": {"gpu-admission.io/workload": "notebook"}}, "notebook",
                 "label gpu-admission.io/workload", id="label-notebook"),
    pytest.param({"labels": {"gpu-admission.io/workload": "inference"}, "owner_kind": "TFJob"},
                 "inference", "label gpu-admission.io/workload", id="label-beats-owner"),
    pytest.param({"owner_kind": "PyTorchJob"}, "training", "owner PyTorchJob/pod-owner",
                 id="owner-pytorchjob"),
    pytest.param({"owner_kind": "MPIJob"}, "training", "owner MPIJob/pod-owner", id="owner-mpijob"),
    pytest.param({"owner_kind": "ReplicaSet", "owner_api_version": "apps/v1"}, "inference",
                 "default", id="owner-replicaset"),
    pytest.param({"labels": {"training.kubeflow.org/job-name": "mnist"}}, "training",
                 "label training.kubeflow.org/job-name", id="kubeflow-label"),
    pytest.param({"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                 "training", "label trainer.kubeflow.org/trainjob-ancestor-step",
                 id="trainer-v2-label"),
    pytest.param({"labels": {"notebook-name": "nb"}}, "notebook", "label notebook-name",
                 id="kubeflow-notebook"),
    pytest.param({}, "inference", "default", id="default"),
]


@pytest.mark.parametrize(("kw", "workload", "reason"), CLASSIFY)
def test_classification(kw: dict[str, Any], workload: str, reason: str) -> None:
    decision, _ = run(make_pod(**kw))
    assert (decision.workload, decision.workload_reason) == (workload, reason)


def test_bad_workload_label_warns_and_falls_back() -> None:
    pod = make_pod(labels={"gpu-admission.io/workload": "Training"}, owner_kind="PyTorchJob")
    decision, _ = run(pod)
    assert decision.workload == "training"
    assert rules_of(decision) == [("workload-label", "warn")]
    assert decision.warnings[0].startswith("workload-label: unknown workload 'Training'")


# --- no-training-on-shared-gpu ---------------------------------------------------------
SHARED_TARGETS = [
    pytest.param({"containers": [make_container(resource="nvidia.com/gpu.shared")]},
                 "spec.containers[0].resources", id="shared-resource"),
    pytest.param({"containers": [make_container(gpu=None)],
                  "init_containers": [make_container(resource="nvidia.com/gpu.shared")]},
                 "spec.initContainers[0].resources", id="shared-in-init-container"),
    pytest.param({"node_selector": {"nvidia.com/gpu.sharing-strategy": "time-slicing"}},
                 "spec.nodeSelector[nvidia.com/gpu.sharing-strategy]", id="selector-ts"),
    pytest.param({"node_selector": {"nvidia.com/gpu.sharing-strategy": "mps"}},
                 "spec.nodeSelector[nvidia.com/gpu.sharing-strategy]", id="selector-mps"),
    pytest.param({"node_selector": {"nvidia.com/gpu.product": "Tesla-T4-SHARED"}},
                 "spec.nodeSelector[nvidia.com/gpu.product]", id="selector-shared-product"),
    pytest.param({"affinity": {"nodeAffinity": {REQ: {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "nvidia.com/gpu.sharing-strategy", "operator": "In",
                               "values": ["none", "mps"]}]}]}}}},
        f"spec.affinity.nodeAffinity.{REQ}.nodeSelectorTerms[1]", id="affinity-second-term"),
]


@pytest.mark.parametrize(("kw", "path"), SHARED_TARGETS)
def test_training_on_shared_gpu_denied(kw: dict[str, Any], path: str) -> None:
    decision, _ = run(make_pod(owner_kind="PyTorchJob", **kw))
    assert not decision.allowed
    assert decision.patch == ()
    [violation] = decision.denials
    assert violation.rule == "no-training-on-shared-gpu" and violation.path == path
    assert "~3x slower" in violation.message and "dedicated" in violation.message
    assert decision.denial_message().startswith("[no-training-on-shared-gpu] ")


@pytest.mark.parametrize("kw", [p.values[0] for p in SHARED_TARGETS],
                         ids=[str(p.id) for p in SHARED_TARGETS])
def test_inference_on_shared_gpu_allowed(kw: dict[str, Any]) -> None:
    decision, _ = run(make_pod(**kw))
    assert decision.allowed and decision.workload == "inference"


def test_training_on_shared_pool_denied() -> None:
    pod = make_pod(owner_kind="TFJob", node_selector={"gpu-admission.io/cuda-version": "12.1"},
                   containers=[make_container(image=CUDA121)])
    decision, _ = run(pod, pools_policy())
    assert [(v.rule, v.message.split(";")[0]) for v in decision.denials] == [
        ("no-training-on-shared-gpu",
         "training pod targets a time-sliced GPU (pool a100-ts-cuda121 is time-slicing)")]


def test_training_on_dedicated_pool_protected() -> None:
    pod = make_pod(owner_kind="TFJob", node_selector={"pool.example.com/name": "h100-dedicated"},
                   containers=[make_container(image=CUDA121)])
    decision, after = run(pod, pools_policy())
    assert decision.allowed and decision.violations == ()
    assert _required_terms(after) == [{"matchExpressions": [NOT_SHARED]}]
    assert env_of(after) == []  # whole GPU: no memory caps
    assert after["spec"]["nodeSelector"] == {"pool.example.com/name": "h100-dedicated"}


def test_training_protection_merged_into_every_term() -> None:
    terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
    ]
    preferred = [{"weight": 1, "preference": {"matchExpressions": [
        {"key": "x", "operator": "Exists"}]}}]
    pod = make_pod(owner_kind="PyTorchJob", affinity={"nodeAffinity": {
        REQ: {"nodeSelectorTerms": terms},
        "preferredDuringSchedulingIgnoredDuringExecution": preferred}})
    decision, after = run(pod)
    assert decision.allowed
    assert _required_terms(after) == [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}, NOT_SHARED]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}],
         "matchExpressions": [NOT_SHARED]},
    ]
    assert after["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert "spec.affinity" in decision.changes


def test_training_rule_in_warn_mode_allows_without_protection() -> None:
    policy = policy_with(rules={"no-training-on-shared-gpu": "warn"})
    pod = make_pod(owner_kind="PyTorchJob",
                   containers=[make_container(resource="nvidia.com/gpu.shared")])
    decision, after = run(pod, policy)
    assert decision.allowed
    assert rules_of(decision) == [("no-training-on-shared-gpu", "warn")]
    assert decision.warnings[0].startswith("no-training-on-shared-gpu: training pod targets")
    assert "affinity" not in after["spec"]


def test_training_rule_in_audit_mode_records_only() -> None:
    policy = policy_with(rules={"no-training-on-shared-gpu": "audit"})
    pod = make_pod(owner_kind="PyTorchJob",
                   containers=[make_container(resource="nvidia.com/gpu.shared")])
    decision, _ = run(pod, policy)
    assert decision.allowed and decision.warnings == ()
    assert decision.violations[0].mode is Mode.AUDIT


# --- scheduler-name --------------------------------------------------------------------
SCHEDULER = [
    pytest.param({}, "gpu-aware-scheduler", [], id="absent"),
    pytest.param({"scheduler_name": ""}, "gpu-aware-scheduler", [], id="empty"),
    pytest.param({"scheduler_name": "default-scheduler"}, "gpu-aware-scheduler", [],
                 id="default-scheduler"),
    pytest.param({"scheduler_name": "gpu-aware-scheduler"}, "gpu-aware-scheduler", [],
                 id="already-set"),
    pytest.param({"scheduler_name": "volcano"}, "volcano", [("scheduler-name", "warn")],
                 id="other-scheduler-kept-with-warning"),
    pytest.param({"nodeName": "gpu-node-1"}, None, [], id="node-name-not-rescheduled"),
]


@pytest.mark.parametrize(("kw", "expected", "violations"), SCHEDULER)
def test_scheduler_name(kw: dict[str, Any], expected: str | None,
                        violations: list[tuple[str, str]]) -> None:
    decision, after = run(make_pod(**kw))
    assert after["spec"].get("schedulerName") == expected
    assert rules_of(decision) == violations
    if violations:
        assert decision.warnings == (
            "scheduler-name: keeps scheduler 'volcano', not 'gpu-aware-scheduler' "
            "(GPU packing off)",)


def test_scheduler_rule_disabled_by_null() -> None:
    decision, after = run(make_pod(), policy_with(schedulerName=None))
    assert "schedulerName" not in after["spec"]
    assert decision.allowed


# --- memory-limit ----------------------------------------------------------------------
def _env(**values: str) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in values.items()]


MEMORY = [
    pytest.param(None, DEFAULT_ENV, [], id="absent-all-added"),
    pytest.param(_env(NVIDIA_MEM_LIMIT_MB="8000"),
                 [{"name": "NVIDIA_MEM_LIMIT_MB", "value": "8000"}, *DEFAULT_ENV[1:]], [],
                 id="lower-limit-kept"),
    pytest.param(_env(NVIDIA_MEM_LIMIT_MB="16000"), DEFAULT_ENV, [], id="equal-kept"),
    pytest.param(_env(NVIDIA_MEM_LIMIT_MB=""), DEFAULT_ENV, [], id="empty-value-replaced"),
    pytest.param(_env(GPU_MEMORY_FRACTION="0.1"),
                 [{"name": "GPU_MEMORY_FRACTION", "value": "0.1"}, DEFAULT_ENV[0],
                  *DEFAULT_ENV[2:]], [], id="lower-fraction-kept"),
    pytest.param(_env(TF_FORCE_GPU_ALLOW_GROWTH="TRUE"),
                 [{"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "TRUE"}, *DEFAULT_ENV[:4]], [],
                 id="tf-true-any-case-kept"),
    pytest.param(_env(NVIDIA_MEM_LIMIT_MB="20000"), None, [("memory-limit", "enforce")],
                 id="higher-denied"),
    pytest.param(_env(NVIDIA_MEM_LIMIT_MB="lots"), None, [("memory-limit", "enforce")],
                 id="unparsable-denied"),
    pytest.param(_env(GPU_MEMORY_FRACTION="0.5"), None, [("memory-limit", "enforce")],
                 id="higher-fraction-denied"),
    pytest.param(_env(XLA_PYTHON_CLIENT_MEM_FRACTION=".9"), None, [("memory-limit", "enforce")],
                 id="jax-fraction-denied"),
    pytest.param(_env(TF_FORCE_GPU_ALLOW_GROWTH="false"), None, [("memory-limit", "enforce")],
                 id="tf-growth-false-denied"),
    pytest.param([{"name": "NVIDIA_MEM_LIMIT_MB",
                   "valueFrom": {"configMapKeyRef": {"name": "gpu", "key": "mb"}}}],
                 [{"name": "NVIDIA_MEM_LIMIT_MB",
                   "valueFrom": {"configMapKeyRef": {"name": "gpu", "key": "mb"}}},
                  *DEFAULT_ENV[1:]], [("memory-limit-unverifiable", "warn")],
                 id="valueFrom-kept-and-warned"),
]


@pytest.mark.parametrize(("env", "expected_env", "violations"), MEMORY)
def test_memory_limit_default_policy(env: list[dict[str, Any]] | None,
                                     expected_env: list[dict[str, Any]] | None,
                                     violations: list[tuple[str, str]]) -> None:
    pod = make_pod(containers=[make_container(env=env)])
    decision, after = run(pod)
    assert rules_of(decision) == violations
    if expected_env is None:
        assert not decision.allowed
        assert decision.denials[0].path == "spec.containers[0].env[0]"
    else:
        assert decision.allowed
        assert env_of(after) == expected_env


def test_higher_limit_in_warn_mode_is_kept_not_overwritten() -> None:
    policy = policy_with(rules={"memory-limit": "warn"})
    pod = make_pod(containers=[make_container(env=_env(NVIDIA_MEM_LIMIT_MB="20000"))])
    decision, after = run(pod, policy)
    assert decision.allowed
    assert env_of(after)[0] == {"name": "NVIDIA_MEM_LIMIT_MB", "value": "20000"}
    assert decision.warnings[0].startswith("memory-limit: NVIDIA_MEM_LIMIT_MB='20000' exceeds")
    assert len(decision.warnings[0]) <= 120


POOLS = [
    pytest.param(CUDA121, 1, _env(NVIDIA_MEM_LIMIT_MB="20480", GPU_MEMORY_FRACTION="0.25",
                                  XLA_CLIENT_MEM_FRACTION="0.25",
                                  XLA_PYTHON_CLIENT_MEM_FRACTION="0.25",
                                  TF_FORCE_GPU_ALLOW_GROWTH="true"), id="time-slicing-pool"),
    pytest.param(TRITON, 1, _env(NVIDIA_MEM_LIMIT_MB="20480", GPU_MEMORY_FRACTION="0.5",
                                 XLA_CLIENT_MEM_FRACTION="0.5",
                                 XLA_PYTHON_CLIENT_MEM_FRACTION="0.5",
                                 TF_FORCE_GPU_ALLOW_GROWTH="true",
                                 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=20480M"), id="mps-pool"),
    pytest.param(TRITON, 2, _env(NVIDIA_MEM_LIMIT_MB="20480", GPU_MEMORY_FRACTION="0.5",
                                 XLA_CLIENT_MEM_FRACTION="0.5",
                                 XLA_PYTHON_CLIENT_MEM_FRACTION="0.5",
                                 TF_FORCE_GPU_ALLOW_GROWTH="true",
                                 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=20480M,1=20480M"),
                 id="mps-pool-two-gpus"),
    pytest.param("example.com/unknown:1", 1, DEFAULT_ENV, id="unknown-cuda-policy-default"),
]


@pytest.mark.parametrize(("image", "gpus", "expected_env"), POOLS)
def test_memory_values_from_pool(image: str, gpus: int,
                                 expected_env: list[dict[str, str]]) -> None:
    pod = make_pod(containers=[make_container(image=image, gpu=gpus)])
    decision, after = run(pod, pools_policy())
    assert decision.allowed
    assert env_of(after) == expected_env


@pytest.mark.parametrize(("env", "ok"), [
    ("0=4096M", True), ("0=20G", True), ("0=20480MB", True), ("0=1G,1=512M", True),
    ("0=30G", False), ("0=20481M", False), ("zero", False),
], ids=["mib", "gib", "mb-suffix", "two-devices", "too-much", "one-over", "garbage"])
def test_mps_existing_limit(env: str, ok: bool) -> None:
    pod = make_pod(containers=[make_container(
        image=TRITON, env=_env(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=env))])
    decision, after = run(pod, pools_policy())
    assert decision.allowed is ok
    if ok:
        assert env_of(after)[0] == {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": env}


@pytest.mark.parametrize("kw", [
    pytest.param({"owner_kind": "PyTorchJob"}, id="training"),
    pytest.param({"containers": [make_container(resource="nvidia.com/mig-1g.5gb")]}, id="mig"),
    pytest.param({"node_selector": {"pool.example.com/name": "a100-mig"}}, id="mig-pool"),
    pytest.param({"node_selector": {"pool.example.com/name": "h100-dedicated"}},
                 id="dedicated-pool"),
])
def test_no_memory_env_without_card_sharing(kw: dict[str, Any]) -> None:
    decision, after = run(make_pod(**kw), pools_policy())
    assert decision.allowed
    assert env_of(after) == []


def test_notebook_gets_memory_env() -> None:
    _, after = run(make_pod(labels={"gpu-admission.io/workload": "notebook"}))
    assert env_of(after) == DEFAULT_ENV


def test_env_switches() -> None:
    policy = policy_with(memoryLimits={"env": {"nvidiaMemLimitMB": True,
                                               "gpuMemoryFraction": False,
                                               "jaxMemFraction": False, "tfAllowGrowth": False,
                                               "mpsPinnedMemLimit": False}})
    _, after = run(make_pod(), policy)
    assert env_of(after) == DEFAULT_ENV[:1]


# --- CUDA routing ----------------------------------------------------------------------
def test_cuda_from_label_routes() -> None:
    pod = make_pod(labels={"gpu-admission.io/cuda-version": "12.01"},
                   containers=[make_container(image="example.com/x:1")])
    decision, after = run(pod)
    assert (decision.cuda_version, decision.cuda_source) == (
        "12.1", "label gpu-admission.io/cuda-version")
    assert after["spec"]["nodeSelector"] == {"gpu-admission.io/cuda-version": "12.1"}


def test_cuda_from_image_routes_and_keeps_other_selectors() -> None:
    pod = make_pod(node_selector={"zone": "a"}, containers=[make_container(image=CUDA121)])
    decision, after = run(pod)
    assert decision.cuda_source == f"image {CUDA121} (spec.containers[0])"
    assert after["spec"]["nodeSelector"] == {"zone": "a", "gpu-admission.io/cuda-version": "12.1"}


def test_label_beats_image() -> None:
    pod = make_pod(labels={"gpu-admission.io/cuda-version": "12.4"},
                   containers=[make_container(image=CUDA121)])
    decision, _ = run(pod)
    assert decision.cuda_version == "12.4" and decision.allowed


def test_training_is_not_routed_by_cuda() -> None:
    _, after = run(make_pod(owner_kind="PyTorchJob", containers=[make_container(image=CUDA121)]))
    assert "nodeSelector" not in after["spec"]


CUDA_DENIALS = [
    pytest.param({"containers": [make_container("a", image=CUDA121),
                                 make_container("b", image=TRITON)]},
                 "cuda-version-conflict", "spec.containers", id="containers-disagree"),
    pytest.param({"containers": [make_container("a", image=CUDA121, gpu=None)],
                  "init_containers": [make_container("i", image=TRITON)]},
                 None, None, id="non-gpu-container-ignored"),
    pytest.param({"containers": [make_container(image=CUDA121)],
                  "init_containers": [make_container("i", image=TRITON)]},
                 "cuda-version-conflict", "spec.containers", id="init-container-disagrees"),
    pytest.param({"containers": [make_container(image=CUDA121)],
                  "node_selector": {"gpu-admission.io/cuda-version": "11.8"}},
                 "cuda-node-selector-conflict",
                 "spec.nodeSelector[gpu-admission.io/cuda-version]", id="selector-contradicts"),
    pytest.param({"containers": [make_container(image=CUDA121)],
                  "affinity": {"nodeAffinity": {REQ: {"nodeSelectorTerms": [
                      {"matchExpressions": [{"key": "gpu-admission.io/cuda-version",
                                             "operator": "In", "values": ["11.8", "12.4"]}]}]}}}},
                 "cuda-node-selector-conflict", "spec.affinity.nodeAffinity",
                 id="affinity-contradicts"),
]


@pytest.mark.parametrize(("kw", "rule", "path"), CUDA_DENIALS)
def test_cuda_denials(kw: dict[str, Any], rule: str | None, path: str | None) -> None:
    decision, _ = run(make_pod(**kw))
    if rule is None:
        assert decision.allowed
        return
    assert not decision.allowed
    assert [(v.rule, v.path) for v in decision.denials] == [(rule, path)]


def test_conflict_message_lists_versions() -> None:
    decision, _ = run(make_pod(containers=[make_container("a", image=CUDA121),
                                           make_container("b", image=TRITON)]))
    assert "12.1 in spec.containers[0]; 12.4 in spec.containers[1]" in decision.denials[0].message


def test_pool_cuda_version_contradiction() -> None:
    policy = policy_with(nodePools=[{"name": "old", "nodeSelector": {"pool": "old"},
                                     "sharing": "time-slicing", "replicasPerGPU": 2,
                                     "memoryMiB": 16384, "cudaVersion": "11.8"}])
    pod = make_pod(node_selector={"pool": "old"}, containers=[make_container(image=CUDA121)])
    decision, _ = run(pod, policy)
    assert [(v.rule, v.message) for v in decision.denials] == [(
        "cuda-node-selector-conflict",
        f"pod targets pool 'old' (CUDA 11.8) but uses CUDA 12.1 (image {CUDA121} "
        "(spec.containers[0]))")]


@pytest.mark.parametrize(("labels", "needle"), [
    (None, "cuda-version-unknown: CUDA version unknown; set label gpu-admission.io/cuda-version; "
           "not routed to a CUDA pool"),
    ({"gpu-admission.io/cuda-version": "12"},
     "cuda-version-unknown: label gpu-admission.io/cuda-version='12' is not <major>.<minor>; "
     "not routed to a CUDA pool"),
], ids=["no-label", "invalid-label"])
def test_unknown_cuda_warns_and_does_not_route(labels: dict[str, str] | None,
                                               needle: str) -> None:
    pod = make_pod(labels=labels, containers=[make_container(image="vllm/vllm-openai:latest")])
    decision, after = run(pod)
    assert decision.allowed and decision.cuda_version is None
    assert rules_of(decision) == [("cuda-version-unknown", "warn")]
    assert decision.warnings == (needle,)
    assert "nodeSelector" not in after["spec"]


def test_unknown_cuda_but_pinned_pool_is_quiet() -> None:
    pod = make_pod(node_selector={"gpu-admission.io/cuda-version": "12.4"},
                   containers=[make_container(image="vllm/vllm-openai:latest")])
    decision, after = run(pod)
    assert decision.allowed and decision.violations == ()
    assert after["spec"]["nodeSelector"] == {"gpu-admission.io/cuda-version": "12.4"}


def test_driver_affinity_switch() -> None:
    policy = policy_with(cudaRouting={"driverAffinity": True})
    pod = make_pod(containers=[make_container(image=CUDA121)], affinity={"nodeAffinity": {
        REQ: {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}})
    decision, after = run(pod, policy)
    assert decision.allowed
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    assert _required_terms(after) == [
        {"matchExpressions": [zone, {"key": "nvidia.com/cuda.runtime-version.major",
                                     "operator": "Gt", "values": ["12"]}]},
        {"matchExpressions": [zone, {"key": "nvidia.com/cuda.runtime-version.major",
                                     "operator": "In", "values": ["12"]},
                              {"key": "nvidia.com/cuda.runtime-version.minor",
                               "operator": "Gt", "values": ["0"]}]},
    ]


def test_driver_affinity_minor_zero_and_training() -> None:
    policy = policy_with(cudaRouting={"driverAffinity": True})
    pod = make_pod(owner_kind="PyTorchJob",
                   containers=[make_container(image="nvidia/cuda:13.0.0-base-ubuntu24.04")])
    _, after = run(pod, policy)
    major = "nvidia.com/cuda.runtime-version.major"
    assert _required_terms(after) == [
        {"matchExpressions": [{"key": major, "operator": "Gt", "values": ["13"]}, NOT_SHARED]},
        {"matchExpressions": [{"key": major, "operator": "In", "values": ["13"]}, NOT_SHARED]},
    ]


def test_node_selector_routing_switch_off() -> None:
    policy = policy_with(cudaRouting={"nodeSelector": False})
    _, after = run(make_pod(containers=[make_container(image=CUDA121)]), policy)
    assert "nodeSelector" not in after["spec"]


# --- every violation is reported ------------------------------------------------------
def test_all_violations_collected() -> None:
    pod = make_pod(
        labels={"gpu-admission.io/workload": "serving"},
        scheduler_name="volcano",
        containers=[make_container("a", image=CUDA121, env=_env(NVIDIA_MEM_LIMIT_MB="99999")),
                    make_container("b", image=TRITON, env=[
                        {"name": "GPU_MEMORY_FRACTION", "valueFrom": {"fieldRef": {
                            "fieldPath": "metadata.annotations['f']"}}}])])
    decision, _ = run(pod)
    assert rules_of(decision) == [
        ("workload-label", "warn"),
        ("scheduler-name", "warn"),
        ("cuda-version-conflict", "enforce"),
        ("memory-limit", "enforce"),
        ("memory-limit-unverifiable", "warn"),
    ]
    assert not decision.allowed and decision.patch == ()
    assert len(decision.warnings) == 3


@pytest.mark.parametrize(("card_mib", "value", "rules"), [
    pytest.param(81920, "40960", [], id="the-written-value"),
    pytest.param(81920, " 40960", [], id="the-written-value-padded"),
    pytest.param(81920, "40961", [("memory-limit", "enforce")], id="one-over"),
    # 1 MiB over 2 replicas: the pool's own share is 0 MiB, a value its check refuses; the
    # validate stage must not take "what the webhook writes" as fine (memory.settled_names)
    pytest.param(1, "0", [("memory-limit", "enforce")], id="a-zero-share-pool"),
])
def test_validate_accepts_a_written_value_only_where_its_check_would(
        card_mib: int, value: str, rules: list[tuple[str, str]]) -> None:
    policy = policy_with(nodePools=[{
        "name": "ts", "nodeSelector": {"pool": "ts"}, "sharing": "time-slicing",
        "replicasPerGPU": 2, "memoryMiB": card_mib, "cudaVersion": "12.4"}])
    pod = make_pod(node_selector={"pool": "ts"}, containers=[make_container(
        image=TRITON, env=[{"name": "NVIDIA_MEM_LIMIT_MB", "value": value}])])
    for _ in range(2):  # the second time from the memoised wanted values
        decision = evaluate(pod, facts(stage="validate"), policy)
        assert [(r, m) for r, m in rules_of(decision) if r == "memory-limit"] == rules
