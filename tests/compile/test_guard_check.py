"""``gpu-admission compile --guard --check``: drift between the policy and the guard half
installed in the cluster, listed through the real ``kubernetes`` client from the fake API
server (tests/kube_api_support.py), as a user runs it (a subprocess with ``--kubeconfig``)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from gpu_admission.compile.guard import compile_guard, guard_digest
from gpu_admission.policy.model import default_policy
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
    with api_in_thread(tmp_path, objects[0], stale) as kubeconfig:
        proc = check(kubeconfig)
        doc["spec"]["exemptions"]["users"] = ["ci-bot"]
        policy.write_text(yaml.safe_dump(doc))
        changed = check(kubeconfig, "--policy", str(policy))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    name = stale["metadata"]["name"]
    assert (f"ValidatingAdmissionPolicy {name}: guard digest sha256:0000000000000000, the "
            f"policy's is {guard_digest(default_policy())}: compile and apply again") in lines
    assert sum("missing" in line for line in lines) == 2  # the warn and audit policies
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
