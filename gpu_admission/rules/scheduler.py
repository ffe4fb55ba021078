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

Pods without a GPU (issue 32, "CPU pods on GPU nodes"): with ``spec.scheduling.cpuPods:
gpu-aware`` (the default) a pod CREATE without a GPU gets the same scheduler under the same
conditions (:func:`cpu_pod_scheduler`), so the GPU-aware profile packs CPU pods instead of the
default scheduler spreading them over GPU nodes and stranding GPUs. DaemonSet pods are not
routed: the DaemonSet controller fixes each one's node (required node affinity on
``metadata.name``), so packing gains nothing and the default scheduler keeps them independent
of the second scheduler's health. A CPU pod naming another scheduler keeps it, unreported (it is
not a GPU pod: nothing of the GPU policy is off). Engine: ``engine._non_gpu``; compiled: the
guard half (``compile/guard.py``) and, for the webhook's zero-quantity pods, ``SchedulerUnit``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gpu_admission.core.vocab import DEFAULT_SCHEDULER
from gpu_admission.rules.base import Context

RULE: Final = "scheduler-name"
DAEMONSET_KIND: Final = "DaemonSet"


def daemonset_pod(meta: Mapping[str, Any]) -> bool:
    """Whether a DaemonSet owns the pod (an ``ownerReferences`` entry of kind DaemonSet)."""
    owners = meta.get("ownerReferences")
    return isinstance(owners, list) and any(
        isinstance(ref, dict) and ref.get("kind") == DAEMONSET_KIND for ref in owners)


def cpu_pod_scheduler(spec: Mapping[str, Any], meta: Mapping[str, Any],
                      target: str | None) -> str | None:
    """The scheduler a pod without a GPU is given on CREATE, None to leave it alone.
    ``target``: the policy's ``schedulerName`` when ``spec.scheduling.cpuPods`` is
    ``gpu-aware`` (``Compiled.cpu_scheduler``), else None."""
    if not target or spec.get("nodeName"):
        return None
    if spec.get("schedulerName") not in (None, "", DEFAULT_SCHEDULER):
        return None
    if daemonset_pod(meta):
        return None
    return target


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
