"""The replay behind ``gpu-admission simulate``. PURE: nodes, pods and a placement in; the
allocation curve and what was left out. No I/O; the clock is passed in (time per decision).

Protocol (FGD's simulator, ``hkust-adsl/kubernetes-scheduler-simulator``
``pkg/simulator/core.go`` and ``simulator.go``): one throw-away draw after seeding
(``rand.Int()`` in its debug log), pods sorted by name and shuffled (Fisher-Yates from the
end, as Go's ``rand.Shuffle``), then topped up with copies of pods drawn uniformly from the
name-sorted originals until the next draw's per-card milli-GPU would pass ``tune`` x the
cluster's milli-GPU (``tuneUpPods``, whose check adds the drawn pod's per-card share, not its
total: kept). Pods are placed one by one, none deleted; a pod that fits nowhere is dropped.
Each pod records (arrived milli-GPU so far, allocated milli-GPU so far); the curve is
``experiments/analysis/merge_alloc_discrete.py``: arrived % of capacity rounded to an
integer (Python's ``round``), the mean allocated % of the records in each bucket (a bucket
without records takes those within +-1), 0..130.

The random numbers come from numpy's PCG64 seeded with ``seed``, not Go's ``math/rand``
(whose generator cannot be rebuilt without its 607-word seed table), so a seed gives the same
kind of shuffle, not the same one.

Placements:

* ``random``: a uniformly random node that fits, a random card that fits (the paper's
  Random: ``RandomScore`` + ``gpusel random``);
* ``bestfit``: the paper's BestFit (``best_fit_score.go``): score
  ``int(100 * (1 - (0.5 * cpu_left / 128000 + 0.5 * gpu_left / 8000)))``, min-max normalised
  to 0..100 in integers, ties to the node whose name sorts first (the simulator's
  ``selectHost``, :func:`_pick_max_first_name`), the tightest card;
* ``fgd``: FGD (``fgd_score.go``) against the typical pods of the input (known in advance,
  keyed as the simulator keys them: :func:`fgd_key`, CPU pods included):
  ``int(100 * sigmoid((frag_before - frag_after) / 1000))`` per node, the card with the
  highest; equal scores go to the node whose name sorts first (the simulator's vendored
  ``selectHost``, :func:`_pick_max_first_name`: not random);
* ``shipped``: what the install runs (:mod:`gpu_admission.placement.frag` with the learned
  workload and the measure counting memory) for every pod of the ``gpu-aware-scheduler``
  profile: fractional, whole-GPU and CPU pods (the webhook routes CPU pods of opted-in
  namespaces there, and the extender entry without ``managedResources`` ranks them). The
  extender's prioritize gives 10 only to the best node of its ranking (fragmentation level,
  then node name: :meth:`~gpu_admission.placement.frag.Ranking.order`), with a weight
  that outweighs every in-tree plugin, so kube-scheduler lands on it; bind takes the
  ranking's card. Nothing is drawn;
* ``shipped-cpu-default``: the same, CPU pods on the default scheduler
  (:func:`default_scheduler`): an install whose CPU pods are not routed to the profile.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

import numpy as np

from gpu_admission.placement.frag import (
    FGD,
    MILLI,
    OURS,
    FragCache,
    Nodes,
    Shape,
    Workload,
    fits,
    fixed_workload,
    name_ranks,
    rank,
    typical_arrays,
)
from gpu_admission.simulate.trace import NodeSpec, PodSpec

Placement = Literal["shipped", "shipped-cpu-default", "fgd", "bestfit", "random"]
PLACEMENTS: Final = ("shipped", "shipped-cpu-default", "fgd", "bestfit", "random")
MAX_PERCENT: Final = 130
MAX_SPEC_CPU: Final = 128000  # milli-CPU, the simulator's gpushareutils.MaxSpecCpu
MAX_SPEC_GPU: Final = 8000  # milli-GPU, gpushareutils.MaxSpecGpu
#: shipped: the learned workload's typical shapes are re-read every this many observed pods
#: (between refreshes only the changed node's fragmentation is recomputed)
REFRESH_EVERY: Final = 256


@dataclass(frozen=True, slots=True)
class Decision:
    node: int  # row, -1 when the pod fits nowhere
    card: int  # share pods: the card, else -1


def protocol_order(pods: Sequence[PodSpec], capacity_milli: int, seed: int, tune: float
                   ) -> list[PodSpec]:
    """Sorted by name, shuffled, topped up to ``tune`` x capacity (see the module doc)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    rng.integers(0, 2**63 - 1)  # the simulator's rand.Int() after seeding
    ordered = sorted(pods, key=lambda p: p.name)
    out = list(ordered)
    for i in range(len(out) - 1, 0, -1):
        j = int(rng.integers(0, i + 1))
        out[i], out[j] = out[j], out[i]
    if tune <= 0 or not ordered:
        return out
    total = sum(p.shape.total_milli for p in out)
    target = tune * capacity_milli
    i = 0
    while True:
        pick = ordered[int(rng.integers(0, len(ordered)))]
        if total + pick.shape.gpu_milli > target:
            break
        total += pick.shape.total_milli
        out.append(PodSpec(f"{pick.name}-tuned-{i}", pick.shape))
        i += 1
    return out


