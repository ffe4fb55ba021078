"""Placement decisions of the ``gpu-aware-scheduler`` extender. PURE: a pod dict, node names,
a GPU :class:`~gpu_admission.placement.gpus.Snapshot` (None = no usable metrics) and the
policy in; a filter result or scores out. No I/O, no clock.

What the pod is comes from the webhook's own engine
(:func:`gpu_admission.admission.pod.analyse_gpu_pod`: GPU containers, workload class, node
pool) and its memory rule
(:func:`gpu_admission.rules.memory.shares_a_gpu`, :func:`~gpu_admission.rules.memory.memory_share`),
so the extender reserves exactly the share the webhook writes into ``NVIDIA_MEM_LIMIT_MB``.

* **shared** (the memory rule applies): the pod needs room for its share plus
  ``spec.placement.memoryHeadroomMiB`` on the GPU it will get. The scheduler picks a node;
  inside it the NVIDIA device plugin picks the GPU (:func:`predicted_gpus`). ``memoryFit``
  says which GPUs must have that room: ``any`` (default) some GPU, ``every`` all of them,
  ``predicted`` the ones the device plugin may pick. Nodes without room are filtered out with
  a reason naming the numbers. Nodes are scored with scheduler-plugins TargetLoadPacking's
  curve (``pkg/trimaran/targetloadpacking/targetloadpacking.go``, ``Score``) applied to the
  SM utilisation of a GPU predicted with the pod (current + the pod's GPU share), not to
  host CPU: for ``predicted`` the GPU the pod will get, otherwise the best-fitting one.
* **whole** (training, or a ``sharing: none`` pool): nodes with enough idle GPUs score 10.
* **mig** pods and pods without GPU resources: neutral (every node passes, equal scores).

Scores are 0..10, the extender protocol's ``MaxExtenderPriority``
(``k8s.io/kube-scheduler/extender/v1/types.go``); kube-scheduler multiplies them by the
extender's ``weight`` x 10. A node with no metrics is never filtered and scores
:data:`NEUTRAL_SCORE`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from gpu_admission.admission.pod import analyse_gpu_pod
from gpu_admission.facts.fractional import NVIDIA_MEM_LIMIT_MB
from gpu_admission.placement.gpus import Gpu, Snapshot
from gpu_admission.policy.model import Placement, Policy
from gpu_admission.rules.base import GpuContainer
from gpu_admission.rules.memory import memory_share, shares_a_gpu

MAX_SCORE: Final = 10  # extender/v1 MaxExtenderPriority
NEUTRAL_SCORE: Final = 5  # no information: the middle, so it neither wins nor loses
MAX_NODE_SCORE: Final = 100  # framework.MaxNodeScore, the scale of TargetLoadPacking's curve
MEMO_MAX: Final = 64  # distinct demands whose node scores a snapshot keeps

DemandKind = Literal["none", "shared", "whole", "mig"]


@dataclass(frozen=True, slots=True)
class Demand:
    """What a pod needs from a node's GPUs."""

    kind: DemandKind
    memory_mib: int = 0  # shared: GPU memory the pod may use, MiB (NVIDIA_MEM_LIMIT_MB)
    source: str = ""  # shared: where memory_mib comes from (env, pool, policy default)
    # shared: the pod's predicted SM utilisation, % (its GPU share: 100 x the fraction the
    # webhook writes into GPU_MEMORY_FRACTION), added to a GPU's before scoring it
    share_percent: float = 0.0
    gpus: int = 0  # whole: GPUs the pod occupies at once
    workload: str = ""


NO_GPU: Final = Demand("none")


def _env_limit(gc: GpuContainer) -> int | None:
    """The container's own NVIDIA_MEM_LIMIT_MB (MiB), when it is a plain positive integer."""
    env = gc.container.get("env")
    if not isinstance(env, list):
        return None
    for entry in env:
        if isinstance(entry, dict) and entry.get("name") == NVIDIA_MEM_LIMIT_MB:
            value = entry.get("value")
            if isinstance(value, str) and value.strip().isdigit() and int(value) > 0:
                return int(value)
            return None
    return None


