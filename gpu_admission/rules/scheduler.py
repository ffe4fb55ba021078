"""Rule ``scheduler-name``: GPU pods go to the GPU-aware scheduler profile.

Why (seed article, option 2): GPU-aware placement packs shared-GPU pods onto GPUs that are
already partly used instead of spreading them. The install ships it as a second scheduler
(``webhook-manifests/base/scheduler-*.yaml``): the upstream kube-scheduler with profile
``gpu-aware-scheduler`` (``NodeResourcesFit`` ``MostAllocated`` on the GPU resources) plus
our DCGM-driven extender, ``gpu-admission extender`` (docs/extender.md). A pod reaches it
through ``spec.schedulerName``
(https://kubernetes.io/docs/tasks/extend-kubernetes/configure-multiple-schedulers/).
A pod whose ``schedulerName`` is empty or ``default-scheduler`` gets the policy's scheduler; a
pod naming another scheduler keeps it (reported, default mode warn); a pod with ``nodeName``
set bypasses scheduling and is left alone.
"""

from __future__ import annotations

from typing import Final

from gpu_admission.core.vocab import DEFAULT_SCHEDULER
from gpu_admission.rules.base import Context

RULE: Final = "scheduler-name"


class SchedulerName:
    ids: tuple[str, ...] = (RULE,)

    def check(self, ctx: Context) -> None:
        target = ctx.policy.spec.scheduler_name
        if not target or ctx.spec.get("nodeName"):
            return
        if ctx.other is not None and ctx.other.declared:
            return  # KAI/HAMi pods are placed by their own scheduler (spec.otherSharingSystems)
        current = ctx.spec.get("schedulerName")
        if current in (None, "", DEFAULT_SCHEDULER):
            if ctx.patch is not None:
                ctx.patch.set_scheduler_name(target)
            return
        if current != target:
            ctx.violate(RULE, "spec.schedulerName",
                        f"keeps scheduler {str(current)[:40]!r}, not {target!r} (GPU packing off)")
