"""Issue 32: ``--placement fgd`` counts typical pods as FGD's simulator does
(``simontype.PodResource``: no memory; CPU through ``GetNonzeroRequests``)."""

from __future__ import annotations

from gpu_admission.placement.frag import Shape, fixed_workload
from gpu_admission.simulate.core import fgd_key


def test_pods_differing_only_in_memory_are_one_typical_shape() -> None:
    pods = [Shape(4000, 8192, 500, 1), Shape(4000, 16384, 500, 1), Shape(8000, 8192, 0, 0)]
    typical = fixed_workload([fgd_key(p) for p in pods]).typical()
    assert [(s, round(w, 3)) for s, w in typical] == [(Shape(4000, 0, 500, 1), 0.667),
                                                     (Shape(8000, 0, 0, 0), 0.333)]


def test_a_pod_without_cpu_counts_kube_schedulers_default_request() -> None:
    assert fgd_key(Shape(0, 1024, 1000, 2, ("T4",))) == Shape(100, 0, 1000, 2, ("T4",))
