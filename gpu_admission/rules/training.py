"""Rule ``no-training-on-shared-gpu``: training never runs on a time-sliced or MPS GPU.

Why (seed article, pitfall 4): two training jobs on one time-sliced GPU each run ~3x slower;
time-slicing is for inference and notebooks, training gets dedicated hardware. A training pod
that targets a shared GPU (``.shared`` resource, GFD ``nvidia.com/gpu.sharing-strategy`` in
time-slicing/mps, a ``-SHARED`` product, or a shared pool) is reported. A training pod that asks
for plain ``nvidia.com/gpu`` is protected instead: it gets the required node-affinity
requirement ``nvidia.com/gpu.sharing-strategy NotIn [time-slicing, mps]`` in every term
(terms are ORed, https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/).
GFD labels: https://github.com/NVIDIA/k8s-device-plugin (docs/gpu-feature-discovery).

Where GPU nodes are visible (:mod:`gpu_admission.facts.nodepools`, issue 33) the node affinity
follows where the pod may land instead, for every GPU pod: a pod that gets no memory caps
while sharing nodes exist gets the same ``NotIn`` requirement (it cannot land on a shared
card uncapped), a pod that shares by default is routed to its sharing pool (an ``In``
requirement per label of the pool's selector), and where no node shares, nothing is added.
"""

from __future__ import annotations

from typing import Any, Final

from gpu_admission.core.vocab import GFD_SHARING_STRATEGY, SHARED_STRATEGIES
from gpu_admission.rules.base import Context

RULE: Final = "no-training-on-shared-gpu"
PROTECTION: Final[dict[str, Any]] = {
    "key": GFD_SHARING_STRATEGY, "operator": "NotIn", "values": list(SHARED_STRATEGIES)}


class NoTrainingOnSharedGpu:
    ids: tuple[str, ...] = (RULE,)

    def check(self, ctx: Context) -> None:
        landing = ctx.landing
        if landing is not None and ctx.patch is not None:
            if landing.protect:
                ctx.patch.require_node_expression(PROTECTION)
            if landing.route is not None:
                for key, value in sorted(landing.route.node_selector.items()):
                    ctx.patch.require_node_expression(
                        {"key": key, "operator": "In", "values": [value]})
        if ctx.workload != "training":
            return
        for path, why in ctx.shared_reasons:
            ctx.violate(RULE, path,
                        f"training pod targets a time-sliced GPU ({why}); time-slicing makes "
                        "each training job ~3x slower. Request nvidia.com/gpu on a dedicated "
                        "node pool (sharing none) or MIG, or label the pod "
                        "gpu-admission.io/workload=inference if it only serves")
        if ctx.patch is not None and not ctx.shared_reasons and landing is None:
            ctx.patch.require_node_expression(PROTECTION)
