"""Rule ``scheduler-name`` (:mod:`gpu_admission.rules.scheduler`) in CEL.

The compiler unit of that rule module; what a unit contributes, and the analysis
every unit reads, are in :mod:`gpu_admission.compile.units`.
"""

from __future__ import annotations

from gpu_admission.core.vocab import (
    DEFAULT_SCHEDULER,
)
from gpu_admission.policy.model import Policy
from gpu_admission.rules import scheduler

from ..cel import lit, pyrepr, trunc, var
from ..units import Program, violation


class SchedulerUnit:
    ids: tuple[str, ...] = (scheduler.RULE,)

    def emit(self, policy: Policy, prog: Program) -> None:
        target = policy.spec.scheduler_name
        if not target:
            prog.add("schedulerOp", "false", "spec.schedulerName is null: rule off")
            return
        cur = var("schedulerCurrent")
        prog.add("schedulerCurrent",
                 'has(object.spec.schedulerName) ? object.spec.schedulerName : ""')
        prog.add("schedulerApplies", f'{var("isGpu")} && !(has(object.spec.nodeName) && '
                                     'object.spec.nodeName != "")',
                 "a pod with nodeName bypasses scheduling and is left alone")
        message = (f'"keeps scheduler " + {pyrepr(trunc(cur, 40))} + '
                   f'{lit(f", not {target!r} (GPU packing off)")}')
        prog.violations.append(
            f'{var("schedulerApplies")} && !({cur} in ["", {lit(DEFAULT_SCHEDULER)}]) && '
            f"{cur} != {lit(target)} ? "
            f"[{violation(scheduler.RULE, lit('spec.schedulerName'), message)}] : []")
        prog.add("schedulerOp", f'{var("schedulerApplies")} && {cur} in ["", '
                                f'{lit(DEFAULT_SCHEDULER)}] && {cur} != {lit(target)}')
