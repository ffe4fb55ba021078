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

import yaml

from gpu_admission.compile.evaluator import admit
from gpu_admission.compile.guard import compile_guard, guard_digest
from gpu_admission.decision import RequestFacts
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
