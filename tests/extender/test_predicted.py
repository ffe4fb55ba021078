"""``memoryFit: predicted`` and the pod counts it rests on, as tables: which GPUs the NVIDIA
device plugin may pick (fewest replicas allocated, ties at random: k8s-device-plugin
``internal/rm/allocate.go``), the filter's reason and the worst-case score, pods counted
from dcgm-exporter's series in each exporter mode (per-pod copies, one pod label per GPU,
``exported_*`` through a ServiceMonitor), and "idle" meaning strictly under
``idleBelowPercent``. The benchmark's device-plugin simulation is held to the prediction."""

from __future__ import annotations

import importlib.util
import random
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpu_admission.extender.gpustate import (
    METRICS,
    UTIL,
    Holders,
    build_snapshot,
    node_labels,
    parse_vector,
)
from gpu_admission.placement.gpus import Gpu, Snapshot
from gpu_admission.placement.score import (
    Demand,
    filter_nodes,
    is_idle,
    predicted_gpus,
    score_nodes,
)
from gpu_admission.policy.model import Placement

PREDICTED = Placement(memoryFit="predicted")
SHARED = Demand("shared", memory_mib=16000, share_percent=20)  # needs 17024 MiB free
CARD = 81920  # MiB


def gpu(index: int, pods: int, free: float, util: float = 30.0) -> Gpu:
    return Gpu(str(index), f"GPU-{index}", "A100", util, CARD - free, free, pods)


# --------------------------------------------------------------------------- which GPU
@pytest.mark.parametrize(("pods", "expected"), [
    pytest.param([0, 0, 0, 0], [0, 1, 2, 3], id="empty-node-all-tied"),
    pytest.param([2, 1, 3, 2], [1], id="fewest-wins"),
    pytest.param([2, 1, 1, 3], [1, 2], id="tie-both-possible"),
    pytest.param([1, 0, 1, 1], [1], id="default-mode-free-gpu-is-exact"),
    pytest.param([1, 1, 1, 1], [0, 1, 2, 3], id="default-mode-all-held-all-tied"),
])
def test_predicted_gpus_are_those_with_fewest_pods(pods: list[int],
                                                   expected: list[int]) -> None:
    gpus = tuple(gpu(i, n, 40000) for i, n in enumerate(pods))
    assert [int(g.index) for g in predicted_gpus(gpus)] == expected


def need(what: str) -> str:
    return f"lacks 17024 MiB free (16000 MiB share + 1024 MiB headroom): {what}"


@pytest.mark.parametrize(("gpus", "reason"), [
    # GPU 0 has room but holds 2 pods: the pod goes to GPU 1 (1 pod), which has none;
    # "any" would pass this node and over-commit GPU 1
    pytest.param((gpu(0, 2, 60000), gpu(1, 1, 9216)), "the GPU the device plugin will pick "
                 "(fewest pods: 1) " + need("GPU 1 has 9216 MiB (memoryFit: predicted)"),
                 id="picked-gpu-full"),
    pytest.param((gpu(0, 2, 10000), gpu(1, 1, 50000)), None, id="picked-gpu-has-room"),
    pytest.param((gpu(0, 1, 50000), gpu(1, 1, 12000)), "the GPU the device plugin will pick "
                 "(fewest pods: 1) " + need("GPU 1 (one of 2 tied) has 12000 MiB (memoryFit: "
                                            "predicted)"), id="tie-one-lacks-room"),
    pytest.param((gpu(0, 1, 50000), gpu(1, 1, 17024)), None, id="tie-all-fit-exactly"),
    # default exporter mode: GPU 0 shows one pod (maybe more), GPU 1 none: GPU 1 is picked
    pytest.param((gpu(0, 1, 5000), gpu(1, 0, 80000)), None, id="fallback-free-gpu"),
    pytest.param((gpu(0, 1, 5000), gpu(1, 1, 80000)), "the GPU the device plugin will pick "
                 "(fewest pods: 1) " + need("GPU 0 (one of 2 tied) has 5000 MiB (memoryFit: "
                                            "predicted)"), id="fallback-all-held"),
])
def test_filter_predicted(gpus: tuple[Gpu, ...], reason: str | None) -> None:
    snap = Snapshot({"n": gpus}, 0.0)
    result = filter_nodes(SHARED, ["n", "no-data"], snap, PREDICTED)
    if reason is None:
        assert (result.passed, result.failed) == (["n", "no-data"], {})
    else:
        assert (result.passed, result.failed) == (["no-data"], {"n": reason})


