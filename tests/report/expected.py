"""The report's figures computed independently from the generated history (no tests here).

Written from the issue's definitions, straight over the generator's own samples (a dict per
GPU from instant to reading), without importing ``gpu_admission.report``: one loop per
figure, readable rather than fast, so a mistake in the module does not repeat here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from tests.dcgm_history_support import Gpu


@dataclass
class Settings:
    start: int
    end: int
    step: int
    tz: str = "UTC"
    days: tuple[int, ...] = (0, 1, 2, 3, 4)  # Monday = 0
    begin: tuple[int, int] = (8, 0)  # local (hour, minute), inclusive
    finish: tuple[int, int] = (18, 0)  # exclusive
    idle_below: float = 10.0
    replicas: int = 5  # default policy: 1 / defaultFraction 0.2
    share_mib: int = 16000  # default policy: defaultMemoryMiB
    target: float = 70.0  # default policy: placement.targetUtilizationPercent
    card_mib: int = 80000  # fractional estimate: default policy's 16000 MiB / 0.2
    headroom_mib: int = 1024  # default policy: placement.memoryHeadroomMiB
    fractional_pool: str | None = None


def nearest_rank_p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(0.95 * len(ordered)) - 1]


def working(ts: int, s: Settings) -> bool:
    local = datetime.fromtimestamp(ts, ZoneInfo(s.tz))
    return local.weekday() in s.days and s.begin <= (local.hour, local.minute) < s.finish


def idle_seconds(flags: list[bool], step: int) -> int:
    """Runs of True of at least 2 h, in seconds."""
    total, run = 0, 0
    for flag in [*flags, False]:
        if flag:
            run += step
        else:
            if run >= 7200:
                total += run
            run = 0
    return total


def expected(gpus: list[Gpu], s: Settings) -> dict[str, Any]:
    instants = list(range(s.start, s.end + 1, s.step))
    h = s.step / 3600
    rows, ns_held, ns_used, ns_idle, ns_gpus = [], {}, {}, {}, {}  # type: ignore[var-annotated]
    node_held, node_used, node_idle, node_gpus = {}, {}, {}, {}  # type: ignore[var-annotated]
    alloc_utils: list[float] = []
    missing_any = False
    items = []
    for g in gpus:
        got = {t: g.samples[t] for t in instants if t in g.samples}
        if not got:
            continue
        missing_any = missing_any or len(got) < len(instants)
        utils = [r[0] for r in got.values()]
        held = {t: r for t, r in got.items() if r[2] is not None}
        flags = [t in got and got[t][0] < s.idle_below and working(t, s) for t in instants]
        idle = idle_seconds(flags, s.step) / 3600
        holders = sorted({r[2] for r in held.values() if r[2] is not None})
        namespaces = sorted({ns for ns, _ in holders})
        for ns in namespaces:
            mine = {t for t, r in held.items() if r[2] is not None and r[2][0] == ns}
            ns_held[ns] = ns_held.get(ns, 0) + len(mine) * h
            ns_used[ns] = ns_used.get(ns, 0) + sum(got[t][0] / 100 for t in mine) * h
            ns_flags = [f and t in mine for f, t in zip(flags, instants, strict=True)]
            ns_idle[ns] = ns_idle.get(ns, 0) + idle_seconds(ns_flags, s.step) / 3600
            ns_gpus.setdefault(ns, set()).add(g.uuid)
        for who in holders:
            mine_utils = [r[0] for r in held.values() if r[2] == who]
            mine_fb = [r[1] for r in held.values() if r[2] == who]
            items.append((nearest_rank_p95(mine_utils), max(mine_fb)))
        node_held[g.node] = node_held.get(g.node, 0) + len(held) * h
        node_used[g.node] = node_used.get(g.node, 0) + sum(r[0] / 100 for r in held.values()) * h
        node_idle[g.node] = node_idle.get(g.node, 0) + idle
        node_gpus[g.node] = node_gpus.get(g.node, 0) + 1
        alloc_utils += [r[0] for r in held.values()]
        rows.append({
            "node": g.node, "gpu": str(g.index), "uuid": g.uuid, "model": g.model,
            "meanUtilizationPercent": statistics.fmean(utils),
            "p95UtilizationPercent": nearest_rank_p95(utils),
            "meanFramebufferUsedMiB": statistics.fmean(r[1] for r in got.values()),
            "idleHoursWorking": idle, "namespaces": namespaces,
            "pods": [f"{ns}/{pod}" for ns, pod in holders],
            "gpuHoursHeld": len(held) * h,
            "gpuHoursUsed": sum(r[0] / 100 for r in held.values()) * h,
            "missingSamples": len(instants) - len(got)})
    used = sum(alloc_utils) / 100 * h
    before = sum(1 for r in rows if r["pods"])
    needed = ffd(items, s)
    frac_shared, frac_whole = ffd_fractional(items, s)
    hours = len(instants) * h
    return {
        "partial": missing_any,
        "fleet": {"gpus": len(rows),
                  "allocatedGpuUtilizationPercent": statistics.fmean(alloc_utils),
                  "idleGpuHoursWorking": sum(r["idleHoursWorking"] for r in rows),
                  "gpuHoursHeld": len(alloc_utils) * h, "gpuHoursUsed": used},
        "gpus": rows,
        "namespaces": [{"namespace": ns, "gpus": len(ns_gpus[ns]), "gpuHoursHeld": ns_held[ns],
                        "gpuHoursUsed": ns_used[ns], "idleGpuHours": ns_idle[ns]}
                       for ns in sorted(ns_held)],
        "nodes": [{"node": n, "gpus": node_gpus[n], "gpuHoursHeld": node_held[n],
                   "gpuHoursUsed": node_used[n], "idleGpuHours": node_idle[n]}
                  for n in sorted(node_held)],
        "sharingEstimate": {"gpusBefore": before,
                            "utilizationPercentBefore": used / (before * hours) * 100,
                            "gpusNeeded": needed,
                            "utilizationPercent": used / (needed * hours) * 100,
                            "fractional": {
                                "gpusNeeded": frac_shared + frac_whole,
                                "utilizationPercent": used / ((frac_shared + frac_whole)
                                                              * hours) * 100,
                                "sharedGpus": frac_shared, "dedicatedGpus": frac_whole,
                                "pool": s.fractional_pool, "memoryMiB": s.card_mib,
                                "memoryHeadroomMiB": s.headroom_mib,
                                "targetUtilizationPercent": int(s.target)}},
    }


def ffd(items: Sequence[tuple[float, float]], s: Settings) -> int:
    """First-fit decreasing as the issue states it: whole GPUs for loads over the target or
    memory over the share, the rest packed under the target and the replica count."""
    whole = [i for i in items if i[0] > s.target or i[1] > s.share_mib]
    bins: list[list[float]] = []
    for load, _mem in sorted((i for i in items if i not in whole), reverse=True):
        for b in bins:
            if len(b) < s.replicas and sum(b) + load <= s.target:
                b.append(load)
                break
        else:
            bins.append([load])
    return len(bins) + len(whole)


def ffd_fractional(items: Sequence[tuple[float, float]], s: Settings) -> tuple[int, int]:
    """The fractional estimate as the issue states it: pods sized by peak framebuffer and p95
    load, first-fit decreasing onto cards that keep the headroom free and stay under the
    target; no replica limit. Returns (shared GPUs, whole GPUs)."""
    fits_a_card = [i for i in items if i[0] <= s.target and i[1] + s.headroom_mib <= s.card_mib]
    whole = len(items) - len(fits_a_card)
    cards: list[list[tuple[float, float]]] = []
    for item in sorted(fits_a_card, key=lambda i: (-i[0], -i[1])):
        for card in cards:
            load = sum(i[0] for i in card) + item[0]
            memory = sum(i[1] for i in card) + item[1] + s.headroom_mib
            if load <= s.target and memory <= s.card_mib:
                card.append(item)
                break
        else:
            cards.append([item])
    return len(cards), whole
