"""Pure computation of ``gpu-admission report``: the issue's definitions, exactly. No I/O.

Per instant ``t`` of the range (one sample stands for the ``step`` seconds ending at ``t``):

* a GPU *sample* exists when ``DCGM_FI_DEV_GPU_UTIL`` had a value; it is *allocated* when a
  series with the exporter's pod label (``pod``, or ``exported_pod`` through a ServiceMonitor)
  had a value, and the pods/namespaces of those series *held* the GPU;
* ``meanUtilizationPercent`` / ``p95UtilizationPercent``: over all samples of the GPU; p95 by
  the nearest-rank method (the ``ceil(0.95 n)``-th smallest value);
* ``allocatedGpuUtilizationPercent``: the mean utilisation over allocated samples of all GPUs
  (the seed article's "15 %");
* ``gpuHoursHeld``: allocated sample time (samples x step / 3600); ``gpuHoursUsed``: the same
  weighted by utilisation / 100;
* idle hours inside working hours: runs of consecutive samples (no missing instant between)
  with utilisation **under** ``--idle-below`` whose instants lie inside working hours, counted
  only when the run lasts at least 2 hours (the article's alert: "GPU idle for 2 hours or
  more"); per GPU over all its samples, per namespace over the samples it held the GPU, per
  node and fleet the sum over GPUs;
* *partial*: some GPU lacks samples at some instants (it vanished, appeared late, or the data
  has gaps); those instants count nowhere, and the GPU names them.

Units: utilisation in % (0-100), framebuffer in MiB, time in hours.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from math import isnan
from typing import Any, Final
from zoneinfo import ZoneInfo

from gpu_admission.core.timeframe import Range, WorkingHours, iso
from gpu_admission.policy.model import Policy
from gpu_admission.usage.data import Fetched, GpuData
from gpu_admission.usage.sharing import FractionalEstimate, SharingEstimate, estimate_sharing

MIN_IDLE_SECONDS: Final = 2 * 3600  # the article's alert: idle for 2 hours or more
HOURS_OF_WEEK: Final = 7 * 24


@dataclass(frozen=True, slots=True)
class Options:
    idle_below: float  # %, a sample is idle when its utilisation is strictly under this
    working_hours: WorkingHours
    tz: ZoneInfo
    policy: Policy


@dataclass(slots=True)
class GpuRow:
    node: str
    gpu: str
    uuid: str
    model: str
    mean_util: float | None
    p95_util: float | None
    mean_fb_mib: float | None
    idle_hours_working: float
    namespaces: list[str]
    pods: list[str]
    samples: int
    allocated_samples: int
    hours_held: float
    hours_used: float
    missing_samples: int
    # mean utilisation per local hour of the week (0 = Monday 00:00-00:59), None = no sample
    hour_of_week: list[float | None] = field(default_factory=list)


@dataclass(slots=True)
class UsageRow:
    """Per namespace or per node: GPU-hours held, used, idle inside working hours."""

    name: str
    gpus: int
    hours_held: float
    hours_used: float
    idle_hours: float


@dataclass(slots=True)
class Report:
    range: Range
    tz: str
    working_hours: str
    idle_below: float
    holder_labels: str
    partial: bool
    warnings: list[str]
    gpus: list[GpuRow]
    namespaces: list[UsageRow]
    nodes: list[UsageRow]
    allocated_util: float | None
    hours_held: float
    hours_used: float
    idle_hours: float
    sharing: SharingEstimate
    queries: int


def p95(values: Sequence[float]) -> float | None:
    """Nearest-rank 95th percentile (the ``ceil(0.95 n)``-th smallest value)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def idle_flags(util: Sequence[float], working: Sequence[int], threshold: float) -> list[bool]:
    """Per instant: a sample exists (not NaN), is **under** ``threshold`` % and lies inside
    working hours. The one definition of an idle instant (the report and
    ``gpu-admission reclaim`` both call it)."""
    return [v < threshold and w == 1 for v, w in zip(util, working, strict=True)]  # NaN < x: False


def idle_runs(idle: Iterable[bool], step: int,
              minimum: int = MIN_IDLE_SECONDS) -> list[tuple[int, int]]:
    """Inclusive ``(first, last)`` instant indices of the runs of consecutive idle instants
    that last at least ``minimum`` seconds (``run x step``), oldest first."""
    runs: list[tuple[int, int]] = []
    start = -1
    i = -1
    for i, flag in enumerate(idle):
        if flag:
            if start < 0:
                start = i
            continue
        if start >= 0 and (i - start) * step >= minimum:
            runs.append((start, i - 1))
        start = -1
    if start >= 0 and (i + 1 - start) * step >= minimum:
        runs.append((start, i))
    return runs


def idle_run_seconds(idle: Iterable[bool], step: int, minimum: int = MIN_IDLE_SECONDS) -> int:
    """Seconds in runs of consecutive idle instants that last at least ``minimum`` seconds."""
    return sum((last - first + 1) * step for first, last in idle_runs(idle, step, minimum))