# score = (curve + tight) / 2 / 10, curve = TLP at utilisation + 20 % (target 70),
# tight = 100 x (1 - (free - 17024) / 81920)
@pytest.mark.parametrize(("gpus", "score"), [
    # picked GPU 1: 30 + 20 = 50 % -> round(30*50/70 + 70) = 91; 60000 MiB free -> 47.5;
    # (91 + 47.5) / 2 = 69 -> 7 (the busier GPU 0 at 60 % is not where the pod goes)
    pytest.param((gpu(0, 2, 60000, util=60), gpu(1, 1, 60000, util=30)), 7, id="picked-gpu"),
    # a tighter fit on the picked GPU: 20000 MiB free -> 96.3; (91 + 96.3) / 2 = 94 -> 9
    pytest.param((gpu(0, 2, 60000, util=60), gpu(1, 1, 20000, util=30)), 9, id="tight-fit"),
    # tie: either may be picked, the worse counts: GPU 0 at 80 % -> round(70*20/30) = 47;
    # (47 + 47.5) / 2 = 47 -> 5
    pytest.param((gpu(0, 1, 60000, util=60), gpu(1, 1, 60000, util=30)), 5, id="tie-worst"),
    # an empty card: 30 % -> 91, 81920 MiB free -> 20.8: (91 + 20.8) / 2 = 56 -> 6
    pytest.param((gpu(0, 0, CARD, util=30),), 6, id="empty-card-loose-fit"),
    pytest.param((gpu(0, 2, 60000), gpu(1, 1, 9216)), 0, id="no-room-zero"),
])
def test_score_predicted(gpus: tuple[Gpu, ...], score: int) -> None:
    assert score_nodes(SHARED, ["n"], Snapshot({"n": gpus}, 0.0), PREDICTED) == [("n", score)]


# --------------------------------------------------------------------------- pod counts
BASE = {"gpu": "0", "UUID": "GPU-a", "modelName": "A100", "Hostname": "n1"}


def reply(*series: dict[str, str], value: str = "10") -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": BASE | s, "value": [0, value]} for s in series]}}


def counted(*series: dict[str, str], util_value: str = "10") -> int:
    """The pods the snapshot shows on GPU-a when every metric has these series."""
    bad: Counter[tuple[str, str]] = Counter()
    holders: Holders = {}
    readings = {m: parse_vector(reply(*series, value=util_value if m == UTIL else "10"), m,
                                node_labels("Hostname"), bad, holders) for m in METRICS}
    snap = build_snapshot(readings, 0.0, bad, holders)
    return snap.nodes["n1"][0].pods if snap.nodes else -1


POD = {"namespace": "team", "container": "main"}


@pytest.mark.parametrize(("series", "pods"), [
    pytest.param([{}], 0, id="no-pod-label"),
    pytest.param([POD | {"pod": "a"}], 1, id="default-mode-one-label"),
    pytest.param([POD | {"pod": "a", "vgpu": "0"}, POD | {"pod": "b", "vgpu": "1"},
                  POD | {"pod": "c", "vgpu": "2"}], 3, id="virtual-copies"),
    # 4.5.3+: device-level series + per-process series with pod_uid, twice for one pod
    pytest.param([{}, POD | {"pod": "a", "pod_uid": "u1"}, POD | {"pod": "a", "pod_uid": "u1"},
                  POD | {"pod": "b", "pod_uid": "u2"}], 2, id="per-process-series"),
    pytest.param([{"namespace": "x", "pod": "a"}, {"namespace": "y", "pod": "a"}], 2,
                 id="same-name-other-namespace"),
    # ServiceMonitor: pod/namespace name the exporter, exported_* the workload
    pytest.param([{"namespace": "gpu-operator", "pod": "dcgm-exporter-x",
                   "exported_namespace": "team", "exported_pod": "a"},
                  {"namespace": "gpu-operator", "pod": "dcgm-exporter-x",
                   "exported_namespace": "team", "exported_pod": "b"}], 2, id="exported"),
])
def test_pods_counted_per_gpu(series: list[dict[str, str]], pods: int) -> None:
    assert counted(*series) == pods


