"""What every rule sees (:class:`Context`) and the small protocol it implements (:class:`Rule`).

The engine analyses the pod once (GPU containers, workload class, CUDA version, node pool,
time-sliced targets) into a :class:`Context`; each rule then reads it, reports violations with
:meth:`Context.violate` and, only when the request may be mutated, declares changes on
``ctx.patch`` (a :class:`~gpu_admission.core.patch.PatchBuilder`, ``None`` when validating).
Rules never stop at the first problem: every violation is collected.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_admission.core.decision import Mode, RequestFacts, Violation
from gpu_admission.core.patch import PatchBuilder
from gpu_admission.core.vocab import GPU_MEMORY_RESOURCE
from gpu_admission.dra.analysis import DraContainer, DraPod
from gpu_admission.facts.fractional import NOT_FRACTIONAL, Fraction, Plan
from gpu_admission.facts.nodepools import Landing
from gpu_admission.facts.other_systems import OtherContainer, OtherGpu
from gpu_admission.policy.model import Compiled, NodePool, Policy


@dataclass(slots=True)
class GpuContainer:
    """A container or init container that requests or limits a GPU resource."""

    kind: str  # "containers" | "initContainers"
    index: int
    container: Mapping[str, Any]
    resources: dict[str, Any]  # GPU resource name -> quantity (limits win over requests)
    shared: bool  # a ".shared" resource (time-slicing/MPS with renameByDefault)
    mig: bool  # a nvidia.com/mig-* resource (or, through DRA, only MIG slices)
    dra: DraContainer | None = None  # set when (also) given a GPU through DRA (docs/dra.md)
    other: OtherContainer | None = None  # set when another sharing system serves it (KAI, HAMi)
    # requests gpu-admission.io/gpu-memory (a fractional GPU, gpu_admission.facts.fractional)
    fractional: bool = False

    @property
    def path(self) -> str:
        return f"spec.{self.kind}[{self.index}]"

    @property
    def gpu_count(self) -> int:
        total = 0
        for name, quantity in self.resources.items():
            if name == GPU_MEMORY_RESOURCE:  # MiB of one GPU's memory, not a GPU count
                continue
            try:
                total += int(str(quantity))
            except ValueError:
                total += 1
        return max(total, 1)


@dataclass(slots=True)
class Context:
    """The analysed pod plus the sinks for violations and changes."""

    pod: Mapping[str, Any]
    spec: Mapping[str, Any]
    facts: RequestFacts
    policy: Policy
    compiled: Compiled
    patch: PatchBuilder | None  # None: validate stage / UPDATE -> report only
    gpu_containers: list[GpuContainer]
    labels: Mapping[str, Any]
    workload: str
    workload_reason: str
    bad_workload_label: str | None  # the invalid label value, if any
    cuda_version: str | None
    cuda_source: str
    cuda_conflict: dict[str, list[str]]  # version -> container paths (only when >1 version)
    cuda_label_invalid: str | None
    node_selector: Mapping[str, Any]  # the pod's own nodeSelector ({} when absent)
    required_terms: list[Mapping[str, Any]]  # required node-affinity terms as sent
    pool: NodePool | None
    shared_reasons: list[tuple[str, str]]  # (field path, why it targets a time-sliced GPU)
    mig: bool
    violations: list[Violation] = field(default_factory=list)
    dra: DraPod | None = None  # the DRA view of the pod, when it names claims or DRA resources
    other: OtherGpu | None = None  # another sharing system's view (spec.otherSharingSystems)
    # fractional GPUs (gpu_admission.facts.fractional): the plan, and its fraction when there is one
    fraction_plan: Plan = NOT_FRACTIONAL
    #: where the visible GPU nodes say the pod lands (gpu_admission.facts.nodepools.place); None:
    #: no GPU node visible (or none it can land on), the policy's pools are assumed
    landing: Landing | None = None
    #: CUDA routing may patch (false where nodes are visible and the pod shares no card, or
    #: no visible node carries gpu-admission.io/cuda-version: the pod would never schedule)
    route_cuda: bool = True

    @property
    def fraction(self) -> Fraction | None:
        return self.fraction_plan.fraction

    def violate(self, rule: str, path: str, message: str) -> None:
        """Record a violation of ``rule`` in the mode the policy sets for it."""
        self.violations.append(Violation(rule, path, message, self.compiled.modes[rule]))

    def mode(self, rule: str) -> Mode:
        return self.compiled.modes[rule]


class Rule(Protocol):
    """One policy rule. ``ids`` lists the rule ids it may report (keys of ``spec.rules``)."""

    ids: tuple[str, ...]

    def check(self, ctx: Context) -> None:
        """Report violations on ``ctx`` and, when ``ctx.patch`` is set, declare changes."""
