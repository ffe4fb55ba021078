"""CPU and memory requested on each node by the pods bound there: what the fragmentation
ranking needs beside the GPU ledger (a node whose CPU or memory is gone strands its GPUs).
PURE accounting, fed by the extender's one list/watch of pods (``KubeState``, beside the
ledger).

A pod counts from the moment it is bound (``spec.nodeName``) until it terminates (phase
``Succeeded``/``Failed``) or is deleted, with Kubernetes' effective request: max(sum over app
containers, max over init containers) of ``requests`` (``limits`` when a request is absent,
as the API server defaults it), in milli-CPU and MiB (rounded up).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_admission.core.quantity import quantity_value
from gpu_admission.placement.ledger import TERMINATED

MIB = 1024 * 1024


def _amount(value: Any, scale: int, divisor: int = 1) -> int:
    q = quantity_value(value)
    if q is None or q < 0:
        return 0
    return math.ceil(q * scale / divisor)  # Decimal: // truncates, so ceil explicitly


def pod_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(milli-CPU, MiB) a pod asks of its node."""
    spec = pod.get("spec") or {}
    app = [0, 0]
    init = [0, 0]
    for kind, acc in (("containers", app), ("initContainers", init)):
        for c in spec.get(kind) or []:
            res = (c or {}).get("resources") or {}
            req = {**(res.get("limits") or {}), **(res.get("requests") or {})}
            cpu = _amount(req.get("cpu", 0), 1000)
            mem = _amount(req.get("memory", 0), 1, MIB)
            if kind == "containers":
                acc[0] += cpu
                acc[1] += mem
            else:
                acc[0] = max(acc[0], cpu)
                acc[1] = max(acc[1], mem)
    return max(app[0], init[0]), max(app[1], init[1])


@dataclass
class NodeRequests:
    """Per node: milli-CPU and MiB requested by the pods bound there."""

    pods: dict[tuple[str, str], tuple[str, int, int]] = field(default_factory=dict)
    used: dict[str, list[int]] = field(default_factory=dict)  # node -> [milli-CPU, MiB]
    #: node name -> (the Node object, its allocatable (milli-CPU, MiB) or None): quantities
    #: parsed once per Node object the watch delivers, not once per request
    allocatable: dict[str, tuple[Mapping[str, Any], tuple[int, int] | None]] = field(
        default_factory=dict)
    #: nodes whose requested CPU/memory changed since the placer last read them
    #: (``changed_all``: every node, after a relist); one reader, as the ledger's
    changed: set[str] = field(default_factory=set)
    changed_all: bool = False

    def take_changed(self) -> set[str] | None:
        """The nodes changed since the last call (None: every node may have)."""
        out = None if self.changed_all else self.changed
        self.changed = set()
        self.changed_all = False
        return out

    def set_pod(self, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        self.remove_key(key)
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in TERMINATED:
            return
        cpu, mem = pod_requests(pod)
        self.pods[key] = (str(node), cpu, mem)
        slot = self.used.setdefault(str(node), [0, 0])
        self.changed.add(str(node))
        slot[0] += cpu
        slot[1] += mem

    def remove_pod(self, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        self.remove_key((str(meta.get("namespace") or ""), str(meta.get("name") or "")))

    def remove_key(self, key: tuple[str, str]) -> None:
        old = self.pods.pop(key, None)
        if old is not None:
            slot = self.used[old[0]]
            self.changed.add(old[0])
            slot[0] -= old[1]
            slot[1] -= old[2]

    def replace(self, pods: Iterable[Mapping[str, Any]]) -> None:
        self.pods.clear()
        self.used.clear()
        self.changed_all = True
        for pod in pods:
            self.set_pod(pod)

    def free(self, node: Mapping[str, Any] | None) -> tuple[int, int] | None:
        """(milli-CPU, MiB) allocatable minus requested; None without the Node object or
        without allocatable cpu and memory (unknown: the ranking counts it unlimited)."""
        if not node:
            return None
        name = str((node.get("metadata") or {}).get("name") or "")
        hit = self.allocatable.get(name)
        if hit is None or hit[0] is not node:
            alloc = (node.get("status") or {}).get("allocatable") or {}
            parsed = (None if "cpu" not in alloc or "memory" not in alloc else
                      (_amount(alloc.get("cpu", 0), 1000),
                       int(_amount(alloc.get("memory", 0), 1) // MIB)))
            hit = self.allocatable[name] = (node, parsed)
        if hit[1] is None:
            return None
        used = self.used.get(name)
        return (hit[1][0], hit[1][1]) if used is None else (hit[1][0] - used[0],
                                                            hit[1][1] - used[1])
