"""Fractional GPUs through the interfaces a user touches: the webhook over TLS exactly as the
API server sends AdmissionReviews (``tests.server_support``: real app, TLS socket, CA-verified
client; exact JSON), its decision log, and ``gpu-admission evaluate`` in a subprocess.

Issue 20, "Proven" 1: a vLLM inference pod on a fractional pool gets the annotations, the
ConfigMap-backed env, the quota request and no ``nvidia.com/gpu``; a training pod on the same
pool keeps its whole GPU; the webhook on its own output (new request UID) changes nothing; a
user-set ``NVIDIA_VISIBLE_DEVICES`` (value or ``valueFrom``) is refused.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import orjson
import pytest
import yaml

from gpu_admission.evaluate.cli import offline_uid
from tests.builders import make_container, make_review, patch_ops
from tests.fractional.support import (
    BAD_INPUT,
    BAD_INPUT_IDS,
    CM,
    POLICY_FILE,
    SHARE,
    UID,
    VLLM,
    ref,
    training_pod,
    vllm_patch,
    vllm_pod,
)
from tests.server_support import Server, serving


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    async with serving(tmp_path, policy_path=POLICY_FILE,
                       audit_log=str(tmp_path / "audit.log")) as srv:
        yield srv


async def test_vllm_pod_becomes_fractional_and_the_output_is_stable(server: Server) -> None:
    pod = vllm_pod()
    status, body, _ = await server.post("/mutate?timeout=10s", make_review(pod, uid=UID))
    assert status == 200
    response = body["response"]
    assert patch_ops(response) == vllm_patch()
    assert body == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                    "response": {"uid": UID, "allowed": True, "patchType": "JSONPatch",
                                 "patch": response["patch"],
                                 "auditAnnotations": {
                                     "decision": "allowed", "workload": "inference",
                                     "workload-reason": "default",
                                     "cuda-version": "12.4",
                                     "cuda-source": f"image {VLLM} (spec.containers[0])",
                                     "patch": "spec.schedulerName; spec.nodeSelector; "
                                              "spec.containers[0].resources; "
                                              "spec.containers[0].env; "
                                              "spec.containers[0].args; metadata.annotations"}}}
    out = jsonpatch.apply_patch(pod, patch_ops(response))
    kubernetes_validate.validate(out, "1.30", strict=True)
    container = out["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in str(container["resources"])
    assert container["resources"]["requests"] == {"gpu-admission.io/gpu-memory": SHARE}
    assert container["env"][-1] == ref()
    assert out["metadata"]["annotations"] == {
        "gpu-admission.io/gpu-memory": SHARE, "gpu-admission.io/gpu-configmap": CM,
        "gpu-admission.io/mutated": "args,env,nodeSelector,resources,schedulerName"}
    assert container["args"] == ["--gpu-memory-utilization=0.347"]  # issue 33: vLLM's own
    # its own output under a new request UID, at both stages: nothing to change or say
    for path in ("/mutate", "/validate"):
        new_uid = str(uuid.uuid4())
        _, again, _ = await server.post(path, make_review(out, uid=new_uid))
        assert again["response"] == {"uid": new_uid, "allowed": True, "auditAnnotations": {
            "decision": "allowed", "workload": "inference", "workload-reason": "default",
            "cuda-version": "12.4", "cuda-source": f"image {VLLM} (spec.containers[0])"}}


async def test_training_pod_on_the_fractional_pool_keeps_its_whole_gpu(server: Server) -> None:
    pod = training_pod()
    _, body, _ = await server.post("/mutate", make_review(pod, uid="u-train"))
    response = body["response"]
    assert response["allowed"] is True
    out = jsonpatch.apply_patch(pod, patch_ops(response))
    assert out["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert "env" not in out["spec"]["containers"][0]
    assert out["metadata"]["annotations"] == {"gpu-admission.io/mutated": "affinity,schedulerName"}


USER_SET = {
    "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-8a7b6c5d"}],
    "own-configmap": [ref("my-gpus")],
    "secret": [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"secretKeyRef": {
        "name": "gpus", "key": "NVIDIA_VISIBLE_DEVICES"}}}],
}


@pytest.mark.parametrize("env", list(USER_SET.values()), ids=list(USER_SET))
async def test_user_set_visible_devices_is_refused(server: Server, env: list[Any]) -> None:
    pod = vllm_pod(containers=[make_container("vllm", VLLM, env=env)])
    _, body, _ = await server.post("/mutate", make_review(pod, uid="u-user"))
    assert body["response"] == {
        "uid": "u-user", "allowed": False,
        "status": {"status": "Failure", "code": 403, "reason": "Forbidden", "message": (
            "[gpu-visible-devices] spec.containers[0].env[0]: NVIDIA_VISIBLE_DEVICES is set in "
            "a container that requests a GPU; the device plugin chooses its GPU: remove "
            "NVIDIA_VISIBLE_DEVICES from env")},
        "auditAnnotations": {"decision": "denied", "workload": "inference",
                             "workload-reason": "default", "cuda-version": "12.4",
                             "cuda-source": f"image {VLLM} (spec.containers[0])",
                             "violations": "gpu-visible-devices=enforce"}}


async def test_bad_share_is_denied_naming_the_annotation(server: Server) -> None:
    pod = vllm_pod(annotations={"gpu-admission.io/gpu-memory": "half"})
    _, body, _ = await server.post("/mutate", make_review(pod, uid="u-bad"))
    assert body["response"]["allowed"] is False
    assert body["response"]["status"]["message"] == (
        "[memory-limit] metadata.annotations[gpu-admission.io/gpu-memory]: expected a positive "
        "integer count of MiB as a string, e.g. \"4096\", got 'half'")


async def test_decision_log_records_the_fractional_mutation(tmp_path: Path) -> None:
    audit = tmp_path / "audit.log"
    async with serving(tmp_path, policy_path=POLICY_FILE, audit_log=str(audit)) as srv:
        await srv.post("/mutate", make_review(vllm_pod(), uid=UID))
    (record,) = map(orjson.loads, audit.read_bytes().splitlines())
    assert (record["uid"], record["decision"], record["mutated"], record["gpu"]) == (
        UID, "allowed", True, True)
    assert record["patch"]["changes"] == [
        "spec.schedulerName", "spec.nodeSelector", "spec.containers[0].resources",
        "spec.containers[0].env", "spec.containers[0].args", "metadata.annotations"]
    assert record["patch"]["paths"] == [
        "add /spec/schedulerName", "add /spec/nodeSelector",
        "add /spec/containers/0/resources/requests",
        "remove /spec/containers/0/resources/limits/nvidia.com~1gpu",
        "add /spec/containers/0/resources/limits/gpu-admission.io~1gpu-memory",
        "add /spec/containers/0/env", "add /spec/containers/0/args",
        "add /metadata/annotations", "add /metadata/annotations/gpu-admission.io~1mutated"]


def test_evaluate_prints_the_fractional_patch(tmp_path: Path) -> None:
    manifests = tmp_path / "pods.yaml"
    manifests.write_text(yaml.safe_dump_all([vllm_pod(), training_pod()]))
    proc = subprocess.run([sys.executable, "-m", "gpu_admission", "evaluate", "-f",
                           str(manifests), "--policy", str(POLICY_FILE), "-o", "json"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    vllm, train = (orjson.loads(line) for line in proc.stdout.splitlines())
    cm = "gpu-admission-gpu-" + offline_uid(str(manifests), 1, "")
    assert vllm["patch"] == vllm_patch(cm)
    assert (vllm["allowed"], vllm["violations"], vllm["workload"]) == (True, [], "inference")
    assert "resources" not in str(train["patch"]) and "gpu-memory" not in str(train["patch"])
    assert train["changes"] == ["spec.schedulerName", "spec.affinity", "metadata.annotations"]
    # the text output shows the same patch, and the run is reproducible
    text = subprocess.run([sys.executable, "-m", "gpu_admission", "evaluate", "-f",
                           str(manifests), "--policy", str(POLICY_FILE)],
                          capture_output=True, text=True, check=False)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert "    remove /spec/containers/0/resources/limits/nvidia.com~1gpu" in lines
    assert (f'    add /metadata/annotations {{"gpu-admission.io/gpu-memory":"{SHARE}",'
            f'"gpu-admission.io/gpu-configmap":"{cm}"}}') in lines
    assert proc.stdout == subprocess.run(
        [sys.executable, "-m", "gpu_admission", "evaluate", "-f", str(manifests), "--policy",
         str(POLICY_FILE), "-o", "json"], capture_output=True, text=True, check=False).stdout


def test_evaluate_refuses_a_user_configmap_reference(tmp_path: Path) -> None:
    manifests = tmp_path / "pod.yaml"
    manifests.write_text(yaml.safe_dump(vllm_pod(
        annotations={"gpu-admission.io/gpu-configmap": "gpu-admission-gpu-mine"},
        containers=[make_container("vllm", VLLM, env=[ref("gpu-admission-gpu-other")])])))
    proc = subprocess.run([sys.executable, "-m", "gpu_admission", "evaluate", "-f",
                           str(manifests), "--policy", str(POLICY_FILE), "-o", "json"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stderr
    (result,) = (orjson.loads(line) for line in proc.stdout.splitlines())
    assert [(v["rule"], v["path"]) for v in result["violations"]] == [
        ("gpu-visible-devices", "spec.containers[0].env[0]")]


def test_evaluate_denies_the_bad_input_table_naming_the_field(tmp_path: Path) -> None:
    """The engine test's bad-input table, through ``evaluate`` in one subprocess."""
    manifests = tmp_path / "bad.yaml"
    pods = [copy.deepcopy(pod) for pod, _ in BAD_INPUT]
    for i, pod in enumerate(pods):
        pod["metadata"]["name"] = f"bad-{i}"
    manifests.write_text(yaml.safe_dump_all(pods))
    proc = subprocess.run([sys.executable, "-m", "gpu_admission", "evaluate", "-f",
                           str(manifests), "--policy", str(POLICY_FILE), "-o", "json"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stderr
    results = [orjson.loads(line) for line in proc.stdout.splitlines()]
    assert len(results) == len(BAD_INPUT)
    for ident, result, (_, expected) in zip(BAD_INPUT_IDS, results, BAD_INPUT, strict=True):
        assert (result["allowed"], result["patch"]) == (False, []), ident
        assert [(v["rule"], v["path"], v["message"])
                for v in result["violations"]] == expected, ident
