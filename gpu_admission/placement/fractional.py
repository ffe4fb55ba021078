"""Placement of fractional pods (``sharing: fractional`` pools). PURE: the ledger's
:class:`~gpu_admission.placement.ledger.NodeView`, the pool, the placement settings and DCGM
utilisation in; a GPU choice, a filter result or scores out. No I/O, no clock.

One rule serves filter, prioritize and bind (so the node kube-scheduler picks is one where
bind finds the GPU the scores promised):

* a GPU **fits** when its free memory (the pool's ``memoryMiB``, the card, minus the shares
  given out) is at least the pod's share + ``memoryHeadroomMiB``; an open GPU (one with a
  reservation pod) or a GPU the node can still open (a whole ``nvidia.com/gpu`` free);
* among fitting GPUs the best **score** wins (0..100): the mean of scheduler-plugins
  TargetLoadPacking's curve at the GPU's DCGM SM utilisation + the pod's share of the card
  (:func:`~gpu_admission.placement.score.target_load_packing`, towards
  ``targetUtilizationPercent``) and a best fit on memory, ``100 x (1 - leftover / card)``
  (the tightest fit leaves roomy GPUs for big pods; Alibaba gpushare's rule); 0 when the
  predicted utilisation passes 100 % (it still fits, as a last resort). Without metrics for a
  GPU the memory fit alone decides. Ties: an open GPU before a new one, then by id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpu_admission.placement.gpus import Snapshot
from gpu_admission.placement.ledger import NodeView, is_fractional_pod, parse_mib
from gpu_admission.placement.score import (
    FilterResult,
    round_half_away,
    target_load_packing,
    to_extender_score,
)
from gpu_admission.policy.model import NodePool, Placement, Policy
from gpu_admission.vocab import GPU_CONFIGMAP_ANNOTATION, GPU_MEMORY_ANNOTATION

NEW_GPU: Final = ""  # Choice.gpu_id of a GPU to open


def fractional_share(pod: Mapping[str, Any]) -> int | None:
    """The pod's share (MiB) when it is a fractional pod, else None."""
    if not is_fractional_pod(pod):
        return None
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return parse_mib(annotations.get(GPU_MEMORY_ANNOTATION))


