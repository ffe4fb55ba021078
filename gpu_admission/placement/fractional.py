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
  USENIX ATC '23, with CPU and memory counted as budgets and a learned workload), read in
  levels of 100 milli-GPU, then node name (:meth:`~gpu_admission.placement.frag.Ranking.order`).
  Prioritize gives the best node 10 and the others 1..9 (:func:`spread_scores`); the shipped
  weight makes one level outweigh every in-tree plugin (docs/extender.md, Resolution).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Final, Protocol

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
    name_ranks,
    rank,
    typical_arrays,
)
from gpu_admission.placement.gpus import Snapshot
from gpu_admission.placement.ledger import Ledger, NodeView, is_fractional_pod, parse_mib
from gpu_admission.placement.requests import NodeRequests
from gpu_admission.placement.score import (
    FilterResult,
)
from gpu_admission.policy.model import NodePool, Placement, Policy

NEW_GPU: Final = ""  # Choice.gpu_id of a GPU to open
#: the learned workload's typical shapes are re-read every this many observed pods
REFRESH_EVERY: Final = 256
REASONS_MAX: Final = 100_000  # remembered no-fit texts (one per node and share) before a reset


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


class NodeSource(Protocol):
    """Where a :class:`Placer` reads the nodes it ranks: the extender's watch
    (:class:`LedgerSource`: the GPU ledger, the Node objects and the CPU/memory requests,
    each saying which nodes changed), or one request's dicts (:class:`DictSource`)."""

    def view(self, name: str) -> NodeView: ...

    def labels(self, name: str) -> Mapping[str, str] | None: ...

    def free(self, name: str) -> tuple[int, int] | None:
        """Free (milli-CPU, MiB); None: unknown (counted unlimited); :data:`KEEP`: keep
        what the placer holds."""

    def changed(self) -> Iterable[str] | None:
        """The nodes that may have changed since the last call (None: every node)."""


#: :meth:`NodeSource.free` of a source that does not know: keep the row's CPU and memory
KEEP: Final = (-1, -1)


@dataclass(frozen=True, slots=True)
class DictSource:
    """One request's dicts (tests, bind, callers without a watch): every node named may
    have changed; a row is rewritten only when its view (the ledger hands out a new object
    when the node changes), pool or free resources differ from the placer's."""

    views: Mapping[str, NodeView]
    labels_of: Mapping[str, Mapping[str, str]]
    resources: Mapping[str, tuple[int, int] | None] | None
    names: Sequence[str]

    def view(self, name: str) -> NodeView:
        return self.views[name]

    def labels(self, name: str) -> Mapping[str, str] | None:
        return self.labels_of.get(name)

    def free(self, name: str) -> tuple[int, int] | None:
        return KEEP if self.resources is None else self.resources.get(name)

    def changed(self) -> Iterable[str] | None:
        return self.names


@dataclass(frozen=True, slots=True)
class LedgerSource:
    """The extender's watch as a :class:`NodeSource`: the ledger's views, the Node objects
    (labels, allocatable) and the pods' CPU/memory requests. The ledger and the requests
    record which nodes changed (:meth:`Ledger.take_changed`), so a request re-reads only
    those, not every node it names."""

    ledger: Ledger
    nodes: Mapping[str, Mapping[str, Any]]
    requests: NodeRequests | None

    def view(self, name: str) -> NodeView:
        return self.ledger.view(name)

    def labels(self, name: str) -> Mapping[str, str] | None:
        labels: Mapping[str, str] | None = ((self.nodes.get(name) or {}).get("metadata")
                                            or {}).get("labels")
        return labels

    def free(self, name: str) -> tuple[int, int] | None:
        return None if self.requests is None else self.requests.free(self.nodes.get(name))

    def changed(self) -> Iterable[str] | None:
        ledger = self.ledger.take_changed()
        if self.requests is None:
            return ledger
        requests = self.requests.take_changed()
        return None if ledger is None or requests is None else ledger | requests


