"""What the extender knows about a cluster's GPUs, apart from how it learns it: one GPU as the
last poll smoothed it (:class:`Gpu`) and one poll's nodes (:class:`Snapshot`). Pure value
types, so placement (:mod:`.score`, :mod:`.fractional`) imports no HTTP client
(:mod:`gpu_admission.extender.gpustate` fills them from Prometheus).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU of a node, smoothed over the poll window."""

    index: str  # dcgm-exporter "gpu" label, e.g. "2"
    uuid: str  # "GPU-..."
    model: str  # "modelName", e.g. "NVIDIA A100-SXM4-80GB"
    util_percent: float  # SM utilisation, % (0..100)
    fb_used_mib: float  # framebuffer used, MiB
    fb_free_mib: float  # framebuffer free, MiB
    #: distinct pods the exporter's labels show holding this GPU in the poll: the replicas
    #: allocated on it with KUBERNETES_VIRTUAL_GPUS=true, else 0 or 1 (= at least one)
    pods: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the last successful poll saw: node name -> its GPUs (sorted by index)."""

    nodes: Mapping[str, tuple[Gpu, ...]]
    taken_at: float  # Unix seconds of the poll
    bad_values: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (metric, reason)
    #: node scores per demand key, filled by :func:`gpu_admission.placement.score.
    #: score_nodes` (a pure function of this immutable snapshot, so it is computed once per
    #: distinct demand and poll instead of once per pod)
    score_memo: dict[Any, dict[str, int]] = field(default_factory=dict, compare=False,
                                                  repr=False)

    @property
    def gpu_count(self) -> int:
        return sum(len(g) for g in self.nodes.values())
