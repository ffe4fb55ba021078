"""Rules ``memory-limit`` and ``memory-limit-unverifiable``: GPU memory caps for shared cards.

Why (seed article, option 1): time-slicing has no memory isolation; if pod A takes 70 GB of an
80 GB card, pod B OOMs. So every GPU container of a pod that shares a card (non-training, not
MIG, not routed to a ``sharing: none`` pool) gets env vars that real runtimes honour, upserted
by name (sources: ``shared/reference/gpu-facts.md`` section 4):

==================================== =========================================================
``NVIDIA_MEM_LIMIT_MB``              the article's convention; value = MiB (2**20 bytes) count.
                                     Not read by any NVIDIA component: the app must read it.
``GPU_MEMORY_FRACTION``              our convention: the 0-1 value the app passes to
                                     ``torch.cuda.set_per_process_memory_fraction``
                                     (https://pytorch.org/docs/stable/generated/torch.cuda.set_per_process_memory_fraction.html);
                                     PyTorch has no env var for it, so the app must read it.
``XLA_CLIENT_MEM_FRACTION``          JAX preallocation share of total GPU memory
``XLA_PYTHON_CLIENT_MEM_FRACTION``   its deprecated alias, still read by older JAX
                                     (https://docs.jax.dev/en/latest/gpu_memory_allocation.html)
``TF_FORCE_GPU_ALLOW_GROWTH=true``   TensorFlow grows on demand instead of mapping ~all memory
                                     (https://www.tensorflow.org/guide/gpu)
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` ``<dev>=<MiB>M`` per device, MPS pools only: the CUDA driver
                                     caps the MPS client (https://docs.nvidia.com/deploy/mps/)
==================================== =========================================================

Values come from the pod's pool (``memoryMiB // replicasPerGPU`` MiB, fraction
``1/replicasPerGPU``) when known, else ``spec.memoryLimits.defaultMemoryMiB`` /
``defaultFraction``. A container that already sets a lower (or equal) limit keeps it; a higher or
unparsable one is a ``memory-limit`` violation. A ``valueFrom`` entry cannot be compared at
admission time: it is kept and reported as ``memory-limit-unverifiable``.

A fractional pod (:mod:`gpu_admission.facts.fractional`) gets the same variables sized to its own
share (MiB, and share / card as the fraction) and, with ``spec.placement.hamiCore: true``,
HAMi-core's ``CUDA_DEVICE_MEMORY_LIMIT=<MiB>m`` (Project-HAMi/HAMi-core README: bytes or a
binary ``k``/``m``/``g`` suffix; ``0`` means no limit); a per-device
``CUDA_DEVICE_MEMORY_LIMIT_<i>`` above the share (it overrides the global value) is a
``memory-limit`` violation.

Where GPU nodes are visible (issue 33, docs/pools.md) the caps apply only to a pod that will
run on a shared card (``ctx.landing``), sized from that pool's card and replicas, and a
container recognised as a serving engine (vLLM, SGLang, TGI, TensorRT-LLM) also gets the
engine's own memory setting sized to its share (:func:`apply_engine`,
docs/serving-engines.md). A denial names the way out (:data:`WAY_OUT`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Final

from gpu_admission.core.patch import last_indexes
from gpu_admission.facts.fractional import (
    HAMI_MEMORY_LIMIT,
    NVIDIA_MEM_LIMIT_MB,
    Fraction,
    hami_limit_bytes,
    hami_limit_text,
)
from gpu_admission.facts.other_systems import OtherContainer
from gpu_admission.facts.serving_engines import EngineUse, recognise
from gpu_admission.policy.model import MemoryLimits, NodePool
from gpu_admission.rules.base import Context, GpuContainer

LIMIT: Final = "memory-limit"
UNVERIFIABLE: Final = "memory-limit-unverifiable"

GPU_MEMORY_FRACTION: Final = "GPU_MEMORY_FRACTION"
XLA_CLIENT_MEM_FRACTION: Final = "XLA_CLIENT_MEM_FRACTION"
XLA_PYTHON_CLIENT_MEM_FRACTION: Final = "XLA_PYTHON_CLIENT_MEM_FRACTION"
TF_FORCE_GPU_ALLOW_GROWTH: Final = "TF_FORCE_GPU_ALLOW_GROWTH"
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
#: The variables that carry a fraction of the card (not written when the card is unknown
#: and the share is given in MiB only).
FRACTION_VARS: Final = frozenset({"GPU_MEMORY_FRACTION", "XLA_CLIENT_MEM_FRACTION",
                                  "XLA_PYTHON_CLIENT_MEM_FRACTION"})

#: How a pod that needs more than a share gets it (issue 33: a denial names the way out).
WAY_OUT: Final = ("lower or drop it, or select a dedicated GPU (nodeSelector "
                  "nvidia.com/gpu.sharing-strategy: none, or a sharing: none pool)")
_HAMI_PER_DEVICE = re.compile(r"^CUDA_DEVICE_MEMORY_LIMIT_[0-9]+$")
# "<dev>=<size>" with size like 4096M, 4G, 512MB, 1GiB (binary units; bare number = MiB).
_MPS_ENTRY = re.compile(r"^\s*(\d+)\s*=\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNIT_MIB: Final = {"": 1.0, "k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 1024.0 * 1024}


def format_fraction(value: float) -> str:
    """Round *down* to 3 decimals so the written share never exceeds the allowed one; a
    positive share under 0.001 (a small fractional share of a large card) gets as many
    decimals as it takes not to become 0 (0 would deny the pod's own value)."""
    decimals = 3
    while True:
        scale = 10 ** decimals
        floored = math.floor(value * scale + 1e-9) / scale
        if floored > 0 or value <= 0 or decimals >= 12:
            return f"{floored:.{decimals}f}".rstrip("0").rstrip(".")
        decimals += 1


def _int_ok(limit: int) -> Callable[[str], bool | None]:
    def check(value: str) -> bool | None:
        try:
            number = int(value.strip())
        except ValueError:
            return None
        return 0 < number <= limit
    return check


def _fraction_ok(limit: float) -> Callable[[str], bool | None]:
    def check(value: str) -> bool | None:
        try:
            number = float(value.strip())
        except ValueError:
            return None
        if math.isnan(number):
            return None
        return 0 < number <= limit + 1e-9
    return check


def _true_ok(value: str) -> bool | None:
    return value.strip().lower() == "true"


def _mps_ok(limit_mib: int) -> Callable[[str], bool | None]:
    def check(value: str) -> bool | None:
        entries = [e for e in value.split(",") if e.strip()]
        if not entries:
            return None
        for entry in entries:
            match = _MPS_ENTRY.match(entry)
            if match is None:
                return None
            mib = float(match.group(2)) * _UNIT_MIB[match.group(3).lower()]
            if not 0 < mib <= limit_mib:
                return False
        return True
    return check


Wanted = list[tuple[str, str, Callable[[str], bool | None], str]]  # name, value, check, text


def shares_a_gpu(workload: str, mig: bool, pool: NodePool | None) -> bool:
    """Whether the memory limits apply: not training (never on a shared card), not MIG, and
    the pod's pool is unknown or time-sliced/MPS. The scheduler extender asks the same
    question (``gpu_admission.placement.score``) to decide which pods must fit a share."""
    if workload == "training" or mig:
        return False
    return pool is None or pool.shared  # a dedicated (sharing none) pool: not time-shared


def memory_share(pool: NodePool | None, limits: MemoryLimits) -> tuple[int, float, str]:
    """(MiB, fraction of the card, where it comes from) a container gets on a shared GPU:
    ``memoryMiB // replicasPerGPU`` and ``1/replicasPerGPU`` of its pool, else the policy
    defaults. The value written into ``NVIDIA_MEM_LIMIT_MB``; the extender reads it too."""
    if pool is not None:
        return pool.memory_per_replica_mib, 1 / pool.replicas_per_gpu, f"pool {pool.name}"
    return limits.default_memory_mib, limits.default_fraction, "policy default"


class MemoryLimit:
    ids: tuple[str, ...] = (LIMIT, UNVERIFIABLE)

    #: Memo of :func:`wanted_env` (the env vars, values and checks for a pool/limit set), built
    #: once per policy object instead of per container: closures, f-strings and the
    #: fraction formatting were a third of this rule's cost. Keyed by object identity; the
    #: entry keeps the objects alive, so an id cannot be reused while it is cached.
    _MEMO_MAX = 256

    def __init__(self) -> None:
        # (pool, limits, wanted, source, the names whose written value passes its own check)
        self._memo: dict[tuple[int, int, int],
                         tuple[object, object, Wanted, str, frozenset[str]]] = {}
        # fractional pods: (id(limits), share MiB, card MiB, source, hamiCore) -> wanted
        self._fractional_memo: dict[tuple[int, int, int, str, bool],
                                    tuple[object, Wanted, str]] = {}

    def check(self, ctx: Context) -> None:
        if ctx.fraction is not None:
            self._fractional(ctx, ctx.fraction)
            return
        if not ctx.gpu_containers or not shares_a_gpu(ctx.workload, ctx.mig, ctx.pool):
            return
        pool = ctx.pool
        limits = ctx.policy.spec.memory_limits
        mps = pool is not None and pool.sharing == "mps" and limits.env.mps_pinned_mem_limit
        for gc in ctx.gpu_containers:
            if gc.mig or gc.dra is not None:  # DRA containers: gpu_admission.rules.dra
                continue
            if gc.other is not None:  # another sharing system's share caps ours
                wanted, source = other_wanted(pool, limits, gc.other)
                self.apply_env(ctx, gc, wanted, source)
                if gc.other.fraction is not None and ctx.landing is not None:
                    apply_engine(ctx, gc, gc.other.fraction, source)
                continue
            devices = gc.gpu_count if mps else 0  # only the MPS value depends on the count
            key = (id(pool), id(limits), devices)
            memo = self._memo.get(key)
            if memo is None or memo[0] is not pool or memo[1] is not limits:
                if len(self._memo) >= self._MEMO_MAX:
                    self._memo.clear()
                wanted, source = wanted_env(pool, limits, devices)
                memo = self._memo[key] = (pool, limits, wanted, source, settled_names(wanted))
            self.apply_env(ctx, gc, memo[2], memo[3], memo[4])
            if ctx.landing is not None:  # the card is known from the nodes (see apply_engine)
                apply_engine(ctx, gc, memory_share(pool, limits)[1], memo[3])

    def _fractional(self, ctx: Context, fraction: Fraction) -> None:
        """A fractional pod: the variables sized to its share, HAMi-core's cap if on."""
        limits = ctx.policy.spec.memory_limits
        mib = fraction.share_mib
        hami = ctx.policy.spec.placement.hami_core
        key = (id(limits), mib, fraction.card_mib, fraction.source, hami)
        memo = self._fractional_memo.get(key)
        if memo is None or memo[0] is not limits:
            if len(self._fractional_memo) >= self._MEMO_MAX:
                self._fractional_memo.clear()
            wanted, source = wanted_env(ctx.pool, limits, 0,
                                    share=(mib, fraction.fraction, fraction.source))
            if hami:
                wanted.append((HAMI_MEMORY_LIMIT, hami_limit_text(mib), _hami_ok(mib),
                               f"<= {hami_limit_text(mib)}"))
            memo = self._fractional_memo[key] = (limits, wanted, source)
        wanted, source = memo[1], memo[2]
        for gc in ctx.gpu_containers:
            if gc.mig or gc.dra is not None:
                continue
            self.apply_env(ctx, gc, wanted, source)
            apply_engine(ctx, gc, fraction.fraction, source)
            if hami:
                _per_device(ctx, gc, mib, source)

    @staticmethod
    def apply_env(ctx: Context, gc: GpuContainer,
                  wanted: list[tuple[str, str, Callable[[str], bool | None], str]],
                  source: str, settled: frozenset[str] = frozenset()) -> None:
        """Upsert the ``wanted`` variables of one container (:func:`wanted_env`) and flag a
        value above the limit; public because the DRA rule (:mod:`.dra`) writes alike.
        ``settled`` (:func:`settled_names`): names whose value, when a container already holds
        exactly the one this rule writes (what the validating webhook sees after the mutating
        one), is accepted without parsing it."""
        env = gc.container.get("env")
        if not isinstance(env, list):
            env = []
        positions = last_indexes(env, {w[0] for w in wanted}) if env else {}
        for name, value, ok, expected in wanted:
            i = positions.get(name)
            if i is not None:
                entry = env[i]
                if entry.get("valueFrom") is not None:
                    ctx.violate(UNVERIFIABLE, f"{gc.path}.env[{i}]",
                                f"{name} uses valueFrom; cannot check it is {expected}")
                    continue
                current = entry.get("value")
                if current == value and name in settled:
                    continue  # the value written here, which passes its own check
                if isinstance(current, str) and current.strip():
                    verdict = ok(current)
                    if verdict:
                        continue  # a limit at or below the allowed one: keep it
                    ctx.violate(LIMIT, f"{gc.path}.env[{i}]",
                                f"{name}={current[:20]!r} exceeds the GPU memory allowed on a "
                                f"shared GPU ({source}): must be {expected}; {WAY_OUT}"
                                if verdict is False else
                                f"{name}={current[:20]!r} is not a valid value; expected "
                                f"{expected} ({source})")
                    continue
            if ctx.patch is not None:
                ctx.patch.upsert_env(gc.kind, gc.index, name, value)


def apply_engine(ctx: Context, gc: GpuContainer, fraction: float, source: str) -> None:
    """A serving engine's own memory setting (:mod:`gpu_admission.facts.serving_engines`,
    issue 33), sized to the container's share of the card: upserted like the env vars
    (appended to ``args`` when absent as one ``--flag=value`` element, a lower or equal value
    kept, a higher or unreadable one a ``memory-limit`` violation naming the flag; TGI
    through its variable ``CUDA_MEMORY_FRACTION`` unless the flag is given). An engine the
    webhook cannot set (started from a shell string, or an image whose command it does not
    know) gets a ``memory-limit-unverifiable`` warning naming the flag to add.

    Only where the card is known: a pool read from the nodes (``ctx.landing``) or a
    fractional share. Without visible GPU nodes the policy's default fraction is a guess
    about an unknown card, so engines are left alone (as before issue 33; the compiled
    policies, which see no nodes, agree: docs/serving-engines.md)."""
    use = recognise(gc.container)
    if use is None:
        return
    engine = use.engine
    text = format_fraction(fraction)
    flag = engine.flags[0]
    if use.settings:
        _check_settings(ctx, gc, use, fraction, source=source)
        return
    if engine.env is not None:  # TGI: its variable (a shell string passes the env on too)
        MemoryLimit.apply_env(ctx, gc, [(engine.env, text, _fraction_ok(fraction),
                                         f"<= {text}")], source)
        if not any(f in use.script for f in engine.flags):
            return
    if not use.settable:
        ctx.violate(UNVERIFIABLE, f"{gc.path}.command",
                    f"{engine.name} ({use.why}): add {flag}={text} yourself, its share of "
                    f"the GPU ({source}); the webhook cannot set it")
        return
    if ctx.patch is not None:
        ctx.patch.set_argument(gc.kind, gc.index, "args", None, f"{flag}={text}")


def _check_settings(ctx: Context, gc: GpuContainer, use: EngineUse, fraction: float, *,
                    source: str) -> None:
    ok = _fraction_ok(fraction)
    text = format_fraction(fraction)
    for setting in use.settings:
        path = f"{gc.path}.{setting.field}[{setting.index}]"
        name = setting.flag
        value = setting.value or ""
        verdict = ok(value) if value else None
        if verdict:
            continue
        if verdict is False:
            ctx.violate(LIMIT, path,
                        f"{name}={value[:20]!r} ({use.engine.name}) exceeds the GPU memory "
                        f"allowed on a shared GPU ({source}): must be <= {text}; {WAY_OUT}")
        else:
            ctx.violate(LIMIT, path,
                        f"{name} ({use.engine.name}) has no valid value "
                        f"({str(value)[:20]!r}); expected <= {text} ({source})")


def settled_names(wanted: Wanted) -> frozenset[str]:
    """The names of ``wanted`` whose written value passes its own check (a pool whose share
    rounds to 0 writes a value its check refuses: that name keeps the full check). The
    compiled policies ask it for every pool at compile time (compile/rules/memory.py)."""
    return frozenset(name for name, value, ok, _ in wanted if ok(value) is True)


def other_wanted(pool: NodePool | None, limits: MemoryLimits,
                 other: OtherContainer) -> tuple[Wanted, str]:
    """The variables for a container whose share another sharing system grants (KAI, HAMi;
    :mod:`gpu_admission.facts.other_systems`): exactly that share, never more, and a variable
    whose value is not known (the MiB of a fraction on an unknown card) is not written."""
    source = other.why
    wanted, _ = wanted_env(pool, limits, 0,
                           (other.memory_mib or 0, other.fraction or 0.0, source))
    skip = set()
    if other.memory_mib is None:
        skip.add(NVIDIA_MEM_LIMIT_MB)
    if other.fraction is None:
        skip.update(FRACTION_VARS)
    return [w for w in wanted if w[0] not in skip], source


def _hami_ok(limit_mib: int) -> Callable[[str], bool | None]:
    def check(value: str) -> bool | None:
        size = hami_limit_bytes(value)
        return None if size is None else size <= limit_mib * 2**20
    return check


def _per_device(ctx: Context, gc: GpuContainer, mib: int, source: str) -> None:
    """HAMi-core reads ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` before the global value: one above
    the share (or 0 = unlimited, or unreadable) would undo the cap."""
    env = gc.container.get("env")
    ok = _hami_ok(mib)
    for i, entry in enumerate(env if isinstance(env, list) else ()):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not _HAMI_PER_DEVICE.match(name):
            continue
        path = f"{gc.path}.env[{i}]"
        value = entry.get("value")
        if entry.get("valueFrom") is not None:
            ctx.violate(UNVERIFIABLE, path,
                        f"{name} uses valueFrom; cannot check it is <= {hami_limit_text(mib)}")
        elif not isinstance(value, str) or not ok(value):
            ctx.violate(LIMIT, path,
                        f"{name}={str(value)[:20]!r} overrides HAMi-core's cap; must be "
                        f"<= {hami_limit_text(mib)} ({source})")


def wanted_env(pool: NodePool | None, limits: MemoryLimits, devices: int,
               share: tuple[int, float, str] | None = None) -> tuple[Wanted, str]:
    """The env vars a container on ``pool`` (None: unknown pool) must have, with the value
    we set, the check of a value already there, and the expected value for messages; and
    where the limit comes from. ``devices`` > 0: also the MPS per-device limit. ``share``
    (MiB, fraction, source) overrides :func:`memory_share` (DRA MPS claims, rules/dra.py)."""
    mem_mib, fraction, source = share or memory_share(pool, limits)
    fraction_text = format_fraction(fraction)
    switches = limits.env
    wanted: Wanted = []
    if switches.nvidia_mem_limit_mb:
        wanted.append((NVIDIA_MEM_LIMIT_MB, str(mem_mib), _int_ok(mem_mib),
                       f"<= {mem_mib} (MiB)"))
    if switches.gpu_memory_fraction:
        wanted.append((GPU_MEMORY_FRACTION, fraction_text, _fraction_ok(fraction),
                       f"<= {fraction_text}"))
    if switches.jax_mem_fraction:
        for name in (XLA_CLIENT_MEM_FRACTION, XLA_PYTHON_CLIENT_MEM_FRACTION):
            wanted.append((name, fraction_text, _fraction_ok(fraction), f"<= {fraction_text}"))
    if switches.tf_allow_growth:
        wanted.append((TF_FORCE_GPU_ALLOW_GROWTH, "true", _true_ok, "true"))
    if devices:
        value = ",".join(f"{d}={mem_mib}M" for d in range(devices))
        wanted.append((CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, value, _mps_ok(mem_mib),
                       f"<= {mem_mib}M per device"))
    return wanted, source