@dataclass
class Registry:
    """Every node the placer has ranked, as frag arrays kept between requests (row i =
    ``nodes.names[i]``, ``index`` the other way): the name -> row map grows when a request
    names a new node, a row is rewritten only when its source says the node changed (the
    ledger's view, the node's pool or its free CPU/memory), and the fragmentation cache is
    updated for those rows only. So a request over 1,213 nodes costs the ranking itself
    (numpy over rows), not a pass over names."""

    index: dict[str, int] = field(default_factory=dict)
    keys: list[tuple[NodeView, int] | None] = field(default_factory=list)
    nodes: Nodes | None = None
    #: (N,) each row's fractional pool card (MiB); 0 = the node is in no fractional pool
    card: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    cache: FragCache | None = None
    #: bumped whenever a row, the node set or the cache changes: a ranking computed at one
    #: generation holds for the next request at the same generation (prioritize after filter)
    generation: int = 0
    dirty: set[int] = field(default_factory=set)  # rows rewritten since the cache update
    unread: set[int] = field(default_factory=set)  # rows added, not read from a source yet
    #: (N,) each row's place in node-name order: the ranking's last tie-break
    name_rank: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: the last request's names and rows: kube-scheduler sends the same list again
    last_names: list[str] = field(default_factory=list)
    last_rows: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def rows(self, names: Sequence[str]) -> IntArray:
        """The rows of ``names`` (added when new: :attr:`unread` until read)."""
        if len(names) == len(self.last_names) and names == self.last_names:
            return self.last_rows
        index = self.index
        if not names:
            return np.zeros(0, dtype=np.int64)
        try:  # one C-level lookup of every name (itemgetter of one name gives no tuple)
            found = [index[names[0]]] if len(names) == 1 else itemgetter(*names)(index)
        except KeyError:
            self._add(list(dict.fromkeys(n for n in names if n not in index)))
            found = [index[n] for n in names]
        rows = np.array(found, dtype=np.int64).reshape(len(names))
        self.last_names, self.last_rows = list(names), rows
        return rows

    def _add(self, names: list[str]) -> None:
        start = len(self.keys)
        for name in names:
            self.index[name] = len(self.keys)
            self.keys.append(None)
        total = len(self.keys)
        old = self.nodes
        width = old.gpu.shape[1] if old is not None else 1
        gpu = np.full((total, width), -1, dtype=np.int64)
        cpu = np.full(total, UNLIMITED, dtype=np.int64)
        mem = np.full(total, UNLIMITED, dtype=np.int64)
        card = np.zeros(total, dtype=np.int64)
        if old is not None:
            gpu[:start], cpu[:start], mem[:start] = old.gpu, old.cpu, old.mem
            card[:start] = self.card
        self.nodes = Nodes(list(self.index), [""], np.zeros(total, dtype=np.int64), cpu, mem,
                           gpu)
        self.card = card
        self.name_rank = name_ranks(self.nodes.names)
        self.cache = None
        self.unread.update(range(start, total))

    def _widen(self, width: int) -> None:
        nodes = self.nodes
        assert nodes is not None
        gpu = np.full((len(nodes.names), width), -1, dtype=np.int64)
        gpu[:, :nodes.gpu.shape[1]] = nodes.gpu
        nodes.gpu = gpu
        self.cache = None

    def set_row(self, row: int, view: NodeView, card: int,
                free: tuple[int, int] | None) -> None:
        """Row ``row`` from the node's view, its pool card (MiB, 0: none) and free
        (milli-CPU, MiB) (None: unknown, unlimited; :data:`KEEP`: unchanged)."""
        nodes = self.nodes
        assert nodes is not None
        key = self.keys[row]
        if key is None or key[0] is not view or key[1] != card:
            self.keys[row] = (view, card)
            gpus, _ = _cards(view, card)
            if len(gpus) > nodes.gpu.shape[1]:
                self._widen(len(gpus))
            nodes.gpu[row] = -1
            nodes.gpu[row, :len(gpus)] = gpus
            self.card[row] = card
            self.dirty.add(row)
        if free is not KEEP:
            cpu, mem = free if free is not None else (UNLIMITED, UNLIMITED)
            if int(nodes.cpu[row]) != cpu or int(nodes.mem[row]) != mem:
                nodes.cpu[row] = cpu
                nodes.mem[row] = mem
                self.dirty.add(row)

    def finish(self, typ: Typical) -> tuple[Nodes, FragCache]:
        """The fragmentation cache brought up to date with the rows rewritten."""
        nodes = self.nodes
        assert nodes is not None
        if self.cache is None or self.cache.typ is not typ:
            self.cache = FragCache.build(nodes, typ)
            self.generation += 1
        elif self.dirty:
            self.cache.update(nodes, np.array(sorted(self.dirty), dtype=np.int64))
            self.generation += 1
        self.dirty.clear()
        return nodes, self.cache

    def arrays(self, views: list[NodeView], cards: list[int], typ: Typical,
               resources: list[tuple[int, int] | None] | None = None
               ) -> tuple[Nodes, FragCache, IntArray]:
        """The arrays for ``views`` with their cards given (bind, tests; rows into them),
        up to date. ``resources``: each node's free (milli-CPU, MiB), None to keep what the
        last request said (bind)."""
        rows = self.rows([v.name for v in views])
        for i, (view, card) in enumerate(zip(views, cards, strict=True)):
            self.set_row(int(rows[i]), view, card,
                         KEEP if resources is None else resources[i])
        self.unread.difference_update(rows.tolist())
        nodes, cache = self.finish(typ)
        return nodes, cache, rows


