"""Issue 33, "what a pod gets matches where it can land": the engine with the nodes visible.

Each case evaluates a pod against Node objects in the issue's shapes, checks the exact env and
node affinity it gets, and that the webhook on its own output yields an empty patch."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from gpu_admission.admission.engine import evaluate
from gpu_admission.core.decision import RequestFacts
from gpu_admission.facts.nodepools import GpuNode, can_land, gfd_pool, node_view
from gpu_admission.policy.model import Policy, default_policy, policy_from_dict
from tests.nodes_support import (
    PROTECT,
    ROUTE_T4,
    T4_POOL,
    dedicated_node,
    env_map,
    jax_pod,
    mig_node,
    no_gfd_node,
    t4_node,
    vllm_pod,
)

FACTS = RequestFacts(namespace="ml")
T4_CAPS = {"NVIDIA_MEM_LIMIT_MB": "1536", "GPU_MEMORY_FRACTION": "0.1",
           "XLA_CLIENT_MEM_FRACTION": "0.1", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.1",
           "TF_FORCE_GPU_ALLOW_GROWTH": "true"}


def training_pod() -> dict[str, Any]:
    pod = jax_pod("train")
    pod["metadata"]["labels"] = {"gpu-admission.io/workload": "training"}
    del pod["spec"]["containers"][0]["env"]
    return pod


def pinned(pod: dict[str, Any], selector: dict[str, str]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["spec"]["nodeSelector"] = selector
    return pod


def decide(pod: dict[str, Any], nodes: list[dict[str, Any]],
           policy: Policy | None = None) -> tuple[Any, dict[str, Any]]:
    """Evaluate with the nodes; the patched pod must come back with an empty patch."""
    policy = policy or default_policy()
    view = node_view(nodes, policy, "test nodes")
    decision = evaluate(pod, FACTS, policy, nodes=view)
    after = jsonpatch.apply_patch(pod, list(decision.patch), in_place=False)
    again = evaluate(after, FACTS, policy, nodes=view)
    assert again.patch == () and again.allowed == decision.allowed, again
    return decision, after


THREE = [dedicated_node(), t4_node(), mig_node()]

CASES = [
    # (pod, nodes, allowed, env of container 0 after, affinity after)
    pytest.param(jax_pod(), [dedicated_node()], True,
                 {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}, None, id="jax-8-dedicated-only"),
    pytest.param(jax_pod(), THREE, True, {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}, PROTECT,
                 id="jax-8-three-shapes-kept-off-shared"),
    pytest.param(vllm_pod(), THREE, True, T4_CAPS, ROUTE_T4, id="vllm-1-routed-to-t4"),
    pytest.param(vllm_pod(), [t4_node()], True, T4_CAPS, None, id="vllm-1-t4-only"),
    pytest.param(vllm_pod(), [dedicated_node(), mig_node()], True, {}, None,
                 id="vllm-1-no-shared-nodes"),
    pytest.param(pinned(vllm_pod(), {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}),
                 THREE, True, {}, None, id="vllm-pinned-to-dedicated"),
    pytest.param(pinned(vllm_pod(), {"nvidia.com/gpu.sharing-strategy": "none"}), THREE, True,
                 {}, None, id="vllm-sharing-none-selector"),
    pytest.param(pinned(jax_pod(), {"nvidia.com/gpu.product": "Tesla-T4-SHARED"}), THREE,
                 False, {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}, None,
                 id="jax-pinned-to-t4-denied"),
    pytest.param(training_pod(), [dedicated_node()], True, {}, None,
                 id="training-dedicated-only-nothing"),
    pytest.param(training_pod(), THREE, True, {}, PROTECT, id="training-three-shapes"),
]


@pytest.mark.parametrize(("pod", "nodes", "allowed", "env", "affinity"), CASES)
def test_what_a_pod_gets_matches_where_it_lands(pod: dict[str, Any], nodes: list[dict[str, Any]],
                                                allowed: bool, env: dict[str, str],
                                                affinity: dict[str, Any] | None) -> None:
    decision, after = decide(pod, nodes)
    assert decision.allowed is allowed, decision.violations
    if not allowed:
        return
    container = after["spec"]["containers"][0]
    assert env_map(container) == env
    assert after["spec"].get("affinity") == affinity
    assert after["spec"]["schedulerName"] == "gpu-aware-scheduler"
    assert "nodeSelector" not in after["spec"] or after["spec"]["nodeSelector"] == \
        pod["spec"].get("nodeSelector")  # no CUDA routing: no node carries the label


def test_jax_untouched_on_dedicated_nodes_gets_only_the_scheduler() -> None:
    decision, _ = decide(jax_pod(), [dedicated_node(), mig_node()])
    assert decision.patch == (
        {"op": "add", "path": "/spec/schedulerName", "value": "gpu-aware-scheduler"},
        {"op": "add", "path": "/metadata/annotations",
         "value": {"gpu-admission.io/mutated": "schedulerName"}})
    assert decision.placement.startswith("dedicated GPU: the nodes it can land on do not share")


def test_denial_on_a_shared_pool_names_the_way_out() -> None:
    decision, _ = decide(pinned(jax_pod(), {"nvidia.com/gpu.product": "Tesla-T4-SHARED"}), THREE)
    (violation,) = decision.violations
    assert violation.rule == "memory-limit"
    assert violation.message.startswith(
        f"XLA_PYTHON_CLIENT_MEM_FRACTION='0.9' exceeds the GPU memory allowed on a shared GPU "
        f"(pool {T4_POOL}): must be <= 0.1; lower or drop it, or select a dedicated GPU "
        "(nodeSelector nvidia.com/gpu.sharing-strategy: none, or a sharing: none pool)")


def test_declared_pool_overrides_the_labels() -> None:
    policy = policy_from_dict({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUSharingPolicy",
        "spec": {"nodePools": [{"name": "t4-mps", "nodeSelector": {
            "kubernetes.io/hostname": "t4-1"}, "sharing": "mps", "replicasPerGPU": 4,
            "memoryMiB": 15360}]}})
    decision, after = decide(vllm_pod(), [t4_node()], policy)
    env = env_map(after["spec"]["containers"][0])
    assert env["NVIDIA_MEM_LIMIT_MB"] == "3840"  # 15360 MiB / 4
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=3840M"
    assert "pool t4-mps" in decision.placement


def test_multi_gpu_shares_when_the_policy_says_so() -> None:
    policy = policy_from_dict({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUSharingPolicy",
        "spec": {"defaultSharing": {"maxGPUs": 8}}})
    pod = jax_pod()
    del pod["spec"]["containers"][0]["env"]
    _, after = decide(pod, THREE, policy)
    assert env_map(after["spec"]["containers"][0])["NVIDIA_MEM_LIMIT_MB"] == "1536"
    assert after["spec"]["affinity"] == ROUTE_T4


@pytest.mark.parametrize("nodes", [
    pytest.param([], id="no-nodes"),
    pytest.param([no_gfd_node()], id="nodes-without-gfd-labels"),
])
def test_without_visible_gpu_nodes_the_policy_is_assumed_as_today(
        nodes: list[dict[str, Any]]) -> None:
    policy = default_policy()
    assert node_view(nodes, policy) is None
    decision = evaluate(vllm_pod(), FACTS, policy, nodes=None)
    assert decision.placement.startswith("no GPU nodes visible: assumed the policy's declared")
    after = jsonpatch.apply_patch(vllm_pod(), list(decision.patch), in_place=False)
    assert env_map(after["spec"]["containers"][0])["NVIDIA_MEM_LIMIT_MB"] == "16000"


def test_a_pod_that_fits_no_visible_node_assumes_the_policy() -> None:
    pod = pinned(vllm_pod(), {"kubernetes.io/hostname": "elsewhere"})
    decision, _ = decide(pod, THREE)
    assert decision.placement.startswith("no visible GPU node matches the pod's node selection")


@pytest.mark.parametrize(("labels", "expected"), [
    pytest.param(t4_node()["metadata"]["labels"],
                 (T4_POOL, "time-slicing", 10, 15360, 1536), id="t4-time-slicing"),
    pytest.param(dedicated_node()["metadata"]["labels"],
                 ("gfd-nvidia-a100-sxm4-80gb", "none", 1, 81920, 81920), id="dedicated"),
    pytest.param(mig_node()["metadata"]["labels"],
                 ("gfd-nvidia-a100-sxm4-40gb-mig-1g-5gb", "mig", 1, 4864, 4864), id="mig-single"),
    pytest.param({"nvidia.com/gpu.product": "H100", "nvidia.com/gpu.memory": "81559",
                  "nvidia.com/gpu.replicas": "3", "nvidia.com/gpu.sharing-strategy": "mps"},
                 ("gfd-h100-mps-x3", "mps", 3, 81559, 27186), id="mps"),
])
def test_gfd_pool(labels: dict[str, str], expected: tuple[str, str, int, int, int]) -> None:
    pool = gfd_pool(labels)
    assert pool is not None
    assert (pool.name, pool.sharing, pool.replicas_per_gpu, pool.memory_mib,
            pool.memory_per_replica_mib) == expected


@pytest.mark.parametrize("labels", [
    pytest.param({"nvidia.com/gpu.product": "Tesla-T4"}, id="no-memory"),
    pytest.param({"nvidia.com/gpu.memory": "15360"}, id="no-product"),
    pytest.param({"nvidia.com/gpu.product": "T4", "nvidia.com/gpu.memory": "lots"},
                 id="memory-not-a-number"),
])
def test_nodes_without_usable_gfd_labels_are_not_gpu_nodes(labels: dict[str, str]) -> None:
    assert gfd_pool(labels) is None


LABELS = {"nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.replicas": "10",
          "kubernetes.io/hostname": "t4-1"}


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, "values": list(values)}


@pytest.mark.parametrize(("selector", "terms", "lands"), [
    pytest.param({}, None, True, id="nothing-asked"),
    pytest.param({"kubernetes.io/hostname": "t4-1"}, None, True, id="selector-match"),
    pytest.param({"kubernetes.io/hostname": "t4-2"}, None, False, id="selector-miss"),
    pytest.param({}, [{"matchExpressions": [expr("nvidia.com/gpu.replicas", "Gt", "4")]}],
                 True, id="gt"),
    pytest.param({}, [{"matchExpressions": [expr("nvidia.com/gpu.replicas", "Lt", "4")]}],
                 False, id="lt"),
    pytest.param({}, [{"matchExpressions": [expr("nvidia.com/gpu.product", "NotIn",
                                                 "Tesla-T4-SHARED")]}], False, id="notin"),
    pytest.param({}, [{"matchExpressions": [expr("gpu-admission.io/cuda-version", "NotIn",
                                                 "12.1")]}], True, id="notin-absent-key"),
    pytest.param({}, [{"matchExpressions": [expr("nvidia.com/gpu.product", "DoesNotExist")]}],
                 False, id="does-not-exist"),
    pytest.param({}, [{"matchExpressions": [expr("nvidia.com/gpu.product", "Exists")]}], True,
                 id="exists"),
    pytest.param({}, [{"matchExpressions": [expr("x", "In", "y")]},
                      {"matchFields": [expr("metadata.name", "In", "t4-1")]}], True,
                 id="terms-ored-match-fields"),
    pytest.param({}, [{}], False, id="empty-term-matches-nothing"),
])
def test_can_land(selector: dict[str, str], terms: list[dict[str, Any]] | None,
                  lands: bool) -> None:
    pool = gfd_pool({**LABELS, "nvidia.com/gpu.memory": "15360",
                     "nvidia.com/gpu.sharing-strategy": "time-slicing"})
    assert pool is not None
    node = GpuNode("t4-1", LABELS, frozenset({"nvidia.com/gpu"}), pool)
    assert can_land(node, selector, terms, frozenset({"nvidia.com/gpu"})) is lands
    assert not can_land(node, {}, None, frozenset({"nvidia.com/mig-1g.5gb"}))


def test_cuda_routing_only_to_nodes_that_carry_the_label() -> None:
    """A sharing pod is routed to its CUDA version when visible nodes carry the label; a pod
    on dedicated GPUs gets no routing at all (decide() checks the fixed point)."""
    t4 = t4_node()
    t4["metadata"]["labels"]["gpu-admission.io/cuda-version"] = "12.4"
    pod = vllm_pod()
    pod["metadata"]["labels"] = {"gpu-admission.io/cuda-version": "12.4"}
    _, after = decide(pod, [t4, dedicated_node()])
    assert after["spec"]["nodeSelector"] == {"gpu-admission.io/cuda-version": "12.4"}
    jax = jax_pod()
    jax["metadata"]["labels"] = {"gpu-admission.io/cuda-version": "12.4"}
    decision, after = decide(jax, [t4, dedicated_node()])
    assert "nodeSelector" not in after["spec"]
    assert [v.rule for v in decision.violations] == []  # no cuda-version-unknown noise
