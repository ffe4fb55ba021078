"""``gpu-admission compile --guard --check``: drift between the policy and the guard half
installed in the cluster, listed through the real ``kubernetes`` client from the fake API
server (tests/kube_api_support.py), as a user runs it (a subprocess with ``--kubeconfig``)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_admission.compile.evaluator import admit
from gpu_admission.compile.guard import compile_guard, guard_digest
from gpu_admission.core.decision import RequestFacts
from gpu_admission.policy.model import default_policy, policy_from_dict
from tests.builders import make_container, make_pod
from tests.compile.test_audit_and_limits import _event
from tests.kube_api_support import api_in_thread


def installed() -> list[dict[str, Any]]:
    return [o for o in compile_guard(default_policy()).objects
            if o["kind"] in ("MutatingAdmissionPolicy", "ValidatingAdmissionPolicy")]


def check(kubeconfig: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_admission", "compile", "--guard",
                           "--check", "--kubeconfig", str(kubeconfig), *extra],
                          capture_output=True, text=True, timeout=60, check=False)


def test_in_step(tmp_path: Path) -> None:
    with api_in_thread(tmp_path, *installed()) as kubeconfig:
        proc = check(kubeconfig)
    digest = guard_digest(default_policy())
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.splitlines() == sorted(
        f"{o['kind']} {o['metadata']['name']}: in step ({digest})" for o in installed())


def test_drift_and_missing_objects_are_named(tmp_path: Path) -> None:
    objects = installed()
    stale = copy.deepcopy(objects[1])  # installed from another policy
    stale["metadata"]["annotations"]["gpu-admission.io/guard-digest"] = "sha256:0000000000000000"
    policy = tmp_path / "policy.yaml"
    doc = default_policy().model_dump(mode="json", by_alias=True)
    doc["spec"]["rules"]["gpu-visible-devices"] = "warn"
    leftover = next(o for o in compile_guard(policy_from_dict(doc)).objects  # an older policy's
                    if o["metadata"]["name"] == "guard-warn.gpu-admission.io")
    doc = default_policy().model_dump(mode="json", by_alias=True)
    with api_in_thread(tmp_path, stale, leftover) as kubeconfig:  # objects[0] missing
        proc = check(kubeconfig)
        doc["spec"]["exemptions"]["users"] = ["ci-bot"]
        policy.write_text(yaml.safe_dump(doc))
        changed = check(kubeconfig, "--policy", str(policy))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    name = stale["metadata"]["name"]
    assert (f"ValidatingAdmissionPolicy {name}: guard digest sha256:0000000000000000, the "
            f"policy's is {guard_digest(default_policy())}: compile and apply again") in lines
    assert [line for line in lines if "missing" in line] == [
        "MutatingAdmissionPolicy guard.gpu-admission.io: missing (the guard is not in the "
        "API server: apply `gpu-admission compile --guard` or the webhook fallback)"]
    # the built-in policy has no guard rule in warn mode: a warn policy left behind is named
    assert ("ValidatingAdmissionPolicy guard-warn.gpu-admission.io: not part of this policy's "
            "guard (no guard rule in its mode): delete it with its binding") in lines
    assert changed.returncode == 1
    assert "in step" not in changed.stdout  # another policy: every object drifts


def test_unreachable_api_is_a_clear_error(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    proc = check(kubeconfig)
    assert proc.returncode == 2
    assert proc.stderr.startswith("Error: GET /apis/admissionregistration.k8s.io/v1/"
                                  "mutatingadmissionpolicies:"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_audit_reads_the_guard_halfs_annotations(tmp_path: Path) -> None:
    """The guard's deny policy publishes ``guard-enforce.gpu-admission.io/<key>`` in the API
    server's audit log (whatever it decides); ``gpu-admission audit`` reads them like the
    webhook's."""
    doc = default_policy().model_dump(mode="json", by_alias=True)
    doc["spec"]["rules"]["gpu-visible-devices"] = "warn"
    policy = type(default_policy()).model_validate(doc)
    pod = make_pod(containers=[make_container("c", "nvidia/cuda:12.4.1-base", gpu=None, env=[
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])])
    outcome = admit(compile_guard(policy).objects, pod, RequestFacts(namespace="team-a"))
    notes = outcome.audit_annotations
    assert {k: v for k, v in notes.items() if k.startswith("guard-")} == {
        "guard-enforce.gpu-admission.io/decision": "allowed",
        "guard-enforce.gpu-admission.io/violations": "gpu-visible-devices=warn",
        "guard-enforce.gpu-admission.io/warnings": "1"}
    log = tmp_path / "audit.log"
    log.write_text(json.dumps(_event({"authorization.k8s.io/decision": "allow", **notes},
                                     "c0ffee00-0000-4000-8000-000000000002")) + "\n")
    out = subprocess.run([sys.executable, "-m", "gpu_admission", "audit", "show", "-o", "json",
                          "c0ffee00", str(log)], capture_output=True, text=True, timeout=60,
                         check=True)
    record = json.loads(out.stdout)
    assert {k: record[k] for k in ("stage", "decision", "modes", "warningCount")} == {
        "stage": "guard-enforce.gpu-admission.io", "decision": "allowed",
        "modes": {"gpu-visible-devices": "warn"}, "warningCount": 1}


