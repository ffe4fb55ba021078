"""Placement of fractional pods (``sharing: fractional`` pools). PURE: the ledger's
:class:`~gpu_admission.placement.ledger.NodeView`, the pool and the placement settings in; a
GPU choice, a filter result or scores out. No I/O, no clock.

One rule serves filter, prioritize and bind (so the node kube-scheduler picks is one where
bind finds the GPU the scores promised), and ``gpu-admission simulate`` runs it too:

* a GPU **fits** when its free memory (the pool's ``memoryMiB``, the card, minus the shares
  given out) is at least the pod's share + ``memoryHeadroomMiB``; an open GPU (one with a
  reservation pod) or a GPU the node can still open (a whole ``nvidia.com/gpu`` free);
* among the nodes and GPUs that fit, the one adding the least **fragmentation** against the
  workload the extender has seen wins (:mod:`gpu_admission.placement.frag`: FGD's measure,
  USENIX ATC '23, with memory counted and a learned workload); ties go to the tightest fit.
  Prioritize gives the best nodes 10 and the others 1..9 (:func:`spread`); the shipped
  weight makes one level outweigh every in-tree plugin (docs/extender.md, Resolution).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from gpu_admission.core.vocab import GPU_CONFIGMAP_ANNOTATION, GPU_MEMORY_ANNOTATION
from gpu_admission.placement.frag import (
    MILLI,
    OURS,
    FragCache,
    IntArray,
    Nodes,
    Ranking,
    Shape,
    Typical,
    Workload,
    rank,
    typical_arrays,
)
from gpu_admission.placement.gpus import Snapshot
from gpu_admission.placement.ledger import NodeView, is_fractional_pod, parse_mib
from gpu_admission.placement.score import (
    FilterResult,
)
from gpu_admission.policy.model import NodePool, Placement, Policy

NEW_GPU: Final = ""  # Choice.gpu_id of a GPU to open
#: the learned workload's typical shapes are re-read every this many observed pods
REFRESH_EVERY: Final = 256


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
    node (the first such pool in policy order). Not remembered (bind and the metrics ask
    for one node at a time; a ranking over many nodes asks :meth:`Placer.pools`)."""
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


def card_milli(free_mib: int, card_mib: int) -> int:
    """Free MiB of a card as milli-GPU, rounded down (a share never looks smaller)."""
    return max(0, free_mib) * MILLI // card_mib


