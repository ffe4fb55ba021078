"""The pure placement functions: TargetLoadPacking's curve (the upstream formula's values),
filter/score tables, and the memory share held to the webhook: for every pod in the table,
the share the extender reserves equals the ``NVIDIA_MEM_LIMIT_MB`` the engine writes."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_admission.placement.gpus import Gpu, Snapshot
from gpu_admission.placement.score import (
    NEUTRAL_SCORE,
    Demand,
    filter_nodes,
    pod_demand,
    score_nodes,
    target_load_packing,
)
from gpu_admission.policy.model import Placement, Policy, default_policy
from tests.builders import make_container, make_pod
from tests.policy_helpers import env_of, pools_policy, run

# scheduler-plugins pkg/trimaran/targetloadpacking/targetloadpacking.go Score, by hand:
# u <= t: round((100-t)*u/t + t); t < u <= 100: round(t*(100-u)/(100-t)); u > 100: 0
TLP = [
    pytest.param(0, 70, 70, id="idle-scores-the-target"),
    pytest.param(35, 70, 85, id="half-way"),
    pytest.param(70, 70, 100, id="at-target-max"),
    pytest.param(71, 70, 68, id="just-above-drops"),
    pytest.param(90, 70, 23, id="hot"),
    pytest.param(100, 70, 0, id="full"),
    pytest.param(101, 70, 0, id="over-100"),
    pytest.param(20, 40, 70, id="target-40"),
    pytest.param(10, 40, 55, id="round-half-away"),
    pytest.param(50, 100, 100, id="target-100-is-flat"),
]


@pytest.mark.parametrize(("util", "target", "score"), TLP)
def test_target_load_packing_curve(util: float, target: int, score: int) -> None:
    assert target_load_packing(util, target) == score


def gpu(index: int, util: float, free: float, used: float = 0) -> Gpu:
    return Gpu(str(index), f"GPU-{index}", "A100", util, used, free)


SNAP = Snapshot({"a": (gpu(0, 65, 40000), gpu(1, 5, 80000)),
                 "b": (gpu(0, 95, 2000, 78000), gpu(1, 20, 9216, 70000)),
                 "idle": (gpu(0, 0, 80000), gpu(1, 2, 80000, 500))}, taken_at=0.0)
PLACEMENT = Placement()
SHARED = Demand("shared", memory_mib=16000, source="policy default", share_percent=20)
WHOLE = Demand("whole", gpus=2)


def test_filter_reason_names_the_numbers() -> None:
    result = filter_nodes(SHARED, ["a", "b", "unknown"], SNAP, PLACEMENT)
    assert result.passed == ["a", "unknown"]
    assert result.failed == {"b": "no GPU with 17024 MiB free (16000 MiB share + 1024 MiB "
                                  "headroom): best 9216 MiB on GPU 1"}


@pytest.mark.parametrize(("demand", "snapshot", "expected"), [
    # shared: each fitting GPU at utilisation + 20 % (the pod's share): a: 25 % -> 81 -> 8
    # (85 % is above the target: 35), b: nothing fits, idle: 22 % -> 79 -> 8
    pytest.param(SHARED, SNAP, [("a", 8), ("b", 0), ("idle", 8), ("unknown", 5)], id="shared"),
    pytest.param(WHOLE, SNAP, [("a", 5), ("b", 0), ("idle", 10), ("unknown", 5)], id="whole"),
    pytest.param(SHARED, None, [(n, NEUTRAL_SCORE) for n in ("a", "b", "idle", "unknown")],
                 id="stale"),
    pytest.param(Demand("none"), SNAP, [(n, 5) for n in ("a", "b", "idle", "unknown")],
                 id="no-gpu"),
    pytest.param(Demand("mig"), SNAP, [(n, 5) for n in ("a", "b", "idle", "unknown")],
                 id="mig"),
])
def test_scores(demand: Demand, snapshot: Snapshot | None,
                expected: list[tuple[str, int]]) -> None:
    assert score_nodes(demand, ["a", "b", "idle", "unknown"], snapshot, PLACEMENT) == expected


def test_memory_fit_every_needs_room_on_every_gpu() -> None:
    """The device plugin, not the scheduler, picks the GPU: with ``memoryFit: every`` node a
    (GPU 0 has 40000 MiB free) fails a 40000 MiB share; "idle" (80000 on both) passes."""
    every = Placement(memoryFit="every")
    demand = Demand("shared", memory_mib=40000)
    result = filter_nodes(demand, ["a", "idle", "unknown"], SNAP, every)
    assert result.passed == ["idle", "unknown"]
    assert result.failed == {"a": "not every GPU has 41024 MiB free (40000 MiB share + 1024 "
                                  "MiB headroom): GPU 0 has 40000 MiB (memoryFit: every)"}
    assert filter_nodes(demand, ["a"], SNAP, PLACEMENT).passed == ["a"]  # "any": GPU 1 fits
    assert score_nodes(demand, ["a", "idle"], SNAP, every) == [("a", 0), ("idle", 7)]
    assert score_nodes(demand, ["a", "idle"], SNAP, PLACEMENT) == [("a", 7), ("idle", 7)]


def test_stale_or_neutral_filters_nothing() -> None:
    for demand, snap in ((SHARED, None), (Demand("none"), SNAP), (Demand("mig"), SNAP)):
        assert filter_nodes(demand, ["a", "b"], snap, PLACEMENT).failed == {}


# --------------------------------------------------------------------------- held to the engine
def pool_pod(selector: dict[str, str] | None = None, **kw: Any) -> dict[str, Any]:
    return make_pod("p", node_selector=selector, **kw)


DEMANDS = [
    pytest.param(make_pod(), None, "shared", id="default-policy-inference"),
    pytest.param(make_pod(containers=[make_container("a"), make_container("b")]), None,
                 "shared", id="two-gpu-containers"),
    pytest.param(make_pod(containers=[make_container("app")],
                          init_containers=[make_container("warm")]), None, "shared",
                 id="init-container"),
    pytest.param(make_pod(containers=[make_container(resource="nvidia.com/gpu.shared")]),
                 None, "shared", id="shared-resource"),
    pytest.param(make_pod(labels={"gpu-admission.io/workload": "notebook"}), None, "shared",
                 id="notebook"),
    pytest.param(make_pod(labels={"gpu-admission.io/cuda-version": "12.1"}), "pools", "shared",
                 id="ts-pool-by-cuda-routing"),
    pytest.param(make_pod(labels={"gpu-admission.io/cuda-version": "12.4"}), "pools", "shared",
                 id="mps-pool"),
    pytest.param(make_pod(node_selector={"pool.example.com/name": "h100-dedicated"}), "pools",
                 "whole", id="dedicated-pool"),
    pytest.param(make_pod(labels={"gpu-admission.io/workload": "training"}), None, "whole",
                 id="training"),
    pytest.param(make_pod(containers=[make_container(resource="nvidia.com/mig-1g.10gb")]),
                 None, "mig", id="mig"),
    pytest.param(make_pod(containers=[make_container(gpu=None)]), None, "none", id="no-gpu"),
]


@pytest.mark.parametrize(("pod", "policy_name", "kind"), DEMANDS)
def test_memory_share_is_what_the_webhook_writes(pod: dict[str, Any], policy_name: str | None,
                                                 kind: str) -> None:
    policy: Policy = pools_policy() if policy_name == "pools" else default_policy()
    demand = pod_demand(pod, policy)
    assert demand.kind == kind
    _, mutated = run(pod, policy)
    # the pod after the webhook (reading its env) asks for the same as before it
    after = pod_demand(mutated, policy)
    assert (after.kind, after.memory_mib, after.gpus) == (kind, demand.memory_mib, demand.gpus)
    written = [int(e["value"]) for kind_ in ("containers", "initContainers")
               for i in range(len(mutated["spec"].get(kind_, [])))
               for e in env_of(mutated, i, kind_) if e["name"] == "NVIDIA_MEM_LIMIT_MB"]
    if kind != "shared":
        assert written == []
        return
    # app containers add up, init containers run alone before them
    n_init = len(mutated["spec"].get("initContainers", []))
    app, init = written[:len(written) - n_init], written[len(written) - n_init:]
    assert demand.memory_mib == max(sum(app), max(init, default=0))


def test_an_own_lower_limit_is_the_share() -> None:
    pod = make_pod(containers=[make_container(env=[{"name": "NVIDIA_MEM_LIMIT_MB",
                                                    "value": "4000"}])])
    decision, _ = run(pod)
    assert decision.allowed  # the webhook keeps a lower limit
    assert pod_demand(pod, default_policy()) == Demand(
        "shared", memory_mib=4000, source="env NVIDIA_MEM_LIMIT_MB", share_percent=20.0,
        workload="inference")


def test_whole_gpu_count() -> None:
    pod = make_pod(containers=[make_container(gpu=2), make_container("b", gpu=1)],
                   labels={"gpu-admission.io/workload": "training"})
    assert pod_demand(pod, default_policy()) == Demand("whole", gpus=3, workload="training")