@dataclass
class Cluster:
    """Free resources as arrays (:class:`~gpu_admission.placement.frag.Nodes`) plus what the
    policies cache between decisions."""

    nodes: Nodes
    capacity_milli: int
    cpu_cap: np.ndarray[Any, Any]  # (N,) milli-CPU allocatable
    mem_cap: np.ndarray[Any, Any]  # (N,) MiB allocatable
    name_rank: np.ndarray[Any, Any]  # (N,) each node's place in name order (the last tie)

    @classmethod
    def build(cls, specs: Sequence[NodeSpec]) -> Cluster:
        nodes = Nodes.build([n.name for n in specs], [n.model for n in specs],
                            [n.cpu_milli for n in specs], [n.mem_mib for n in specs],
                            [[MILLI] * n.gpus for n in specs])
        return cls(nodes, sum(n.gpus for n in specs) * MILLI, nodes.cpu.copy(),
                   nodes.mem.copy(), name_ranks([n.name for n in specs]))

    def apply(self, row: int, card: int, pod: Shape) -> None:
        n = self.nodes
        n.cpu[row] -= pod.cpu_milli
        n.mem[row] -= pod.mem_mib
        if pod.gpus == 0:
            return
        if pod.gpu_milli < MILLI:
            assert n.gpu[row, card] >= pod.gpu_milli, "over-committed card"
            n.gpu[row, card] -= pod.gpu_milli
            return
        free = np.flatnonzero(n.gpu[row] >= MILLI)[:pod.gpus]
        assert len(free) == pod.gpus, "over-committed node"
        n.gpu[row, free] -= MILLI


Policy = Callable[[Cluster, Shape], Decision]


def random_policy(rng: np.random.Generator) -> Policy:
    def decide(cluster: Cluster, pod: Shape) -> Decision:
        ok, card_ok = fits(cluster.nodes, pod)
        cand = np.flatnonzero(ok)
        if len(cand) == 0:
            return Decision(-1, -1)
        row = int(cand[rng.integers(0, len(cand))])
        card = -1
        if pod.gpus and pod.gpu_milli < MILLI:
            cards = np.flatnonzero(card_ok[row])
            card = int(cards[rng.integers(0, len(cards))])
        return Decision(row, card)
    return decide


def _tightest_card(nodes: Nodes, row: int, pod: Shape) -> int:
    if not pod.gpus or pod.gpu_milli >= MILLI:
        return -1
    g = nodes.gpu[row]
    fit = np.flatnonzero(g >= pod.gpu_milli)
    return int(fit[np.argmin(g[fit])])  # first of the least free (argmin: first index)


def _pick_max(scores: np.ndarray[Any, Any], rng: np.random.Generator) -> int:
    top = np.flatnonzero(scores == scores.max())
    return int(top[rng.integers(0, len(top))]) if len(top) > 1 else int(top[0])


