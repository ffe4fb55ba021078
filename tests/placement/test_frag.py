"""The fragmentation measure (:mod:`gpu_admission.placement.frag`): FGD's per-shape rule on
hand-worked nodes, and the vectorised ranking held to a brute-force recomputation (place the
pod, measure the node again) over random states."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_admission.placement.frag import (
    FGD,
    LEVEL_MILLI,
    OURS,
    Measure,
    Nodes,
    Ranking,
    Shape,
    Workload,
    fixed_workload,
    node_frag,
    rank,
    typical_arrays,
)


def one_node(gpus: list[int], cpu: int = 32000, mem: int = 131072, model: str = "T4") -> Nodes:
    return Nodes.build(["n"], [model], [cpu], [mem], [gpus])


#: FGD's per-shape rule with our memory check, without the stranding term
PER_SHAPE = Measure(stranding=False)


@pytest.mark.parametrize("gpus, cpu, shapes, expected", [
    ([1000, 1000], 32000, [Shape(1000, 1024, 500, 1)], 0.0),  # every card hosts a half
    ([300, 1000], 32000, [Shape(1000, 1024, 500, 1)], 300.0),  # 300 left is a sliver
    ([300, 1000], 500, [Shape(1000, 1024, 500, 1)], 1300.0),  # no CPU: all of it
    ([1000, 600], 32000, [Shape(1000, 1024, 1000, 2)], 1600.0),  # 2 whole cards: not there
    ([1000, 600], 32000, [Shape(1000, 1024, 500, 1), Shape(1000, 1024, 1000, 1)], 300.0),
], ids=["fits", "sliver", "no-cpu", "lacks-cards", "weighted-half"])
def test_fgd_rule_by_hand(gpus: list[int], cpu: int, shapes: list[Shape],
                          expected: float) -> None:
    typ = typical_arrays(fixed_workload(shapes).typical(), ["T4"], PER_SHAPE)
    assert node_frag(one_node(gpus, cpu), typ)[0] == pytest.approx(expected)


@pytest.mark.parametrize("gpus, cpu, mem, expected", [
    ([1000, 1000], 16000, 131072, 0.0),  # CPU for both cards
    ([1000, 1000], 8000, 131072, 1000.0 + 1000.0),  # CPU for one card: per shape + mean
    ([1000, 1000], 4000, 131072, 2000.0 + 1500.0),  # per-shape rule: all; mean: 1500
    ([1000, 1000], 16000, 4000, 1000.0 + 1000.0),  # memory for one card
    ([1000, 1000], 8000, 4000, 1000.0 + 2000.0),  # shape: fed for one; mean: CPU + memory
], ids=["fed", "cpu-feeds-one-card", "below-shape-too", "memory-feeds-one", "both-short"])
def test_stranded_gpu_is_fragment(gpus: list[int], cpu: int, mem: int,
                                  expected: float) -> None:
    # the workload asks 8 milli-CPU and 4 MiB per milli-GPU (8 cores, 4000 MiB a card): the
    # shape's own term (GPU it could use that the node cannot feed for it) and the mean term
    # (GPU the node cannot feed at the workload's mean rate) are equal for one shape
    typ = typical_arrays(fixed_workload([Shape(8000, 4000, 1000, 1)]).typical(), ["T4"], OURS)
    assert (typ.cpu_per_milli, typ.mem_per_milli) == (8.0, 4.0)
    assert node_frag(one_node(gpus, cpu, mem), typ)[0] == pytest.approx(expected)


def test_each_shape_is_fed_at_its_own_rate() -> None:
    # half the pods ask 16 cores a card, half none: the mean (8 a card) feeds both cards of
    # a node with 16 cores, but the CPU-hungry half can use only one of them
    typ = typical_arrays(fixed_workload([Shape(16000, 1, 1000, 1),
                                         Shape(0, 1, 1000, 1)]).typical(), ["T4"], OURS)
    assert typ.cpu_per_milli == 8.0
    assert node_frag(one_node([1000, 1000], 16000), typ)[0] == pytest.approx(0.5 * 1000.0)


def test_fgd_measure_has_no_stranding_term() -> None:
    typ = typical_arrays(fixed_workload([Shape(8000, 4000, 1000, 1)]).typical(), ["T4"], FGD)
    assert (typ.cpu_per_milli, typ.mem_per_milli) == (0.0, 0.0)
    assert node_frag(one_node([1000, 1000], 8000), typ)[0] == 0.0


def test_cpu_pod_goes_where_cpu_is_plentiful_per_gpu() -> None:
    # openb's two common nodes: G2 (8 cards, 96 cores, 384 GiB) and T4 (2 cards, 104 cores,
    # 512 GiB); the workload's shares ask about 11 cores per card. A CPU pod of 16 cores on
    # the G2 node would leave 80 cores for 8 cards (10 a card): the T4 node is the place,
    # though neither placement takes a node below any one shape's need
    nodes = Nodes.build(["g2", "t4"], ["G2", "T4"], [96000, 104000], [393216, 524288],
                        [[1000] * 8, [1000, 1000]])
    typ = typical_arrays(fixed_workload([Shape(5500, 20480, 500, 1)] * 3
                                        + [Shape(11000, 40960, 1000, 1)]).typical(),
                         nodes.models, OURS)
    r = rank(nodes, Shape(16000, 32768, 0, 0), typ)
    assert [nodes.names[int(r.rows[int(i)])] for i in r.order()] == ["t4", "g2"]
    flat = rank(nodes, Shape(16000, 32768, 0, 0),
                typical_arrays(fixed_workload([Shape(5500, 20480, 500, 1)] * 3
                                              + [Shape(11000, 40960, 1000, 1)]).typical(),
                               nodes.models, PER_SHAPE))
    assert flat.delta.tolist() == [0.0, 0.0]  # the per-shape rule alone sees no difference


@pytest.mark.parametrize("measure, expected", [(PER_SHAPE, 1300.0), (FGD, 300.0)],
                         ids=["ours-counts-memory", "fgd-cpu-only"])
def test_memory_strands_gpus_in_our_measure(measure: Measure, expected: float) -> None:
    typ = typical_arrays(fixed_workload([Shape(1000, 65536, 500, 1)]).typical(), ["T4"],
                         measure)
    assert node_frag(one_node([300, 1000], mem=32768), typ)[0] == pytest.approx(expected)


def test_a_model_the_shape_cannot_use_is_all_fragment() -> None:
    typ = typical_arrays(fixed_workload([Shape(1000, 1024, 500, 1, ("V100M32",))]).typical(),
                         ["T4"], OURS)
    assert node_frag(one_node([1000, 1000]), typ)[0] == 2000.0


@pytest.mark.parametrize("seed", range(6), ids=[f"seed{s}" for s in range(6)])
@pytest.mark.parametrize("measure", [OURS, FGD], ids=["ours", "fgd"])
def test_ranking_equals_brute_force(seed: int, measure: Measure) -> None:
    rng = np.random.default_rng(seed)
    n = 30
    widths = rng.choice([1, 2, 4, 8], size=n)
    gpus = [list(rng.choice([0, 100, 250, 400, 500, 750, 1000], size=w)) for w in widths]
    models = list(rng.choice(["A", "B"], size=n))
    nodes = Nodes.build([f"n{i}" for i in range(n)], models,
                        list(rng.integers(0, 64000, size=n)),
                        list(rng.integers(0, 262144, size=n)), gpus)
    shapes = [Shape(4000, 16384, 250, 1), Shape(8000, 32768, 500, 1, ("A",)),
              Shape(8000, 65536, 1000, 1), Shape(16000, 65536, 1000, 2), Shape(2000, 4096, 0, 0)]
    typ = typical_arrays(fixed_workload(shapes).typical(), nodes.models, measure)
    for pod in [Shape(2000, 8192, 300, 1), Shape(8000, 16384, 1000, 2),
                Shape(1000, 2048, 0, 0), Shape(2000, 8192, 500, 1, ("B",))]:
        r = rank(nodes, pod, typ)
        before = node_frag(nodes, typ)
        for row, card, delta in zip(r.rows, r.card, r.delta, strict=True):
            after = Nodes(nodes.names, nodes.models, nodes.model.copy(), nodes.cpu.copy(),
                          nodes.mem.copy(), nodes.gpu.copy())
            after.cpu[row] -= pod.cpu_milli
            after.mem[row] -= pod.mem_mib
            if pod.gpus and pod.gpu_milli < 1000:
                assert after.gpu[row, card] >= pod.gpu_milli
                after.gpu[row, card] -= pod.gpu_milli
                # no other card of the node adds less
                for other in np.flatnonzero(nodes.gpu[row] >= pod.gpu_milli):
                    alt = after.gpu.copy()
                    alt[row, card] += pod.gpu_milli
                    alt[row, other] -= pod.gpu_milli
                    trial = Nodes(nodes.names, nodes.models, after.model, after.cpu,
                                  after.mem, alt)
                    assert node_frag(trial, typ)[row] - before[row] >= delta - 1e-6
            elif pod.gpus:
                free = np.flatnonzero(after.gpu[row] >= 1000)[:pod.gpus]
                after.gpu[row, free] -= 1000
            assert node_frag(after, typ)[row] - before[row] == pytest.approx(delta)
        assert len(r.rows) == int(np.sum(
            (nodes.cpu >= pod.cpu_milli) & (nodes.mem >= pod.mem_mib)
            & (np.array([not pod.models or m in pod.models for m in models]) | (pod.gpus == 0))
            & ((nodes.gpu >= pod.gpu_milli).sum(axis=1) >= pod.gpus)))


def test_workload_learns_and_forgets() -> None:
    w = Workload(half_life=100.0)
    prior = {s for s, _ in w.typical()}
    for _ in range(500):
        w.observe(Shape(6000, 24576, 300, 1))
    top, weight = w.typical()[0]
    assert top == Shape(6000, 24576, 300, 1) and weight > 0.9
    for _ in range(1000):
        w.observe(Shape(2000, 8192, 700, 1))
    assert w.typical()[0][0] == Shape(2000, 8192, 700, 1)
    assert Shape(6000, 24576, 300, 1) not in {s for s, _ in w.typical()}  # decayed away
    assert prior  # the prior was there before anything was seen


def ranking(delta: list[float], gpu_left: list[int], tie: list[int] | None = None) -> Ranking:
    n = len(delta)
    return Ranking(np.arange(n), np.full(n, -1), np.array(delta, dtype=np.float64),
                   np.array(gpu_left), np.zeros(n, dtype=np.int64),
                   None if tie is None else np.array(tie))


@pytest.mark.parametrize("delta, gpu_left, tie, best", [
    ([30.0, 0.0], [1000, 4000], None, 0),  # one level (100 milli): the first name wins
    ([0.0, 60.0], [4000, 1000], None, 0),  # 60 rounds to the next level: the delta wins
    ([49.0, -49.0], [1000, 2000], None, 0),  # -0.49 and 0.49 levels round to 0 alike
    ([10.0, 20.0, 0.0], [1000, 1000, 1000], None, 0),  # all equal: the first row
    ([10.0, 20.0, 0.0], [1000, 1000, 1000], [2, 0, 1], 1),  # ... or the first name
    ([500.0, -300.0, -290.0], [0, 2000, 3000], [0, 2, 1], 2),  # best level, then name
], ids=["level-then-name", "next-level", "rounding", "row-order", "name-order",
        "level-first"])
def test_order_levels_then_name(delta: list[float], gpu_left: list[int],
                                tie: list[int] | None, best: int) -> None:
    """The order the extender and simulate share (:meth:`Ranking.order`): fragmentation
    added in levels of :data:`LEVEL_MILLI`, then node name (the GPU left on the node plays
    no part: best fit within a level sends pods to the small nodes that model-pinned pods
    need); one best, never a draw."""
    r = ranking(delta, gpu_left, tie)
    assert LEVEL_MILLI == 100
    assert r.best().tolist() == [best]
    assert r.order()[0] == best
    assert sorted(r.order().tolist()) == list(range(len(delta)))
    assert r.take(r.order()).best().tolist() == [0]
