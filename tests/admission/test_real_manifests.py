"""What real clusters send (issue 22): manifests written in the shapes their projects publish
(tests/data/realworld/), through ``gpu-admission evaluate`` (a subprocess, as a user runs
it) and through the webhook over TLS (each pod the objects would create, POSTed as the API
server does), which must agree pod for pod.

* workload objects: a Volcano Job, KubeRay RayCluster/RayJob/RayService, a LeaderWorkerSet, a
  Kubeflow Notebook, a JAX fine-tuning batch/v1 Job (training by default), a TrainJob (no pod
  template: said so) and an unknown kind (said, evaluation goes on);
* an image whose name carries ``cu124`` and no tag;
* KAI-Scheduler pods before and after KAI's webhook, a pod borrowing KAI's annotations, a
  HAMi pod: with the systems not declared (denied, naming what to declare) and declared;
* offline DRA: a training pod whose template is not in the files, a consumable-capacity claim.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
import yaml

from gpu_admission.workloads.kinds import pod_templates
from tests.builders import make_review
from tests.builders import patch_env as env_of
from tests.server_support import SecretDir, Server, make_config, new_bundle, running_server

DATA = Path(__file__).parent.parent / "data" / "realworld"
DECLARED = DATA / "policy-other-systems.yaml"
MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")


def evaluate(*args: str) -> tuple[int, list[dict[str, Any]], str]:
    proc = subprocess.run([sys.executable, "-m", "gpu_admission", "evaluate", "-o", "json",
                           *args], capture_output=True, text=True, timeout=120, check=False)
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr



@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[int, list[dict[str, Any]], str]]:
    return {
        "workloads": evaluate("-f", str(DATA / "workloads.yaml")),
        "images": evaluate("-f", str(DATA / "images.yaml")),
        "others": evaluate("-f", str(DATA / "other-systems.yaml")),
        "others-declared": evaluate("-f", str(DATA / "other-systems.yaml"), "--policy",
                                    str(DECLARED)),
        "dra": evaluate("-f", str(DATA / "dra-offline.yaml")),
    }


def rows(runs: dict[str, Any], run: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["name"], r["template"]): r for r in runs[run][1]}


# ------------------------------------------------------------------------------ workloads
def test_workload_objects_are_read(runs: dict[str, Any]) -> None:
    code, out, stderr = runs["workloads"]
    assert code == 0, stderr
    path = str(DATA / "workloads.yaml")
    assert stderr == (
        f"{path}: document 7: skipped TrainJob (no pod template: TrainJob embeds no pod "
        "template (trainer.kubeflow.org/v1alpha1): its pods come from the "
        "TrainingRuntime/ClusterTrainingRuntime named in spec.runtimeRef; evaluate that "
        "runtime's file)\n"
        f"{path}: document 9: skipped KafkaTopic (no pod template)\n")
    assert [(r["kind"], r["template"], r["gpu"], r["workload"]) for r in out] == [
        ("Job", "spec.tasks[0].template", True, "training"),
        ("Job", "spec.tasks[1].template", True, "training"),
        ("RayCluster", "spec.headGroupSpec.template", False, None),
        ("RayCluster", "spec.workerGroupSpecs[0].template", True, "inference"),
        ("RayJob", "spec.rayClusterSpec.headGroupSpec.template", False, None),
        ("RayJob", "spec.rayClusterSpec.workerGroupSpecs[0].template", True, "inference"),
        ("RayService", "spec.rayClusterConfig.headGroupSpec.template", False, None),
        ("RayService", "spec.rayClusterConfig.workerGroupSpecs[0].template", True,
         "inference"),
        ("LeaderWorkerSet", "spec.leaderWorkerTemplate.leaderTemplate", True, "inference"),
        ("LeaderWorkerSet", "spec.leaderWorkerTemplate.workerTemplate", True, "inference"),
        ("Notebook", "spec.template", True, "notebook"),
        ("Job", "spec.template", True, "training"),
    ]


def test_a_jax_batch_job_is_training_unless_labelled(runs: dict[str, Any]) -> None:
    row = rows(runs, "workloads")[("jax-finetune", "spec.template")]
    assert row["workloadReason"] == "owner Job/jax-finetune (classification.batchJobWorkload)"
    assert env_of(row["patch"]) == {}  # no XLA_PYTHON_CLIENT_MEM_FRACTION=0.2 on a trainer
    assert {"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.sharing-strategy",
                                   "operator": "NotIn",
                                   "values": ["time-slicing", "mps"]}]}]}}}} in row["patch"]


def test_batch_job_class_is_configurable(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: gpu-admission.io/v1alpha1\nkind: GPUSharingPolicy\n"
                      "spec: {classification: {batchJobWorkload: null}}\n")
    code, out, _ = evaluate("-f", str(DATA / "workloads.yaml"), "--policy", str(policy))
    assert code == 0
    jax = next(r for r in out if r["name"] == "jax-finetune")
    assert (jax["workload"], jax["workloadReason"]) == ("inference", "default")
    assert env_of(jax["patch"])["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.2"
    policy.write_text("apiVersion: gpu-admission.io/v1alpha1\nkind: GPUSharingPolicy\n"
                      "spec: {classification: {batchJobWorkload: batch}}\n")
    code, _, stderr = evaluate("-f", str(DATA / "workloads.yaml"), "--policy", str(policy))
    assert code == 2
    assert "spec.classification.batchJobWorkload" in stderr


def test_a_cuda_token_in_the_image_name(runs: dict[str, Any]) -> None:
    code, (row,), stderr = runs["images"]
    assert code == 0, stderr
    assert row["cudaVersion"] == "12.4"
    assert row["cudaSource"].startswith("image us-docker.pkg.dev/deeplearning-platform-release/"
                                        "gcr.io/huggingface-text-generation-inference-cu124")
    assert {"op": "add", "path": "/spec/nodeSelector",
            "value": {"gpu-admission.io/cuda-version": "12.4"}} in row["patch"]


# ------------------------------------------------------------------ other sharing systems
def test_undeclared_systems_are_denied_naming_what_to_declare(runs: dict[str, Any]) -> None:
    code, out, _ = runs["others"]
    assert code == 1
    got = {r["name"]: (r["allowed"], [(v["rule"], v["path"]) for v in r["violations"]])
           for r in out}
    assert got == {
        "kai-fraction": (False, [("other-sharing-system",
                                  "metadata.annotations[gpu-fraction]")]),
        "kai-memory": (False, [("gpu-visible-devices", "spec.containers[0].env[0]"),
                               ("other-sharing-system", "metadata.annotations[gpu-memory]")]),
        "kai-borrowed": (False, [("gpu-visible-devices", "spec.containers[0].env[0]"),
                                 ("other-sharing-system",
                                  "metadata.annotations[gpu-fraction]")]),
        "hami-vgpu": (False, [("other-sharing-system", "spec.containers[0].resources")]),
    }
    hami = next(r for r in out if r["name"] == "hami-vgpu")
    assert hami["violations"][0]["message"] == (
        "asks HAMi for its GPU (HAMi vGPU nvidia.com/gpumem=3000, nvidia.com/gpucores=30), but "
        "this cluster's policy does not declare HAMi: add hami to spec.otherSharingSystems if "
        "HAMi runs here, or remove the HAMi resources")


def test_declared_systems_keep_their_env_and_cap_ours(runs: dict[str, Any]) -> None:
    code, out, _ = runs["others-declared"]
    assert code == 1  # kai-borrowed only
    by_name = {r["name"]: r for r in out}
    kai = by_name["kai-fraction"]
    assert (kai["allowed"], kai["gpu"], kai["violations"]) == (True, True, [])
    # a fraction of a card of unknown size: the fraction, never a MiB guess
    assert env_of(kai["patch"]) == {"GPU_MEMORY_FRACTION": "0.5",
                                    "XLA_CLIENT_MEM_FRACTION": "0.5",
                                    "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5",
                                    "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    assert not any(op["path"] == "/spec/schedulerName" for op in kai["patch"])
    after = by_name["kai-memory"]  # after KAI's webhook: its ConfigMap env is kept as is
    assert (after["allowed"], after["violations"]) == (True, [])
    assert env_of(after["patch"]) == {"NVIDIA_MEM_LIMIT_MB": "4000",
                                      "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    assert not any("/env/0" in op["path"] or "/env/1" in op["path"] for op in after["patch"])
    borrowed = by_name["kai-borrowed"]
    assert borrowed["allowed"] is False
    assert borrowed["violations"] == [{
        "rule": "gpu-visible-devices", "path": "spec.containers[0].env[0]", "mode": "enforce",
        "message": "NVIDIA_VISIBLE_DEVICES in KAI's fraction container must be what KAI's "
                   "webhook writes: configMapKeyRef {name: x-abcdefg-shared-gpu-0, key: "
                   "NVIDIA_VISIBLE_DEVICES}"}]
    hami = by_name["hami-vgpu"]
    assert (hami["allowed"], hami["violations"]) == (True, [])
    assert env_of(hami["patch"]) == {"NVIDIA_MEM_LIMIT_MB": "3000",  # HAMi's 3000, not 16000
                                     "TF_FORCE_GPU_ALLOW_GROWTH": "true"}


def test_other_systems_field_errors_name_the_field(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: gpu-admission.io/v1alpha1\nkind: GPUSharingPolicy\n"
                      "spec: {otherSharingSystems: [kai, runai]}\n")
    code, out, stderr = evaluate("-f", str(DATA / "other-systems.yaml"), "--policy",
                                 str(policy))
    assert (code, out) == (2, [])
    assert "spec.otherSharingSystems[1]: expected 'kai' or 'hami', got \"runai\"" in stderr


# --------------------------------------------------------------------------- offline DRA
def test_offline_dra_names_the_missing_object(runs: dict[str, Any]) -> None:
    code, out, _ = runs["dra"]
    assert code == 1
    by_name = {r["name"]: r for r in out}
    train = by_name["train-missing-template"]
    assert train["allowed"] is False
    assert train["violations"] == [{
        "rule": "dra-reference-unknown", "path": "spec.resourceClaims[0]", "mode": "enforce",
        "message": "ResourceClaimTemplate ml/single-gpu is not in the files given to "
                   "evaluate: add the file that defines it (-f), or read the cluster's "
                   "objects with --kubeconfig FILE; cannot tell whether the GPU is shared"}]
    infer = by_name["infer-4gi"]
    assert infer["allowed"] is True
    assert env_of(infer["patch"]) == {"NVIDIA_MEM_LIMIT_MB": "4096",  # 4Gi in MiB
                                      "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    (unknown,) = [v for v in infer["violations"] if v["rule"] == "dra-reference-unknown"]
    assert "no memory limits set" not in unknown["message"]
    assert unknown["message"].endswith("memory limits set from the known objects")


# --------------------------------------------------------------------------- the webhook
@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers(tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[dict[str, Server]]:
    tmp = tmp_path_factory.mktemp("realworld")
    secret = SecretDir(tmp / "certs", new_bundle())
    async with running_server(make_config(secret), secret.bundles[0].ca_pem) as default, \
            running_server(make_config(secret, policy_path=DECLARED),
                           secret.bundles[0].ca_pem) as declared:
        yield {"default": default, "declared": declared}


def pods_of(name: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for doc in yaml.safe_load_all((DATA / name).read_text()):
        for tpl in pod_templates(doc):
            out.append((tpl.pod["metadata"].get("name") or doc["metadata"]["name"], tpl.pod))
    return out


@MODULE_LOOP
@pytest.mark.parametrize(("file", "server", "run"), [
    ("workloads.yaml", "default", "workloads"), ("images.yaml", "default", "images"),
    ("other-systems.yaml", "default", "others"),
    ("other-systems.yaml", "declared", "others-declared")])
async def test_the_webhook_decides_every_pod_as_evaluate(
        servers: dict[str, Server], runs: dict[str, Any], file: str, server: str,
        run: str) -> None:
    expected = runs[run][1]
    pods = pods_of(file)
    assert len(pods) == len(expected)
    for (_, pod), row in zip(pods, expected, strict=True):
        status, body, _ = await servers[server].post("/mutate", make_review(pod))
        assert status == 200
        response = body["response"]
        assert response["allowed"] is row["allowed"], row["name"]
        raw = response.get("patch")
        assert (orjson.loads(base64.b64decode(raw)) if raw else []) == row["patch"]
        assert response.get("warnings", []) == row["warnings"]
        if not row["allowed"]:
            assert response["status"]["message"] == "; ".join(
                f"[{v['rule']}] {v['path']}: {v['message']}" for v in row["violations"]
                if v["mode"] == "enforce")