def _pod_total(per_container: Iterable[tuple[GpuContainer, int]]) -> int:
    """A pod's effective amount, as Kubernetes computes effective requests: init containers
    run one at a time before the app containers, so max(sum(app), max(init))
    (https://kubernetes.io/docs/concepts/workloads/pods/init-containers/#resource-sharing-within-containers)."""
    app = init = 0
    for gc, amount in per_container:
        if gc.kind == "initContainers":
            init = max(init, amount)
        else:
            app += amount
    return max(app, init)


def pod_demand(pod: Mapping[str, Any], policy: Policy) -> Demand:
    """Classify the pod with the webhook's engine and compute its need."""
    facts = analyse_gpu_pod(pod, policy)
    if facts is None:
        return NO_GPU
    if facts.mig:
        return Demand("mig", workload=facts.workload)
    if shares_a_gpu(facts.workload, facts.mig, facts.pool):
        mem_mib, fraction, source = memory_share(facts.pool, policy.spec.memory_limits)
        amounts: list[tuple[GpuContainer, int]] = []
        sources = set()
        for gc in facts.containers:
            own = _env_limit(gc)
            amounts.append((gc, own if own is not None else mem_mib))
            sources.add(f"env {NVIDIA_MEM_LIMIT_MB}" if own is not None else source)
        return Demand("shared", memory_mib=_pod_total(amounts),
                      source=", ".join(sorted(sources)), share_percent=100 * fraction,
                      workload=facts.workload)
    gpus = _pod_total((gc, gc.gpu_count) for gc in facts.containers)
    return Demand("whole", gpus=gpus, workload=facts.workload)


def target_load_packing(util_percent: float, target_percent: int) -> int:
    """TargetLoadPacking's score (0..100) for a predicted utilisation ``util_percent`` (%)
    and target ``target_percent`` (%): rising linearly from ``target`` at 0 % to 100 at the
    target, then falling from ``target`` to 0 at 100 % (a penalty above the target); 0 above
    100 %. Same formula and rounding (``math.Round``: half away from zero) as upstream."""
    u, t = util_percent, float(target_percent)
    if u > t:
        if u > 100 or t >= 100:
            return 0
        return _round_half_away(t * (100 - u) / (100 - t))
    return _round_half_away((100 - t) * u / t + t)


def _round_half_away(value: float) -> int:
    return int(value + 0.5) if value >= 0 else -int(-value + 0.5)


def round_half_away(value: float) -> int:
    """Go's ``math.Round`` (half away from zero), as kube-scheduler's scores round."""
    return _round_half_away(value)


def to_extender_score(node_score: int) -> int:
    """0..100 -> 0..10 (MaxNodeScore / MaxExtenderPriority), rounded, clamped."""
    return max(0, min(MAX_SCORE, _round_half_away(node_score * MAX_SCORE / MAX_NODE_SCORE)))


def is_idle(gpu: Gpu, placement: Placement) -> bool:
    """An idle GPU: SM utilisation strictly under ``idleBelowPercent`` (the seed article's
    alert "under 10 %", the same ``<`` as ``gpu-admission report``) and no more framebuffer
    in use than the headroom (a card holding a resident model is not free for training)."""
    return (gpu.util_percent < placement.idle_below_percent
            and gpu.fb_used_mib <= placement.memory_headroom_mib)


