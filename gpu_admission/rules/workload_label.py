"""Rule ``workload-label``: the pod label ``gpu-admission.io/workload`` must be a known class.

Why: the class decides whether a pod may share a GPU; a typo such as ``Training`` must not
silently make a training job look like inference. The engine falls back to owner/label
classification (Kubeflow training operator labels, see gpu-facts.md section 6) and this rule
reports the bad value.
"""

from __future__ import annotations

from gpu_admission.core.vocab import WORKLOAD_CLASSES, WORKLOAD_LABEL
from gpu_admission.rules.base import Context


class WorkloadLabel:
    ids: tuple[str, ...] = ("workload-label",)

    def check(self, ctx: Context) -> None:
        if ctx.bad_workload_label is None:
            return
        ctx.violate(
            "workload-label", f"metadata.labels[{WORKLOAD_LABEL}]",
            f"unknown workload {ctx.bad_workload_label[:20]!r}; use one of "
            f"{', '.join(WORKLOAD_CLASSES)} (classified as {ctx.workload})")
