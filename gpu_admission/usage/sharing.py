"""What sharing would give: the measured per-pod load packed onto time-sliced GPUs. An
**estimate**, pure, and its method is part of the output.

The packing uses the policy the webhook and the scheduler extender use
(``gpu_admission.policy.model``): the first ``time-slicing``/``mps`` pool of
``spec.nodePools`` (replicas per GPU, the memory share per pod as the memory-limit rule
computes it, :func:`gpu_admission.rules.memory.memory_share`), and the placement target
``spec.placement.targetUtilizationPercent``. Without a shared pool, the policy defaults the
memory rule uses for pods of unknown pools apply (``defaultMemoryMiB`` per pod,
``1 / defaultFraction`` pods per GPU).

Method, first-fit decreasing (the classic bin-packing heuristic; Johnson 1973):

1. one item per (pod, GPU it held): its load is the p95 (nearest rank) SM utilisation, in %,
   of that GPU over the samples the pod held it; its memory is the largest framebuffer used,
   in MiB, over those samples;
2. an item whose load exceeds the target or whose memory exceeds the share keeps a whole GPU;
3. the others, sorted by load (highest first), each go to the first shared GPU with a free
   replica whose summed load stays at or under the target; if none, a new shared GPU;
4. before = the GPUs that were held at all; utilisation before/after = measured GPU-hours
   used / (GPUs x hours in the range) x 100.

Loads are summed as if every pod ran all the time (p95, no time-of-day offsets), so the
estimate leans towards more GPUs, not fewer.

**Fractional estimate** (``sharing: fractional`` pools, docs/fractional.md): the same
items, but a pod's share is sized by what it used, not a fixed slice: its memory is its peak
framebuffer (``DCGM_FI_DEV_FB_USED``, MiB) and there is no replica limit. First-fit
decreasing (same order) onto cards of ``memoryMiB`` of the policy's first fractional pool
(else of its first time-slicing/mps pool, else the card the memory defaults describe,
``defaultMemoryMiB / defaultFraction``): an item goes to the first GPU where the summed load
stays at or under the target and the summed memory plus ``spec.placement.memoryHeadroomMiB``
stays at or under the card's memory (the room the extender keeps free on a card); an item
over the target, or whose memory plus headroom exceeds the card, keeps a whole GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from math import isnan

from gpu_admission.core.timeframe import Range
from gpu_admission.policy.model import Policy
from gpu_admission.rules.memory import memory_share
from gpu_admission.usage.data import GpuData


@dataclass(frozen=True, slots=True)
class Item:
    key: str  # namespace/pod@node/uuid
    load: float  # % SM
    memory_mib: float


@dataclass(frozen=True, slots=True)
class SharingEstimate:
    gpus_before: int
    utilization_before: float | None
    gpus_needed: int
    utilization_after: float | None
    shared_gpus: int
    dedicated_gpus: int
    pool: str | None
    replicas: int
    memory_per_pod_mib: int
    target: int
    method: str
    fractional: FractionalEstimate | None = None


@dataclass(frozen=True, slots=True)
class FractionalEstimate:
    """Pods sized by their peak framebuffer and p95 load, packed by memory and load."""

    gpus_needed: int
    utilization_after: float | None
    shared_gpus: int
    dedicated_gpus: int
    pool: str | None
    card_mib: int  # memory of one card, MiB
    headroom_mib: int  # kept free on every card, MiB
    target: int  # % SM
    method: str


def items(gpus: Sequence[GpuData]) -> list[Item]:
    out = []
    for data in gpus:
        for (namespace, pod), marks in sorted(data.holders.items()):
            loads = [v for v, m in zip(data.util, marks, strict=True) if m]
            mems = [f for f, m in zip(data.fb_used, marks, strict=True) if m and not isnan(f)]
            if not loads:
                continue
            ordered = sorted(loads)
            load = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
            out.append(Item(f"{namespace}/{pod}@{data.node}/{data.uuid}", load,
                            max(mems, default=0.0)))
    return out


def pack(loads: Sequence[Item], *, replicas: int, target: float,
         memory_share_mib: float) -> tuple[int, int]:
    """First-fit decreasing; returns (shared GPUs, dedicated GPUs)."""
    dedicated = 0
    bins: list[list[float]] = []  # [summed load %, pods]
    for item in sorted(loads, key=lambda i: (-i.load, -i.memory_mib, i.key)):
        if item.load > target or item.memory_mib > memory_share_mib or replicas == 1:
            dedicated += 1
            continue
        for b in bins:
            if b[1] < replicas and b[0] + item.load <= target:
                b[0] += item.load
                b[1] += 1
                break
        else:
            bins.append([item.load, 1])
    return len(bins), dedicated


def pack_fractional(loads: Sequence[Item], *, card_mib: float, headroom_mib: float,
                    target: float) -> tuple[int, int]:
    """First-fit decreasing by load and memory; returns (shared GPUs, dedicated GPUs)."""
    dedicated = 0
    room = card_mib - headroom_mib  # MiB a card may give out
    bins: list[list[float]] = []  # [summed load %, summed memory MiB]
    for item in sorted(loads, key=lambda i: (-i.load, -i.memory_mib, i.key)):
        if item.load > target or item.memory_mib > room:
            dedicated += 1
            continue
        for b in bins:
            if b[0] + item.load <= target and b[1] + item.memory_mib <= room:
                b[0] += item.load
                b[1] += item.memory_mib
                break
        else:
            bins.append([item.load, item.memory_mib])
    return len(bins), dedicated


def estimate_fractional(found: Sequence[Item], rng: Range, policy: Policy,
                        hours_used: float) -> FractionalEstimate:
    """The fractional estimate (module docstring) for the items of :func:`items`."""
    spec = policy.spec
    pool = (next((p for p in spec.node_pools if p.fractional), None)
            or next((p for p in spec.node_pools if p.shared), None))
    limits = spec.memory_limits
    card = pool.memory_mib if pool is not None else math.floor(
        limits.default_memory_mib / limits.default_fraction + 1e-9)
    headroom = spec.placement.memory_headroom_mib
    target = spec.placement.target_utilization_percent
    shared, dedicated = pack_fractional(found, card_mib=card, headroom_mib=headroom,
                                        target=target)
    where = (f"cards of pool {pool.name} ({pool.sharing}, memoryMiB {card})" if pool is not None
             else f"cards of {card} MiB (no fractional or time-slicing/mps pool in the policy: "
                  f"defaultMemoryMiB {limits.default_memory_mib} / defaultFraction "
                  f"{limits.default_fraction:g})")
    method = (
        f"Estimate, not a measurement. Fractional GPUs: the same items, each sized by its peak "
        f"framebuffer use (DCGM_FI_DEV_FB_USED) and its p95 SM utilisation instead of a fixed "
        f"slice; first-fit decreasing (by load, then memory) onto {where}: an item goes to the "
        f"first GPU whose summed load stays at or under the placement target {target} % and "
        f"whose summed memory plus spec.placement.memoryHeadroomMiB {headroom} MiB stays "
        f"within the card; an item over the target, or with more memory than the card minus "
        f"the headroom, keeps a whole GPU. No replica limit. Utilisation = measured GPU-hours "
        f"used / (GPUs x {rng.hours:g} h in the range).")
    needed = shared + dedicated
    after = hours_used / (needed * rng.hours) * 100 if needed else None
    return FractionalEstimate(needed, after, shared, dedicated,
                              pool.name if pool is not None and pool.fractional else None,
                              card, headroom, target, method)


def estimate_sharing(gpus: Sequence[GpuData], rng: Range, policy: Policy,
                     hours_used: float) -> SharingEstimate:
    spec = policy.spec
    pool = next((p for p in spec.node_pools if p.shared), None)
    share_mib, fraction, source = memory_share(pool, spec.memory_limits)
    replicas = pool.replicas_per_gpu if pool is not None else max(1, math.floor(1 / fraction
                                                                                + 1e-9))
    target = spec.placement.target_utilization_percent
    found = items(gpus)
    shared, dedicated = pack(found, replicas=replicas, target=target,
                             memory_share_mib=share_mib)
    before = sum(1 for g in gpus if any(any(m) for m in g.holders.values()))
    needed = shared + dedicated
    where = (f"pool {pool.name} ({pool.sharing}, replicasPerGPU {replicas}, memoryMiB "
             f"{pool.memory_mib})" if pool is not None else
             f"no time-slicing/mps pool in the policy, so its defaults ({source}: "
             f"{share_mib} MiB per pod, {replicas} pods per GPU = 1/defaultFraction)")
    method = (
        f"Estimate, not a measurement. First-fit decreasing onto time-sliced GPUs of {where}: "
        f"one item per pod and GPU it held, sized by the p95 SM utilisation of that GPU while "
        f"the pod held it and by its peak framebuffer use; items sorted by load, highest "
        f"first, each put on the first shared GPU with a free replica whose summed load stays "
        f"at or under the placement target {target} % (spec.placement."
        f"targetUtilizationPercent); an item over the target or over the memory share of "
        f"{share_mib} MiB per pod keeps a whole GPU. Utilisation = measured GPU-hours used / "
        f"(GPUs x {rng.hours:g} h in the range). Loads are summed as if all pods ran at "
        f"once, so the estimate errs towards more GPUs.")
    hours = rng.hours

    def util(n: int) -> float | None:
        return hours_used / (n * hours) * 100 if n else None

    return SharingEstimate(before, util(before), needed, util(needed), shared, dedicated,
                           pool.name if pool is not None else None, replicas, share_mib,
                           target, method, estimate_fractional(found, rng, policy, hours_used))
