"""Issue 32: ``--placement fgd`` counts typical pods as FGD's simulator does
(``simontype.PodResource``: no memory; CPU through ``GetNonzeroRequests``), and settles
equal scores as its vendored kube-scheduler does (the node whose name sorts first)."""

from __future__ import annotations

import numpy as np

from gpu_admission.placement.frag import Shape, fixed_workload
from gpu_admission.simulate.core import Cluster, Fgd, fgd_key
from gpu_admission.simulate.trace import NodeSpec


def test_pods_differing_only_in_memory_are_one_typical_shape() -> None:
    pods = [Shape(4000, 8192, 500, 1), Shape(4000, 16384, 500, 1), Shape(8000, 8192, 0, 0)]
    typical = fixed_workload([fgd_key(p) for p in pods]).typical()
    assert [(s, round(w, 3)) for s, w in typical] == [(Shape(4000, 0, 500, 1), 0.667),
                                                     (Shape(8000, 0, 0, 0), 0.333)]


def test_a_pod_without_cpu_counts_kube_schedulers_default_request() -> None:
    assert fgd_key(Shape(0, 1024, 1000, 2, ("T4",))) == Shape(100, 0, 1000, 2, ("T4",))


def test_fgd_gives_equal_scores_to_the_node_whose_name_sorts_first() -> None:
    """Three identical nodes, listed out of name order: every draw picks ``n-a`` (random
    ties would pick another for some seed)."""
    specs = [NodeSpec(name, 64000, 262144, 2, "T4") for name in ("n-b", "n-a", "n-c")]
    pod = Shape(4000, 8192, 500, 1)
    for seed in range(20):
        cluster = Cluster.build(specs)
        policy = Fgd(np.random.default_rng(seed), [fgd_key(pod)])
        assert cluster.nodes.names[policy(cluster, pod).node] == "n-a"
