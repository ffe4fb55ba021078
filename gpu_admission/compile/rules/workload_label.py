"""Rule ``workload-label`` (:mod:`gpu_admission.rules.workload_label`) in CEL.

The compiler unit of that rule module; what a unit contributes, and the analysis
every unit reads, are in :mod:`gpu_admission.compile.units`.
"""

from __future__ import annotations

from gpu_admission.core.vocab import (
    WORKLOAD_CLASSES,
    WORKLOAD_LABEL,
)
from gpu_admission.policy.model import Policy

from ..cel import lit, pyrepr, trunc, var
from ..units import Program, violation


class WorkloadLabelUnit:
    ids: tuple[str, ...] = ("workload-label",)

    def emit(self, policy: Policy, prog: Program) -> None:
        labels = var("labels")
        wl = lit(WORKLOAD_LABEL)
        bad = f"{wl} in {labels} && !({labels}[{wl}] in {lit(list(WORKLOAD_CLASSES))})"
        value = f"{labels}[{wl}]"
        message = (f'"unknown workload " + {pyrepr(trunc(value, 20))} + '
                   f'{lit("; use one of " + ", ".join(WORKLOAD_CLASSES) + " (classified as ")}'
                   f' + {var("workload")} + ")"')
        prog.violations.append(
            f"{var('isGpu')} && {bad} ? "
            f"[{violation('workload-label', lit(f'metadata.labels[{WORKLOAD_LABEL}]'), message)}]"
            " : []")