UNLIMITED: Final = 2**40  # CPU/memory of a node nothing is known about (milli-CPU, MiB)


def _cards(view: NodeView, card_mib: int) -> tuple[list[int], list[str]]:
    """A node's cards in milli-GPU (open GPUs, then whole GPUs free to open) and their ids;
    ``card_mib`` 0 (no fractional pool): open GPUs count as full (nothing to give out)."""
    return ([card_milli(card_mib - g.used_mib, card_mib) if card_mib else 0
             for g in view.open] + [MILLI] * view.free_whole,
            [g.gpu_id for g in view.open] + [NEW_GPU] * view.free_whole)


@dataclass(frozen=True, slots=True)
class RankMemo:
    """The last ranking of a placer, in registry rows: for which pod, at which registry
    generation and shapes, over which rows (``evaluated``, a mask over registry rows)."""

    key: tuple[Any, ...]  # what was ranked (the pod) and the registry generation
    typ: Typical
    evaluated: npt.NDArray[np.bool_]
    ranking: Ranking  # rows: registry rows


#: a node's labels object, the policy and the fractional pool they select
PoolEntry = tuple[Mapping[str, str] | None, Policy, NodePool | None]


@dataclass(frozen=True, slots=True)
class Request:
    """The nodes of one filter or prioritize request, as placer rows."""

    names: Sequence[str]
    rows: IntArray  # registry row of each name, request order
    card: IntArray  # each name's fractional pool card (MiB), 0 = in none


@dataclass
class Placer:
    """Everything placement remembers between requests, held by whoever places (the
    extender's ``create_app`` makes one and keeps it in its state for filter, prioritize
    and bind; each test or benchmark makes its own). Nothing of it is process-wide, so two
    extenders or two replays in one process never see each other's workload (project rule:
    state passed explicitly).

    * ``workload``: the shapes of the pods asked about (filter observes each pod once per
      scheduling attempt: fractional, whole-GPU and CPU pods), which the fragmentation is
      measured against; its typical shapes are re-read every :data:`REFRESH_EVERY`
      observations, so filter, prioritize and bind of one pod rank against the same shapes
      (the card bind takes is the one the ranking promised);
    * ``registry``: the nodes' arrays between requests (:class:`Registry`);
    * ``pool_cache``: node name -> (its labels object, policy, pool): one lookup and two
      identity checks per node read (the watch replaces a node's labels object when they
      change) instead of matching every selector."""

    workload: Workload = field(default_factory=Workload)
    registry: Registry = field(default_factory=Registry)
    pool_cache: dict[str, PoolEntry] = field(default_factory=dict)
    #: reuse the last ranking when the same pod (share, CPU, memory, headroom) is ranked
    #: again on unchanged arrays: kube-scheduler calls prioritize right after filter
    reuse: bool = True
    last: RankMemo | None = None
    #: (node, card MiB, share MiB, headroom MiB) -> (the view it was written for, why the
    #: share does not fit): a full node fails every request alike until it changes
    reasons: dict[tuple[str, int, int, int], tuple[NodeView, str]] = field(
        default_factory=dict)
    _typ: Typical | None = None
    _typ_seen: int = -1
    _policy: Policy | None = None

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

    def request(self, names: Sequence[str], source: NodeSource, policy: Policy) -> Request:
        """The rows of ``names``, every row the source says changed re-read (all of them
        after a relist or a new policy), the cache up to date: numpy from here on."""
        reg = self.registry
        rows = reg.rows(names)
        changed = source.changed()
        if policy is not self._policy:
            self._policy = policy
            changed = None
        nodes = reg.nodes
        assert nodes is not None
        pending = reg.unread
        if changed is None:
            pending = set(range(len(nodes.names)))
        else:
            index = reg.index
            pending.update(index[n] for n in changed if n in index)
        if pending:  # read the requested ones now, the others when a request names them
            wanted = np.zeros(len(nodes.names), dtype=bool)
            wanted[rows] = True
            read = [r for r in pending if wanted[r]]
            reg.unread = {r for r in pending if not wanted[r]}
            for row in read:
                name = nodes.names[row]
                pool = self.pool(name, source.labels(name), policy)
                reg.set_row(row, source.view(name),
                            pool.memory_mib if pool is not None else 0, source.free(name))
        reg.finish(self.typical())
        return Request(names, rows, reg.card[rows])

    def ranked(self, key: tuple[Any, ...], rows: IntArray,
               compute: Callable[[Nodes, FragCache, IntArray], Ranking]) -> Ranking:
        """``compute`` over registry ``rows`` (a ranking in registry rows), or the last
        ranking when it was for the same ``key`` at the same generation over these rows."""
        reg = self.registry
        nodes, cache = reg.nodes, reg.cache
        assert nodes is not None and cache is not None
        full = (*key, reg.generation)
        memo = self.last
        n = len(nodes.names)
        if (self.reuse and memo is not None and memo.key == full and memo.typ is cache.typ
                and len(memo.evaluated) == n and bool(memo.evaluated[rows].all())):
            wanted = np.zeros(n, dtype=bool)
            wanted[rows] = True
            return memo.ranking.take(wanted[memo.ranking.rows])
        r = compute(nodes, cache, rows)
        evaluated = np.zeros(n, dtype=bool)
        evaluated[rows] = True
        self.last = RankMemo(full, cache.typ, evaluated, r)
        return r


