"""Issue 32: the FGD measure in :mod:`gpu_admission.placement.frag` (``Measure FGD``) is FGD's
own, checked against a line-by-line reading of the simulator's Go
(hkust-adsl/kubernetes-scheduler-simulator ``pkg/utils/frag.go``: ``NodeGpuShareFragAmount``,
``GetNodePodFrag``, ``CanNodeHostPodOnGpuMemory``, ``IsNodeAccessibleToPodByType``) on random
node states, for the node's fragmentation and for the increase a placement causes (what
``fgd_score.go`` feeds its sigmoid)."""

from __future__ import annotations

import numpy as np

from gpu_admission.placement.frag import (
    FGD,
    MILLI,
    FragCache,
    Nodes,
    Shape,
    fixed_workload,
    rank,
    typical_arrays,
)

MODELS = ["A10", "P100", "T4"]


def literal(gpus: list[int], cpu: int, model: str, typical: list[tuple[Shape, float]]) -> float:
    """FGD's ``NodeGpuShareFragAmountScore``: per typical pod, Q3 (CPU fits, enough cards
    with the pod's milli-GPU free, model accessible) counts only the cards with less than the
    pod's milli-GPU free; every other class (lack GPU, lack CPU, no access, CPU-only pod:
    XL/XR) counts all the node's free milli-GPU."""
    total = sum(gpus)
    out = 0.0
    for pod, freq in typical:
        if pod.gpu_milli == 0:  # XLSatisfied / XRLackCPU: not Q3
            out += freq * total
            continue
        if pod.models and model not in pod.models:  # NoAccess
            out += freq * total
            continue
        host = sum(1 for g in gpus if g >= pod.gpu_milli) >= pod.gpus
        if host and cpu >= pod.cpu_milli:  # Q3: the cards that cannot take the pod
            out += freq * sum(g for g in gpus if g < pod.gpu_milli)
        else:
            out += freq * total
    return out


def random_state(rng: np.random.Generator, n: int) -> tuple[list[list[int]], list[int],
                                                            list[str]]:
    gpus = [[int(rng.choice([0, 90, 250, 500, 530, 1000, 1000])) for _ in
             range(int(rng.choice([1, 2, 4, 8])))] for _ in range(n)]
    cpus = [int(rng.choice([0, 2000, 8000, 30000, 64000])) for _ in range(n)]
    models = [str(rng.choice(MODELS)) for _ in range(n)]
    return gpus, cpus, models


def workload(rng: np.random.Generator) -> list[Shape]:
    shapes = [Shape(int(rng.choice([1000, 4000, 12000])), 0, int(rng.choice([100, 470, 810])),
                    1, ()) for _ in range(30)]
    shapes += [Shape(8000, 0, MILLI, int(rng.choice([1, 2, 8])), ()) for _ in range(10)]
    shapes += [Shape(4000, 0, 500, 1, ("T4",)) for _ in range(5)]
    shapes += [Shape(12000, 0, 0, 0, ()) for _ in range(8)]
    return shapes


def test_node_fragmentation_is_fgds() -> None:
    rng = np.random.default_rng(7)
    gpus, cpus, models = random_state(rng, 60)
    typical = fixed_workload(workload(rng)).typical()
    nodes = Nodes.build([f"n{i}" for i in range(60)], models, cpus, [2**30] * 60, gpus)
    cache = FragCache.build(nodes, typical_arrays(typical, nodes.models, FGD))
    for i in range(60):
        assert abs(cache.frag[i] - literal(gpus[i], cpus[i], models[i], typical)) < 1e-6


def test_the_increase_a_placement_causes_is_fgds() -> None:
    """For a share pod the card is the one adding the least (FGD's ``calculate...Score``
    keeps the card with the highest score, i.e. the least increase); for whole-GPU and CPU
    pods the node's only outcome."""
    rng = np.random.default_rng(11)
    gpus, cpus, models = random_state(rng, 40)
    typical = fixed_workload(workload(rng)).typical()
    nodes = Nodes.build([f"n{i}" for i in range(40)], models, cpus, [2**30] * 40, gpus)
    typ = typical_arrays(typical, nodes.models, FGD)
    for pod in (Shape(2000, 0, 470, 1), Shape(8000, 0, MILLI, 2), Shape(6000, 0, 0, 0)):
        r = rank(nodes, pod, typ)
        assert len(r.rows) > 0
        for j, row in enumerate(r.rows.tolist()):
            before = literal(gpus[row], cpus[row], models[row], typical)
            if pod.gpus and pod.gpu_milli < MILLI:
                options = []
                for c, free in enumerate(gpus[row]):
                    if free >= pod.gpu_milli:
                        after = list(gpus[row])
                        after[c] -= pod.gpu_milli
                        options.append(literal(after, cpus[row] - pod.cpu_milli, models[row],
                                               typical) - before)
                assert abs(r.delta[j] - min(options)) < 1e-6
                continue
            after = list(gpus[row])
            taken = 0
            for c, free in enumerate(after):  # whole cards: fully free ones
                if taken < pod.gpus and free >= MILLI:
                    after[c] -= MILLI
                    taken += 1
            got = literal(after, cpus[row] - pod.cpu_milli, models[row], typical) - before
            assert abs(r.delta[j] - got) < 1e-6
