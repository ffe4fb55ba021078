"""CPU and memory requested per node (:mod:`gpu_admission.placement.requests`): Kubernetes'
effective request, bound pods only, terminated and deleted pods freed."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_admission.placement.requests import NodeRequests, pod_requests


def pod(name: str, node: str | None, *containers: dict[str, str], init: tuple[dict[str, str],
        ...] = (), phase: str = "Running") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": f"c{i}", "resources": {"requests": r}}
                       for i, r in enumerate(containers)],
        "initContainers": [{"name": f"i{i}", "resources": {"limits": r}}
                           for i, r in enumerate(init)]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "t"}, "spec": spec,
            "status": {"phase": phase}}


@pytest.mark.parametrize("p, expected", [
    (pod("a", "n", {"cpu": "2", "memory": "4Gi"}), (2000, 4096)),
    (pod("a", "n", {"cpu": "500m", "memory": "1G"}, {"cpu": "1"}), (1500, 954)),
    (pod("a", "n", {"cpu": "1"}, init=({"cpu": "3", "memory": "1Mi"},)), (3000, 1)),
    (pod("a", "n"), (0, 0)),
], ids=["plain", "sum-of-containers-G-rounded-up", "init-max-from-limits", "none"])
def test_pod_requests(p: dict[str, Any], expected: tuple[int, int]) -> None:
    assert pod_requests(p) == expected


NODE = {"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}}}


def test_bound_pods_count_until_they_end() -> None:
    r = NodeRequests()
    r.replace([pod("a", "n", {"cpu": "2", "memory": "4Gi"}), pod("pending", None, {"cpu": "4"})])
    assert r.free(NODE) == (6000, 28672)
    r.set_pod(pod("b", "n", {"cpu": "1", "memory": "1Gi"}))
    assert r.free(NODE) == (5000, 27648)
    r.set_pod(pod("b", "n", {"cpu": "1", "memory": "1Gi"}, phase="Succeeded"))
    assert r.free(NODE) == (6000, 28672)
    r.remove_pod(pod("a", "n"))
    assert r.free(NODE) == (8000, 32768)
    assert r.free(None) is None
    assert r.free({"metadata": {"name": "x"}, "status": {"allocatable": {"cpu": "1"}}}) is None