def _mean(total: float, count: int) -> float | None:
    return total / count if count else None


def build_report(fetched: Fetched, options: Options) -> Report:
    rng = fetched.range
    step = rng.step
    hours_per_sample = step / 3600
    working = options.working_hours.mask(rng, options.tz)
    how = _hour_of_week(rng, options.tz)
    threshold = options.idle_below
    warnings: list[str] = []
    rows: list[GpuRow] = []
    ns_acc: dict[str, list[float]] = {}  # namespace -> [held samples, used sum, idle s]
    ns_gpus: dict[str, set[str]] = {}
    node_acc: dict[str, list[float]] = {}
    node_gpus: dict[str, int] = {}
    alloc_sum = 0.0
    alloc_n = 0
    for data in fetched.gpus:
        util = data.util
        present = [not isnan(v) for v in util]
        values = [v for v in util if not isnan(v)]
        fb = [v for v in data.fb_used if not isnan(v)]
        allocated = _any(data.holders.values(), rng.points)
        a_sum = sum(v for v, a in zip(util, allocated, strict=True) if a)
        a_n = sum(allocated)
        idle = idle_flags(util, working, threshold)
        idle_s = idle_run_seconds(idle, step)
        missing = rng.points - len(values)
        if missing:
            warnings.append(_missing_message(data, present, rng))
        by_ns: dict[str, bytearray] = {}
        for (namespace, _pod), marks in data.holders.items():
            by_ns[namespace] = _or(by_ns.get(namespace), marks)
        for namespace, marks in by_ns.items():
            acc = ns_acc.setdefault(namespace, [0.0, 0.0, 0.0])
            acc[0] += sum(marks)
            acc[1] += sum(v for v, m in zip(util, marks, strict=True) if m) / 100
            acc[2] += idle_run_seconds((i and m == 1 for i, m in zip(idle, marks, strict=True)),
                                       step)
            ns_gpus.setdefault(namespace, set()).add(f"{data.node}/{data.uuid}")
        nacc = node_acc.setdefault(data.node, [0.0, 0.0, 0.0])
        nacc[0] += a_n
        nacc[1] += a_sum / 100
        nacc[2] += idle_s
        node_gpus[data.node] = node_gpus.get(data.node, 0) + 1
        alloc_sum += a_sum
        alloc_n += a_n
        rows.append(GpuRow(
            node=data.node, gpu=data.gpu, uuid=data.uuid, model=data.model,
            mean_util=_mean(sum(values), len(values)), p95_util=p95(values),
            mean_fb_mib=_mean(sum(fb), len(fb)), idle_hours_working=idle_s / 3600,
            namespaces=sorted(by_ns), pods=sorted({f"{ns}/{pod}" for ns, pod in data.holders}),
            samples=len(values), allocated_samples=a_n, hours_held=a_n * hours_per_sample,
            hours_used=a_sum / 100 * hours_per_sample, missing_samples=missing,
            hour_of_week=_heat(util, how)))
    for metric in fetched.metrics_missing:
        warnings.append(f"no {metric} series: framebuffer figures are missing")
    namespaces = [UsageRow(ns, len(ns_gpus[ns]), a[0] * hours_per_sample,
                           a[1] * hours_per_sample, a[2] / 3600)
                  for ns, a in sorted(ns_acc.items())]
    nodes = [UsageRow(node, node_gpus[node], a[0] * hours_per_sample, a[1] * hours_per_sample,
                      a[2] / 3600) for node, a in sorted(node_acc.items())]
    hours_used = alloc_sum / 100 * hours_per_sample
    return Report(
        range=rng, tz=options.tz.key, working_hours=options.working_hours.text,
        idle_below=threshold, holder_labels=fetched.holder_labels,
        partial=bool(warnings), warnings=warnings, gpus=rows, namespaces=namespaces,
        nodes=nodes, allocated_util=_mean(alloc_sum, alloc_n),
        hours_held=alloc_n * hours_per_sample, hours_used=hours_used,
        idle_hours=sum(r.idle_hours_working for r in rows),
        sharing=estimate_sharing(fetched.gpus, rng, options.policy, hours_used),
        queries=fetched.queries)


def _any(marks: Iterable[bytearray], points: int) -> bytearray:
    out = bytearray(points)
    for m in marks:
        out = _or(out, m)
    return out


def _or(a: bytearray | None, b: bytearray) -> bytearray:
    if a is None:
        return bytearray(b)
    # int.from_bytes OR is C speed; bytes stay 0/1
    n = len(b)
    return bytearray((int.from_bytes(a, "big") | int.from_bytes(b, "big")).to_bytes(n, "big"))


