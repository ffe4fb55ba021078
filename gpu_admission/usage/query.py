"""Querying layer of ``gpu-admission report``: dcgm-exporter series from Prometheus, chunked.

What is read (facts: ``shared/reference/scheduling-and-dcgm.md`` section 2; dcgm-exporter
``etc/default-counters.csv``, https://github.com/NVIDIA/dcgm-exporter):

* ``DCGM_FI_DEV_GPU_UTIL``: SM utilisation, **%** (0-100);
* ``DCGM_FI_DEV_FB_USED``: framebuffer used, **MiB**.

One GPU is ``(Hostname|hostname, UUID|uuid)``; ``Hostname`` is the node name (the exporter
takes it from ``NODE_NAME``). The workload holding a GPU is the exporter's pod label ``pod`` /
``namespace``; scraped through a ServiceMonitor (``honor_labels: false``) those arrive as
``exported_pod`` / ``exported_namespace`` and ``pod`` names the exporter itself, so as soon as
any series carries ``exported_pod``, only ``exported_*`` count as holders.

Each instant ``t`` of the range is evaluated as ``last_over_time(M[<step - 1ms>])``: the
newest sample in ``(t - step, t]``, so a sample is never counted at two instants (Prometheus
2.x range selectors include both ends) and a series that stopped is not carried into the next
step by the 5-minute lookback. Series of one GPU (per-pod copies of a device-wide value with
``KUBERNETES_VIRTUAL_GPUS``, a driver upgrade, a new exporter pod) are merged here, taking the
largest value per instant; a server-side ``max by (...)`` did the same 3-5x slower in
Prometheus 2.42 (benchmarks/report_bench.py).

Chunking: Prometheus rejects a range query of more than 11,000 points per series, and every
query's answer is held in memory here and in Prometheus. Each query covers at most
``min(MAX_STEPS, POINT_BUDGET // series)`` instants, where ``series`` is the number of GPU
series ``/api/v1/series`` reports for the range (an upper bound for any chunk).
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from math import isnan
from typing import Any, Final

from gpu_admission.core.timeframe import Range, iso
from gpu_admission.usage.data import Fetched, GpuData
from gpu_admission.usage.prom import MAX_POINTS_PER_SERIES, PrometheusClient

UTIL_METRIC: Final = "DCGM_FI_DEV_GPU_UTIL"  # %
FB_USED_METRIC: Final = "DCGM_FI_DEV_FB_USED"  # MiB
MAX_STEPS: Final = MAX_POINTS_PER_SERIES - 1_000  # margin below the hard limit
POINT_BUDGET: Final = 200_000  # series x instants per query: ~5 MB of JSON, ~25 MB decoded
IN_FLIGHT: Final = 2  # concurrent queries

Progress = Callable[[int, int], None]  # (queries done, queries planned)


class NoDataError(Exception):
    """No dcgm-exporter series in the range; ``str()`` is the message for the user."""


def plan_chunks(rng: Range, series: int, *, max_steps: int = MAX_STEPS,
                budget: int = POINT_BUDGET) -> list[tuple[int, int]]:
    """Inclusive ``(start, end)`` pairs covering ``rng``, each within both limits."""
    per_chunk = max(1, min(max_steps, budget // max(1, series)))
    chunks = []
    first = rng.start
    while first <= rng.end:
        last = min(rng.end, first + (per_chunk - 1) * rng.step)
        chunks.append((first, last))
        first = last + rng.step
    return chunks


def instant_query(metric: str, step: int) -> str:
    return f"last_over_time({metric}[{step * 1000 - 1}ms])"


def fetch(client: PrometheusClient, rng: Range, *, progress: Progress | None = None,
          max_steps: int = MAX_STEPS, budget: int = POINT_BUDGET) -> Fetched:
    """Query both metrics over ``rng`` and decode them per GPU.

    Raises :class:`~gpu_admission.usage.prom.PromError` (unreachable, rejected) or
    :class:`NoDataError` (no dcgm-exporter GPU utilisation series in the range).
    """
    # Series that can contribute to the first instant started up to one step earlier.
    inventory = client.series(UTIL_METRIC, rng.start - rng.step + 1, rng.end)
    if not inventory:
        raise NoDataError(
            f"no dcgm-exporter series ({UTIL_METRIC}) in Prometheus at {client.base_url} "
            f"between {iso(rng.start)} and {iso(rng.end)}: is dcgm-exporter scraped by this "
            "Prometheus, and does its retention cover the range?")
    exported = any("exported_pod" in labels for labels in inventory)
    chunks = plan_chunks(rng, len(inventory), max_steps=max_steps, budget=budget)
    total = 2 * len(chunks)
    gpus: dict[tuple[str, str], GpuData] = {}
    seen_fb = False
    done = 0
    if progress is not None:
        progress(done, total)
    plan = [(metric, first, last) for metric in (UTIL_METRIC, FB_USED_METRIC)
            for first, last in chunks]
    # Up to IN_FLIGHT queries run at once (Prometheus evaluates each query on one core);
    # results are merged in plan order, so every GPU_UTIL chunk is merged before the first
    # FB_USED one, and at most IN_FLIGHT answers are held in memory.
    with ThreadPoolExecutor(max_workers=IN_FLIGHT) as pool:
        pending: deque[tuple[str, Future[list[dict[str, Any]]]]] = deque()
        upcoming = iter(plan)

        def submit() -> None:
            job = next(upcoming, None)
            if job is not None:
                pending.append((job[0], pool.submit(
                    client.query_range, instant_query(job[0], rng.step), job[1], job[2],
                    rng.step)))

        for _ in range(IN_FLIGHT):
            submit()
        while pending:
            metric, future = pending.popleft()
            result = future.result()
            submit()
            if metric == UTIL_METRIC:
                merge_util(result, rng, gpus, exported)
            else:
                seen_fb = merge_fb(result, rng, gpus) or seen_fb
            del result
            done += 1
            if progress is not None:
                progress(done, total)
    if not gpus:
        raise NoDataError(
            f"no {UTIL_METRIC} samples in Prometheus at {client.base_url} between "
            f"{iso(rng.start)} and {iso(rng.end)} (series exist but hold no samples at "
            f"the {rng.step}s instants)")
    ordered = sorted(gpus.values(), key=lambda g: (g.node, _index(g.gpu), g.uuid))
    return Fetched(rng, ordered, "exported_pod" if exported else "pod", client.queries,
                   [] if seen_fb else [FB_USED_METRIC])


def _index(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


def _key(labels: dict[str, str]) -> tuple[str, str]:
    node = labels.get("Hostname") or labels.get("hostname") or ""
    uuid = labels.get("UUID") or labels.get("uuid") or f"gpu-{labels.get('gpu', '?')}"
    return node, uuid


def _samples(values: list[list[Any]], rng: Range, high: float) -> list[tuple[int, float]]:
    """(instant index, value) pairs; NaN, infinite, negative and over-``high`` values (not a
    reading a GPU can give) are left out, so they count as missing samples."""
    out = []
    start, step, points = rng.start, rng.step, rng.points
    for ts, text in values:
        value = float(text)
        if not 0 <= value <= high:  # also false for NaN
            continue
        i = round((ts - start) / step)
        if 0 <= i < points:
            out.append((i, value))
    return out


def merge_util(result: list[dict[str, Any]], rng: Range, gpus: dict[tuple[str, str], GpuData],
               exported: bool) -> None:
    """Merge one ``DCGM_FI_DEV_GPU_UTIL`` range result into ``gpus`` (per-instant maximum over
    a GPU's series; the pod label of each series marks its holder at the instants it has)."""
    nan = math.nan
    for item in result:
        labels: dict[str, str] = item.get("metric") or {}
        key = _key(labels)
        data = gpus.get(key)
        if data is None:
            data = gpus[key] = GpuData(
                node=key[0], gpu=labels.get("gpu", ""), uuid=key[1],
                model=labels.get("modelName", ""), util=array("d", [nan]) * rng.points,
                fb_used=array("d", [nan]) * rng.points)
        pod = labels.get("exported_pod" if exported else "pod")
        marks = None
        if pod:
            namespace = labels.get("exported_namespace" if exported else "namespace", "")
            marks = data.holders.get((namespace, pod))
            if marks is None:
                marks = data.holders[(namespace, pod)] = bytearray(rng.points)
        util = data.util
        for i, value in _samples(item.get("values") or [], rng, 100.0):
            old = util[i]
            if isnan(old) or value > old:  # NaN or a larger copy of the device value
                util[i] = value
            if marks is not None:
                marks[i] = 1


def merge_fb(result: list[dict[str, Any]], rng: Range,
             gpus: dict[tuple[str, str], GpuData]) -> bool:
    """Merge one ``DCGM_FI_DEV_FB_USED`` result into the GPUs already known; True if any."""
    found = False
    for item in result:
        data = gpus.get(_key(item.get("metric") or {}))
        if data is None:
            continue  # framebuffer without utilisation: not a GPU we report on
        found = True
        fb = data.fb_used
        for i, value in _samples(item.get("values") or [], rng, 1e9):  # MiB
            old = fb[i]
            if isnan(old) or value > old:
                fb[i] = value
    return found