def _positions(r: Ranking, rows: IntArray, reg: Registry) -> Ranking:
    """A ranking in registry rows as positions into ``rows``, its ties by node name."""
    position = np.full(len(reg.index), -1, dtype=np.int64)
    position[rows] = np.arange(len(rows))
    return Ranking(position[r.rows], r.card, r.delta, r.gpu_left, r.cpu_left,
                   reg.name_rank[r.rows])


def rank_share(placer: Placer, req: Request, share_mib: int, placement: Placement,
               pod: tuple[int, int] = (0, 0)) -> Ranking:
    """A fractional pod over a request's nodes in fractional pools (rows: positions into
    ``req.names``): :func:`gpu_admission.placement.frag.rank` one card size at a time."""
    reg = placer.registry
    rows = req.rows[req.card > 0]
    r = placer.ranked(("share", share_mib, placement.memory_headroom_mib, pod), rows,
                      lambda nodes, cache, rows_: _rank_rows(
                          share_mib, reg.card[rows_].tolist(), placement, typ=cache.typ,
                          nodes=nodes, cache=cache, rows_of=rows_, pod=pod))
    return _positions(r, req.rows, reg)


def rank_pod(placer: Placer, req: Request, shape: Shape) -> Ranking:
    """A whole-GPU pod (``shape.gpus`` cards of 1000) or a CPU pod over every node of the
    request (rows: positions into ``req.names``): the fragmentation its placement adds.
    Whole cards are the ledger's free ones (not opened for shares); a CPU pod adds
    fragmentation where it takes CPU or memory a GPU shape needs."""
    reg = placer.registry
    r = placer.ranked(("pod", shape), req.rows,
                      lambda nodes, cache, rows_: rank(nodes, shape, cache.typ, cache,
                                                       rows=rows_))
    return _positions(r, req.rows, reg)


def rank_fractional(share_mib: int, views: list[NodeView], card_mib: list[int],
                    placement: Placement, typical: Typical | None = None, *, placer: Placer,
                    resources: list[tuple[int, int] | None] | None = None,
                    pod: tuple[int, int] = (0, 0)) -> Ranking:
    """Every node of ``views`` the share fits, with the card and the fragmentation it adds
    (:func:`gpu_admission.placement.frag.rank`); ``rows`` index ``views``. Cards of
    different sizes: the pod's share is converted per node, so nodes are ranked one card
    size at a time and merged."""
    if typical is not None:  # a caller's own shapes: arrays of its own (tests)
        nodes, ids = node_state(views, card_mib)
        del ids
        cache = FragCache.build(nodes, typical)
        rows_of = np.arange(len(views), dtype=np.int64)
        return _rank_rows(share_mib, card_mib, placement, typ=typical, nodes=nodes,
                          cache=cache, rows_of=rows_of, pod=pod)
    reg = placer.registry
    _, _, rows_of = reg.arrays(views, card_mib, placer.typical(), resources)
    r = placer.ranked(("share", share_mib, placement.memory_headroom_mib, pod), rows_of,
                      lambda nodes, cache, rows_: _rank_rows(
                          share_mib, reg.card[rows_].tolist(), placement, typ=cache.typ,
                          nodes=nodes, cache=cache, rows_of=rows_, pod=pod))
    return _positions(r, rows_of, reg)


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