def _pick_max_first_name(scores: np.ndarray[Any, Any], names: Sequence[str]) -> int:
    """The simulator's own tie rule: among the highest scores, the node whose name sorts
    first. Its vendored kube-scheduler replaced ``selectHost``'s reservoir sampling with "for
    reproducibility, choose the smallest lexicographical order if the score remains the same"
    (``vendor/k8s.io/kubernetes/pkg/scheduler/core/generic_scheduler.go``). ``names``: the
    candidates' names, in the order of ``scores``."""
    top = np.flatnonzero(scores == scores.max())
    return int(min(top.tolist(), key=lambda i: names[i]))


def bestfit_policy(rng: np.random.Generator) -> Policy:
    del rng  # equal scores go by node name (the simulator's selectHost), nothing is drawn
    def decide(cluster: Cluster, pod: Shape) -> Decision:
        n = cluster.nodes
        ok, _ = fits(n, pod)
        cand = np.flatnonzero(ok)
        if len(cand) == 0:
            return Decision(-1, -1)
        cpu_left = (n.cpu[cand] - pod.cpu_milli) / MAX_SPEC_CPU * 0.5
        gpu_left = (n.free_gpu()[cand] - pod.total_milli) / MAX_SPEC_GPU * 0.5
        raw = ((1.0 - (cpu_left + gpu_left)) * 100).astype(np.int64)  # Go int64(): truncate
        lo, hi = raw.min(), raw.max()
        norm = (raw - lo) * 100 // (hi - lo) if hi > lo else np.zeros_like(raw)
        row = int(cand[_pick_max_first_name(norm, [n.names[int(c)] for c in cand])])
        return Decision(row, _tightest_card(n, row, pod))
    return decide


