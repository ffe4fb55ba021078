"""The policy rules, one per module, run in a fixed order by
:func:`gpu_admission.admission.engine.evaluate`.

Order matters only for readability of the output (every rule runs; all violations are kept):
workload label, training placement, scheduler, CUDA routing, memory limits, fractional GPUs,
GPU-access guard
(which also runs alone on pods without GPU containers, see the engine).
"""

from __future__ import annotations

from gpu_admission.rules.base import Context, GpuContainer, Rule
from gpu_admission.rules.cuda_routing import CudaRouting
from gpu_admission.rules.dra import DraRules
from gpu_admission.rules.fractional import FractionalGpu
from gpu_admission.rules.gpu_access import GpuAccess
from gpu_admission.rules.memory import MemoryLimit
from gpu_admission.rules.other_systems import OtherSharingSystems
from gpu_admission.rules.scheduler import SchedulerName
from gpu_admission.rules.training import NoTrainingOnSharedGpu
from gpu_admission.rules.workload_label import WorkloadLabel

RULES: tuple[Rule, ...] = (
    WorkloadLabel(),
    NoTrainingOnSharedGpu(),
    SchedulerName(),
    CudaRouting(),
    MemoryLimit(),
    FractionalGpu(),
    GpuAccess(),
    DraRules(),
    OtherSharingSystems(),
)

__all__ = ["RULES", "Context", "GpuContainer", "Rule"]