def predicted_gpus(gpus: tuple[Gpu, ...]) -> tuple[Gpu, ...]:
    """The GPUs of a node the NVIDIA device plugin may give a one-replica pod.

    With time-slicing the kubelet asks the plugin for a preferred allocation and the plugin's
    ``distributed`` policy (the default) takes the GPU with the fewest replicas allocated
    (NVIDIA/k8s-device-plugin ``internal/rm/allocate.go``: ``distributedAlloc``, now the
    ``AllocationPolicyDistributed`` comparator of ``greedyAlloc``). Ties are not broken by
    anything we can see: the old code sorts candidates from a Go map with the unstable
    ``sort.Slice``, the new one orders equal GPUs by ``pickedFrom`` (0 for all of them in a
    one-replica request) and then by heap order built from a Go map, whose iteration order
    is random. So every GPU with the fewest pods is a possible pick, and all of them are
    returned. Replicas allocated = :attr:`Gpu.pods` (distinct pods in the exporter's labels).

    Accuracy: exact with ``KUBERNETES_VIRTUAL_GPUS=true`` (one series copy per pod). In the
    exporter's default mode a GPU shows at most one pod, so counts are 0 (exact) or 1 (at
    least one): while a node has a GPU without pods the prediction is still exact (those
    GPUs, count 0, are the candidates); once every GPU holds a pod they all tie, and
    ``predicted`` asks them all for room, as ``every`` does."""
    fewest = min(g.pods for g in gpus)
    return tuple(g for g in gpus if g.pods == fewest)


@dataclass(frozen=True, slots=True)
class FilterResult:
    passed: list[str]
    failed: dict[str, str]  # node -> reason (ExtenderFilterResult.FailedNodes)
    neutral: str = ""  # why every node passed without looking, e.g. "no GPU request"


def neutral_reason(demand: Demand, snapshot: Snapshot | None) -> str:
    """Why this pod gets a neutral answer, or "" when it is decided on metrics."""
    if demand.kind == "none":
        return "no_gpu_request"
    if demand.kind == "mig":
        return "mig"
    if snapshot is None:
        return "metrics_stale"
    return ""


def filter_nodes(demand: Demand, names: list[str], snapshot: Snapshot | None,
                 placement: Placement) -> FilterResult:
    """Shared-GPU pods: drop nodes none of whose GPUs has the pod's share + headroom free.
    Nodes without metrics pass; everything passes for a neutral pod or stale metrics."""
    reason = neutral_reason(demand, snapshot)
    if reason or demand.kind != "shared" or snapshot is None:
        return FilterResult(list(names), {}, reason)
    need = demand.memory_mib + placement.memory_headroom_mib
    fit = placement.memory_fit
    every = fit == "every"
    passed: list[str] = []
    failed: dict[str, str] = {}
    for name in names:
        gpus = snapshot.nodes.get(name)
        if not gpus or node_fits(gpus, need, fit):
            passed.append(name)  # no data: never filtered for lack of it
            continue
        what = (f"{need} MiB free ({demand.memory_mib} MiB share + "
                f"{placement.memory_headroom_mib} MiB headroom)")
        best = max(gpus, key=lambda g: g.fb_free_mib)
        if best.fb_free_mib < need:  # no GPU at all has room, whatever memoryFit says
            failed[name] = (f"no GPU with {what}: best {int(best.fb_free_mib)} MiB on GPU "
                            f"{best.index or best.uuid}")
        elif fit == "predicted":
            picks = predicted_gpus(gpus)
            worst = min(picks, key=lambda g: g.fb_free_mib)
            which = (f"GPU {worst.index or worst.uuid}" if len(picks) == 1 else
                     f"GPU {worst.index or worst.uuid} (one of {len(picks)} tied)")
            failed[name] = (f"the GPU the device plugin will pick (fewest pods: "
                            f"{worst.pods}) lacks {what}: {which} has "
                            f"{int(worst.fb_free_mib)} MiB (memoryFit: predicted)")
        elif every:
            worst = min(gpus, key=lambda g: g.fb_free_mib)
            failed[name] = (f"not every GPU has {what}: GPU {worst.index or worst.uuid} has "
                            f"{int(worst.fb_free_mib)} MiB (memoryFit: every)")
    return FilterResult(passed, failed)


def node_fits(gpus: tuple[Gpu, ...], need_mib: int, fit: str) -> bool:
    """Whether the node has room for ``need_mib`` (MiB) per ``memoryFit``: on every GPU the
    device plugin may pick (``predicted``), on any GPU, or on every GPU."""
    if fit == "predicted":
        return all(g.fb_free_mib >= need_mib for g in predicted_gpus(gpus))
    if fit == "every":
        return all(g.fb_free_mib >= need_mib for g in gpus)
    return any(g.fb_free_mib >= need_mib for g in gpus)