def need_milli(mib: int, card_mib: int) -> int:
    """MiB asked of a card as milli-GPU, rounded up (so the MiB always fit)."""
    return -(-mib * MILLI // card_mib)


def node_state(views: list[NodeView], card_mib: list[int]) -> tuple[Nodes, list[list[str]]]:
    """The ledger's nodes as arrays (milli-GPU per card: open GPUs, then whole GPUs still
    free to open) and each card's GPU id. CPU and memory are not on the ledger: unlimited
    here (the simulator counts them; docs/extender.md, Limits)."""
    gpus: list[list[int]] = []
    ids: list[list[str]] = []
    for view, card in zip(views, card_mib, strict=True):
        gpus.append([card_milli(card - g.used_mib, card) for g in view.open]
                    + [MILLI] * view.free_whole)
        ids.append([g.gpu_id for g in view.open] + [NEW_GPU] * view.free_whole)
    big = 2**40
    return Nodes.build([v.name for v in views], [""] * len(views), [big] * len(views),
                       [big] * len(views), gpus), ids


@dataclass
class Registry:
    """Every node the extender has ranked, as frag arrays kept between requests: a row is
    rebuilt only when the ledger hands out a new :class:`NodeView` for the node (the ledger
    caches a node's view until something on it changes), and the fragmentation cache is
    updated for those rows only. So a request over 1,213 nodes costs the ranking itself."""

    index: dict[str, int] = field(default_factory=dict)
    keys: list[tuple[NodeView, int]] = field(default_factory=list)
    nodes: Nodes | None = None
    cache: FragCache | None = None
    #: bumped whenever a row, the node set or the cache changes: a ranking computed at one
    #: generation holds for the next request at the same generation (prioritize after filter)
    generation: int = 0

    def arrays(self, views: list[NodeView], cards: list[int], typ: Typical,
               resources: list[tuple[int, int] | None] | None = None
               ) -> tuple[Nodes, FragCache, IntArray]:
        """The arrays for ``views`` (rows into them), up to date. ``resources``: each
        node's free (milli-CPU, MiB), None to keep what the last request said (bind)."""
        index, keys = self.index, self.keys
        changed: list[tuple[int, list[int]]] = []
        rebuild = self.nodes is None
        width = self.nodes.gpu.shape[1] if self.nodes is not None else 1
        for view, card in zip(views, cards, strict=True):
            row = index.get(view.name)
            if row is None:
                rebuild = True
                continue
            key = keys[row]
            if key[0] is not view or key[1] != card:
                keys[row] = (view, card)
                gpus, _ = _cards(view, card)
                rebuild = rebuild or len(gpus) > width
                changed.append((row, gpus))
        if rebuild:
            self._grow(views, cards)
        nodes = self.nodes
        assert nodes is not None
        for row, gpus in changed:
            nodes.gpu[row] = -1
            nodes.gpu[row, :len(gpus)] = gpus
        rows = np.array([index[v.name] for v in views], dtype=np.int64)
        dirty = {r for r, _ in changed}
        if resources is not None:
            cpu = np.array([r[0] if r is not None else UNLIMITED for r in resources],
                           dtype=np.int64)
            mem = np.array([r[1] if r is not None else UNLIMITED for r in resources],
                           dtype=np.int64)
            moved = rows[(nodes.cpu[rows] != cpu) | (nodes.mem[rows] != mem)]
            nodes.cpu[rows] = cpu
            nodes.mem[rows] = mem
            dirty.update(moved.tolist())
        if self.cache is None or self.cache.typ is not typ:
            self.cache = FragCache.build(nodes, typ)
            self.generation += 1
        elif dirty:
            self.cache.update(nodes, np.array(sorted(dirty), dtype=np.int64))
            self.generation += 1
        elif rebuild:
            self.generation += 1
        return nodes, self.cache, rows

    def _grow(self, views: list[NodeView], cards: list[int]) -> None:
        for v, c in zip(views, cards, strict=True):
            if v.name not in self.index:
                self.index[v.name] = len(self.keys)
                self.keys.append((v, c))
            else:
                self.keys[self.index[v.name]] = (v, c)
        names = list(self.index)
        gpus = [_cards(*self.keys[i])[0] for i in range(len(names))]
        width = max((len(g) for g in gpus), default=1) or 1
        old = self.nodes
        cpu = [UNLIMITED] * len(names)
        mem = [UNLIMITED] * len(names)
        if old is not None:  # keep what requests said about the nodes already known
            for i, name in enumerate(old.names):
                cpu[i], mem[i] = int(old.cpu[i]), int(old.mem[i])
                assert names[i] == name
        self.nodes = Nodes.build(names, [""] * len(names), cpu, mem,
                                 [g + [-1] * (width - len(g)) for g in gpus])
        self.cache = None


UNLIMITED: Final = 2**40  # CPU/memory of a node nothing is known about (milli-CPU, MiB)


def _cards(view: NodeView, card_mib: int) -> tuple[list[int], list[str]]:
    """A node's cards in milli-GPU (open GPUs, then whole GPUs free to open) and their ids."""
    return ([card_milli(card_mib - g.used_mib, card_mib) for g in view.open]
            + [MILLI] * view.free_whole,
            [g.gpu_id for g in view.open] + [NEW_GPU] * view.free_whole)


@dataclass(frozen=True, slots=True)
class RankMemo:
    """The last ranking of a placer, in registry rows: for which pod, at which registry
    generation and shapes, over which rows (``evaluated``, a mask over registry rows)."""

    key: tuple[int, int, tuple[int, int], int]  # share MiB, headroom MiB, pod, generation
    typ: Typical
    evaluated: npt.NDArray[np.bool_]
    ranking: Ranking  # rows: registry rows


#: a node's labels object, the policy and the fractional pool they select
PoolEntry = tuple[Mapping[str, str] | None, Policy, NodePool | None]


@dataclass
class Placer:
    """Everything fractional placement remembers between requests, held by whoever places
    (the extender's ``create_app`` makes one and keeps it in its state for filter,
    prioritize and bind; each test or benchmark makes its own). Nothing of it is
    process-wide, so two extenders or two replays in one process never see each other's
    workload (project rule: state passed explicitly).

    * ``workload``: the shapes of the fractional pods asked about (filter observes each pod
      once per scheduling attempt), which the fragmentation is measured against; its typical
      shapes are re-read every :data:`REFRESH_EVERY` observations, so filter, prioritize and
      bind of one pod rank against the same shapes (the card bind takes is the one the
      ranking promised);
    * ``registry``: the nodes' arrays between requests (:class:`Registry`);
    * ``pool_cache``: node name -> (its labels object, policy, pool): one lookup and two
      identity checks per node and request (the watch replaces a node's labels object when
      they change) instead of matching every selector."""

    workload: Workload = field(default_factory=Workload)
    registry: Registry = field(default_factory=Registry)
    pool_cache: dict[str, PoolEntry] = field(default_factory=dict)
    #: reuse the last ranking when the same pod (share, CPU, memory, headroom) is ranked
    #: again on unchanged arrays: kube-scheduler calls prioritize right after filter
    reuse: bool = True
    last: RankMemo | None = None
    _typ: Typical | None = None
    _typ_seen: int = -1

    def typical(self) -> Typical:
        """The learned workload's typical shapes as arrays (stable between refreshes)."""
        if self._typ is None or self.workload.seen - self._typ_seen >= REFRESH_EVERY:
            # one model column: a fractional pool's share is a fraction of any card
            self._typ = typical_arrays(self.workload.typical(), [""], OURS)
            self._typ_seen = self.workload.seen
        return self._typ

    def observe(self, share_mib: int, card_mib: int, pod: tuple[int, int] = (0, 0)) -> None:
        """Count a fractional pod in the learned workload: its share as milli-GPU of its
        pool's card, its (milli-CPU, MiB) requests."""
        self.workload.observe(Shape(pod[0], pod[1], min(MILLI, need_milli(share_mib,
                                                                          card_mib)), 1))

    def pool(self, name: str, labels: Mapping[str, str] | None,
             policy: Policy) -> NodePool | None:
        """:func:`node_pool` of a node, remembered per name, labels object and policy."""
        hit = self.pool_cache.get(name)
        if hit is not None and hit[0] is labels and hit[1] is policy:
            return hit[2]
        pool = node_pool(labels, policy)
        self.pool_cache[name] = (labels, policy, pool)
        return pool


def rank_fractional(share_mib: int, views: list[NodeView], card_mib: list[int],
                    placement: Placement, typical: Typical | None = None, *, placer: Placer,
                    resources: list[tuple[int, int] | None] | None = None,
                    pod: tuple[int, int] = (0, 0)) -> Ranking:
    """Every node of ``views`` the share fits, with the card and the fragmentation it adds
    (:func:`gpu_admission.placement.frag.rank`); ``rows`` index ``views``. Cards of
    different sizes: the pod's share is converted per node, so nodes are ranked one card
    size at a time and merged."""
    typ = typical if typical is not None else placer.typical()
    if typical is not None:  # a caller's own shapes: arrays of its own (tests)
        nodes, ids = node_state(views, card_mib)
        del ids
        cache = FragCache.build(nodes, typ)
        rows_of = np.arange(len(views), dtype=np.int64)
    else:
        nodes, cache, rows_of = placer.registry.arrays(views, card_mib, typ, resources)
    position = np.full(len(nodes.names), -1, dtype=np.int64)
    position[rows_of] = np.arange(len(rows_of))
    key = (share_mib, placement.memory_headroom_mib, pod, placer.registry.generation)
    memo = placer.last
    if (typical is None and placer.reuse and memo is not None and memo.key == key
            and memo.typ is typ and len(memo.evaluated) == len(nodes.names)
            and bool(memo.evaluated[rows_of].all())):
        wanted = np.zeros(len(nodes.names), dtype=bool)
        wanted[rows_of] = True
        keep = wanted[memo.ranking.rows]
        m = memo.ranking
        return Ranking(position[m.rows[keep]], m.card[keep], m.delta[keep],
                       m.gpu_left[keep], m.cpu_left[keep])
    merged = _rank_rows(share_mib, card_mib, placement, typ=typ, nodes=nodes, cache=cache,
                        rows_of=rows_of, pod=pod)
    if typical is None:
        evaluated = np.zeros(len(nodes.names), dtype=bool)
        evaluated[rows_of] = True
        placer.last = RankMemo(key, typ, evaluated, merged)
    return Ranking(position[merged.rows], merged.card, merged.delta, merged.gpu_left,
                   merged.cpu_left)


def _rank_rows(share_mib: int, card_mib: list[int], placement: Placement, *, typ: Typical,
               nodes: Nodes, cache: FragCache, rows_of: IntArray,
               pod: tuple[int, int]) -> Ranking:
    """:func:`rank` over ``rows_of`` one card size at a time, merged (rows: array rows)."""
    sizes = np.array(card_mib, dtype=np.int64)
    parts: list[Ranking] = []
    for size in np.unique(sizes).tolist():
        rows = rows_of[sizes == size]
        share = need_milli(share_mib, size)
        head = need_milli(share_mib + placement.memory_headroom_mib, size) - share
        if share > MILLI:
            continue
        parts.append(rank(nodes, Shape(pod[0], pod[1], share, 1), typ, cache, rows=rows,
                          headroom_milli=head))
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return Ranking(empty, empty, np.zeros(0), empty, empty)
    return parts[0] if len(parts) == 1 else Ranking(
        *(np.concatenate([getattr(p, f) for p in parts])
          for f in ("rows", "card", "delta", "gpu_left", "cpu_left")))


def options(view: NodeView, card_mib: int, share_mib: int, placement: Placement,
            util: Mapping[str, float] | None = None, *, placer: Placer | None = None,
            typical: Typical | None = None) -> list[Choice]:
    """The GPU of the node the pod fits best on (the card that adds the least
    fragmentation, :func:`rank_fractional`), or nothing. ``placer``: the extender's (its
    learned workload, the node's CPU/memory as the last filter saw them); None = a fresh
    one (the prior workload, CPU and memory unknown). ``util`` is accepted for callers of
    the DCGM-based rule it replaced and not used: fragmentation decides the card."""
    del util
    r = rank_fractional(share_mib, [view], [card_mib], placement, typical,
                        placer=placer if placer is not None else Placer())
    if len(r.rows) == 0:
        return []
    _, ids = node_state([view], [card_mib])
    card = int(r.card[0])
    gpu_id = ids[0][card]
    free = card_mib - next((g.used_mib for g in view.open if g.gpu_id == gpu_id), 0)
    return [Choice(gpu_id, max(0, 100 - round(float(r.delta[0]) / 10)), free)]


def choose(view: NodeView, card_mib: int, share_mib: int, placement: Placement,
           util: Mapping[str, float] | None = None, *, placer: Placer | None = None,
           typical: Typical | None = None) -> Choice | None:
    """The GPU bind gives the pod on this node (the card the ranking chose there), or None
    when nothing fits. ``typical``: the shapes to measure against (default: the placer's
    learned ones); ``placer`` as in :func:`options`."""
    best = options(view, card_mib, share_mib, placement, util, placer=placer,
                   typical=typical)
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


NOT_IN_POOL: Final = ("not in a fractional node pool (no spec.nodePools[] with sharing: "
                      "fractional whose nodeSelector matches the node's labels)")
def _pooled(placer: Placer, names: list[str], views: Mapping[str, NodeView],
            labels: Mapping[str, Mapping[str, str]], policy: Policy
            ) -> tuple[list[str], list[NodeView], list[int], dict[str, str]]:
    inside: list[str] = []
    pooled: list[NodeView] = []
    cards: list[int] = []
    outside: dict[str, str] = {}
    cache = placer.pool_cache
    for name in names:
        lab = labels.get(name)
        hit = cache.get(name)
        if hit is not None and hit[0] is lab and hit[1] is policy:
            pool = hit[2]
        else:
            pool = placer.pool(name, lab, policy)
        if pool is None:
            outside[name] = NOT_IN_POOL
            continue
        inside.append(name)
        pooled.append(views[name])
        cards.append(pool.memory_mib)
    return inside, pooled, cards, outside


def filter_fractional(share_mib: int, names: list[str], views: Mapping[str, NodeView],
                      labels: Mapping[str, Mapping[str, str]], policy: Policy, *,
                      placer: Placer,
                      resources: Mapping[str, tuple[int, int] | None] | None = None,
                      pod: tuple[int, int] = (0, 0)) -> FilterResult:
    """Nodes where some GPU fits (open or to open); the others with a reason. Every node
    that fits passes: the ranking is prioritize's (scores spread so the best alone gets
    10; docs/extender.md, Resolution)."""
    placement = policy.spec.placement
    inside, pooled, cards, failed = _pooled(placer, names, views, labels, policy)
    r = rank_fractional(share_mib, pooled, cards, placement, placer=placer, pod=pod,
                        resources=None if resources is None else
                        [resources.get(n) for n in inside])
    fit = {inside[int(i)] for i in r.rows}
    for name, view, card in zip(inside, pooled, cards, strict=True):
        if name not in fit:
            failed[name] = no_fit_reason(view, card, share_mib, placement)
    return FilterResult([n for n in names if n in fit], failed)


def spread(r: Ranking) -> dict[int, int]:
    """Row -> 0..10: the nodes tied at the top of the ranking (same fragmentation added,
    same GPU and CPU left) 10; the others 1..9 by where their fragmentation added falls
    between the best and the worst (never 10, so with the shipped weight kube-scheduler's
    own plugins cannot lift one of them over a best node)."""
    if len(r.rows) == 0:
        return {}
    lo, hi = float(r.delta.min()), float(r.delta.max())
    frac = (hi - r.delta) / (hi - lo) if hi > lo else np.ones(len(r.rows))
    score = 1 + (frac * 8).astype(np.int64)  # 1..9
    score[r.best()] = MAX_EXTENDER
    return dict(zip(r.rows.tolist(), score.tolist(), strict=True))


MAX_EXTENDER: Final = 10


def score_fractional(share_mib: int, names: list[str], views: Mapping[str, NodeView],
                     labels: Mapping[str, Mapping[str, str]], policy: Policy, *,
                     placer: Placer,
                     snapshot: Snapshot | None,
                     resources: Mapping[str, tuple[int, int] | None] | None = None,
                     pod: tuple[int, int] = (0, 0)) -> list[tuple[str, int]]:
    """(node, 0..10) in request order: :func:`spread` of the ranking; 0 where nothing fits.
    ``snapshot`` (DCGM) no longer changes the order: fragmentation decides."""
    del snapshot
    inside, pooled, cards, _ = _pooled(placer, names, views, labels, policy)
    r = rank_fractional(share_mib, pooled, cards, policy.spec.placement, placer=placer,
                        pod=pod,
                        resources=None if resources is None else
                        [resources.get(n) for n in inside])
    by_row = spread(r)
    scores = {inside[row]: s for row, s in by_row.items()}
    return [(name, scores.get(name, 0)) for name in names]

