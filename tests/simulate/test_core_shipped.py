"""Issue 32: ``--placement shipped`` learns the workload as the extender does. The
extender's arrays have one GPU-model column (kube-scheduler applies a pod's nodeSelector), so
the shapes it learns carry no model; the simulator's shipped placement must not know more."""

from __future__ import annotations

import numpy as np

from gpu_admission.placement.frag import Shape
from gpu_admission.simulate.core import Cluster, Shipped
from gpu_admission.simulate.trace import NodeSpec


def test_shipped_learns_shapes_without_gpu_model_but_places_on_the_pinned_model() -> None:
    cluster = Cluster.build([NodeSpec("n-a", 64000, 262144, 2, "T4"),
                             NodeSpec("n-b", 64000, 262144, 2, "V100M32")])
    policy = Shipped(np.random.Generator(np.random.PCG64(1)))
    pinned = Shape(4000, 8192, 500, 1, ("V100M32",))
    decision = policy(cluster, pinned)
    assert cluster.nodes.names[decision.node] == "n-b"  # the pod's own constraint holds
    assert Shape(4000, 8192, 500, 1) in policy.workload.counts
    assert all(not s.models for s in policy.workload.counts)