def test_exporter_pod_is_not_a_holder_when_the_poll_has_exported_labels() -> None:
    """GPU-b is idle: through a ServiceMonitor its series carry only the exporter's own
    ``pod``; GPU-a's carry ``exported_pod``, so the plain label is not a workload pod."""
    exporter = {"namespace": "gpu-operator", "pod": "dcgm-exporter-x"}
    series = [BASE | exporter | {"exported_namespace": "team", "exported_pod": "a"},
              BASE | exporter | {"UUID": "GPU-b", "gpu": "1"}]
    payload = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": s, "value": [0, "10"]} for s in series]}}
    bad: Counter[tuple[str, str]] = Counter()
    holders: Holders = {}
    readings = {m: parse_vector(payload, m, ("Hostname",), bad, holders) for m in METRICS}
    snap = build_snapshot(readings, 0.0, bad, holders)
    assert [(g.uuid, g.pods) for g in snap.nodes["n1"]] == [("GPU-a", 1), ("GPU-b", 0)]


def test_a_pod_whose_sample_is_dropped_still_holds_the_gpu() -> None:
    """A NaN utilisation copy is dropped (and counted) but its labels still say who holds
    the GPU: the other metrics' copies carry the same pods."""
    assert counted(POD | {"pod": "a", "vgpu": "0"}, POD | {"pod": "b", "vgpu": "1"},
                   util_value="NaN") == -1  # no utilisation: the GPU is left out (neutral)
    assert counted(POD | {"pod": "a", "vgpu": "0"}, POD | {"pod": "b", "vgpu": "1"}) == 2


# --------------------------------------------------------------------------- held to the sim
def benchmark() -> ModuleType:
    """``benchmarks/placement.py``, loaded by path (benchmarks/ is scripts, not a package)."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "placement.py"
    spec = importlib.util.spec_from_file_location("placement_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("virtual", [True, False], ids=["virtual-copies", "default-mode"])
def test_benchmark_device_plugin_lands_on_a_predicted_gpu(virtual: bool) -> None:
    """The benchmark's device plugin (fewest replicas, random ties) always puts the pod on
    a GPU the extender predicted from the exporter's series of that node."""
    bench = benchmark()
    rng = random.Random(7)
    for _ in range(200):
        node = bench.SimNode("n", 4)
        for _ in range(rng.randrange(0, 16)):
            node.place(bench.SimPod(10, 8192), rng)
        predicted = {g.index for g in
                     predicted_gpus(bench.snapshot([node], virtual).nodes["n"])}
        before = [len(g.pods) for g in node.gpus]
        node.place(bench.SimPod(10, 8192), rng)
        landed = next(i for i, g in enumerate(node.gpus) if len(g.pods) != before[i])
        assert str(landed) in predicted, (before, predicted)


# --------------------------------------------------------------------------- idle
@pytest.mark.parametrize(("util", "used", "idle"), [
    pytest.param(9.99, 0, True, id="under-10"),
    pytest.param(10.0, 0, False, id="at-10-is-not-idle"),
    pytest.param(10.01, 0, False, id="over-10"),
    pytest.param(0.0, 1024, True, id="headroom-of-memory"),
    pytest.param(0.0, 1025, False, id="resident-model"),
])
def test_idle_means_strictly_under_the_threshold(util: float, used: float, idle: bool) -> None:
    g = Gpu("0", "GPU-0", "A100", util, used, CARD - used)
    assert is_idle(g, Placement()) is idle  # idleBelowPercent 10, memoryHeadroomMiB 1024
