"""The values ``gpu-admission report`` measures, apart from how they are fetched: one GPU's
series (:class:`GpuData`) and one fetched range (:class:`Fetched`). Pure value types, so the
computation (:mod:`.compute`, :mod:`.sharing`, :mod:`gpu_admission.reclaim.plan`) reads them
without importing the Prometheus client (:mod:`.query` fills them; docs/architecture.md).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from gpu_admission.core.timeframe import Range


@dataclass(slots=True)
class GpuData:
    """Everything measured for one GPU, one slot per instant of the range."""

    node: str
    gpu: str  # device index as the exporter prints it ("0")
    uuid: str
    model: str
    util: array[float]  # %; NaN = no sample at that instant
    fb_used: array[float]  # MiB; NaN = no sample
    holders: dict[tuple[str, str], bytearray] = field(default_factory=dict)
    # (namespace, pod) -> 1 at the instants that pod's series carried a value


@dataclass(slots=True)
class Fetched:
    range: Range
    gpus: list[GpuData]
    holder_labels: str  # "pod" or "exported_pod"
    queries: int
    metrics_missing: list[str]
