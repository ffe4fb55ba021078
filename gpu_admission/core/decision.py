"""The values that cross the layer boundaries: request facts in, a frozen decision out.

The wire layer builds :class:`RequestFacts` from an AdmissionReview; the policy layer
returns a :class:`Decision`; the wire layer renders it. Nothing here does I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal

Stage = Literal["mutate", "validate"]


class Mode(enum.StrEnum):
    """Enforcement mode of a rule, as Kyverno/Gatekeeper offer it."""

    ENFORCE = "enforce"  # deny the request
    WARN = "warn"  # allow, with an admission warning
    AUDIT = "audit"  # allow, record only


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What the policy may know about the request besides the pod itself."""

    namespace: str
    operation: str = "CREATE"
    user: str = ""
    groups: tuple[str, ...] = ()
    dry_run: bool = False
    stage: Stage = "mutate"
    #: ``request.subResource``: "" for the Pod itself, ``ephemeralcontainers`` when
    #: ``kubectl debug`` adds a container (an UPDATE carrying the whole Pod).
    sub_resource: str = ""
    #: On a ``pods/ephemeralcontainers`` UPDATE: the names of the ephemeral containers the pod
    #: already had (``request.oldObject``); they are immutable, only the others are judged.
    existing_ephemeral: frozenset[str] = frozenset()
    # AdmissionReview request.uid: names a fractional pod's ConfigMap
    # (gpu_admission.facts.fractional)
    uid: str = ""


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: which rule, where in the pod, what to do about it."""

    rule: str  # stable rule id, e.g. "no-training-on-shared-gpu"
    path: str  # field path in the pod, e.g. "spec.containers[0].resources.limits"
    message: str  # what is wrong and how to fix it
    mode: Mode = Mode.ENFORCE

    def as_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "path": self.path, "message": self.message,
                "mode": str(self.mode)}


@dataclass(frozen=True, slots=True)
class Decision:
    """The policy's verdict on one pod. Immutable; the wire layer only renders it.

    ``patch`` holds RFC 6902 operations against the pod as it was received (empty when
    the pod needs no change, or when the decision is a denial).
    """

    allowed: bool
    gpu: bool = False  # does the pod touch a GPU resource at all
    patch: tuple[dict[str, Any], ...] = ()
    violations: tuple[Violation, ...] = ()
    warnings: tuple[str, ...] = ()
    workload: str | None = None  # training | inference | notebook (GPU pods only)
    workload_reason: str = ""  # why that class, e.g. "label gpu-admission.io/workload"
    cuda_version: str | None = None  # "<major>.<minor>"
    cuda_source: str = ""  # where the CUDA version came from, e.g. "image nvidia/cuda:12.2.0-base"
    exempt: str = ""  # non-empty when an exemption applied: which one
    changes: tuple[str, ...] = field(default=())  # short summary of mutated fields
    #: GPU pods: where the pod was judged to land and why (a pool read from the nodes, or
    #: the policy's declared pools assumed because no GPU node was visible; docs/pools.md)
    placement: str = ""

    @property
    def denials(self) -> tuple[Violation, ...]:
        return tuple(v for v in self.violations if v.mode is Mode.ENFORCE)

    def denial_message(self) -> str:
        """One human-readable message for ``status.message`` on a denial."""
        return "; ".join(f"[{v.rule}] {v.path}: {v.message}" for v in self.denials)
