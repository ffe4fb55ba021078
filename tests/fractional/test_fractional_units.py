"""The pure helpers of gpu_admission.facts.fractional the webhook and the extender share."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_admission.core.quantity import integer_quantity
from gpu_admission.facts.fractional import (
    Problem,
    configmap_name,
    hami_limit_bytes,
    is_configmap_name,
    parse_share_mib,
    plan,
    pool_share_mib,
    recorded_configmap,
    recorded_share_mib,
    requested_share_mib,
    visible_devices_value,
)
from gpu_admission.policy.model import NodePool, default_policy
from tests.builders import make_container, make_pod
from tests.fractional.support import policy


@pytest.mark.parametrize(("text", "mib"), [("4096", 4096), (" 1 ", 1), ("000512", 512)])
def test_parse_share(text: str, mib: int) -> None:
    assert parse_share_mib(text) == mib


@pytest.mark.parametrize("bad", ["", "0", "-1", "4Gi", "4096.5", "1e3", 4096, None,
                                 "1" * 13], ids=repr)
def test_parse_share_refuses(bad: Any) -> None:
    with pytest.raises(ValueError, match="expected a positive integer count of MiB"):
        parse_share_mib(bad)


@pytest.mark.parametrize(("quantity", "value"), [
    (4096, 4096), ("4096", 4096), ("16k", 16000), ("4Ki", 4096), ("1M", 10**6),
    ("2Gi", 2 * 2**30), ("1e3", 1000), ("1.5", None), ("500m", None), ("lots", None),
    (True, None), (None, None)])
def test_integer_quantity(quantity: Any, value: int | None) -> None:
    assert integer_quantity(quantity) == value


@pytest.mark.parametrize(("text", "size"), [("16000m", 16000 * 2**20), ("1g", 2**30),
                                            ("1024", 1024), ("8K", 8192), ("0", None),
                                            ("1t", None), ("", None)])
def test_hami_limit(text: str, size: int | None) -> None:
    assert hami_limit_bytes(text) == size


def test_configmap_names() -> None:
    uid = "0B9F2C1E-6D0C-4A3E-9A51-0C8F5B9F0D11"
    assert configmap_name(uid) == "gpu-admission-gpu-" + uid.lower()
    odd = configmap_name("not_a valid/uid", "fallback")
    assert is_configmap_name(odd) and odd == configmap_name("not_a valid/uid", "other")
    assert is_configmap_name(configmap_name("", "team-a/llm"))
    assert configmap_name("", "team-a/llm") != configmap_name("", "team-a/other")
    assert not is_configmap_name("my-gpus")
    assert not is_configmap_name("gpu-admission-gpu-" + "a" * 240)
    assert not is_configmap_name("gpu-admission-gpu-Upper")


def test_visible_devices_value_follows_the_device_list_strategy() -> None:
    uuid = "GPU-1a2b3c4d-0000-1111-2222-333344445555"
    assert visible_devices_value(uuid, "envvar") == uuid
    assert visible_devices_value(uuid, "cdi-cri") == "k8s.device-plugin.nvidia.com/gpu=" + uuid


def test_recorded_and_requested_share() -> None:
    pod = make_pod(annotations={"gpu-admission.io/gpu-memory": "4096",
                                "gpu-admission.io/gpu-configmap": "gpu-admission-gpu-abc"},
                   containers=[make_container(resource="gpu-admission.io/gpu-memory",
                                              gpu="16k"), make_container("side", gpu=None)],
                   init_containers=[make_container(resource="gpu-admission.io/gpu-memory",
                                                   gpu=20000)])
    assert recorded_share_mib(pod) == 4096
    assert recorded_configmap(pod) == "gpu-admission-gpu-abc"
    assert requested_share_mib(pod) == 20000  # max(sum app, max init)
    assert requested_share_mib(make_pod()) is None
    assert recorded_share_mib(make_pod(annotations={"gpu-admission.io/gpu-memory": "x"})) is None


@pytest.mark.parametrize(("replicas", "memory", "share"), [
    (1, 46068, 16000),  # spec.memoryLimits.defaultMemoryMiB
    (3, 46068, 15356),  # 46068 // 3
    (1, 15360, 14336),  # a T4: the default capped at memoryMiB - memoryHeadroomMiB
])
def test_pool_share(replicas: int, memory: int, share: int) -> None:
    pool = NodePool.model_validate({"name": "p", "nodeSelector": {"a": "b"},
                                    "sharing": "fractional", "replicasPerGPU": replicas,
                                    "memoryMiB": memory})
    assert pool_share_mib(pool, policy()) == share


def test_plan_without_any_fractional_pool_names_the_reason() -> None:
    """Called directly (the engine skips policies without fractional pools)."""
    pod = make_pod(annotations={"gpu-admission.io/gpu-memory": "4096"})
    result = plan(pod, [("spec.containers[0]", pod["spec"]["containers"][0])], gpus=1,
                  workload="inference", mig=False, dra=False, pool=None,
                  policy=default_policy())
    assert (result.fraction, result.explicit) == (None, True)
    assert result.problems == (Problem(
        "metadata.annotations[gpu-admission.io/gpu-memory]",
        "the policy has no pool with sharing: fractional, so no node can give a GPU fraction"),)
