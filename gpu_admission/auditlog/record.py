"""The decision record (one JSON line per admission decision) and the audit annotations.

Two views of the same decision leave the server:

* :func:`decision_record` builds the line the server appends to its own decision log
  (``--audit-log FILE|-``). The field list is documented in ``docs/audit.md`` and versioned
  by ``schemaVersion``; readers (``gpu-admission audit``) accept every version they know.
* :func:`audit_annotations` builds ``AdmissionResponse.auditAnnotations``. The API server
  stores each entry on the request's audit event as ``<webhook name>/<key>``
  (``k8s.io/api/admission/v1`` ``AdmissionResponse.AuditAnnotations``:
  https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#response).
  It *drops* entries whose combined key fails ``checkKeyFormat`` in
  ``k8s.io/apiserver/pkg/admission/attributes.go`` (exactly one ``/``, and the part after it a
  Kubernetes qualified name: at most 63 characters, ``[A-Za-z0-9]`` at both ends,
  ``[-A-Za-z0-9_.]`` inside), so our keys are checked against that rule here and in tests.

Secrets never reach either view: the patch is summarised as RFC 6902 ``op`` + ``path`` pairs
and the policy engine's ``Decision.changes`` (which only names values the policy itself set,
such as the GPU-memory limit); ``value`` members of patch operations, and therefore env var
values taken from the user's pod, are never copied.
"""

from __future__ import annotations

import re
import time as clock
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from gpu_admission.core.decision import Decision, RequestFacts

#: Version of the record layout. Bump when a field changes meaning or type; adding a
#: field does not need a bump (readers ignore unknown fields).
SCHEMA_VERSION: Final = 1

#: ``checkKeyFormat``'s qualified-name rule for the part after ``<webhook>/``
#: (``k8s.io/apimachinery/pkg/util/validation`` ``qualifiedNameFmt``, max 63 characters).
QUALIFIED_NAME_RE: Final = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
QUALIFIED_NAME_MAX: Final = 63

#: Audit-annotation values are free text for the API server, but audit backends (webhook
#: batch sizes, log lines) suffer from huge values; cap ours. Characters, not bytes.
ANNOTATION_VALUE_MAX: Final = 1024

# The annotation keys we emit (each a valid qualified name; see ``is_valid_annotation_key``).
KEY_DECISION: Final = "decision"  # "allowed" | "denied"
KEY_WORKLOAD: Final = "workload"  # training | inference | notebook
KEY_WORKLOAD_REASON: Final = "workload-reason"
KEY_CUDA_VERSION: Final = "cuda-version"  # "<major>.<minor>"
KEY_CUDA_SOURCE: Final = "cuda-source"
KEY_VIOLATIONS: Final = "violations"  # "rule=mode,rule=mode"
KEY_PATCH: Final = "patch"  # "; "-joined change summary
KEY_EXEMPT: Final = "exempt"
KEY_WARNINGS: Final = "warnings"  # count of warnings sent back to the client

ANNOTATION_KEYS: Final = (KEY_DECISION, KEY_WORKLOAD, KEY_WORKLOAD_REASON, KEY_CUDA_VERSION,
                          KEY_CUDA_SOURCE, KEY_VIOLATIONS, KEY_PATCH, KEY_EXEMPT, KEY_WARNINGS)


def is_valid_annotation_key(key: str) -> bool:
    """True if the API server would keep ``<webhook>/<key>`` (``checkKeyFormat``)."""
    return len(key) <= QUALIFIED_NAME_MAX and QUALIFIED_NAME_RE.match(key) is not None


def format_time(when: datetime) -> str:
    """RFC 3339 in UTC with millisecond precision and a ``Z`` suffix.

    A naive datetime is taken to be UTC already (the server always passes aware ones).
    """
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


_second_prefix: tuple[int, str] = (-1, "")  # (Unix second, "YYYY-MM-DDTHH:MM:SS.")


def now_text() -> str:
    """The current time as :func:`format_time` writes it. The date and time of day are
    formatted once per second (``datetime.now`` + ``isoformat`` on every record cost more
    than the rest of the record's scalar fields together)."""
    global _second_prefix  # noqa: PLW0603 - a memo of the last second, not configuration
    now = clock.time()
    second = int(now)
    cached, prefix = _second_prefix  # one tuple: consistent even if another thread swaps it
    if second != cached:
        prefix = clock.strftime("%Y-%m-%dT%H:%M:%S.", clock.gmtime(second))
        _second_prefix = (second, prefix)
    return f"{prefix}{int((now - second) * 1000):03d}Z"


def patch_paths(patch: Iterable[Mapping[str, Any]]) -> list[str]:
    """``"<op> <path>"`` for each RFC 6902 operation; the ``value`` member is never read."""
    out: list[str] = []
    for op in patch:
        text = f"{op.get('op', '?')} {op.get('path', '?')}"
        if "from" in op:  # move/copy name their source path, which is not a value either
            text += f" from {op['from']}"
        out.append(text)
    return out