# --------------------------------------------------------------------------- health (issue 31)
def metrics_text(*samples: tuple[str, str, str, int]) -> str:
    """``GET /metrics`` as kube-apiserver 1.36 writes it: the two families of
    k8s.io/apiserver ``pkg/admission/plugin/policy/{validating,mutating}/metrics/metrics.go``
    (HELP text with component-base's stability prefix), labels sorted as Prometheus' Go client
    writes them, plus an unrelated family. ``samples``: (kind, policy, error_type, count)."""
    vap = "apiserver_validating_admission_policy_check_total"
    map_ = "apiserver_mutating_admission_policy_check_total"
    lines = [
        "# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for "
        "each verb, dry run value, group, version, resource, scope, component, and HTTP "
        "response code.",
        "# TYPE apiserver_request_total counter",
        'apiserver_request_total{code="201",component="apiserver",dry_run="",group="",'
        'resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 42',
        f"# HELP {map_} [ALPHA] Mutation admission policy check total, labeled by policy and "
        "further identified by binding.",
        f"# TYPE {map_} counter"]
    lines += [f'{map_}{{error_type="{error}",policy="{policy}",policy_binding="{policy}"}} '
              f"{count}" for kind, policy, error, count in samples
              if kind == "MutatingAdmissionPolicy"]
    lines += [f"# HELP {vap} [BETA] Validation admission policy check total, labeled by policy "
              "and further identified by binding and enforcement action taken.",
              f"# TYPE {vap} counter"]
    lines += [f'{vap}{{enforcement_action="{"allow" if error == "no_error" else "deny"}",'
              f'error_type="{error}",policy="{policy}",policy_binding="{policy}"}} {count}'
              for kind, policy, error, count in samples if kind == "ValidatingAdmissionPolicy"]
    return "\n".join(lines) + "\n"


def health_check(kubeconfig: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_admission", "compile", "--check",
                           "--kubeconfig", str(kubeconfig), *extra],
                          capture_output=True, text=True, timeout=60, check=False)


def test_check_reports_type_checking_warnings_and_failed_evaluations(tmp_path: Path) -> None:
    objects = copy.deepcopy(installed())
    vap = next(o for o in objects if o["metadata"]["name"] == "guard-enforce.gpu-admission.io")
    vap["status"] = {"observedGeneration": 1, "typeChecking": {"expressionWarnings": [{
        "fieldRef": "spec.validations[0].expression",
        "warning": "apps/v1, Kind=Pod: ERROR: <input>:1:8: undefined field 'spce'\n"
                   " | object.spce\n | .......^"}]}}
    metrics = metrics_text(
        ("MutatingAdmissionPolicy", "guard.gpu-admission.io", "no_error", 40),
        ("MutatingAdmissionPolicy", "guard.gpu-admission.io", "invalid_error", 7),
        ("ValidatingAdmissionPolicy", "guard-enforce.gpu-admission.io", "no_error", 40),
        ("ValidatingAdmissionPolicy", "someone-elses.example.com", "invalid_error", 3))
    with api_in_thread(tmp_path, *objects, metrics=metrics) as kubeconfig:
        proc = health_check(kubeconfig)
        guard = check(kubeconfig)
    assert (proc.returncode, proc.stderr) == (1, "")
    assert proc.stdout.splitlines() == [
        "ValidatingAdmissionPolicy guard-enforce.gpu-admission.io: type checking: "
        "spec.validations[0].expression: apps/v1, Kind=Pod: ERROR: <input>:1:8: undefined "
        "field 'spce' | object.spce | .......^",
        "MutatingAdmissionPolicy guard.gpu-admission.io: evaluations failed (invalid_error 7; "
        "apiserver_mutating_admission_policy_check_total since the API server started): see "
        "its logs, or `kubectl create --dry-run=server` a pod to see the error"]
    # --guard --check: the drift report and the same health findings
    assert guard.returncode == 1
    assert proc.stdout.splitlines()[0] in guard.stdout.splitlines()


def test_check_healthy_cluster(tmp_path: Path) -> None:
    metrics = metrics_text(("ValidatingAdmissionPolicy", "guard-enforce.gpu-admission.io",
                            "no_error", 40))
    with api_in_thread(tmp_path, *installed(), metrics=metrics) as kubeconfig:
        proc = health_check(kubeconfig)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == (f"{len(installed())} gpu-admission admission policies: no "
                           "type-checking warnings, no failed evaluations\n")


@pytest.mark.parametrize(("metrics", "error"), [
    pytest.param(None, "Error: GET /metrics: HTTP 403 (reading the API server's metrics needs "
                 "`get` on the non-resource URL /metrics, e.g. ClusterRole system:monitoring)",
                 id="forbidden"),
    pytest.param("apiserver_x{a=\"1\" 2\n", "Error: GET /metrics: not the Prometheus text "
                 "format:", id="garbage"),
])
def test_check_unreadable_metrics_is_a_clear_error(tmp_path: Path, metrics: str | None,
                                                   error: str) -> None:
    with api_in_thread(tmp_path, *installed(), metrics=metrics) as kubeconfig:
        proc = health_check(kubeconfig)
    assert proc.returncode == 2
    assert proc.stderr.startswith(error), proc.stderr
    assert "Traceback" not in proc.stderr
