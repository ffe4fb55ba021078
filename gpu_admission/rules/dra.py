"""DRA rules: ``dra-reference-unknown``, ``dra-sharing-possible``, and the memory limits of
containers on a shared DRA claim (rule ids ``memory-limit``/``memory-limit-unverifiable``).

Why (issue 15, docs/dra.md): a pod that gets its GPU through Dynamic Resource Allocation
names a ResourceClaimTemplate or ResourceClaim; whether the GPU is shared lives in that object
and in its DeviceClass (``shared/reference/dra-gpus.md`` §4). The engine turns the DRA view
(:class:`gpu_admission.dra.analysis.DraPod`) into GPU containers and shared reasons, so
``no-training-on-shared-gpu``, ``scheduler-name`` and CUDA routing apply unchanged; this
module adds what only DRA has:

* ``dra-reference-unknown``: a template/claim/DeviceClass not in the webhook's cache (created
  a moment ago, or the cache is not synced). We cannot tell whether the GPU is shared, so a
  training pod is reported in the rule's mode (default enforce: denied with "retry"), any
  other pod in ``spec.dra.nonTrainingUnknownReferences`` (default warn). Never a silent allow.
* ``dra-sharing-possible`` (training pods, default warn): the claim is not shared now but may
  be: a ResourceClaim named by this pod only (pods created later may name it too), a
  ``firstAvailable`` list with a MIG alternative, a pod group with template claims.
* memory env vars (the ``memory-limit`` rule's, :mod:`gpu_admission.rules.memory`) for the
  containers on a shared claim (not training, not MIG: MIG slices have their own memory).
  The share is the MPS ``defaultPinnedDeviceMemoryLimit`` of the claim/class config when set
  (MiB, what the MPS daemon enforces), the consumable capacity the claim asks for
  (``exactly.capacity.requests.memory``, in MiB; the smaller of the two when both), otherwise
  the policy's (pool or defaults).
"""

from __future__ import annotations

from typing import Final

from gpu_admission.core.decision import Mode, Violation
from gpu_admission.rules.base import Context
from gpu_admission.rules.memory import (
    FRACTION_VARS,
    MemoryLimit,
    Wanted,
    memory_share,
    shares_a_gpu,
    wanted_env,
)

UNKNOWN: Final = "dra-reference-unknown"
POSSIBLE: Final = "dra-sharing-possible"


def unknown_mode(ctx: Context) -> Mode:
    """Training pods: the rule's mode; others: ``spec.dra.nonTrainingUnknownReferences``."""
    if ctx.workload == "training":
        return ctx.compiled.modes[UNKNOWN]
    return ctx.compiled.dra_unknown_other


def unknown_message(what: str, training: bool, *, offline: bool = False,
                    limits_set: bool = False) -> str:
    """The ``dra-reference-unknown`` message. ``offline``: the snapshot is ``evaluate``'s
    files, so the object is missing from the input (no retry helps); ``limits_set``: the pod
    gets memory variables anyway (from what is known), so the message must not deny it."""
    if offline:
        where = (f"{what} is not in the files given to evaluate: add the file that defines it "
                 "(-f), or read the cluster's objects with --kubeconfig FILE")
        if training:
            return where + "; cannot tell whether the GPU is shared"
        return where + ("; sharing not fully checked, memory limits set from the known objects"
                        if limits_set else "; sharing not checked, no memory limits set")
    if training:
        return (f"{what} is not in the webhook's DRA cache (just created, or the cache is "
                "syncing): cannot tell whether the GPU is shared; retry in a few seconds")
    if limits_set:
        return (f"{what} is not in the webhook's DRA cache yet: sharing not fully checked, "
                "memory limits set from the known objects")
    return (f"{what} is not in the webhook's DRA cache yet: sharing not checked, no memory "
            "limits set")


class DraRules:
    ids: tuple[str, ...] = (UNKNOWN, POSSIBLE)

    #: Memo of the env var table per (pool, limits, MiB) as MemoryLimit keeps its own: keyed
    #: by object identity, the entry keeps the objects alive so an id is never reused.
    _MEMO_MAX = 256

    def __init__(self) -> None:
        self._memo: dict[tuple[int, int, int, str], tuple[object, object, Wanted]] = {}

    def check(self, ctx: Context) -> None:
        dra = ctx.dra
        if dra is None:
            return
        training = ctx.workload == "training"
        mode = unknown_mode(ctx)
        # memory variables this pod gets anyway: on a shared DRA claim (below), or from the
        # memory-limit rule for its device-plugin GPUs (e.g. whole nvidia.com/gpu beside an
        # unknown claim), so the message must not say "no memory limits set"
        plugin_limits = shares_a_gpu(ctx.workload, ctx.mig, ctx.pool) and any(
            gc.dra is None and gc.other is None and not gc.fractional
            for gc in ctx.gpu_containers)
        limits_set = not training and (plugin_limits or any(
            gc.dra is not None and not gc.mig and gc.dra.shared for gc in ctx.gpu_containers))
        for path, what in dra.unresolved:
            ctx.violations.append(Violation(UNKNOWN, path, unknown_message(
                what, training, offline=dra.offline, limits_set=limits_set), mode))
        if training and not ctx.shared_reasons:
            for path, why in dra.possible:
                ctx.violate(POSSIBLE, path, f"GPU may become shared: {why}")
        if training:
            return
        limits = ctx.policy.spec.memory_limits
        for gc in ctx.gpu_containers:
            if gc.dra is None or gc.mig or not gc.dra.shared:
                continue
            mem_mib, fraction, source = memory_share(ctx.pool, limits)
            if gc.dra.mps_limit_mib is not None:
                mem_mib = gc.dra.mps_limit_mib
                source = "MPS defaultPinnedDeviceMemoryLimit of " + ", ".join(gc.dra.claims)
            if gc.dra.capacity_mib is not None:
                # consumable capacity: the claim's own memory share (MiB) is the limit
                mem_mib = min(mem_mib, gc.dra.capacity_mib) if gc.dra.mps_limit_mib else \
                    gc.dra.capacity_mib
                source = "capacity.requests.memory of " + ", ".join(gc.dra.claims)
                if ctx.pool is not None:  # the share of the pool's card it is
                    fraction = min(fraction, mem_mib / ctx.pool.memory_mib)
            key = (id(ctx.pool), id(limits), mem_mib, source)
            memo = self._memo.get(key)
            if memo is None or memo[0] is not ctx.pool or memo[1] is not limits:
                if len(self._memo) >= self._MEMO_MAX:
                    self._memo.clear()
                memo = self._memo[key] = (ctx.pool, limits, wanted_env(
                    ctx.pool, limits, 0, (mem_mib, fraction, source))[0])
            wanted = memo[2]
            if gc.dra.capacity_mib is not None and ctx.pool is None:
                # a share in MiB of a card of unknown size: no fraction is known to be
                # within it, so none is written (only NVIDIA_MEM_LIMIT_MB and growth)
                wanted = [w for w in wanted if w[0] not in FRACTION_VARS]
            MemoryLimit.apply_env(ctx, gc, wanted, source)