def _controller_owner(metadata: Mapping[str, Any]) -> dict[str, str] | None:
    """The owner reference with ``controller: true`` (at most one may have it:
    https://kubernetes.io/docs/concepts/overview/working-with-objects/owners-dependents/),
    else the first owner, else None."""
    refs = metadata.get("ownerReferences")
    if not isinstance(refs, list) or not refs:
        return None
    chosen = next((r for r in refs if isinstance(r, Mapping) and r.get("controller") is True),
                  refs[0])
    if not isinstance(chosen, Mapping):
        return None
    return {"kind": str(chosen.get("kind", "")), "name": str(chosen.get("name", ""))}


def decision_record(*, decision: Decision, facts: RequestFacts, pod: Mapping[str, Any] | None,
                    uid: str, policy_digest: str, instance: str,
                    time: datetime | None = None) -> dict[str, Any]:
    """The one-line JSON record of a decision (fields documented in ``docs/audit.md``).

    ``pod`` is ``request.object`` and is None on DELETE; the pod name is empty on CREATE
    with ``metadata.generateName`` (the API server names the pod after admission), so both
    are recorded. Only JSON-native types are returned so ``orjson.dumps`` never fails.
    """
    metadata: Mapping[str, Any] = {}
    if isinstance(pod, Mapping) and isinstance(pod.get("metadata"), Mapping):
        metadata = pod["metadata"]
    violations = [v.as_dict() for v in decision.violations]
    # The wire layer only sends a patch for an allowed Pod CREATE on /mutate; record what
    # was actually applied, not what a decision might carry at another stage.
    sent = (decision.patch if decision.allowed and facts.stage == "mutate"
            and facts.operation == "CREATE" else ())
    record = {
        "schemaVersion": SCHEMA_VERSION,
        "time": now_text() if time is None else format_time(time),
        "uid": uid,
        "stage": facts.stage,
        "operation": facts.operation,
        "dryRun": facts.dry_run,
        "namespace": facts.namespace or str(metadata.get("namespace", "")),
        "pod": str(metadata.get("name", "")),
        "generateName": str(metadata.get("generateName", "")),
        "owner": _controller_owner(metadata),
        "user": facts.user,
        "groups": list(facts.groups),
        "gpu": decision.gpu,
        "workload": decision.workload,
        "workloadReason": decision.workload_reason,
        "cudaVersion": decision.cuda_version,
        "cudaSource": decision.cuda_source,
        "decision": "allowed" if decision.allowed else "denied",
        "mutated": bool(sent),
        "modes": {v.rule: str(v.mode) for v in decision.violations},
        "violations": violations,
        "warnings": list(decision.warnings),
        "exempt": decision.exempt,
        "patch": {"ops": len(sent), "paths": patch_paths(sent),
                  "changes": list(decision.changes) if sent else []},
        "policyDigest": policy_digest,
        "instance": instance,
    }
    if decision.placement:  # GPU pods: the pool it lands in, or the pools assumed (issue 33)
        record["placement"] = decision.placement
    return record


def _cap(value: str) -> str:
    return value if len(value) <= ANNOTATION_VALUE_MAX else value[:ANNOTATION_VALUE_MAX - 1] + "…"


def audit_annotations(decision: Decision) -> dict[str, str]:
    """``AdmissionResponse.auditAnnotations`` for a decision; every key passes
    ``checkKeyFormat`` and every value is a string (at most ``ANNOTATION_VALUE_MAX`` chars).

    Keys are only present when they carry information (no empty values), except
    ``decision``, which is always there so an audit-log reader can tell "our webhook saw
    this request" from "it did not".
    """
    notes: dict[str, str] = {KEY_DECISION: "allowed" if decision.allowed else "denied"}
    if decision.workload:
        notes[KEY_WORKLOAD] = decision.workload
        if decision.workload_reason:
            notes[KEY_WORKLOAD_REASON] = decision.workload_reason
    if decision.cuda_version:
        notes[KEY_CUDA_VERSION] = decision.cuda_version
        if decision.cuda_source:
            notes[KEY_CUDA_SOURCE] = decision.cuda_source
    if decision.violations:
        notes[KEY_VIOLATIONS] = ",".join(f"{v.rule}={v.mode}" for v in decision.violations)
    if decision.patch and decision.allowed:
        summary = list(decision.changes) or patch_paths(decision.patch)
        notes[KEY_PATCH] = "; ".join(summary)
    if decision.exempt:
        notes[KEY_EXEMPT] = decision.exempt
    if decision.warnings:
        notes[KEY_WARNINGS] = str(len(decision.warnings))
    return {key: _cap(value) for key, value in notes.items()}