def _shared_score(below: float, above: float, target: int) -> int:
    """0..10 from the busiest fitting GPU at or below the target (``below``, -1: none) and
    the least busy one above it (``above``, 1000: none)."""
    if below < 0 and above == 1000.0:
        return 0  # no GPU fits
    best = max(target_load_packing(below, target) if below >= 0 else 0,
               target_load_packing(above, target) if above < 1000.0 else 0)
    return to_extender_score(best)


def node_score(demand: Demand, gpus: tuple[Gpu, ...] | None, placement: Placement) -> int:
    """0..10 for one node (NEUTRAL_SCORE without metrics).

    Shared pods: like TargetLoadPacking, which scores the node's utilisation *predicted*
    with the pod (its CPU limit, ``PredictUtilisation``), each fitting GPU is scored at its
    SM utilisation plus the pod's GPU share (``share_percent``); the node gets the best
    GPU's score. The curve rises up to the target and falls above it, so the best GPU is
    the busiest one predicted at or below the target or the least busy one above it: one
    pass over the GPUs and two curve evaluations per node."""
    if not gpus:
        return NEUTRAL_SCORE
    if demand.kind == "shared":
        need = demand.memory_mib + placement.memory_headroom_mib
        target = placement.target_utilization_percent
        fit = placement.memory_fit
        if fit != "any" and not node_fits(gpus, need, fit):
            return 0
        if fit == "predicted":
            # the pod lands on one of these, any of them: score the worst case
            return to_extender_score(min(predicted_score(g, demand, need, target)
                                         for g in predicted_gpus(gpus)))
        below, above = -1.0, 1000.0
        for g in gpus:
            if g.fb_free_mib >= need:
                u = g.util_percent + demand.share_percent
                if u <= target:
                    below = max(below, u)
                elif u < above:
                    above = u
        return _shared_score(below, above, target)
    if demand.kind == "whole":
        idle = sum(1 for g in gpus if is_idle(g, placement))
        need_gpus = max(demand.gpus, 1)
        return min(MAX_SCORE, MAX_SCORE * idle // need_gpus)
    return NEUTRAL_SCORE


def predicted_score(gpu: Gpu, demand: Demand, need_mib: int, target: int) -> int:
    """0..100 for the GPU a shared pod will get (``memoryFit: predicted``): the mean of
    TargetLoadPacking's curve at its utilisation + the pod's share (pack towards the target)
    and a best fit on memory, ``100 x (1 - leftover / card)`` with leftover = free MiB after
    the pod's share + headroom and card = used + free MiB (a tight fit leaves the roomy GPUs
    to the big pods that come later). The device plugin fills a node's GPUs in turn, so a pod
    that fits no open node opens a GPU elsewhere; in the benchmark best fit alone stacks busy
    GPUs past 100 %, the curve alone opens more GPUs on 2 of 10 seeds (docs/extender.md)."""
    curve = target_load_packing(gpu.util_percent + demand.share_percent, target)
    card = gpu.fb_used_mib + gpu.fb_free_mib
    tight = 100 * (1 - (gpu.fb_free_mib - need_mib) / card) if card > 0 else 0.0
    return _round_half_away((curve + tight) / 2)


def score_nodes(demand: Demand, names: list[str], snapshot: Snapshot | None,
                placement: Placement) -> list[tuple[str, int]]:
    """(node, 0..10) for every node, in request order (a HostPriorityList)."""
    if neutral_reason(demand, snapshot) or snapshot is None:
        return [(name, NEUTRAL_SCORE) for name in names]
    key = (demand.kind, demand.memory_mib, demand.share_percent, demand.gpus, placement)
    table = snapshot.score_memo.get(key)
    if table is None:
        if len(snapshot.score_memo) >= MEMO_MAX:
            snapshot.score_memo.clear()
        table = snapshot.score_memo[key] = {
            node: node_score(demand, gpus, placement) for node, gpus in snapshot.nodes.items()}
    get = table.get
    return [(name, get(name, NEUTRAL_SCORE)) for name in names]
