"""``gpu-admission evaluate --kubeconfig`` against a test API endpoint, and the command-line
errors of ``evaluate --kubeconfig`` / ``serve --kubeconfig`` (click-style message, non-zero
exit)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from gpu_admission.certs.bundle import write_bundle
from tests.dra.objects import INFERENCE, POLICY_YAML, TRAINING, cluster, dra_pod
from tests.kube_api_support import api_in_thread, write_kubeconfig
from tests.server_support import free_port, new_bundle


def gpu_admission(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_admission", *args], capture_output=True,
                          text=True, timeout=60, check=False, cwd=cwd)


def test_evaluate_reads_dra_objects_from_the_cluster(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY_YAML)
    pods = tmp_path / "pods.yaml"
    pods.write_text(yaml.safe_dump_all([
        dra_pod("t-ts", TRAINING, template_name="timesliced"),
        dra_pod("t-shared", TRAINING, claim_name="shared-claim"),
        dra_pod("i-mps", INFERENCE, template_name="mps")]))
    with api_in_thread(tmp_path, *cluster()) as kubeconfig:
        proc = gpu_admission("evaluate", "--policy", str(policy), "-f", str(pods),
                             "--kubeconfig", str(kubeconfig), "-o", "json")
    assert proc.returncode == 1, proc.stderr
    rows = {r["name"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert [(v["rule"], v["path"]) for v in rows["t-ts"]["violations"]] == [
        ("no-training-on-shared-gpu", "spec.resourceClaims[0]")]
    assert "ResourceClaimTemplate ml/timesliced request gpu" in rows["t-ts"]["violations"][0][
        "message"]
    # the cluster's pod other-user names shared-claim too
    assert "ResourceClaim ml/shared-claim is also named by pod ml/other-user" in rows[
        "t-shared"]["violations"][0]["message"]
    env = next(op["value"] for op in rows["i-mps"]["patch"]
               if op["path"] == "/spec/containers/0/env")
    assert {"name": "NVIDIA_MEM_LIMIT_MB", "value": "10240"} in env


def test_evaluate_cluster_unreachable_is_a_clear_error(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", free_port())  # nobody listens
    pods = tmp_path / "pods.yaml"
    pods.write_text(yaml.safe_dump(dra_pod("p", TRAINING, template_name="timesliced")))
    proc = gpu_admission("evaluate", "-f", str(pods), "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("Error: --kubeconfig: listing deviceclasses failed: ")
    assert "Traceback" not in proc.stderr


def test_bad_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    pods = tmp_path / "pods.yaml"
    pods.write_text(yaml.safe_dump(dra_pod("p", TRAINING, template_name="timesliced")))
    proc = gpu_admission("evaluate", "-f", str(pods), "--kubeconfig", str(missing))
    assert (proc.returncode, proc.stderr.splitlines()[0]) == (
        2, f"Error: --kubeconfig: cannot load the kubeconfig {missing}: "
           f"Invalid kube-config file. No configuration found.")
    write_bundle(new_bundle(), tmp_path / "certs")
    proc = gpu_admission("serve", "--cert-dir", str(tmp_path / "certs"), "--kubeconfig",
                         str(missing), cwd=tmp_path)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"Error: --kubeconfig: cannot load the kubeconfig {missing}: "
        "Invalid kube-config file. No configuration found.")
