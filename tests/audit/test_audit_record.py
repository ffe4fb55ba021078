"""decision_record and audit_annotations: exact fields, no env values, valid annotation keys."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_admission.auditlog.record import (
    ANNOTATION_KEYS,
    ANNOTATION_VALUE_MAX,
    SCHEMA_VERSION,
    audit_annotations,
    decision_record,
    format_time,
    is_valid_annotation_key,
)
from gpu_admission.core.decision import Decision, Mode, RequestFacts, Violation
from tests.builders import make_container, make_pod

SECRET = "s3cr3t-token-value"
T0 = datetime(2026, 12, 1, 10, 30, 5, 123456, tzinfo=UTC)

MUTATING = Decision(
    allowed=True, gpu=True,
    patch=({"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"},
           {"op": "add", "path": "/spec/containers/0/env/-",
            "value": {"name": "API_TOKEN", "value": SECRET}}),
    violations=(Violation("gpu-memory-limit", "spec.containers[0].resources.limits",
                          "no memory limit", Mode.WARN),),
    warnings=("added a GPU memory limit",), workload="inference",
    workload_reason="label gpu-admission.io/workload", cuda_version="12.2",
    cuda_source="image nvidia/cuda:12.2.0-base", changes=("schedulerName", "env"))

DENIED = Decision(
    allowed=False, gpu=True,
    violations=(Violation("no-training-on-shared-gpu", "spec.containers[0].resources.limits",
                          "training on a time-sliced GPU"),),
    workload="training", workload_reason="owner PyTorchJob")


def test_record_exact_fields_for_a_mutation() -> None:
    pod = make_pod("infer-1", "team-a", containers=[make_container(
        env=[{"name": "API_TOKEN", "value": SECRET}])], owner_kind="Deployment")
    pod["metadata"]["ownerReferences"].insert(0, {"kind": "Other", "name": "x"})
    facts = RequestFacts("team-a", "CREATE", "alice", ("dev", "system:authenticated"), True,
                         "mutate")
    record = decision_record(decision=MUTATING, facts=facts, pod=pod, uid="u-1",
                             policy_digest="sha256:abc", instance="gpu-admission-0", time=T0)
    assert record == {
        "schemaVersion": SCHEMA_VERSION, "time": "2026-12-01T10:30:05.123Z", "uid": "u-1",
        "stage": "mutate", "operation": "CREATE", "dryRun": True, "namespace": "team-a",
        "pod": "infer-1", "generateName": "", "owner": {"kind": "Deployment",
                                                       "name": "infer-1-owner"},
        "user": "alice", "groups": ["dev", "system:authenticated"], "gpu": True,
        "workload": "inference", "workloadReason": "label gpu-admission.io/workload",
        "cudaVersion": "12.2", "cudaSource": "image nvidia/cuda:12.2.0-base",
        "decision": "allowed", "mutated": True, "modes": {"gpu-memory-limit": "warn"},
        "violations": [{"rule": "gpu-memory-limit", "path": "spec.containers[0].resources.limits",
                        "message": "no memory limit", "mode": "warn"}],
        "warnings": ["added a GPU memory limit"], "exempt": "",
        "patch": {"ops": 2, "paths": ["add /spec/schedulerName", "add /spec/containers/0/env/-"],
                  "changes": ["schedulerName", "env"]},
        "policyDigest": "sha256:abc", "instance": "gpu-admission-0"}
    assert SECRET.encode() not in orjson.dumps(record)


def test_record_generate_name_and_delete_without_object() -> None:
    pod = make_pod("", "team-b")
    pod["metadata"]["generateName"] = "train-"
    facts = RequestFacts("team-b", stage="validate")
    record = decision_record(decision=DENIED, facts=facts, pod=pod, uid="u-2",
                             policy_digest="d", instance="i", time=T0)
    assert (record["pod"], record["generateName"], record["owner"]) == ("", "train-", None)
    assert (record["decision"], record["mutated"]) == ("denied", False)
    assert record["modes"] == {"no-training-on-shared-gpu": "enforce"}

    gone = decision_record(decision=Decision(allowed=True),
                           facts=RequestFacts("team-c", operation="DELETE"), pod=None,
                           uid="u-3", policy_digest="d", instance="i")
    assert (gone["pod"], gone["namespace"], gone["operation"]) == ("", "team-c", "DELETE")
    parsed = datetime.fromisoformat(gone["time"])
    assert parsed.tzinfo is not None and gone["time"].endswith("Z")
    assert abs(parsed - datetime.now(UTC)) < timedelta(minutes=1)


@pytest.mark.parametrize(("stage", "operation"), [("validate", "CREATE"), ("mutate", "UPDATE")],
                         ids=["validate-stage", "update"])
def test_record_claims_no_mutation_where_no_patch_is_sent(stage: str, operation: str) -> None:
    facts = RequestFacts("team-a", operation, stage=stage)  # type: ignore[arg-type]
    record = decision_record(decision=MUTATING, facts=facts, pod=make_pod(), uid="u",
                             policy_digest="d", instance="i", time=T0)
    assert record["mutated"] is False
    assert record["patch"] == {"ops": 0, "paths": [], "changes": []}


@pytest.mark.parametrize(("when", "text"), [
    (datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "2026-01-02T03:04:05.000Z"),
    (datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2))),
     "2026-01-02T01:04:05.000Z"),
    (datetime(2026, 1, 2, 3, 4, 5), "2026-01-02T03:04:05.000Z"),
], ids=["utc", "offset-converted", "naive-is-utc"])
def test_format_time_is_rfc3339_utc(when: datetime, text: str) -> None:
    assert format_time(when) == text


def test_annotations_exact() -> None:
    assert audit_annotations(MUTATING) == {
        "decision": "allowed", "workload": "inference",
        "workload-reason": "label gpu-admission.io/workload", "cuda-version": "12.2",
        "cuda-source": "image nvidia/cuda:12.2.0-base", "violations": "gpu-memory-limit=warn",
        "patch": "schedulerName; env", "warnings": "1"}
    assert audit_annotations(DENIED) == {
        "decision": "denied", "workload": "training", "workload-reason": "owner PyTorchJob",
        "violations": "no-training-on-shared-gpu=enforce"}
    assert audit_annotations(Decision(allowed=True, exempt="namespace kube-system")) == {
        "decision": "allowed", "exempt": "namespace kube-system"}


def test_annotation_patch_falls_back_to_op_paths_without_values() -> None:
    decision = Decision(allowed=True, patch=({"op": "add", "path": "/spec/containers/0/env",
                                              "value": [{"name": "X", "value": SECRET}]},))
    assert audit_annotations(decision)["patch"] == "add /spec/containers/0/env"


def test_annotation_values_are_capped() -> None:
    decision = Decision(allowed=True, warnings=("w",), exempt="x" * 5000)
    value = audit_annotations(decision)["exempt"]
    assert len(value) == ANNOTATION_VALUE_MAX and value.endswith("…")


@pytest.mark.parametrize(("key", "ok"), [
    ("decision", True), ("cuda-version", True), ("a", True), ("a.b_c-d", True),
    ("x" * 63, True), ("x" * 64, False), ("-lead", False), ("trail.", False),
    ("has/slash", False), ("has space", False), ("", False),
], ids=lambda v: str(v)[:12])
def test_key_check_mirrors_apiserver(key: str, ok: bool) -> None:
    assert is_valid_annotation_key(key) is ok


def test_every_emitted_key_is_valid() -> None:
    assert all(is_valid_annotation_key(k) for k in ANNOTATION_KEYS)


@given(allowed=st.booleans(), workload=st.none() | st.sampled_from(["training", "notebook"]),
       cuda=st.none() | st.text(min_size=1), rules=st.lists(st.text(min_size=1), max_size=3),
       changes=st.lists(st.text(), max_size=3), exempt=st.text())
def test_annotations_always_valid_keys_and_string_values(
        allowed: bool, workload: str | None, cuda: str | None, rules: list[str],
        changes: list[str], exempt: str) -> None:
    decision = Decision(allowed=allowed, workload=workload, cuda_version=cuda,
                        violations=tuple(Violation(r, "p", "m") for r in rules),
                        patch=({"op": "add", "path": "/x", "value": 1},) if changes else (),
                        changes=tuple(changes), exempt=exempt)
    notes = audit_annotations(decision)
    assert set(notes) <= set(ANNOTATION_KEYS)
    assert all(isinstance(v, str) and len(v) <= ANNOTATION_VALUE_MAX for v in notes.values())
    assert notes["decision"] == ("allowed" if allowed else "denied")