def _hour_of_week(rng: Range, tz: ZoneInfo) -> list[int]:
    out = []
    for ts in rng.timestamps():
        local = datetime.fromtimestamp(ts, tz)
        out.append(local.weekday() * 24 + local.hour)
    return out


def _heat(util: Sequence[float], how: Sequence[int]) -> list[float | None]:
    sums = [0.0] * HOURS_OF_WEEK
    counts = [0] * HOURS_OF_WEEK
    for v, h in zip(util, how, strict=True):
        if not isnan(v):
            sums[h] += v
            counts[h] += 1
    return [s / c if c else None for s, c in zip(sums, counts, strict=True)]


def _missing_message(data: GpuData, present: list[bool], rng: Range) -> str:
    """Which instants a GPU lacks, as at most three spans (the rest counted)."""
    spans: list[tuple[int, int]] = []
    start = None
    for i, p in enumerate([*present, True]):
        if not p and start is None:
            start = i
        elif p and start is not None:
            spans.append((start, i - 1))
            start = None
    missing = sum(b - a + 1 for a, b in spans)
    shown = ", ".join(f"{iso(rng.start + a * rng.step)}..{iso(rng.start + b * rng.step)}"
                      for a, b in spans[:3])
    more = f" and {len(spans) - 3} more gaps" if len(spans) > 3 else ""
    return (f"GPU {data.node}/{data.gpu} ({data.uuid}): no samples for "
            f"{missing * rng.step / 3600:.2f} h of {rng.hours:.2f} h ({shown}{more}); "
            "its figures cover the samples that exist")


def _r(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def to_json(report: Report) -> dict[str, Any]:
    """The machine contract (``-o json``); table, CSV and HTML show these same rounded figures.

    Rounding: % to 2 decimals, hours to 3, MiB to 1.
    """
    rng = report.range
    s = report.sharing
    return {
        "range": {"start": iso(rng.start), "end": iso(rng.end), "step": f"{rng.step}s"},
        "partial": report.partial,
        "warnings": report.warnings,
        "settings": {"tz": report.tz, "workingHours": report.working_hours,
                     "idleBelowPercent": report.idle_below,
                     "minIdleHours": MIN_IDLE_SECONDS / 3600,
                     "holderLabel": report.holder_labels},
        "fleet": {"gpus": len(report.gpus),
                  "allocatedGpuUtilizationPercent": _r(report.allocated_util, 2),
                  "idleGpuHoursWorking": round(report.idle_hours, 3),
                  "gpuHoursHeld": round(report.hours_held, 3),
                  "gpuHoursUsed": round(report.hours_used, 3)},
        "gpus": [{"node": g.node, "gpu": g.gpu, "uuid": g.uuid, "model": g.model,
                  "meanUtilizationPercent": _r(g.mean_util, 2),
                  "p95UtilizationPercent": _r(g.p95_util, 2),
                  "meanFramebufferUsedMiB": _r(g.mean_fb_mib, 1),
                  "idleHoursWorking": round(g.idle_hours_working, 3),
                  "namespaces": g.namespaces, "pods": g.pods,
                  "gpuHoursHeld": round(g.hours_held, 3),
                  "gpuHoursUsed": round(g.hours_used, 3),
                  "missingSamples": g.missing_samples} for g in report.gpus],
        "namespaces": [_usage("namespace", u) for u in report.namespaces],
        "nodes": [_usage("node", u) for u in report.nodes],
        "sharingEstimate": {
            "estimate": True,
            "gpusBefore": s.gpus_before,
            "utilizationPercentBefore": _r(s.utilization_before, 2),
            "gpusNeeded": s.gpus_needed,
            "utilizationPercent": _r(s.utilization_after, 2),
            "sharedGpus": s.shared_gpus, "dedicatedGpus": s.dedicated_gpus,
            "pool": s.pool, "replicasPerGPU": s.replicas,
            "memoryPerPodMiB": s.memory_per_pod_mib,
            "targetUtilizationPercent": s.target,
            "method": s.method,
            "fractional": _fractional(s.fractional)},
    }


def _fractional(f: FractionalEstimate | None) -> dict[str, Any] | None:
    """The fractional estimate (gpu_admission.usage.sharing), next to the time-sliced one."""
    if f is None:
        return None
    return {"estimate": True, "gpusNeeded": f.gpus_needed,
            "utilizationPercent": _r(f.utilization_after, 2),
            "sharedGpus": f.shared_gpus, "dedicatedGpus": f.dedicated_gpus,
            "pool": f.pool, "memoryMiB": f.card_mib, "memoryHeadroomMiB": f.headroom_mib,
            "targetUtilizationPercent": f.target, "method": f.method}


def _usage(kind: str, u: UsageRow) -> dict[str, Any]:
    return {kind: u.name, "gpus": u.gpus, "gpuHoursHeld": round(u.hours_held, 3),
            "gpuHoursUsed": round(u.hours_used, 3), "idleGpuHours": round(u.idle_hours, 3)}
