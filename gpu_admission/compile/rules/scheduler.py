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
from .other_systems import other_system_pods

CURRENT = 'has(object.spec.schedulerName) ? object.spec.schedulerName : ""'
NO_NODE_NAME = '!(has(object.spec.nodeName) && object.spec.nodeName != "")'
DAEMONSET_POD = ("has(object.metadata.ownerReferences) && object.metadata.ownerReferences"
                 f".exists(r, has(r.kind) && r.kind == {lit(scheduler.DAEMONSET_KIND)})")


def cpu_route(target: str, current: str = f"({CURRENT})") -> str:
    """scheduler.cpu_pod_scheduler in CEL, for a pod without a GPU on CREATE: ``target`` (a
    CEL string, "" when ``spec.scheduling.cpuPods`` routes nothing) is non-empty, the pod's
    ``schedulerName`` is empty or ``default-scheduler`` and not already the target, no
    ``nodeName``, no DaemonSet owner. Every access guarded with ``has()``."""
    return (f'{target} != "" && {current} in ["", {lit(DEFAULT_SCHEDULER)}] && '
            f"{current} != {target} && {NO_NODE_NAME} && !({DAEMONSET_POD})")


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
        gpu_op = (f'{var("schedulerApplies")} && {cur} in ["", {lit(DEFAULT_SCHEDULER)}] && '
                  f'{cur} != {lit(target)}')
        cpu_target = policy.compiled.cpu_scheduler
        if cpu_target is None:
            prog.add("schedulerOp", gpu_op)
            return
        # spec.scheduling.cpuPods: a pod here without a GPU (a zero quantity: the webhook's
        # split sends it here, the engine decides it as a CPU pod) is routed too, unless
        # another sharing system's (the engine leaves those to their scheduler)
        prog.add("schedulerOp",
                 f"{var('isGpu')} ? {gpu_op}\n"
                 f"  : {cpu_route(lit(cpu_target), cur)} && !({other_system_pods()})",
                 "GPU pods, and pods without a GPU (spec.scheduling.cpuPods; not DaemonSet "
                 "pods, not another sharing system's)")
