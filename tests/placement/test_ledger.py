"""The ledger (pure accounting) and the GPU choice rule, table-driven; the reservation pod
against the Kubernetes OpenAPI schema."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from gpu_admission.core.vocab import GPU_UUID_ANNOTATION, RESERVATION_LABEL
from gpu_admission.extender.binder import BindConfig, configmap, reservation_pod
from gpu_admission.facts.fractional import visible_devices_value
from gpu_admission.placement.fractional import NEW_GPU, choose, no_fit_reason
from gpu_admission.placement.frag import OURS, Workload, typical_arrays
from gpu_admission.placement.ledger import (
    OPENING_PREFIX,
    Assignment,
    Ledger,
    uuid_of,
)
from gpu_admission.policy.model import Placement
from tests.corpus_support import SCHEMA_VERSION
from tests.extender.fractional_support import NAMESPACE, frac_node, frac_pod, whole_pod

CARD = 81920  # MiB
PLACEMENT = Placement.model_validate({"memoryHeadroomMiB": 1024})


def bound(pod: dict[str, Any], node: str, uid: str, phase: str = "Running") -> dict[str, Any]:
    pod = {**pod, "spec": {**pod["spec"], "nodeName": node}, "status": {"phase": phase}}
    pod["metadata"] = {**pod["metadata"], "uid": uid}
    return pod


def reservation(name: str, node: str, uuid: str = "") -> dict[str, Any]:
    pod = reservation_pod(name, node, BindConfig(NAMESPACE, "img"), "t/p")
    if uuid:
        pod["metadata"]["annotations"][GPU_UUID_ANNOTATION] = uuid
    pod["metadata"]["uid"] = f"uid-{name}"
    return pod


def cm_for(pod: dict[str, Any], uuid: str, owner: str | None = None) -> dict[str, Any]:
    meta = pod["metadata"]
    return configmap(meta["namespace"], meta["annotations"]["gpu-admission.io/gpu-configmap"],
                     meta["name"], owner or meta["uid"], visible_devices_value(uuid, "envvar"))


def ledger_with(*pods: dict[str, Any], cms: tuple[dict[str, Any], ...] = (),
                gpus: int = 4) -> Ledger:
    ledger = Ledger(NAMESPACE)
    ledger.replace_nodes([frac_node("n1", gpus=gpus)])
    ledger.replace_configmaps(cms)
    ledger.replace_pods(pods)
    return ledger


def test_bound_fractional_pods_charge_the_gpu_their_configmap_names() -> None:
    a, b = bound(frac_pod("a", 20000), "n1", "ua"), bound(frac_pod("b", 12000), "n1", "ub")
    done = bound(frac_pod("c", 30000), "n1", "uc", phase="Succeeded")
    ledger = ledger_with(a, b, done, reservation("r1", "n1", "GPU-1"),
                         cms=(cm_for(a, "GPU-1"), cm_for(b, "GPU-1"), cm_for(done, "GPU-1")))
    assert ledger.usage() == {"n1": {"GPU-1": 32000}}
    view = ledger.view("n1")
    assert (view.allocatable_gpus, view.reservations, view.free_whole) == (4, 1, 3)


def test_a_configmap_not_owned_by_the_pod_charges_no_gpu() -> None:
    a = bound(frac_pod("a", 20000), "n1", "ua")
    ledger = ledger_with(a, reservation("r1", "n1", "GPU-1"),
                         cms=(cm_for(a, "GPU-1", owner="someone-else"),))
    assert ledger.usage() == {"n1": {"GPU-1": 0}}
    assert ledger.view("n1").unplaced_mib == 20000


def test_whole_gpu_pods_and_reservations_use_up_the_gpus_to_open() -> None:
    ledger = ledger_with(whole_pod("t", "n1", gpus=3), reservation("r1", "n1"), gpus=4)
    view = ledger.view("n1")
    assert view.free_whole == 0
    assert [g.gpu_id for g in view.open] == [OPENING_PREFIX + "r1"]
    assert choose(view, CARD, 8000, PLACEMENT) is not None  # the opening GPU fits
    assert no_fit_reason(view, CARD, 90000, PLACEMENT) == (
        "no GPU with 91024 MiB free (90000 MiB share + 1024 MiB headroom, card 81920 MiB): "
        "best open GPU opening:r1 has 81920 MiB free of 1 open; 0 whole GPUs free to open "
        "(4 allocatable, 3 held by whole-GPU pods, 1 by reservations)")


def test_assumed_shares_count_until_the_watch_shows_them_then_once() -> None:
    ledger = ledger_with(reservation("r1", "n1", "GPU-1"))
    pod = bound(frac_pod("a", 20000), "n1", "ua")
    ledger.assume(Assignment("team-a", "a", "ua", "n1", "GPU-1", 20000))
    assert ledger.usage() == {"n1": {"GPU-1": 20000}}
    ledger.set_pod(pod)  # bound, ConfigMap not seen yet: still the assumed share, once
    assert ledger.usage() == {"n1": {"GPU-1": 20000}}
    ledger.set_configmap(cm_for(pod, "GPU-1"))
    assert ledger.assumed == {}
    assert ledger.usage() == {"n1": {"GPU-1": 20000}}
    ledger.remove_pod(pod)
    assert ledger.usage() == {"n1": {"GPU-1": 0}}
    assert [e.name for e in ledger.empty_reservations()] == ["r1"]


@pytest.mark.parametrize("used, share, expected", [
    # fragmentation against the prior workload: 10000 MiB on GPU-1 would leave 11920 MiB
    # (145 milli-GPU), less than the smallest typical share (250): GPU-2 keeps both usable
    ({"GPU-1": 60000, "GPU-2": 20000}, 10000, "GPU-2"),
    ({"GPU-1": 55000, "GPU-2": 20000}, 4000, "GPU-1"),  # no sliver either way: tightest
    ({"GPU-1": 75000, "GPU-2": 20000}, 10000, "GPU-2"),  # GPU-1 lacks share + headroom
    ({"GPU-1": 75000, "GPU-2": 75000}, 10000, NEW_GPU),  # open a new one
    ({"GPU-1": 75000, "GPU-2": 75000}, 90000, None),  # larger than the card
], ids=["no-unusable-sliver", "best-fit", "skip-full", "open-new", "never-fits"])
def test_choice(used: dict[str, int], share: int, expected: str | None) -> None:
    pods, cms = [], []
    for i, (uuid, mib) in enumerate(used.items()):
        pod = bound(frac_pod(f"p{i}", mib), "n1", f"u{i}")
        pods += [pod, reservation(f"r{i}", "n1", uuid)]
        cms.append(cm_for(pod, uuid))
    choice = choose(ledger_with(*pods, cms=tuple(cms)).view("n1"), CARD, share, PLACEMENT,
                    typical=typical_arrays(Workload().typical(), [""], OURS))
    assert (choice.gpu_id if choice else None) == expected


def test_device_values_round_trip() -> None:
    assert visible_devices_value("GPU-1", "envvar") == "GPU-1"
    assert visible_devices_value("GPU-1", "cdi-cri") == "k8s.device-plugin.nvidia.com/gpu=GPU-1"
    assert uuid_of(visible_devices_value("GPU-1", "cdi-annotations")) == "GPU-1"


def test_the_reservation_pod_validates_against_the_openapi_schema() -> None:
    pod = reservation_pod("gpu-admission-reserve-0123456789-abcdef", "n1",
                          BindConfig(NAMESPACE, "ghcr.io/example/gpu-admission:1.0"), "t/p")
    kubernetes_validate.validate(pod, SCHEMA_VERSION, strict=True)
    assert pod["metadata"]["labels"][RESERVATION_LABEL] == "true"
    container, = pod["spec"]["containers"]
    assert container["args"] == ["reserve"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["spec"]["nodeName"] == "n1"
    cm = configmap("t", "gpu-admission-gpu-x", "p", "uid-1", "GPU-1")
    kubernetes_validate.validate(cm, SCHEMA_VERSION, strict=True)
