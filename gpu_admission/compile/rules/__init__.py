"""The compiler units, one module per engine rule module, in RULES order (:data:`UNITS`, as
:data:`gpu_admission.rules.RULES`), and the rules CEL admission cannot express
(:data:`WEBHOOK_ONLY`). ``compile/rules/<rule>.py`` writes ``gpu_admission/rules/<rule>.py`` in
CEL; the analysis they share is :mod:`gpu_admission.compile.units`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_admission.dra.analysis import DEVICECLASS_RESOURCE_PREFIX

from ..cel import lit
from ..units import Unit
from .cuda_routing import CudaUnit
from .gpu_access import GuardUnit
from .memory import MemoryUnit
from .other_systems import OtherSystemsUnit
from .scheduler import SchedulerUnit
from .training import TrainingUnit
from .workload_label import WorkloadLabelUnit

# The engine's rule modules, in RULES order, and the unit that compiles each.
UNITS: tuple[Unit, ...] = (WorkloadLabelUnit(), TrainingUnit(), SchedulerUnit(), CudaUnit(),
                           MemoryUnit(), GuardUnit(), OtherSystemsUnit())


@dataclass(frozen=True, slots=True)
class WebhookOnly:
    """A rule CEL admission cannot express: why, the policy field, and (CEL over ``object``)
    which pods it concerns, so the compiled policies skip them and a webhook scoped to them
    keeps the rule (``None``: every pod)."""

    field: str
    why: str
    pods: str | None


def _dra_pods() -> str:
    """gpu_admission.dra.analysis.needs_analysis, without the cluster's extended-resource
    names (those live in DeviceClasses, which CEL admission cannot read)."""
    prefix = lit(DEVICECLASS_RESOURCE_PREFIX)
    per_kind = []
    for kind in ("containers", "initContainers"):
        lst = f"object.spec.{kind}"
        names = " || ".join(
            f"(has(c.resources.{key}) && c.resources.{key}.exists(k, k.startsWith({prefix})))"
            for key in ("limits", "requests"))
        per_kind.append(f"(has({lst}) && {lst}.exists(c, has(c.resources) && ({names})))")
    return ("(has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0) || "
            + " || ".join(per_kind))


_DRA_WHY = ("needs the webhook's cache of ResourceClaims, ResourceClaimTemplates and "
            "DeviceClasses; CEL admission sees only the request and one params object")


#: Rule ids that stay with the webhook (compile fails naming them unless --partial).
WEBHOOK_ONLY: dict[str, WebhookOnly] = {
    "dra-reference-unknown": WebhookOnly("spec.dra (pods with spec.resourceClaims)", _DRA_WHY,
                                         _dra_pods()),
    "dra-sharing-possible": WebhookOnly("spec.dra (pods with spec.resourceClaims)", _DRA_WHY,
                                        _dra_pods()),
}


def unit_for(rule: str) -> Unit | None:
    for unit in UNITS:
        if rule in unit.ids:
            return unit
    return None