def filter_share(placer: Placer, req: Request, source: NodeSource, share_mib: int,
                 policy: Policy, *, pod: tuple[int, int] = (0, 0)) -> FilterResult:
    """Nodes where some GPU fits (open or to open); the others with a reason. Every node
    that fits passes: the ranking is prioritize's (scores spread so the best alone gets
    10; docs/extender.md, Resolution)."""
    placement = policy.spec.placement
    r = rank_share(placer, req, share_mib, placement, pod)
    names = req.names
    fit = np.zeros(len(names), dtype=bool)
    fit[r.rows] = True
    failed: dict[str, str] = {}
    reasons = placer.reasons
    if len(reasons) > REASONS_MAX:
        reasons.clear()
    head = placement.memory_headroom_mib
    for i in np.flatnonzero(~fit).tolist():
        name, card = names[i], int(req.card[i])
        if not card:
            failed[name] = NOT_IN_POOL
            continue
        view = source.view(name)
        key = (name, card, share_mib, head)
        hit = reasons.get(key)
        if hit is None or hit[0] is not view:  # the text of an unchanged node is kept
            hit = reasons[key] = (view, no_fit_reason(view, card, share_mib, placement))
        failed[name] = hit[1]
    passed = names if not failed else [names[i] for i in np.flatnonzero(fit).tolist()]
    return FilterResult(list(passed), failed)


def spread_scores(r: Ranking) -> IntArray:
    """0..10 for each entry of the ranking: its best entry (:meth:`Ranking.order`: the
    fragmentation level, then node name) 10; the others 1..9 by where their
    fragmentation added falls between the best and the worst (never 10, so with the shipped
    weight kube-scheduler's own plugins cannot lift one of them over the best node)."""
    if len(r.rows) == 0:
        return np.zeros(0, dtype=np.int64)
    lo, hi = float(r.delta.min()), float(r.delta.max())
    frac = (hi - r.delta) / (hi - lo) if hi > lo else np.ones(len(r.rows))
    score: IntArray = 1 + (frac * 8).astype(np.int64)  # 1..9
    score[r.best()] = MAX_EXTENDER
    return score


MAX_EXTENDER: Final = 10


def priorities(req: Request, r: Ranking) -> list[tuple[str, int]]:
    """(node, 0..10) in request order from a ranking over its positions; 0 where nothing
    fits."""
    score = np.zeros(len(req.names), dtype=np.int64)
    score[r.rows] = spread_scores(r)
    return list(zip(req.names, score.tolist(), strict=True))


def prioritize_pod(placer: Placer, req: Request, shape: Shape) -> list[tuple[str, int]]:
    """A whole-GPU or CPU pod's scores (:func:`rank_pod`, :func:`spread_scores`). Its filter
    passes every node: kube-scheduler's NodeResourcesFit already checks the GPU count, CPU
    and memory against its own cache, which knows the pods it has just assumed before the
    ledger's watch does."""
    return priorities(req, rank_pod(placer, req, shape))


def filter_fractional(share_mib: int, names: list[str], views: Mapping[str, NodeView],
                      labels: Mapping[str, Mapping[str, str]], policy: Policy, *,
                      placer: Placer,
                      resources: Mapping[str, tuple[int, int] | None] | None = None,
                      pod: tuple[int, int] = (0, 0)) -> FilterResult:
    """:func:`filter_share` over one request's dicts (:class:`DictSource`)."""
    source = DictSource(views, labels, resources, names)
    return filter_share(placer, placer.request(names, source, policy), source, share_mib,
                        policy, pod=pod)


def score_fractional(share_mib: int, names: list[str], views: Mapping[str, NodeView],
                     labels: Mapping[str, Mapping[str, str]], policy: Policy, *,
                     placer: Placer,
                     snapshot: Snapshot | None,
                     resources: Mapping[str, tuple[int, int] | None] | None = None,
                     pod: tuple[int, int] = (0, 0)) -> list[tuple[str, int]]:
    """(node, 0..10) in request order: :func:`spread_scores` of the ranking; 0 where
    nothing fits. ``snapshot`` (DCGM) no longer changes the order: fragmentation decides."""
    del snapshot
    req = placer.request(names, DictSource(views, labels, resources, names), policy)
    return priorities(req, rank_share(placer, req, share_mib, policy.spec.placement, pod))
