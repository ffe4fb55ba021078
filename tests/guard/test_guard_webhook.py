"""The guard and the policy's image table through the real webhook over TLS, as the API
server sends reviews (``tests.server_support``: real app, real TLS socket, CA-verified client),
plus the decision log it writes and ``gpu-admission evaluate`` on the same pods.

The three cases the issue names: a CPU pod with a CUDA image in an opted-in namespace gets
``NVIDIA_VISIBLE_DEVICES=void``; ``NVIDIA_VISIBLE_DEVICES=all`` without a GPU request is
refused; a digest-pinned vLLM pod is routed by ``spec.cudaRouting.images``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import orjson
import pytest
import yaml

from gpu_admission.policy.model import default_policy_text
from tests.builders import make_container, make_pod, make_review, patch_ops
from tests.server_support import Server, serving

CUDA_IMAGE = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"
DIGEST = "sha256:" + "4f" * 32
VLLM = f"vllm/vllm-openai@{DIGEST}"
VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


def policy_yaml() -> str:
    """The built-in policy plus one user image entry (digest-pinned vLLM -> CUDA 12.4)."""
    doc = yaml.safe_load(default_policy_text())
    doc["spec"]["cudaRouting"]["images"] = [
        {"repository": "docker.io/vllm/vllm-openai", "tags": "v0.6.*", "digests": [DIGEST],
         "cudaVersion": "12.4"}]
    return yaml.safe_dump(doc, sort_keys=False)


def cpu_pod() -> dict[str, Any]:
    return make_pod("batch-etl", namespace="ml-serving",
                    containers=[make_container("etl", CUDA_IMAGE, gpu=None)])


def all_gpus_pod() -> dict[str, Any]:
    return make_pod("sneaky", namespace="ml-serving", containers=[make_container(
        "app", CUDA_IMAGE, gpu=None, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])])


def vllm_pod() -> dict[str, Any]:
    return make_pod("llm", namespace="ml-serving", labels={"app": "llm"},
                    containers=[make_container("vllm", VLLM)])


DENIAL = ("[gpu-visible-devices] spec.containers[0].env[0]: NVIDIA_VISIBLE_DEVICES='all' "
          "without a GPU request gives this container GPUs outside the scheduler's accounting; "
          "request nvidia.com/gpu, or set NVIDIA_VISIBLE_DEVICES=void")


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml())
    async with serving(tmp_path, policy_path=policy, audit_log=str(tmp_path / "audit.log")) as srv:
        yield srv


async def test_cpu_pod_with_cuda_image_gets_void(server: Server) -> None:
    """Changed on purpose (issue 32): the CPU pod also goes to the GPU-aware scheduler
    (spec.scheduling.cpuPods: gpu-aware, the default)."""
    pod = cpu_pod()
    status, body, _ = await server.post("/mutate?timeout=10s", make_review(pod, uid="u-cpu"))
    assert status == 200
    response = body["response"]
    assert patch_ops(response) == [
        {"op": "add", "path": "/spec/schedulerName", "value": "gpu-aware-scheduler"},
        {"op": "add", "path": "/spec/containers/0/env", "value": [VOID]},
        {"op": "add", "path": "/metadata/annotations",
         "value": {"gpu-admission.io/mutated": "env,schedulerName"}}]
    assert body == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                    "response": {"uid": "u-cpu", "allowed": True, "patchType": "JSONPatch",
                                 "patch": response["patch"],
                                 "auditAnnotations": {
                                     "decision": "allowed",
                                     "patch": "spec.schedulerName; spec.containers[0].env; "
                                              "metadata.annotations"}}}
    patched = jsonpatch.apply_patch(pod, patch_ops(response))
    kubernetes_validate.validate(patched, "1.30", strict=True)
    # the validating webhook sees the mutated pod: nothing left to say
    status, body, _ = await server.post("/validate", make_review(patched, uid="u-cpu-v"))
    assert body["response"] == {"uid": "u-cpu-v", "allowed": True,
                                "auditAnnotations": {"decision": "allowed"}}


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
async def test_all_gpus_without_a_request_is_refused(server: Server, path: str) -> None:
    status, body, _ = await server.post(path, make_review(all_gpus_pod(), uid="u-all"))
    assert (status, body["response"]) == (200, {
        "uid": "u-all", "allowed": False,
        "status": {"status": "Failure", "code": 403, "reason": "Forbidden", "message": DENIAL},
        "auditAnnotations": {"decision": "denied", "violations": "gpu-visible-devices=enforce"}})


async def test_digest_pinned_vllm_is_routed_by_the_user_table(server: Server) -> None:
    pod = vllm_pod()
    status, body, _ = await server.post("/mutate", make_review(pod, uid="u-vllm"))
    response = body["response"]
    assert status == 200 and response["allowed"] is True
    patched = jsonpatch.apply_patch(pod, patch_ops(response))
    assert patched["spec"]["nodeSelector"] == {"gpu-admission.io/cuda-version": "12.4"}
    assert response["auditAnnotations"]["cuda-version"] == "12.4"
    assert response["auditAnnotations"]["cuda-source"] == f"image {VLLM} (spec.containers[0])"
    assert "warnings" not in response  # no cuda-version-unknown warning any more


async def test_default_policy_leaves_digest_pinned_vllm_unknown(tmp_path: Path) -> None:
    async with serving(tmp_path) as srv:
        _, body, _ = await srv.post("/mutate", make_review(vllm_pod(), uid="u-default"))
    assert body["response"]["warnings"] == [
        "cuda-version-unknown: CUDA version unknown; set label gpu-admission.io/cuda-version; "
        "not routed to a CUDA pool"]


async def test_decision_log_records_guard_decisions(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml())
    audit = tmp_path / "audit.log"
    async with serving(tmp_path, policy_path=policy, audit_log=str(audit)) as srv:
        await srv.post("/mutate", make_review(cpu_pod(), uid="r-cpu"))
        await srv.post("/mutate", make_review(all_gpus_pod(), uid="r-all"))
        await srv.post("/mutate", make_review(cpu_pod(), uid="r-exempt",
                                              namespace="kube-system"))
    records = {r["uid"]: r for r in map(orjson.loads, audit.read_bytes().splitlines())}
    assert set(records) == {"r-cpu", "r-all", "r-exempt"}
    cpu = records["r-cpu"]
    assert {k: cpu[k] for k in ("gpu", "workload", "cudaVersion", "decision", "mutated",
                                "violations", "exempt", "patch")} == {
        "gpu": False, "workload": None, "cudaVersion": None, "decision": "allowed",
        "mutated": True, "violations": [], "exempt": "",
        "patch": {"ops": 3, "paths": ["add /spec/schedulerName", "add /spec/containers/0/env",
                                      "add /metadata/annotations"],
                  "changes": ["spec.schedulerName", "spec.containers[0].env",
                              "metadata.annotations"]}}
    denied = records["r-all"]
    assert (denied["gpu"], denied["decision"], denied["mutated"]) == (False, "denied", False)
    assert denied["violations"] == [{"rule": "gpu-visible-devices",
                                     "path": "spec.containers[0].env[0]",
                                     "message": DENIAL.split(": ", 1)[1], "mode": "enforce"}]
    assert denied["modes"] == {"gpu-visible-devices": "enforce"}
    exempt = records["r-exempt"]
    assert (exempt["exempt"], exempt["mutated"]) == ("namespace kube-system", False)


def test_evaluate_shows_the_guard_decisions(tmp_path: Path) -> None:
    manifests = tmp_path / "pods.yaml"
    manifests.write_text(yaml.safe_dump_all([cpu_pod(), all_gpus_pod(), vllm_pod()]))
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml())
    proc = subprocess.run([sys.executable, "-m", "gpu_admission", "evaluate", "-f",
                           str(manifests), "--policy", str(policy), "-o", "json"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stderr  # one pod is denied
    cpu, denied, vllm = (orjson.loads(line) for line in proc.stdout.splitlines())
    assert (cpu["gpu"], cpu["allowed"], cpu["changes"]) == (
        False, True, ["spec.schedulerName", "spec.containers[0].env", "metadata.annotations"])
    assert cpu["patch"][:2] == [
        {"op": "add", "path": "/spec/schedulerName", "value": "gpu-aware-scheduler"},
        {"op": "add", "path": "/spec/containers/0/env", "value": [VOID]}]
    assert (denied["allowed"], [v["rule"] for v in denied["violations"]]) == (
        False, ["gpu-visible-devices"])
    assert (vllm["cudaVersion"], vllm["cudaSource"]) == (
        "12.4", f"image {VLLM} (spec.containers[0])")