def _sigmoid(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    out: np.ndarray[Any, Any] = 1.0 / (1.0 + np.exp(-x))
    return out


@dataclass
class Fgd:
    """FGD (see the module doc): the fragmentation cache kept row by row."""

    rng: np.random.Generator
    shapes: Sequence[Shape]
    cache: FragCache | None = None

    def __call__(self, cluster: Cluster, pod: Shape) -> Decision:
        n = cluster.nodes
        if self.cache is None:
            typ = typical_arrays(fixed_workload(self.shapes).typical(), n.models, FGD)
            self.cache = FragCache.build(n, typ)
        r = rank(n, pod, self.cache.typ, self.cache)
        if len(r.rows) == 0:
            return Decision(-1, -1)
        score = (_sigmoid(-r.delta / 1000) * 100).astype(np.int64)
        i = _pick_max_first_name(score, [n.names[int(row)] for row in r.rows])
        return Decision(int(r.rows[i]), int(r.card[i]))

    def placed(self, cluster: Cluster, row: int) -> None:
        if self.cache is not None:
            self.cache.update(cluster.nodes, np.array([row]))


@dataclass
class Shipped:
    """The install's placement: the extender's ranking (learned workload, our measure), its
    scores spread so only the best gets 10, which kube-scheduler therefore takes."""

    rng: np.random.Generator
    workload: Workload = field(default_factory=Workload)
    cache: FragCache | None = None
    _seen_at: int = -1

    #: CPU pods: "ranked" = the extender's fragmentation ranking (the shipped profile),
    #: "default" = the default scheduler (CPU pods not routed to the profile)
    cpu_pods: str = "ranked"

    def __call__(self, cluster: Cluster, pod: Shape) -> Decision:
        n = cluster.nodes
        if pod.gpus == 0 and self.cpu_pods == "default":
            return default_scheduler(cluster, pod, self.rng)
        # the extender learns every pod it is asked about, with no GPU model (its arrays have
        # one model column; kube-scheduler applies a pod's nodeSelector), so neither does this
        self.workload.observe(replace(pod, models=()) if pod.models else pod)
        if self.cache is None or self.workload.seen - self._seen_at >= REFRESH_EVERY:
            self.cache = FragCache.build(n, typical_arrays(self.workload.typical(), n.models,
                                                           OURS))
            self._seen_at = self.workload.seen
        r = rank(n, pod, self.cache.typ, self.cache)
        best = replace(r, tie=cluster.name_rank[r.rows]).best()
        if len(best) == 0:
            return Decision(-1, -1)
        i = int(best[0])
        return Decision(int(r.rows[i]), int(r.card[i]))

    def placed(self, cluster: Cluster, row: int) -> None:
        if self.cache is not None:
            self.cache.update(cluster.nodes, np.array([row]))


def default_scheduler(cluster: Cluster, pod: Shape, rng: np.random.Generator) -> Decision:
    """kube-scheduler's default profile for a pod without GPUs, as far as the node's
    resources decide: NodeResourcesFit ``LeastAllocated`` (cpu and memory, weight 1 each:
    mean of ``(capacity - requested) x 100 / capacity``, integers) plus
    NodeResourcesBalancedAllocation (``(1 - std of the cpu and memory fractions) x 100``),
    ties at random (``selectHost``); the other default plugins score every node alike here."""
    n = cluster.nodes
    ok, _ = fits(n, pod)
    cand = np.flatnonzero(ok)
    if len(cand) == 0:
        return Decision(-1, -1)
    cap_c, cap_m = cluster.cpu_cap[cand], cluster.mem_cap[cand]
    left_c = n.cpu[cand] - pod.cpu_milli
    left_m = n.mem[cand] - pod.mem_mib
    least = ((left_c * 100 // cap_c) + (left_m * 100 // cap_m)) // 2
    frac_c = 1 - left_c / cap_c
    frac_m = 1 - left_m / cap_m
    balanced = ((1 - np.abs(frac_c - frac_m) / 2) * 100).astype(np.int64)
    return Decision(int(cand[_pick_max(least + balanced, rng)]), -1)


DEFAULT_MILLI_CPU: Final = 100  # kube-scheduler's non-zero CPU request (milli-CPU)


def fgd_key(shape: Shape) -> Shape:
    """A pod as FGD's typical-pod histogram counts it: ``simontype.PodResource`` is (milli-CPU,
    milli-GPU per card, cards, GPU model) with no memory (``pkg/type/resource.go``), and
    ``utils.GetPodResource`` takes the CPU through ``GetNonzeroRequests`` (0 -> 100m). So pods
    differing only in memory are one typical shape, and the 95 % coverage cut is made over
    those merged counts (``GetTypicalPods``, ``podPopularityThreshold: 95``,
    ``podIncreaseStep: 1``, ``isInvolvedCpuPods: true`` in ``generate_config_and_run.py``)."""
    return Shape(shape.cpu_milli or DEFAULT_MILLI_CPU, 0, shape.gpu_milli, shape.gpus,
                 shape.models)


def make_policy(name: str, seed: int, pods: Sequence[PodSpec]) -> Policy:
    rng = np.random.Generator(np.random.PCG64(seed + 1_000_003))
    if name == "random":
        return random_policy(rng)
    if name == "bestfit":
        return bestfit_policy(rng)
    if name == "fgd":
        return Fgd(rng, [fgd_key(p.shape) for p in pods])
    if name == "shipped":
        return Shipped(rng)
    if name == "shipped-cpu-default":
        return Shipped(rng, cpu_pods="default")
    raise ValueError(f"unknown placement {name!r}; expected one of {', '.join(PLACEMENTS)}")


@dataclass
class Result:
    placement: str
    seed: int
    tune: float
    pods: int
    gpus: int
    curve: dict[str, float]
    failed: dict[str, int]
    arrived: dict[str, int]
    unallocated: dict[str, Any]
    decision_ms: dict[str, float]
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"placement": self.placement, "seed": self.seed, "tune": self.tune,
                "pods": self.pods, "gpus": self.gpus, "curve": self.curve,
                "failed_pods": self.failed, "arrived_pods": self.arrived,
                "unallocated_gpus": self.unallocated, "decision_ms": self.decision_ms,
                "note": self.note}


def curve(records: Sequence[tuple[int, int]], gpus: int, until: int = MAX_PERCENT
          ) -> dict[str, float]:
    """merge_alloc_discrete.py's discretisation (see the module doc)."""
    if not records or gpus == 0:
        return {}
    arr = np.array(records, dtype=np.float64)
    arrive = np.array([round(x, 0) for x in (arr[:, 0] / gpus / 10).tolist()])
    alloc = np.array([round(x, 2) for x in (arr[:, 1] / gpus / 10).tolist()])
    out: dict[str, float] = {}
    for pct in range(0, until + 1):
        sel = alloc[arrive == pct]
        if len(sel) == 0:
            sel = alloc[(arrive >= pct - 1) & (arrive <= pct + 1)]
            if len(sel) == 0:
                continue
        out[str(pct)] = round(float(sel.mean()), 2)
    return out


def unallocated(nodes: Nodes, seen: Sequence[Shape]) -> dict[str, Any]:
    """Free GPUs at the end (in GPUs), whole and partial cards, and why no pod took them:
    the node's CPU or memory is below what any GPU pod seen asked, or (partial cards) the
    free part is below the smallest share seen."""
    gpu_pods = [s for s in seen if s.gpus]
    min_cpu = min((s.cpu_milli for s in gpu_pods), default=0)
    min_mem = min((s.mem_mib for s in gpu_pods), default=0)
    min_share = min((s.gpu_milli for s in gpu_pods), default=MILLI)
    g = np.clip(nodes.gpu, 0, None)
    whole = (g >= MILLI).sum(axis=1)
    partial = np.where((g > 0) & (g < MILLI), g, 0)
    reasons: dict[str, float] = {}
    for row in np.flatnonzero(g.sum(axis=1) > 0):
        free = float(g[row].sum()) / MILLI
        if nodes.cpu[row] < min_cpu:
            reasons["no_cpu"] = reasons.get("no_cpu", 0.0) + free
        elif nodes.mem[row] < min_mem:
            reasons["no_memory"] = reasons.get("no_memory", 0.0) + free
        else:
            small = float(partial[row][partial[row] < min_share].sum()) / MILLI
            reasons["share_too_small"] = reasons.get("share_too_small", 0.0) + small
            reasons["other"] = reasons.get("other", 0.0) + free - small
    return {"whole": int(whole.sum()), "partial_cards": int((partial > 0).sum()),
            "partial_gpus": round(float(partial.sum()) / MILLI, 2),
            "total_gpus": round(float(g.sum()) / MILLI, 2),
            "why": {k: round(v, 2) for k, v in sorted(reasons.items())}}


def simulate(nodes: Sequence[NodeSpec], pods: Sequence[PodSpec], *, placement: str = "shipped",
             seed: int = 42, tune: float = 1.3, until: int = MAX_PERCENT,
             clock: Callable[[], float] | None = None,
             progress: Callable[[int, int], None] | None = None, note: str = "") -> Result:
    """Replay ``pods`` on ``nodes`` under the protocol; stop once arrived demand passes
    ``until`` % of capacity (the curve beyond it would be empty anyway)."""
    cluster = Cluster.build(nodes)
    order = protocol_order(pods, cluster.capacity_milli, seed, tune)
    policy = make_policy(placement, seed, pods)
    gpus = cluster.capacity_milli // MILLI
    arrived = used = 0
    records: list[tuple[int, int]] = []
    failed: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    times: list[float] = []
    seen: list[Shape] = []
    stop = (until + 1) * gpus * 10  # arrived milli-GPU past the last bucket
    for i, pod in enumerate(order):
        shape = pod.shape
        kinds[pod.kind] += 1
        seen.append(shape)
        t0 = clock() if clock else 0.0
        d = policy(cluster, shape)
        if clock:
            times.append(clock() - t0)
        arrived += shape.total_milli
        if d.node >= 0:
            cluster.apply(d.node, d.card, shape)
            used += shape.total_milli
            placed = getattr(policy, "placed", None)
            if placed is not None:
                placed(cluster, d.node)
        else:
            failed[pod.kind] += 1
        records.append((arrived, used))
        if progress:
            progress(i + 1, len(order))
        if arrived > stop:
            break
    ms = np.array(times) * 1000 if times else np.zeros(1)
    return Result(placement, seed, tune, len(records), gpus, curve(records, gpus, until),
                  {k: failed.get(k, 0) for k in ("cpu", "share", "1-gpu", "multi-gpu")},
                  dict(sorted(kinds.items())), unallocated(cluster.nodes, seen),
                  {"p50": round(float(np.percentile(ms, 50)), 3),
                   "p99": round(float(np.percentile(ms, 99)), 3),
                   "max": round(float(ms.max()), 3)}, note)


def at(result: Result, percent: int) -> float:
    """The curve's value at ``percent`` (nan when the replay did not reach it)."""
    return result.curve.get(str(percent), math.nan)
