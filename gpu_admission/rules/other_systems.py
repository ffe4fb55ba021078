"""Rule ``other-sharing-system``: pods whose GPU another GPU-sharing system hands out.

Why (issue 22): a KAI-Scheduler pod asks for its GPU with annotations and no resource, a HAMi
pod with its own resources (:mod:`gpu_admission.facts.other_systems`). Without knowing the
system, gpu-admission would silently void the first (the pod loses its GPU) and give the
second memory variables that contradict HAMi's limit. So:

* system **not declared** in ``spec.otherSharingSystems``: the pod is reported (default
  enforce: denied) with a message naming what to declare. The GPU-access guard still applies:
  KAI's annotations never unlock an ``NVIDIA_VISIBLE_DEVICES`` reference;
* system **declared**: its containers are GPU containers; a KAI fraction container may carry
  ``NVIDIA_VISIBLE_DEVICES`` only in exactly the shape KAI's webhook writes (a
  ``configMapKeyRef`` to the pod's own KAI ConfigMap), anything else is
  ``gpu-visible-devices``; a malformed request (``gpu-fraction: 2``) is reported here. The
  memory variables are capped by :class:`gpu_admission.rules.memory.MemoryLimit`, the
  scheduler is left to the other system (:mod:`gpu_admission.rules.scheduler`).
"""

from __future__ import annotations

from typing import Final

from gpu_admission.facts.other_systems import KAI, SYSTEM_NAMES, kai_env_ok
from gpu_admission.facts.other_systems import VISIBLE_DEVICES as ENV
from gpu_admission.rules.base import Context
from gpu_admission.rules.gpu_access import VISIBLE_DEVICES, last_entry

RULE: Final = "other-sharing-system"


def undeclared_message(system: str, why: str) -> str:
    """What a pod of an undeclared system is told (the webhook and the compiled policies)."""
    name = SYSTEM_NAMES[system]
    instead = ("request nvidia.com/gpu instead" if system == KAI else
               "remove the HAMi resources")
    return (f"asks {name} for its GPU ({why}), but this cluster's policy does not declare "
            f"{name}: add {system} to spec.otherSharingSystems if {name} runs here, or "
            f"{instead}")


class OtherSharingSystems:
    ids: tuple[str, ...] = (RULE,)

    def check(self, ctx: Context) -> None:
        other = ctx.other
        if other is None:
            return
        if not other.declared:
            path, why = other.asked
            ctx.violate(RULE, path, undeclared_message(other.system, why))
            return
        for path, problem in other.problems:
            ctx.violate(RULE, path, f"{SYSTEM_NAMES[other.system]} request: {problem}")
        if other.system != KAI or ctx.facts.operation != "CREATE":
            return
        for oc in other.containers:
            container = ctx.spec[oc.kind][oc.index]
            found = last_entry(container.get("env"))
            if found is None:
                continue  # KAI's webhook adds it (it may run after us)
            at, entry = found
            expected = other.kai_configmaps.get((oc.kind, oc.index))
            if not kai_env_ok(entry, expected):
                shape = (f"configMapKeyRef {{name: {expected}, key: {ENV}}}" if expected else
                         "a configMapKeyRef to the ConfigMap named by the annotation "
                         "runai/shared-gpu-configmap (<name>-shared-gpu)")
                ctx.violate(VISIBLE_DEVICES, f"spec.{oc.kind}[{oc.index}].env[{at}]",
                            f"{ENV} in KAI's fraction container must be what KAI's webhook "
                            f"writes: {shape}")