def fractional_error(pod: Mapping[str, Any]) -> str:
    """Why a pod that names a GPU ConfigMap is not a valid fractional pod ("" when it is, or
    when it names none): its share annotation must be a positive integer (MiB)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if not annotations.get(GPU_CONFIGMAP_ANNOTATION):
        return ""
    value = annotations.get(GPU_MEMORY_ANNOTATION)
    if parse_mib(value) is None:
        return (f"annotation {GPU_MEMORY_ANNOTATION}: expected a positive integer (MiB), got "
                f"{value!r}")
    return ""


def node_pool(labels: Mapping[str, str] | None, policy: Policy) -> NodePool | None:
    """The fractional pool a node belongs to: every nodeSelector label of the pool on the
    node (the first such pool in policy order)."""
    if not labels:
        return None
    for pool in policy.spec.node_pools:
        if pool.fractional and all(labels.get(k) == v for k, v in pool.node_selector.items()):
            return pool
    return None


@dataclass(frozen=True, slots=True)
class Choice:
    gpu_id: str  # an open GPU's id (UUID or opening:<reservation>), or NEW_GPU
    score: int  # 0..100
    free_mib: int  # free before the pod, MiB


def gpu_score(free_mib: int, need_mib: int, card_mib: int, util: float | None, *,
              share_percent: float, target: int) -> int:
    """0..100 for one GPU (MiB: free before the pod, share + headroom, the card; util: DCGM
    SM %, None without metrics; share_percent: the pod's share of the card, %)."""
    tight = 100 * (1 - (free_mib - need_mib) / card_mib) if card_mib > 0 else 0.0
    if util is None:
        return round_half_away(tight)
    if util + share_percent > 100:
        # predicted past the card's compute: TargetLoadPacking gives 0, and a tight memory
        # fit must not win it back (the pod would slow every tenant of a saturated GPU)
        return 0
    return round_half_away((target_load_packing(util + share_percent, target) + tight) / 2)


def options(view: NodeView, card_mib: int, share_mib: int, placement: Placement,
            util: Mapping[str, float] | None = None) -> list[Choice]:
    """Every GPU of the node the pod fits on, best first."""
    need = share_mib + placement.memory_headroom_mib
    share_percent = 100 * share_mib / card_mib
    target = placement.target_utilization_percent
    out = []
    for g in view.open:
        free = card_mib - g.used_mib
        if free >= need:
            u = util.get(g.uuid) if util is not None and g.uuid else None
            out.append(Choice(g.gpu_id, gpu_score(free, need, card_mib, u,
                                                  share_percent=share_percent,
                                                  target=target), free))
    if view.free_whole > 0 and card_mib >= need:
        out.append(Choice(NEW_GPU, gpu_score(card_mib, need, card_mib,
                                             0.0 if util is not None else None,
                                             share_percent=share_percent, target=target),
                          card_mib))
    out.sort(key=lambda c: (-c.score, c.gpu_id == NEW_GPU, c.gpu_id))
    return out


def choose(view: NodeView, card_mib: int, share_mib: int, placement: Placement,
           util: Mapping[str, float] | None = None) -> Choice | None:
    """The GPU bind gives the pod on this node, or None when nothing fits."""
    best = options(view, card_mib, share_mib, placement, util)
    return best[0] if best else None


def no_fit_reason(view: NodeView, card_mib: int, share_mib: int, placement: Placement) -> str:
    """Why no GPU of the node fits, with the numbers (MiB)."""
    need = share_mib + placement.memory_headroom_mib
    what = (f"no GPU with {need} MiB free ({share_mib} MiB share + "
            f"{placement.memory_headroom_mib} MiB headroom, card {card_mib} MiB)")
    if view.open:
        best = min(view.open, key=lambda g: g.used_mib)
        opened = (f"best open GPU {best.uuid or best.gpu_id} has {card_mib - best.used_mib} "
                  f"MiB free of {len(view.open)} open")
    else:
        opened = "no open GPU"
    return (f"{what}: {opened}; {view.free_whole} whole GPUs free to open "
            f"({view.allocatable_gpus} allocatable, {view.whole_pod_gpus} held by whole-GPU "
            f"pods, {view.reservations} by reservations)")


def node_utilisation(snapshot: Snapshot | None, node: str) -> dict[str, float] | None:
    """GPU UUID -> DCGM SM utilisation (%) of a node, None without fresh metrics."""
    if snapshot is None:
        return None
    gpus = snapshot.nodes.get(node)
    return {g.uuid: g.util_percent for g in gpus} if gpus else {}


def filter_fractional(share_mib: int, names: list[str], views: Mapping[str, NodeView],
                      labels: Mapping[str, Mapping[str, str]], policy: Policy) -> FilterResult:
    """Nodes where some GPU fits (open or to open); the others with a reason."""
    placement = policy.spec.placement
    passed: list[str] = []
    failed: dict[str, str] = {}
    for name in names:
        pool = node_pool(labels.get(name), policy)
        if pool is None:
            failed[name] = ("not in a fractional node pool (no spec.nodePools[] with sharing: "
                            "fractional whose nodeSelector matches the node's labels)")
            continue
        view = views[name]
        if options(view, pool.memory_mib, share_mib, placement):
            passed.append(name)
        else:
            failed[name] = no_fit_reason(view, pool.memory_mib, share_mib, placement)
    return FilterResult(passed, failed)


def score_fractional(share_mib: int, names: list[str], views: Mapping[str, NodeView],
                     labels: Mapping[str, Mapping[str, str]], policy: Policy, *,
                     snapshot: Snapshot | None) -> list[tuple[str, int]]:
    """(node, 0..10): the score of the GPU bind would choose there; 0 where nothing fits."""
    placement = policy.spec.placement
    out = []
    for name in names:
        pool = node_pool(labels.get(name), policy)
        best = (choose(views[name], pool.memory_mib, share_mib, placement,
                       node_utilisation(snapshot, name)) if pool is not None else None)
        out.append((name, to_extender_score(best.score) if best is not None else 0))
    return out
