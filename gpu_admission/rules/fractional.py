"""Fractional GPUs: the webhook's mutation of a pod on a ``sharing: fractional`` pool.

Why (issue 20; ``shared/reference/exact-gpu-placement.md`` section 2, the KAI-Scheduler
pattern with the stock NVIDIA device plugin): the GPU-aware scheduler's extender chooses the
card at ``bind`` and writes its UUID into a ConfigMap of the pod's own; the pod must therefore
not ask the device plugin for a GPU, must read its GPU from that ConfigMap, and must ask for
its memory share in a resource the scheduler and ``ResourceQuota`` can count. For a pod that
:func:`gpu_admission.facts.fractional.plan` makes fractional, at Pod CREATE (mutate stage), every
GPU container gets:

* ``nvidia.com/gpu`` and ``nvidia.com/gpu.shared`` removed from ``requests`` and ``limits``
  (the device plugin never sees the pod);
* ``gpu-admission.io/gpu-memory: <share MiB>`` in ``requests`` and ``limits`` (an extended
  resource: integer, request == limit). Only one app container can hold the one GPU, so the
  pod's effective request (max(sum over app containers, max over init containers), what
  ResourceQuota ``requests.gpu-admission.io/gpu-memory`` counts) is exactly the share;
* ``NVIDIA_VISIBLE_DEVICES`` from ``valueFrom.configMapKeyRef`` (the pod's ConfigMap, key
  ``NVIDIA_VISIBLE_DEVICES``, ``optional: false``), upserted by name;

and the pod gets the annotations ``gpu-admission.io/gpu-memory`` (the share, MiB) and
``gpu-admission.io/gpu-configmap`` (the ConfigMap's name). The memory variables (sized to the
share) are the memory rule's (:mod:`gpu_admission.rules.memory`), ``schedulerName`` the
scheduler rule's, the acceptance of this exact ``NVIDIA_VISIBLE_DEVICES`` form the guard's
(:mod:`gpu_admission.rules.gpu_access`).

Reported here (Pod CREATE, both stages):

* ``memory-limit``: an explicit ask that cannot be served (unparsable or non-positive
  annotation, a share larger than one GPU, with MIG, DRA or more than one GPU, on a pool that
  is not fractional); such a pod is not made fractional;
* ``gpu-visible-devices``: a fractional pod that would bypass the extender's ``bind`` (the only
  writer of its ConfigMap, which checks the ConfigMap's ownership): ``spec.nodeName`` preset,
  or a scheduler other than the policy's GPU-aware one. A recorded ConfigMap name can be forged
  on the pod; without bind nothing checks what the ConfigMap holds.
"""

from __future__ import annotations

from typing import Final

from gpu_admission.core.vocab import (
    DEFAULT_SCHEDULER,
    GPU_CONFIGMAP_ANNOTATION,
    GPU_MEMORY_ANNOTATION,
    GPU_MEMORY_RESOURCE,
    GPU_RESOURCE,
    SHARED_SUFFIX,
)
from gpu_admission.facts.fractional import Fraction, visible_devices_env
from gpu_admission.rules.base import Context

LIMIT: Final = "memory-limit"
VISIBLE_DEVICES: Final = "gpu-visible-devices"
_WHOLE: Final = (GPU_RESOURCE, GPU_RESOURCE + SHARED_SUFFIX)


class FractionalGpu:
    # Reports ids owned by the memory rule and the guard (as the DRA rules report
    # memory-limit): a fraction is a memory share, a bypassed bind a GPU-access hole.
    ids: tuple[str, ...] = ()

    def check(self, ctx: Context) -> None:
        if ctx.facts.operation != "CREATE":
            return
        for problem in ctx.fraction_plan.problems:
            ctx.violate(LIMIT, problem.path, problem.message)
        fraction = ctx.fraction
        if fraction is None:
            return
        if not self._bind_guaranteed(ctx):
            return
        if ctx.patch is not None:
            self._mutate(ctx, fraction)

    @staticmethod
    def _bind_guaranteed(ctx: Context) -> bool:
        """Only the extender's bind may place a fractional pod (it writes the ConfigMap). At
        the validate stage only a pod already in the fractional form is held to it (a pod
        merely lacking our mutation keeps its whole GPU and is not denied)."""
        if ctx.patch is None and not any(gc.fractional for gc in ctx.gpu_containers):
            return True
        ok = True
        if ctx.spec.get("nodeName"):
            ctx.violate(VISIBLE_DEVICES, "spec.nodeName",
                        "a fractional GPU pod must be bound by the GPU-aware scheduler, which "
                        "chooses its GPU; remove spec.nodeName (use a nodeSelector)")
            ok = False
        target = ctx.policy.spec.scheduler_name
        current = ctx.spec.get("schedulerName")
        if not target:
            ctx.violate(VISIBLE_DEVICES, "spec.schedulerName",
                        "a fractional GPU pod needs the GPU-aware scheduler, but the policy's "
                        "spec.schedulerName is null")
            ok = False
        elif current != target and (ctx.patch is None
                                    or current not in (None, "", DEFAULT_SCHEDULER)):
            ctx.violate(VISIBLE_DEVICES, "spec.schedulerName",
                        f"a fractional GPU pod must use scheduler {target!r} (its bind "
                        f"chooses the GPU), not {str(current or DEFAULT_SCHEDULER)[:40]!r}")
            ok = False
        return ok

    @staticmethod
    def _mutate(ctx: Context, fraction: Fraction) -> None:
        patch = ctx.patch
        assert patch is not None
        share = str(fraction.share_mib)
        for gc in ctx.gpu_containers:
            for section in ("requests", "limits"):
                for name in _WHOLE:
                    patch.set_resource(gc.kind, gc.index, section, name, None)
                patch.set_resource(gc.kind, gc.index, section, GPU_MEMORY_RESOURCE, share)
            patch.upsert_env_entry(gc.kind, gc.index, visible_devices_env(fraction.configmap))
        patch.set_annotation(GPU_MEMORY_ANNOTATION, share)
        patch.set_annotation(GPU_CONFIGMAP_ANNOTATION, fraction.configmap)
