"""``memoryFit: predicted`` end to end: a fake dcgm-exporter printing the pods that hold each
GPU the way the exporter does (``KUBERNETES_VIRTUAL_GPUS``: one copy of every series per pod
with ``vgpu``; 4.5.3+: per-process series with ``pod_uid``; default mode: one pod label per
GPU), scraped by a real Prometheus, polled by the real ``gpu-admission extender``; requests
as kube-scheduler sends them, exact JSON back.

Policy: the default with ``memoryFit: predicted``; an inference pod's share is 16000 MiB, so
the GPU it will get needs 17024 MiB free, and it is scored at that GPU's utilisation + 20 %.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpu_admission.policy.model import default_policy_text
from tests.builders import make_container, make_pod
from tests.dcgm_support import FakeDcgmExporter, FakeGpu
from tests.extender_support import (
    ExtenderProcess,
    args_with_names,
    args_with_nodes,
    make_node,
    post,
    running_extender,
    wait_for,
)
from tests.prometheus_support import running_prometheus, scrape_config

CARD = 81920  # MiB


def card(node: str, index: int, util: float, free: float, pods: list[str],
         virtual: bool = True) -> FakeGpu:
    return FakeGpu(node, index, util, CARD - free, free, holders=pods, virtual_copies=virtual)


FLEET = [
    # GPU 0 has room but holds 2 pods; the device plugin picks GPU 1 (1 pod): 9216 MiB free
    card("vg-pick-full", 0, 60, 60000, ["a", "b"]), card("vg-pick-full", 1, 30, 9216, ["c"]),
    # the reverse: the picked GPU 1 has room although GPU 0 has not ("every" would refuse)
    card("vg-pick-room", 0, 60, 10000, ["d", "e"]), card("vg-pick-room", 1, 30, 50000, ["f"]),
    # one pod each: a tie, either may be picked, GPU 1 lacks room
    card("vg-tied", 0, 30, 50000, ["g"]), card("vg-tied", 1, 30, 12000, ["h"]),
    # the exporter's default mode (one pod label per GPU): GPU 1 holds nothing, it is picked
    card("default-mode", 0, 50, 5000, ["x"], virtual=False),
    card("default-mode", 1, 10, CARD, [], virtual=False),
    # exporter 4.5.3+: per-process series with pod_uid; GPU 0: 2 pods, GPU 1: 1 pod, full
    FakeGpu("per-process", 0, 40, 20000, CARD - 20000,
            pod_copies=[("p", "u1", 20, 10000), ("q", "u2", 20, 10000)]),
    FakeGpu("per-process", 1, 20, CARD - 8000, 8000, pod_copies=[("r", "u3", 20, 70000)]),
]
NODES = ["vg-pick-full", "vg-pick-room", "vg-tied", "default-mode", "per-process"]
NEED = "lacks 17024 MiB free (16000 MiB share + 1024 MiB headroom)"


@pytest.fixture(scope="module")
def extender(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExtenderProcess]:
    work = tmp_path_factory.mktemp("predicted-e2e")
    exporter = FakeDcgmExporter().start()
    exporter.set(FLEET)
    doc = yaml.safe_load(default_policy_text())
    doc["spec"]["placement"]["memoryFit"] = "predicted"
    policy = work / "policy.yaml"
    policy.write_text(yaml.safe_dump(doc))
    try:
        with running_prometheus(work / "prom", scrape_config([exporter.target], "1s")) as prom, \
                running_extender(work / "ext", prom.url, "--policy", str(policy)) as ext:
            wait_for(lambda: ext.status().get("gpus") == len(FLEET), 60,
                     f"{len(FLEET)} GPUs in the extender's snapshot")
            yield ext
    finally:
        exporter.stop()


def inference_pod() -> dict[str, Any]:
    return make_pod("infer", containers=[make_container()],
                    labels={"gpu-admission.io/workload": "inference"},
                    schedulerName="gpu-aware-scheduler")


EXPECTED_FAILED = {
    "vg-pick-full": "the GPU the device plugin will pick (fewest pods: 1) "
                    f"{NEED}: GPU 1 has 9216 MiB (memoryFit: predicted)",
    "vg-tied": "the GPU the device plugin will pick (fewest pods: 1) "
               f"{NEED}: GPU 1 (one of 2 tied) has 12000 MiB (memoryFit: predicted)",
    "per-process": "the GPU the device plugin will pick (fewest pods: 1) "
                   f"{NEED}: GPU 1 has 8000 MiB (memoryFit: predicted)",
}


def test_filter_checks_the_gpu_the_device_plugin_will_pick(extender: ExtenderProcess) -> None:
    code, body = post(extender.verb("filter"), args_with_names(inference_pod(), NODES))
    assert code == 200
    assert body == {"Nodes": None, "NodeNames": ["vg-pick-room", "default-mode"],
                    "FailedNodes": EXPECTED_FAILED, "FailedAndUnresolvableNodes": {},
                    "Error": ""}


def test_filter_with_full_nodes_keeps_the_passing_node_objects(
        extender: ExtenderProcess) -> None:
    nodes = [make_node(n, gpus=2) for n in NODES]
    code, body = post(extender.verb("filter"), args_with_nodes(inference_pod(), nodes))
    assert code == 200
    assert body["Nodes"]["items"] == [nodes[1], nodes[3]]
    assert body["FailedNodes"] == EXPECTED_FAILED


def test_prioritize_scores_the_gpu_the_pod_will_get(extender: ExtenderProcess) -> None:
    """(TLP curve at utilisation + 20 % + best fit 100 x (1 - (free - 17024) / 81920)) / 2,
    on the GPU the pod will get: vg-pick-room GPU 1 (30 %, 50000 MiB free): (91 + 59.7) / 2
    = 75 -> 8; default-mode GPU 1 (10 %, empty): (83 + 20.8) / 2 = 52 -> 5."""
    code, body = post(extender.verb("prioritize"), args_with_names(inference_pod(), NODES))
    assert code == 200
    assert body == [{"Host": "vg-pick-full", "Score": 0},
                    {"Host": "vg-pick-room", "Score": 8},
                    {"Host": "vg-tied", "Score": 0},
                    {"Host": "default-mode", "Score": 5},
                    {"Host": "per-process", "Score": 0}]
