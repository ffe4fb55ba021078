"""What the API server records and what it allows: ``gpu-admission audit`` reads the compiled
policies' audit annotations from an ``audit.k8s.io/v1`` Event, and the emitted CEL stays within
the API server's size and cost limits (facts sheet section 6-7)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import celpy.celtypes as ct
import pytest

from gpu_admission.compile.compiler import compile_policy
from gpu_admission.compile.evaluator import CelError, activation_of, admit, counting_cost, run
from gpu_admission.compile.offline import as_admitted
from gpu_admission.core.decision import RequestFacts
from gpu_admission.policy.model import policy_from_dict
from tests.builders import make_container, make_pod
from tests.compile_support import check, compiled, modes_policy

# API server limits (facts sheet sections 6 and 7; k8s pkg/apis/cel/config.go)
PER_CALL_LIMIT = 1_000_000
RUNTIME_BUDGET = 10_000_000
# celpy counts AST nodes evaluated; cel-go also charges string/list sizes. A margin of 10x
# covers that (an estimate, not the API server's own cost calculator).
COST_MARGIN = 10


def _event(notes: dict[str, str], uid: str) -> dict[str, Any]:
    return {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
            "auditID": uid, "stage": "ResponseComplete",
            "requestURI": "/api/v1/namespaces/team-a/pods", "verb": "create",
            "user": {"username": "alice", "groups": ["system:authenticated"]},
            "objectRef": {"resource": "pods", "namespace": "team-a", "name": "pod",
                          "apiVersion": "v1"},
            "responseStatus": {"metadata": {}, "code": 201},
            "requestReceivedTimestamp": "2026-12-02T10:00:00.000000Z",
            "stageTimestamp": "2026-12-02T10:00:00.004000Z", "annotations": notes}


def test_audit_reads_the_compiled_policies_annotations(tmp_path: Path) -> None:
    pod = make_pod(labels={"gpu-admission.io/workload": "Training"}, containers=[
        make_container(gpu="1", env=[{"name": "NVIDIA_MEM_LIMIT_MB", "value": "99999"}])])
    facts = RequestFacts(namespace="team-a")
    _, outcome = check("modes", pod, facts)  # memory-limit warn, workload-label audit
    notes = outcome.audit_annotations
    # the enforce policy carries the annotations (published whatever it decides); the audit
    # policy, there for the audit-mode rule, only its validation failure
    assert notes["enforce.gpu-admission.io/decision"] == "allowed"
    assert notes["enforce.gpu-admission.io/violations"] == (
        "workload-label=audit,memory-limit=warn")
    assert not any(k.startswith("audit.gpu-admission.io/") for k in notes)
    failure = json.loads(notes["validation.policy.admission.k8s.io/validation_failure"])
    assert failure == [{"message": "[workload-label] metadata.labels[gpu-admission.io/workload]: "
                                   "unknown workload 'Training'; use one of training, inference, "
                                   "notebook (classified as notebook)",
                        "policy": "audit.gpu-admission.io", "binding": "audit.gpu-admission.io",
                        "expressionIndex": 0, "validationActions": ["Audit"]}]
    log = tmp_path / "audit.log"
    log.write_text(json.dumps(_event({"authorization.k8s.io/decision": "allow", **notes},
                                     "c0ffee00-0000-4000-8000-000000000001")) + "\n")
    out = subprocess.run([sys.executable, "-m", "gpu_admission", "audit", "show", "-o", "json",
                          "c0ffee00", str(log)], capture_output=True, text=True, timeout=60,
                         check=True)
    record = json.loads(out.stdout)
    assert {k: record[k] for k in ("stage", "decision", "workload", "workloadReason",
                                   "cudaVersion", "cudaSource", "modes", "warningCount")} == {
        "stage": "enforce.gpu-admission.io", "decision": "allowed", "workload": "notebook",
        "workloadReason": "default", "cudaVersion": "12.4",
        "cudaSource": "image nvcr.io/nvidia/tritonserver:24.05-py3 (spec.containers[0])",
        "modes": {"workload-label": "audit", "memory-limit": "warn"}, "warningCount": 1}


def test_a_denied_pod_is_recorded_as_denied() -> None:
    pod = make_pod(labels={"gpu-admission.io/workload": "training"},
                   containers=[make_container(resource="nvidia.com/gpu.shared")])
    expected, outcome = check("default", pod, RequestFacts(namespace="team-a"))
    assert not expected.allowed
    assert outcome.audit_annotations["enforce.gpu-admission.io/decision"] == "denied"
    assert outcome.denial == ("ValidatingAdmissionPolicy 'enforce.gpu-admission.io' with binding "
                              "'enforce.gpu-admission.io' denied request: "
                              + expected.denial_message())


def test_warnings_are_sent_as_the_api_server_formats_them() -> None:
    pod = make_pod(scheduler_name="volcano", containers=[make_container(gpu="1")])
    expected, outcome = check("default", pod, RequestFacts(namespace="team-a"))
    assert outcome.warnings_sent == [
        "Validation failed for ValidatingAdmissionPolicy 'warn.gpu-admission.io' with binding "
        f"'warn.gpu-admission.io': {w}" for w in expected.warnings]
    assert outcome.warnings_sent


def _pools_policy(count: int) -> Any:
    doc = modes_policy().model_dump(mode="json", by_alias=True)
    doc["spec"]["nodePools"] = [
        {"name": f"pool-{i}", "nodeSelector": {"gpu-admission.io/cuda-version": f"12.{i}",
                                               "pool.example.com/name": f"p{i}"},
         "sharing": ["time-slicing", "mps", "none", "mig"][i % 4], "replicasPerGPU": 1 + i % 7,
         "memoryMiB": 40960 + i, "cudaVersion": f"12.{i}"} for i in range(count)]
    return policy_from_dict(doc)


def _big_pod() -> dict[str, Any]:
    env = [{"name": n, "value": "x" * 200} for n in
           ("NVIDIA_MEM_LIMIT_MB", "GPU_MEMORY_FRACTION", "TF_FORCE_GPU_ALLOW_GROWTH")] + [
        {"name": f"VAR_{i}", "value": "v" * 100} for i in range(40)]
    containers = [{**make_container(f"c{i}", image=f"nvcr.io/nvidia/pytorch:24.0{i % 9 + 1}-py3",
                                    gpu=str(1 + i % 3), env=env)} for i in range(20)]
    inits = [make_container(f"i{i}", image="busybox", gpu=None, env=env) for i in range(10)]
    term = {"matchExpressions": [{"key": f"k{j}", "operator": "In", "values": ["a", "b"]}
                                 for j in range(5)]}
    pod = make_pod(containers=containers, init_containers=inits,
                   labels={f"l{i}": "v" for i in range(20)},
                   node_selector={f"n{i}": "v" for i in range(10)},
                   affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                       "nodeSelectorTerms": [term] * 8}}},
                   volumes=[{"name": f"v{i}", "hostPath": {"path": f"/data/{i}"}}
                            for i in range(10)])
    plain: dict[str, Any] = json.loads(json.dumps(pod))
    return plain


def test_expressions_stay_within_the_api_server_cost_limits() -> None:
    """Runtime cost estimate on a large pod (20 GPU + 10 init containers, 43 env vars each,
    8 required terms) with 20 node pools: every expression under the per-call limit, every
    policy under the per-evaluation budget (a VAP's variables counted twice)."""
    objects = compile_policy(_pools_policy(20), partial=True).objects
    pod = _big_pod()
    facts = RequestFacts(namespace="team-a")
    act = activation_of(pod, facts, {"gpu-admission.io/enabled": "true"})
    for obj in objects:
        spec = obj.get("spec", {})
        if "variables" not in spec:
            continue
        total = 0
        values: dict[str, Any] = {}
        for item in spec["variables"]:
            with counting_cost() as cost:
                values[ct.StringType(item["name"])] = run(
                    item["expression"], {**act, "variables": ct.MapType(values)})
            assert cost[0] * COST_MARGIN < PER_CALL_LIMIT, (obj["metadata"]["name"], item["name"])
            total += cost[0]
        # A VAP computes its variables again for the messageExpressions, on the same budget
        # as the validations (validating/validator.go: messageFilter.ForInput with the
        # remaining budget; composition.go builds a new context each time): twice.
        phases = 2 if obj["kind"] == "ValidatingAdmissionPolicy" else 1
        assert total * phases * COST_MARGIN < RUNTIME_BUDGET, obj["metadata"]["name"]


def test_object_sizes_and_counts_within_limits() -> None:
    result = compile_policy(_pools_policy(20), partial=True)
    for obj in result.objects:
        text = json.dumps(obj)
        assert len(text) < 1024 * 1024, obj["metadata"]["name"]  # etcd: 1.5 MiB per object
        spec = obj.get("spec", {})
        assert len(spec.get("matchConditions", [])) <= 64
        annotations = spec.get("auditAnnotations", [])
        assert len(annotations) <= 20
        for note in annotations:
            assert len(note["valueExpression"].encode()) <= 5 * 1024
            assert len(note["key"]) <= 63
        assert len(spec.get("validations", [])) <= 64


@pytest.mark.parametrize("marker", ["exceeds the GPU memory", "; time-slicing makes"])
def test_the_differential_check_catches_a_wrong_message(marker: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard against a check that cannot fail: change one text in the compiled CEL."""
    objects = json.loads(json.dumps(compiled("default").objects).replace(marker, marker.upper()))
    monkeypatch.setattr(compiled("default"), "objects", objects)
    pod = make_pod(labels={"gpu-admission.io/workload": "training"}, containers=[
        make_container(resource="nvidia.com/gpu.shared",
                       env=[{"name": "NVIDIA_MEM_LIMIT_MB", "value": "99999"}])])
    pod2 = make_pod(containers=[make_container(
        gpu="1", env=[{"name": "NVIDIA_MEM_LIMIT_MB", "value": "99999"}])])
    with pytest.raises(AssertionError):
        check("default", pod if "time" in marker else pod2, RequestFacts(namespace="team-a"))


# --------------------------------------------------------------------------- run-time errors
def test_only_enforce_fails_closed() -> None:
    """Under ``failurePolicy: Fail`` a run-time error denies whatever the binding's actions
    (k8s validating/dispatcher.go); only the MAP and the enforce VAP may deny."""
    policies = {o["metadata"]["name"]: o["spec"]["failurePolicy"]
                for o in compiled("modes").objects if o["kind"].endswith("AdmissionPolicy")}
    assert policies == {"mutate.gpu-admission.io": "Fail", "enforce.gpu-admission.io": "Fail",
                        "warn.gpu-admission.io": "Ignore", "audit.gpu-admission.io": "Ignore",
                        # the guard half (compile --guard)
                        "guard.gpu-admission.io": "Fail", "guard-enforce.gpu-admission.io": "Fail",
                        "guard-warn.gpu-admission.io": "Ignore",
                        "guard-audit.gpu-admission.io": "Ignore"}


@pytest.mark.parametrize(("policy_name", "denies"), [("warn.gpu-admission.io", False),
                                                    ("audit.gpu-admission.io", False),
                                                    ("enforce.gpu-admission.io", True)])
def test_a_run_time_error_follows_the_policys_failure_policy(policy_name: str,
                                                              denies: bool) -> None:
    objects = copy.deepcopy(compiled("modes").objects)
    (target,) = [o for o in objects if o["metadata"]["name"] == policy_name
                 and o["kind"] == "ValidatingAdmissionPolicy"]
    for item in target["spec"].get("validations", []):
        item["expression"] = 'int("not a number") == 0'
    for note in target["spec"].get("auditAnnotations", []):
        note["valueExpression"] = 'string(int("not a number"))'
    pod = as_admitted(make_pod(containers=[make_container()]))
    facts = RequestFacts(namespace="team-a")
    if denies:
        with pytest.raises(CelError):
            admit(objects, pod, facts)
    else:
        assert admit(objects, pod, facts).decision.allowed


@pytest.mark.parametrize("value", [
    "1e400", "-1e400", "1" + "0" * 400, "0.5e400", "0." + "0" * 500 + "1e400",
    "1e99999999999999", "5e-400", "0e99999999999999999999", "9.99", "10", "0.2e1", "1.8e308",
    "0.0000000001e10", " 1_000e-3 ", "+.5e1"])
@pytest.mark.parametrize("policy_name", ["default", "modes"])
def test_fractions_beyond_a_double_are_decided_as_the_engine_decides(value: str,
                                                                     policy_name: str) -> None:
    """cel-go's double() fails on 1e400 (strconv.ParseFloat range error): a denial under Fail
    even in warn mode (``modes``), where the engine only reports "exceeds". The compiled
    policy decides those values on their text (variable ``largeFractions``)."""
    pod = make_pod(containers=[make_container(
        env=[{"name": "GPU_MEMORY_FRACTION", "value": value}])])
    check(policy_name, pod, RequestFacts(namespace="team-a"))
