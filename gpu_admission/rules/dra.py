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
  (MiB, what the MPS daemon enforces), otherwise the policy's (pool or defaults).
"""

from __future__ import annotations

from typing import Final

from gpu_admission.decision import Mode, Violation
from gpu_admission.rules.base import Context
from gpu_admission.rules.memory import MemoryLimit, Wanted, memory_share, wanted_env

UNKNOWN: Final = "dra-reference-unknown"
POSSIBLE: Final = "dra-sharing-possible"


def unknown_mode(ctx: Context) -> Mode:
    """Training pods: the rule's mode; others: ``spec.dra.nonTrainingUnknownReferences``."""
    if ctx.workload == "training":
        return ctx.compiled.modes[UNKNOWN]
    return ctx.compiled.dra_unknown_other


def unknown_message(what: str, training: bool) -> str:
    if training:
        return (f"{what} is not in the webhook's DRA cache (just created, or the cache is "
                "syncing): cannot tell whether the GPU is shared; retry in a few seconds")
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
        for path, what in dra.unresolved:
            ctx.violations.append(Violation(UNKNOWN, path, unknown_message(what, training),
                                            mode))
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
            key = (id(ctx.pool), id(limits), mem_mib, source)
            memo = self._memo.get(key)
            if memo is None or memo[0] is not ctx.pool or memo[1] is not limits:
                if len(self._memo) >= self._MEMO_MAX:
                    self._memo.clear()
                memo = self._memo[key] = (ctx.pool, limits, wanted_env(
                    ctx.pool, limits, 0, (mem_mib, fraction, source))[0])
            MemoryLimit.apply_env(ctx, gc, memo[2], source)
