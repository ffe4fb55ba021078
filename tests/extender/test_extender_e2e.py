"""The issue's proofs 1-3 end to end: a fake dcgm-exporter (exact text format, values set
here) scraped every second by a real Prometheus, the real ``gpu-admission extender`` command
polling it, and requests sent the way kube-scheduler sends them (full ``Nodes`` with GFD
labels and ``nvidia.com/gpu`` capacity, and ``NodeNames``), answers compared as exact JSON.

One Prometheus and one extender for the module; every test has nodes of its own, all
served from the start, so no test waits for a smoothing window to forget old values.

Default policy: no node pools, so an inference pod's share is
``memoryLimits.defaultMemoryMiB`` = 16000 MiB, and with ``memoryHeadroomMiB`` 1024 a GPU must
have 17024 MiB free; its GPU share is ``defaultFraction`` 0.2, so a GPU is scored at its
utilisation + 20 %; target 70 %, idle under 10 %.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_admission.placement.score import target_load_packing, to_extender_score
from gpu_admission.policy.model import default_policy_text
from tests.builders import make_container, make_pod
from tests.dcgm_support import FakeDcgmExporter, FakeGpu
from tests.extender_support import (
    ExtenderProcess,
    args_with_names,
    args_with_nodes,
    make_node,
    metric_value,
    post,
    running_extender,
    wait_for,
)
from tests.prometheus_support import running_prometheus, scrape_config

GIB = 1024  # MiB
FREE_A100 = 80 * GIB  # MiB free on an empty 80 GB card


def gpus(node: str, utils: list[float | str], *, used: list[float | str] | None = None,
         free: list[float | str] | None = None, **kw: Any) -> list[FakeGpu]:
    used = used or [0] * len(utils)
    free = free or [FREE_A100] * len(utils)
    return [FakeGpu(node, i, u, m, f, **kw) for i, (u, m, f) in
            enumerate(zip(utils, used, free, strict=True))]


FLEET: list[FakeGpu] = [
    # proof 1: shared inference pods, packed towards 70 % (GPU utilisation + the pod's 20 %)
    *gpus("p1-light", [20, 20, 20, 20], used=[8000] * 4, free=[FREE_A100 - 8000] * 4),
    *gpus("p1-near-target", [48, 10, 10, 10], used=[30000, 0, 0, 0],
          free=[FREE_A100 - 30000, FREE_A100, FREE_A100, FREE_A100]),
    *gpus("p1-above", [60, 60, 60, 60], used=[30000] * 4, free=[FREE_A100 - 30000] * 4),
    *gpus("p1-hot", [90, 92, 95, 99], used=[30000] * 4, free=[FREE_A100 - 30000] * 4),
    # the busy-below-target GPU is full: only the 10 % GPUs fit
    *gpus("p1-full-busy", [48, 10], used=[80000, 0], free=[1000, FREE_A100]),
    # proof 2: a share that fits nowhere (best 9216 MiB free on GPU 2)
    *gpus("p2-a", [50, 50, 50, 50], free=[4000, 8000, 9216, 1000]),
    *gpus("p2-b", [50, 50], free=[4000, 3000]),
    # proof 3: whole-GPU training
    *gpus("p3-idle", [0, 0, 0, 0], used=[0, 0, 0, 0]),
    *gpus("p3-one-idle", [0, 80, 80, 3], used=[0, 40000, 40000, 30000]),
    *gpus("p3-busy", [70, 80, 90, 100], used=[40000] * 4),
    # dcgm-exporter main prints "hostname"
    *gpus("lower-hostname", [65], node_label="hostname"),
    # KUBERNETES_VIRTUAL_GPUS: per-pod copies with pod_uid (per-process values) + device level
    FakeGpu("virtual", 0, 65, 20000, FREE_A100 - 20000,
            pod_copies=[("infer-1", "uid-1", 30, 9000), ("infer-2", "uid-2", 35, 11000)]),
    # garbage from the exporter: NaN utilisation, negative free memory
    *gpus("bad-values", ["NaN", 65], free=[FREE_A100, "-5"]),
]
GOOD_NODES = 12  # nodes with at least one complete GPU (bad-values has none)


@pytest.fixture(scope="module")
def extender(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExtenderProcess]:
    work = tmp_path_factory.mktemp("extender-e2e")
    exporter = FakeDcgmExporter().start()
    exporter.set(FLEET)
    policy = work / "policy.yaml"
    policy.write_text(default_policy_text())
    try:
        with running_prometheus(work / "prom", scrape_config([exporter.target], "1s")) as prom, \
                running_extender(work / "ext", prom.url, "--policy", str(policy)) as ext:
            wait_for(lambda: ext.status().get("gpu_nodes") == GOOD_NODES, 60,
                     f"{GOOD_NODES} GPU nodes in the extender's snapshot")
            yield ext
    finally:
        exporter.stop()


def inference_pod(name: str = "infer", **kw: Any) -> dict[str, Any]:
    return make_pod(name, containers=[make_container(**kw)],
                    labels={"gpu-admission.io/workload": "inference"},
                    schedulerName="gpu-aware-scheduler")


def training_pod(gpu: int = 2) -> dict[str, Any]:
    return make_pod("train-0", containers=[make_container(
        image="nvcr.io/nvidia/pytorch:24.05-py3", gpu=gpu)],
        labels={"gpu-admission.io/workload": "training"})


def scores(ext: ExtenderProcess, pod: dict[str, Any], names: list[str]) -> list[dict[str, Any]]:
    code, body = post(ext.verb("prioritize"), args_with_names(pod, names))
    assert code == 200, body
    return body  # type: ignore[no-any-return]


def tlp(util: float) -> int:
    """The score of a lone fitting GPU at ``util`` % for a default-policy pod (+20 %)."""
    return to_extender_score(target_load_packing(util + 20, 70))


# --------------------------------------------------------------------------- proof 1
def test_shared_pods_pack_towards_the_target(extender: ExtenderProcess) -> None:
    names = ["p1-light", "p1-near-target", "p1-above", "p1-hot", "p1-full-busy"]
    assert scores(extender, inference_pod(), names) == [
        {"Host": "p1-light", "Score": 9},  # 20+20 %: (100-70)*40/70+70 = 87.1 -> 9
        {"Host": "p1-near-target", "Score": 10},  # 48+20 %: 99.1 -> 10, busiest below 70
        {"Host": "p1-above", "Score": 5},  # 60+20 %: 70*(100-80)/30 = 46.7 -> 5
        {"Host": "p1-hot", "Score": 0},  # 90+20 % > 100 %
        {"Host": "p1-full-busy", "Score": 8},  # the 48 % GPU has 1000 MiB free: 10 % counts
    ]
    assert [tlp(20), tlp(48), tlp(60), tlp(90), tlp(10)] == [9, 10, 5, 0, 8]


def test_prioritize_with_full_node_objects(extender: ExtenderProcess) -> None:
    nodes = [make_node(n) for n in ("p1-hot", "p1-near-target", "no-metrics-node")]
    code, body = post(extender.verb("prioritize"), args_with_nodes(inference_pod(), nodes))
    assert code == 200
    assert body == [{"Host": "p1-hot", "Score": 0}, {"Host": "p1-near-target", "Score": 10},
                    {"Host": "no-metrics-node", "Score": 5}]  # no data: neutral middle


def test_shared_pods_pass_the_filter_where_a_gpu_has_room(extender: ExtenderProcess) -> None:
    code, body = post(extender.verb("filter"),
                      args_with_names(inference_pod(), ["p1-light", "p1-hot"]))
    assert (code, body) == (200, {"Nodes": None, "NodeNames": ["p1-light", "p1-hot"],
                                  "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                                  "Error": ""})


# --------------------------------------------------------------------------- proof 2
REASON_A = ("no GPU with 17024 MiB free (16000 MiB share + 1024 MiB headroom): "
            "best 9216 MiB on GPU 2")
REASON_B = ("no GPU with 17024 MiB free (16000 MiB share + 1024 MiB headroom): "
            "best 4000 MiB on GPU 0")


def test_a_share_that_fits_no_gpu_filters_every_node_names(extender: ExtenderProcess) -> None:
    code, body = post(extender.verb("filter"), args_with_names(inference_pod(),
                                                               ["p2-a", "p2-b"]))
    assert (code, body) == (200, {"Nodes": None, "NodeNames": [],
                                  "FailedNodes": {"p2-a": REASON_A, "p2-b": REASON_B},
                                  "FailedAndUnresolvableNodes": {}, "Error": ""})


def test_a_share_that_fits_no_gpu_filters_every_node_objects(extender: ExtenderProcess) -> None:
    nodes = [make_node("p2-a"), make_node("p2-b")]
    code, body = post(extender.verb("filter"), args_with_nodes(inference_pod(), nodes))
    assert (code, body) == (200, {"Nodes": {"apiVersion": "v1", "kind": "NodeList",
                                            "items": []}, "NodeNames": None,
                                  "FailedNodes": {"p2-a": REASON_A, "p2-b": REASON_B},
                                  "FailedAndUnresolvableNodes": {}, "Error": ""})


def test_filter_keeps_full_node_objects_and_nodes_without_metrics(
        extender: ExtenderProcess) -> None:
    """A pod the webhook already mutated carries its share: NVIDIA_MEM_LIMIT_MB=4000 needs
    5024 MiB: p2-a (9216) passes, p2-b (best 4000) does not; an unknown node passes."""
    pod = inference_pod(env=[{"name": "NVIDIA_MEM_LIMIT_MB", "value": "4000"}])
    nodes = [make_node("p2-a"), make_node("p2-b"), make_node("no-metrics-node")]
    code, body = post(extender.verb("filter"), args_with_nodes(pod, nodes))
    assert (code, body) == (200, {
        "Nodes": {"apiVersion": "v1", "kind": "NodeList", "items": [nodes[0], nodes[2]]},
        "NodeNames": None,
        "FailedNodes": {"p2-b": "no GPU with 5024 MiB free (4000 MiB share + 1024 MiB "
                                "headroom): best 4000 MiB on GPU 0"},
        "FailedAndUnresolvableNodes": {}, "Error": ""})


# --------------------------------------------------------------------------- proof 3
def test_whole_gpu_training_pods_prefer_idle_gpus(extender: ExtenderProcess) -> None:
    names = ["p3-busy", "p3-one-idle", "p3-idle"]
    assert scores(extender, training_pod(gpu=2), names) == [
        {"Host": "p3-busy", "Score": 0},
        {"Host": "p3-one-idle", "Score": 5},  # 1 idle of the 2 needed (GPU 3 holds memory)
        {"Host": "p3-idle", "Score": 10},
    ]
    # training pods are never filtered for memory: they get whole GPUs
    _, body = post(extender.verb("filter"), args_with_names(training_pod(), names))
    assert body["NodeNames"] == names and body["FailedNodes"] == {}


# --------------------------------------------------------------------------- labels & copies
def test_lowercase_hostname_label_and_virtual_gpu_copies(extender: ExtenderProcess) -> None:
    """``hostname`` (dcgm-exporter main) joins like ``Hostname``; with per-pod copies the
    device-level series (no pod_uid, 65 %) wins over the per-process ones (30 %, 35 %)."""
    assert scores(extender, inference_pod(), ["lower-hostname", "virtual"]) == [
        {"Host": "lower-hostname", "Score": tlp(65)}, {"Host": "virtual", "Score": tlp(65)}]
    assert tlp(65) != tlp(35)


def test_non_gpu_pods_pass_everything_with_equal_scores(extender: ExtenderProcess) -> None:
    pod = make_pod("web", containers=[make_container(image="nginx", gpu=None)])
    names = ["p2-a", "p2-b", "p1-hot"]
    assert scores(extender, pod, names) == [{"Host": n, "Score": 5} for n in names]
    _, body = post(extender.verb("filter"), args_with_names(pod, names))
    assert body["NodeNames"] == names and body["FailedNodes"] == {}
    assert (metric_value(extender.metrics(), "gpu_admission_extender_neutral_answers_total",
                         'reason="no_gpu_request",verb="filter"') or 0) >= 1


# --------------------------------------------------------------------------- bad values
def test_nan_and_negative_samples_are_dropped_and_counted(extender: ExtenderProcess) -> None:
    text = extender.metrics()
    for metric, reason in (("DCGM_FI_DEV_GPU_UTIL", "nan"),
                           ("DCGM_FI_DEV_FB_FREE", "negative")):
        value = metric_value(text, "gpu_admission_extender_bad_values_total",
                             f'metric="{metric}",reason="{reason}"')
        assert value is not None and value >= 1, (metric, reason)
    # the node has no complete GPU: neutral, never filtered for it
    assert scores(extender, inference_pod(), ["bad-values"]) == [
        {"Host": "bad-values", "Score": 5}]
    _, body = post(extender.verb("filter"), args_with_names(inference_pod(), ["bad-values"]))
    assert body["NodeNames"] == ["bad-values"]


# --------------------------------------------------------------------------- policy reload
def test_policy_file_is_hot_reloaded(extender: ExtenderProcess) -> None:
    """Lower the target to 40 %: the 48 % GPU is now above it and the 20 % node wins."""
    policy_path = Path(extender.option("--policy"))
    before = extender.status()["policy"]
    original = policy_path.read_text()
    doc = yaml.safe_load(original)
    doc["spec"]["placement"]["targetUtilizationPercent"] = 40
    try:
        policy_path.write_text(yaml.safe_dump(doc))
        wait_for(lambda: extender.status()["policy"] != before, 20, "the policy reload")
        assert scores(extender, inference_pod(), ["p1-light", "p1-near-target"]) == [
            {"Host": "p1-light", "Score": 10},  # 20+20 % = the target
            {"Host": "p1-near-target", "Score": 9}]  # best now a 10 % GPU: 60*30/40+40 = 85
        policy_path.write_text("spec: {placement: {targetUtilizationPercent: 0}}\n")
        wait_for(lambda: (metric_value(extender.metrics(),
                                       "gpu_admission_extender_policy_reloads_total",
                                       'result="failure"') or 0) >= 1, 20, "a failed reload")
        # the broken file changes nothing
        assert scores(extender, inference_pod(), ["p1-light"]) == [
            {"Host": "p1-light", "Score": 10}]
    finally:
        policy_path.write_text(original)
        wait_for(lambda: extender.status()["policy"] == before, 20, "the original policy")
