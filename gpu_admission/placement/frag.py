"""GPU fragmentation of nodes against the workload a cluster receives, and the placement that
adds the least of it. PURE (numpy arrays in, arrays out; no I/O, no clock).

The measure is FGD's ("Beware of Fragmentation", Weng et al., USENIX ATC '23; the
simulator's ``pkg/utils/frag.go`` ``NodeGpuShareFragAmount`` and
``pkg/simulator/plugin/fgd_score.go``): for a *typical* pod shape ``k`` of popularity
``w_k``, the free GPU capacity of a node that ``k`` cannot use is fragmented. If the node can
host ``k`` (GPU model allowed, CPU left, enough cards with ``k``'s share free), only the
cards with less than ``k``'s share free are fragments; otherwise every free milli-GPU is.
The node's fragmentation is ``sum_k w_k * frag_k``; a placement's cost is how much it raises
that (FGD schedules by the smallest increase, and picks the card the same way).

Where ours differs, and why:

* **memory counts too** (FGD checks CPU only): a node whose memory is gone strands its GPUs
  as surely as one whose CPU is gone, and the webhook's pods ask for both;
* **CPU-only shapes are not GPU fragments** (FGD counts every free GPU as a fragment "for"
  a CPU pod, a term that is the same for every candidate node and so only adds noise). A
  CPU pod is scored by the same measure over the GPU shapes: placing it where it takes the
  last CPU or memory a GPU shape needs raises the fragmentation, so CPU pods go where GPUs
  are already used up;
* **CPU and memory are budgets, not thresholds**: FGD sees a node's CPU only when it falls
  below what some shape needs, so a pod may take CPU from a node with few cores per GPU at
  no cost right up to that edge, and then every GPU there is lost at once. Two terms count
  the GPU a node's CPU and memory cannot feed: for each shape the node can host, the GPU
  that shape could use beyond what the free CPU and memory feed at the shape's own rate
  (added to ``frag_k``), and for the node, :func:`stranded`: the free GPU beyond what they
  feed at the workload's weighted mean rate. On openb a G2 node has 12 cores and 48 GiB per
  GPU, a T4 node 52 cores and 256 GiB, while the GPU pods ask about 11 cores and 40 GiB per
  GPU: a CPU pod, or a CPU-hungry share, placed on a G2 node brings its GPUs nearer to
  stranding, on a T4 node it does not. The node term carries the CPU-tight traces, the
  per-shape term keeps a node's CPU for the shapes that need more of it per GPU than the
  mean (it matters most where pods are pinned to a few nodes); together they place more of
  the fleet than FGD on every openb trace tried (docs/extender.md, "The measure");
* **the workload is learned** (:class:`Workload`): a decayed histogram of the shapes of the
  pods the scheduler has been asked to place, starting from a generic prior, instead of the
  whole trace known in advance;
* **near-equal is equal, then first fit**: a node's fragmentation added is read in levels of
  :data:`LEVEL_MILLI` (a tenth of a card), and within the best level the node whose name
  sorts first wins. The measure is an estimate (its weights are learned, its shapes are the
  popular ones only), and a few milli-GPU of difference in it says less than packing the
  nodes already in use does. FGD's own score does the same in effect:
  ``int(100 * sigmoid(-delta / 1000))`` turns deltas into integer levels 40 to 100+
  milli-GPU wide and its simulator takes the first node name among equal scores. Best fit
  within a level (the least GPU left) was tried and dropped: it sends pods that could go
  anywhere to the small nodes that model-pinned pods need.

Units: CPU in milli-CPU, memory in MiB, GPU in milli-GPU of one card (1000 = a whole card;
a fractional pool's MiB shares are converted with the pool's card memory).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

MILLI: Final = 1000  # milli-GPU in one card
EPS: Final = 1e-6  # fragmentation deltas closer than this (milli-GPU) tie
#: fragmentation added is compared in levels this wide (milli-GPU: a tenth of a card); see
#: the module doc ("near-equal is equal, then pack")
LEVEL_MILLI: Final = 100

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Shape:
    """What one pod asks of a node."""

    cpu_milli: int
    mem_mib: int
    gpu_milli: int  # per card: 0 = no GPU, < 1000 a share of one card, 1000 whole cards
    gpus: int  # cards (a share pod: 1; no GPU: 0)
    models: tuple[str, ...] = ()  # GPU models allowed, () = any

    @property
    def total_milli(self) -> int:
        return self.gpu_milli * self.gpus


#: Before any pod is seen: a generic mix of GPU-sharing work (small and half shares, one to
#: eight whole cards) and CPU pods, with modest CPU and memory per GPU. Worth
#: :data:`PRIOR_PODS` observed pods, so the real workload takes over within a few hundred.
PRIOR: Final[tuple[tuple[Shape, float], ...]] = (
    (Shape(4000, 16384, 250, 1), 2.0),
    (Shape(4000, 16384, 500, 1), 2.0),
    (Shape(8000, 32768, 1000, 1), 3.0),
    (Shape(16000, 65536, 1000, 2), 1.0),
    (Shape(32000, 131072, 1000, 4), 1.0),
    (Shape(64000, 262144, 1000, 8), 0.5),
    (Shape(4000, 8192, 0, 0), 1.5),
)
PRIOR_PODS: Final = 20.0


@dataclass
class Workload:
    """A decayed histogram of pod shapes: the workload fragmentation is measured against.

    Each observation weighs ``2 ** (t / half_life)`` (t counts observations), so a pod seen
    ``half_life`` pods ago counts half as much as the newest: the measure follows a changing
    workload without forgetting it at once. :meth:`typical` keeps the most popular shapes
    covering ``coverage`` of the weight (FGD's typical pods: the top 95 %), at most
    ``max_shapes`` (each shape costs one pass over the nodes per decision)."""

    half_life: float = 2000.0  # observations
    coverage: float = 0.95
    max_shapes: int = 64
    prior: Sequence[tuple[Shape, float]] = PRIOR
    prior_pods: float = PRIOR_PODS
    counts: dict[Shape, float] = field(default_factory=dict)
    seen: int = 0
    version: int = 0
    _scale: float = 1.0
    _cache: tuple[int, list[tuple[Shape, float]]] | None = None

    def __post_init__(self) -> None:
        total = sum(w for _, w in self.prior) or 1.0
        for shape, w in self.prior:
            self.counts[shape] = self.counts.get(shape, 0.0) + self.prior_pods * w / total

    def observe(self, shape: Shape) -> None:
        self.seen += 1
        self._scale *= 2.0 ** (1.0 / self.half_life)
        if self._scale > 1e100:  # renormalise before floats overflow
            for k in self.counts:
                self.counts[k] /= self._scale
            self._scale = 1.0
        self.counts[shape] = self.counts.get(shape, 0.0) + self._scale
        self.version += 1

    def typical(self) -> list[tuple[Shape, float]]:
        """The most popular shapes and their normalised weights (summing to 1)."""
        if self._cache is not None and self._cache[0] == self.version:
            return self._cache[1]
        ranked = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0].gpu_milli,
                                                             kv[0].gpus, kv[0].cpu_milli,
                                                             kv[0].mem_mib, kv[0].models))
        total = sum(w for _, w in ranked) or 1.0
        out: list[tuple[Shape, float]] = []
        cum = 0.0
        for shape, w in ranked:
            if cum >= self.coverage * total or len(out) >= self.max_shapes:
                break
            out.append((shape, w))
            cum += w
        norm = sum(w for _, w in out) or 1.0
        result = [(s, w / norm) for s, w in out]
        self._cache = (self.version, result)
        return result


def fixed_workload(shapes: Iterable[Shape], coverage: float = 0.95) -> Workload:
    """FGD's typical pods: every shape of a known pod list counted once, no prior, no decay."""
    w = Workload(half_life=float("inf"), coverage=coverage, max_shapes=10**6, prior=())
    for s in shapes:
        w.counts[s] = w.counts.get(s, 0.0) + 1.0
    w.version += 1
    return w


@dataclass(frozen=True, slots=True)
class Measure:
    """Which fragmentation: ours (default) or FGD's exactly (``memory=False``,
    ``cpu_shapes=True``)."""

    memory: bool = True  # a shape whose memory does not fit strands the node's GPUs
    cpu_shapes: bool = False  # FGD: every free GPU is a fragment for a CPU-only shape
    #: free GPU the node's CPU and memory left cannot feed at the workload's CPU and memory
    #: per milli-GPU counts as fragment (:func:`stranded`); FGD has no such term
    stranding: bool = True


FGD: Final = Measure(memory=False, cpu_shapes=True, stranding=False)
OURS: Final = Measure()


@dataclass
class Typical:
    """The typical shapes as arrays, with the GPU models each accepts per node model."""

    cpu: IntArray  # (K,) milli-CPU
    mem: IntArray  # (K,) MiB
    milli: IntArray  # (K,) milli-GPU per card
    count: IntArray  # (K,) cards
    weight: FloatArray  # (K,)
    accepts: BoolArray  # (K, models): shape k may run on a node of model m
    #: the GPU shapes' weighted mean milli-CPU (MiB) per milli-GPU; 0 = no stranding term
    cpu_per_milli: float = 0.0
    mem_per_milli: float = 0.0


def typical_arrays(shapes: Sequence[tuple[Shape, float]], models: Sequence[str],
                   measure: Measure) -> Typical:
    keep = [(s, w) for s, w in shapes if measure.cpu_shapes or s.gpu_milli > 0]
    norm = sum(w for _, w in keep) or 1.0
    accepts = np.array([[not s.models or m in s.models for m in models] for s, _ in keep],
                       dtype=bool).reshape(len(keep), len(models))
    cpu = np.array([s.cpu_milli for s, _ in keep], dtype=np.int64)
    mem = np.array([s.mem_mib if measure.memory else 0 for s, _ in keep], dtype=np.int64)
    milli = np.array([s.gpu_milli for s, _ in keep], dtype=np.int64)
    count = np.array([s.gpus for s, _ in keep], dtype=np.int64)
    weight = np.array([w / norm for _, w in keep], dtype=np.float64)
    gpu = weight * (milli > 0)  # the GPU shapes' weights: the rates are what GPUs come with
    gpu_milli = float(gpu @ (milli * count))
    stranding = measure.stranding and gpu_milli > 0
    return Typical(cpu, mem, milli, count, weight, accepts,
                   float(gpu @ cpu) / gpu_milli if stranding else 0.0,
                   float(gpu @ mem) / gpu_milli if stranding else 0.0)


@dataclass
class Nodes:
    """Free resources of every node, as arrays (row i = ``names[i]``).

    ``gpu`` holds each card's free milli-GPU; a node with fewer cards than the widest node
    has ``-1`` in the missing columns (never free, never a fragment)."""

    names: list[str]
    models: list[str]  # distinct GPU models; model[i] indexes this
    model: IntArray  # (N,)
    cpu: IntArray  # (N,) free milli-CPU
    mem: IntArray  # (N,) free MiB
    gpu: IntArray  # (N, C) free milli-GPU per card, -1 = no such card

    @classmethod
    def build(cls, names: Sequence[str], models: Sequence[str], cpu: Sequence[int],
              mem: Sequence[int], gpus: Sequence[Sequence[int]]) -> Nodes:
        distinct = sorted(set(models))
        width = max((len(g) for g in gpus), default=0) or 1
        table = np.full((len(names), width), -1, dtype=np.int64)
        for i, g in enumerate(gpus):
            table[i, :len(g)] = g
        return cls(list(names), distinct,
                   np.array([distinct.index(m) for m in models], dtype=np.int64),
                   np.array(cpu, dtype=np.int64), np.array(mem, dtype=np.int64), table)

    def free_gpu(self) -> IntArray:
        out: IntArray = np.clip(self.gpu, 0, None).sum(axis=1)
        return out


def node_frag(nodes: Nodes, typ: Typical, rows: IntArray | None = None) -> FloatArray:
    """Fragmentation (milli-GPU, weighted by the shapes' popularity) of the given rows."""
    idx = np.arange(len(nodes.names)) if rows is None else rows
    frag: FloatArray = FragCache.build(nodes, typ).frag[idx]
    return frag


@dataclass(frozen=True, slots=True)
class Ranking:
    """Every node that can host the pod, with the fragmentation placing it there adds."""

    rows: IntArray  # node rows that fit the pod
    card: IntArray  # the card chosen on each (share pods; -1 otherwise)
    delta: FloatArray  # fragmentation added, milli-GPU
    gpu_left: IntArray  # free milli-GPU on the node after the pod
    cpu_left: IntArray  # free milli-CPU on the node after the pod

    #: each entry's place in node-name order (the last tie-break); None = ``rows`` order
    #: (the simulator's rows, which follow the node names)
    tie: IntArray | None = None

    def order(self) -> IntArray:
        """Positions into ``rows``, best first: the least fragmentation added, in levels of
        :data:`LEVEL_MILLI`; within a level the node whose name sorts first (:attr:`tie`:
        first fit in name order). No two entries tie, so nothing is left to chance."""
        level = np.floor(self.delta / LEVEL_MILLI + 0.5)
        last = self.rows if self.tie is None else self.tie
        out: IntArray = np.lexsort((last, level))
        return out

    def best(self) -> IntArray:
        """The position of the best entry (:meth:`order`), empty when nothing fits."""
        out: IntArray = self.order()[:1]
        return out

    def take(self, keep: IntArray | BoolArray) -> Ranking:
        """The entries ``keep`` selects (indices or a mask), every field alike."""
        return Ranking(self.rows[keep], self.card[keep], self.delta[keep], self.gpu_left[keep],
                       self.cpu_left[keep], None if self.tie is None else self.tie[keep])


def name_ranks(names: Sequence[str]) -> IntArray:
    """Each name's place in sorted order (:attr:`Ranking.tie`, the last tie-break)."""
    out: IntArray = np.empty(len(names), dtype=np.int64)
    out[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
    return out


def fits(nodes: Nodes, pod: Shape, headroom_milli: int = 0) -> tuple[BoolArray, BoolArray]:
    """(node fits, per-card fits for a share pod). ``pod.models`` filters the GPU model.
    A card fits a share when share + headroom (milli-GPU) is free: never over-committed."""
    ok = (nodes.cpu >= pod.cpu_milli) & (nodes.mem >= pod.mem_mib)
    card = np.zeros_like(nodes.gpu, dtype=bool)
    if pod.gpus > 0:
        if pod.models:
            allowed = np.array([m in pod.models for m in nodes.models], dtype=bool)
            ok &= allowed[nodes.model]
        if pod.gpu_milli < MILLI:
            card = nodes.gpu >= pod.gpu_milli + headroom_milli
            ok &= card.any(axis=1)
        else:
            ok &= (nodes.gpu >= MILLI).sum(axis=1) >= pod.gpus
    return ok, card


@dataclass
class FragCache:
    """Per shape and node: cards that can host the shape and free milli-GPU on the cards
    that cannot (FGD's partial fragments), and each node's fragmentation. Built once per
    typical-shape set (K x N x C), then one row per placement (:meth:`update`), so a
    decision costs K x candidates, not K x nodes x cards."""

    typ: Typical
    count: IntArray  # (K, N)
    partial: IntArray  # (K, N) milli-GPU
    total: IntArray  # (N,) free milli-GPU
    frag: FloatArray  # (N,)

    @classmethod
    def build(cls, nodes: Nodes, typ: Typical) -> FragCache:
        n = len(nodes.names)
        k = len(typ.weight)
        c = cls(typ, np.zeros((k, n), dtype=np.int64), np.zeros((k, n), dtype=np.int64),
                np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.float64))
        c.update(nodes, np.arange(n))
        return c

    def update(self, nodes: Nodes, rows: IntArray) -> None:
        g = np.clip(nodes.gpu[rows], 0, None)  # (M, C)
        self.total[rows] = g.sum(axis=1)
        fit = g[None, :, :] >= self.typ.milli[:, None, None]  # (K, M, C)
        self.count[:, rows] = fit.sum(axis=2)
        self.partial[:, rows] = np.where(fit, 0, g[None, :, :]).sum(axis=2)
        cpu, mem = nodes.cpu[rows], nodes.mem[rows]
        ok = _node_ok(self.typ, nodes.model[rows], cpu, mem)
        self.frag[rows] = _combine(self.typ, ok, self.count[:, rows], self.partial[:, rows],
                                   self.total[rows], feed=_feed(self.typ, cpu, mem), cpu=cpu,
                                   mem=mem)


def _node_ok(typ: Typical, model: IntArray, cpu: IntArray, mem: IntArray) -> BoolArray:
    """(K, M): shape k's GPU model, CPU and memory fit node state m (CPU-only shapes: never,
    so the FGD measure counts every free GPU for them)."""
    ok: BoolArray = (typ.accepts[:, model] & (cpu[None, :] >= typ.cpu[:, None])
                     & (mem[None, :] >= typ.mem[:, None]) & (typ.milli[:, None] > 0))
    return ok


def _combine(typ: Typical, ok: BoolArray, count: IntArray, partial: IntArray,
             total: IntArray, *, feed: FloatArray | None, cpu: IntArray,
             mem: IntArray) -> FloatArray:
    """sum_k w_k * (partial_k plus k's unfed GPU if the node can host shape k, else every
    free milli-GPU), plus the GPU stranded at the workload's rate (:func:`stranded`);
    ``ok`` from :func:`_node_ok`, ``feed`` from :func:`_feed` (None: no stranding terms),
    arrays (K, M) and (M,) for M node states."""
    feasible = ok & (count >= typ.count[:, None])
    if feed is None:
        plain: FloatArray = typ.weight @ np.where(feasible, partial, total[None, :])
        return plain
    unfed = np.maximum(0.0, total[None, :] - partial - feed)
    frag: FloatArray = (typ.weight @ np.where(feasible, partial + unfed, total[None, :])
                        + stranded(typ, total, cpu, mem))
    return frag


def _feed(typ: Typical, cpu: IntArray, mem: IntArray) -> FloatArray | None:
    """(K, M): the milli-GPU node state m's free CPU and memory feed for shape k at k's own
    rate (None when the measure has no stranding terms)."""
    if typ.cpu_per_milli == 0 and typ.mem_per_milli == 0:
        return None
    milli = (typ.milli * typ.count)[:, None]  # (K, 1): what shape k asks of the GPU
    feed: FloatArray = np.minimum(
        np.where(typ.cpu[:, None] > 0, cpu[None, :] * milli / np.maximum(typ.cpu, 1)[:, None],
                 np.inf),
        np.where(typ.mem[:, None] > 0, mem[None, :] * milli / np.maximum(typ.mem, 1)[:, None],
                 np.inf))
    return feed


def stranded(typ: Typical, total: IntArray, cpu: IntArray, mem: IntArray) -> FloatArray:
    """Free milli-GPU of each node state that its free CPU (milli-CPU) and memory (MiB)
    cannot feed at the workload's rate, ``max(0, total - cpu / cpu_per_milli)`` plus the
    same for memory (see the module doc, "CPU and memory are budgets")."""
    out: FloatArray = np.zeros(total.shape, dtype=np.float64)
    if typ.cpu_per_milli > 0:
        out += np.maximum(0.0, total - cpu / typ.cpu_per_milli)
    if typ.mem_per_milli > 0:
        out += np.maximum(0.0, total - mem / typ.mem_per_milli)
    return out


def rank(nodes: Nodes, pod: Shape, typ: Typical, cache: FragCache | None = None, *,
         rows: IntArray | None = None, headroom_milli: int = 0) -> Ranking:
    """Score every node (or ``rows``) the pod fits: the fragmentation added by placing it,
    over the best card for a share pod. ``cache``: a :class:`FragCache` of ``nodes`` for
    ``typ`` kept up to date by the caller (built here when None)."""
    ok, card_ok = fits(nodes, pod, headroom_milli)
    if rows is not None:
        mask = np.zeros_like(ok)
        mask[rows] = True
        ok &= mask
    cand = np.flatnonzero(ok)
    empty = np.zeros(0, dtype=np.int64)
    if len(cand) == 0:
        return Ranking(empty, empty, np.zeros(0), empty, empty)
    if cache is None or cache.typ is not typ:
        cache = FragCache.build(nodes, typ)
    before = cache.frag[cand]
    cpu = nodes.cpu[cand] - pod.cpu_milli
    mem = nodes.mem[cand] - pod.mem_mib
    model = nodes.model[cand]
    total = cache.total[cand]
    if pod.gpus > 0 and pod.gpu_milli < MILLI:
        # every (node, card) pair the share fits on, in one flat batch: each shape's card
        # count and partial sum corrected for the one card that changes
        ni, ci = np.nonzero(card_ok[cand])
        gc = nodes.gpu[cand[ni], ci]
        # cards of one node with the same free milli-GPU are the same choice: keep the first
        _, first_of = np.unique(ni * (MILLI + 1) + gc, return_index=True)
        ni, ci, gc = ni[first_of], ci[first_of], gc[first_of]
        after_c = gc - pod.gpu_milli
        m = typ.milli[:, None]
        # the card hosted shape k before (gc >= m) and not after (after_c < m, as
        # after_c < gc): one card fewer for k, and its remainder a new sliver; a card
        # already too small for k (gc < m) stays a sliver, share milli-GPU smaller
        small = gc < m
        lost = ~small & (after_c < m)
        rows_p = cand[ni]  # gathered once from the cache, straight to the pairs
        count_p = cache.count[:, rows_p] - lost
        partial_p = cache.partial[:, rows_p] + np.where(
            small, -pod.gpu_milli, np.where(lost, after_c, 0))
        total_p = total[ni] - pod.gpu_milli
        feed = _feed(typ, cpu, mem)  # per node, then per pair: the card does not change it
        after = _combine(typ, _node_ok(typ, model, cpu, mem)[:, ni], count_p, partial_p,
                         total_p, feed=None if feed is None else feed[:, ni], cpu=cpu[ni],
                         mem=mem[ni])
        delta_pair = after - before[ni]
        # best card per node: least delta, then tightest card, then lowest index
        order = np.lexsort((ci, after_c, np.round(delta_pair / EPS), ni))
        first = np.ones(len(order), dtype=bool)
        first[1:] = ni[order][1:] != ni[order][:-1]
        pick = order[first]
        return Ranking(cand[ni[pick]], ci[pick], delta_pair[pick], total_p[pick],
                       cpu[ni[pick]])
    count = cache.count[:, cand]
    partial = cache.partial[:, cand]
    if pod.gpus > 0:  # whole cards: full cards host every shape, so each shape loses them
        count = count - pod.gpus
        total = total - MILLI * pod.gpus
    after = _combine(typ, _node_ok(typ, model, cpu, mem), count, partial, total,
                     feed=_feed(typ, cpu, mem), cpu=cpu, mem=mem)
    return Ranking(cand, np.full(len(cand), -1, dtype=np.int64), after - before, total, cpu)
