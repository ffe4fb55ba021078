"""Rule ``no-training-on-shared-gpu`` (:mod:`gpu_admission.rules.training`) in CEL.

The compiler unit of that rule module; what a unit contributes, and the analysis
every unit reads, are in :mod:`gpu_admission.compile.units`.
"""

from __future__ import annotations

from gpu_admission.policy.model import Policy
from gpu_admission.rules import training

from ..cel import lit, var
from ..units import Program, violation


class TrainingUnit:
    ids: tuple[str, ...] = (training.RULE,)

    def emit(self, policy: Policy, prog: Program) -> None:
        text = ("; time-slicing makes each training job ~3x slower. Request nvidia.com/gpu on a "
                "dedicated node pool (sharing none) or MIG, or label the pod "
                "gpu-admission.io/workload=inference if it only serves")
        message = f'"training pod targets a time-sliced GPU (" + r.why + ")" + {lit(text)}'
        prog.violations.append(
            f"{var('isGpu')} && {var('workload')} == \"training\" ? "
            f"{var('sharedReasons')}.map(r, {violation(training.RULE, 'r.path', message)}) : []")
        prog.add("protect", f'{var("isGpu")} && {var("workload")} == "training" && '
                            f'size({var("sharedReasons")}) == 0',
                 "training on plain nvidia.com/gpu: add the training-protection requirement")
