"""The second rule set: ResourceClaims and ResourceClaimTemplates at their own CREATE.

Why (issue 15): claim and template specs are immutable (``shared/reference/dra-gpus.md`` §5),
and a pod naming a shared claim is refused only when the pod comes. Refusing a training
template or claim that carries a sharing config at creation catches the mistake before any
pod uses it. Same rule id and mode as for pods: ``no-training-on-shared-gpu``.

"Training" is decided by the engine's own classification (the workload label
``gpu-admission.io/workload``, training label prefixes, owner kinds) on the object's labels
(templates: plus ``spec.metadata.labels``, copied into every generated claim). "Sharing
config" is S1/S2 of :mod:`gpu_admission.dra.analysis` (plus S7 capacity shares and S8
adminAccess). Claims the scheduler creates for extended resources
(annotation ``resource.kubernetes.io/extended-resource-claim``) are never judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gpu_admission.admission.engine import short_warning
from gpu_admission.admission.pod import classify, exemption
from gpu_admission.core.decision import Decision, Mode, RequestFacts, Violation
from gpu_admission.dra.analysis import (
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    claim_object_labels,
    sharing_findings,
)
from gpu_admission.dra.model import CLAIM, GROUP, TEMPLATE, DraSnapshot, normalize
from gpu_admission.policy.model import Policy
from gpu_admission.rules.dra import UNKNOWN
from gpu_admission.rules.training import RULE as TRAINING_RULE

CLAIM_KINDS: Final = frozenset({CLAIM, TEMPLATE})
_ALLOWED = Decision(allowed=True)


def is_claim_kind(group: str, kind: str) -> bool:
    """A ``resource.k8s.io`` ResourceClaim or ResourceClaimTemplate (any version)."""
    return group == GROUP and kind in CLAIM_KINDS


def evaluate_claim(obj: Mapping[str, Any], kind: str, facts: RequestFacts, policy: Policy,
                   dra: DraSnapshot | None = None) -> Decision:
    """Decide one ResourceClaim/ResourceClaimTemplate CREATE. Pure; never a patch.

    ``dra`` supplies the DeviceClasses (class configs, S2); a GPU class it does not hold is
    reported as ``dra-reference-unknown`` (training objects only, in that rule's mode).
    """
    if kind not in CLAIM_KINDS or facts.operation != "CREATE" or not isinstance(obj, dict):
        return _ALLOWED
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    annotations = meta.get("annotations")
    if isinstance(annotations, dict) and annotations.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION):
        return _ALLOWED
    compiled = policy.compiled
    findings, unknown = sharing_findings(normalize(obj, kind), kind, dra, compiled.dra_gpu_classes)
    if not findings and not unknown:
        return _ALLOWED
    labels = claim_object_labels(obj, kind)
    workload, reason, _ = classify(meta, labels, compiled,
                                   policy.spec.classification.default_workload)
    exempt = exemption(facts, compiled)
    if exempt:
        return Decision(allowed=True, gpu=True, workload=workload, workload_reason=reason,
                        exempt=exempt)
    if workload != "training":
        return Decision(allowed=True, gpu=True, workload=workload, workload_reason=reason)
    name = meta.get("name") or meta.get("generateName", "")
    label = f"{kind} {facts.namespace}/{name}"
    violations = [Violation(
        TRAINING_RULE, f.path,
        f"training {label} ({reason}) shares its GPU ({f.why}); time-slicing and MPS make "
        "each training job ~3x slower: remove the sharing config, or label it "
        "gpu-admission.io/workload=inference if it only serves",
        compiled.modes[TRAINING_RULE]) for f in findings]
    offline = dra is not None and dra.offline
    violations.extend(Violation(
        UNKNOWN, "spec", f"DeviceClass {c} is not in the files given to evaluate: cannot check "
        "its sharing config; add the file that defines it (-f), or read the cluster's objects "
        "with --kubeconfig FILE" if offline else
        f"DeviceClass {c} is not in the webhook's DRA cache: cannot check its "
        "sharing config; retry in a few seconds", compiled.modes[UNKNOWN]) for c in unknown)
    allowed = not any(v.mode is Mode.ENFORCE for v in violations)
    warnings = tuple(dict.fromkeys(short_warning(v) for v in violations if v.mode is Mode.WARN))
    return Decision(allowed=allowed, gpu=True, violations=tuple(violations), warnings=warnings,
                    workload=workload, workload_reason=reason)
