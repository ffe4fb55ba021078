"""``gpu-admission evaluate`` as a user runs it: a subprocess on real files under tests/data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from tests.policy_helpers import DEFAULT_ENV

DATA = Path(__file__).parent.parent / "data" / "evaluate"


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_admission", "evaluate", *args],
                          capture_output=True, text=True, input=stdin, timeout=60, check=False)


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_json_output_exact() -> None:
    path = str(DATA / "inference-pod.yaml")
    proc = cli("-f", path, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert json_lines(proc.stdout) == [{
        "file": path, "document": 1, "kind": "Pod", "name": "triton", "namespace": "team-a",
        "template": "", "allowed": True, "gpu": True, "exempt": "",
        "workload": "inference", "workloadReason": "default", "cudaVersion": "12.4",
        "cudaSource": "image nvcr.io/nvidia/tritonserver:24.05-py3 (spec.containers[0])",
        "violations": [], "warnings": [],
        "patch": [
            {"op": "add", "path": "/spec/schedulerName", "value": "gpu-aware-scheduler"},
            {"op": "add", "path": "/spec/nodeSelector",
             "value": {"gpu-admission.io/cuda-version": "12.4"}},
            {"op": "add", "path": "/spec/containers/0/env", "value": DEFAULT_ENV},
            {"op": "add", "path": "/metadata/annotations",
             "value": {"gpu-admission.io/mutated": "env,nodeSelector,schedulerName"}},
        ],
        "changes": ["spec.schedulerName", "spec.nodeSelector", "spec.containers[0].env",
                    "metadata.annotations"],
        # issue 33: no Node objects in the input, so it says what it assumed
        "placement": "no GPU nodes visible: assumed the policy's declared pools and defaults "
                     "(spec.nodePools, spec.memoryLimits); no declared pool selected: "
                     "spec.memoryLimits defaults",
    }]


def test_mixed_file_denied_exit_1() -> None:
    path = str(DATA / "mixed.yaml")
    proc = cli("-f", path, "-o", "json")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == f"{path}: document 2: skipped Service (no pod template)\n"
    results = json_lines(proc.stdout)
    assert [(r["document"], r["kind"], r["template"], r["allowed"], r["workload"])
            for r in results] == [
        (1, "Deployment", "spec.template", True, "inference"),
        (3, "PyTorchJob", "spec.pytorchReplicaSpecs.Master.template", True, "training"),
        (3, "PyTorchJob", "spec.pytorchReplicaSpecs.Worker.template", False, "training"),
        (4, "Pod", "", True, None),
    ]
    deployment, master, worker, cpu = results
    # a lower limit the user set is kept; the other variables are appended by name
    env_ops = [op for op in deployment["patch"] if op["path"].startswith("/spec/containers")]
    assert [op["value"]["name"] for op in env_ops] == [
        "GPU_MEMORY_FRACTION", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION",
        "TF_FORCE_GPU_ALLOW_GROWTH"]
    assert master["cudaVersion"] == "12.3"  # NGC pytorch 24.01 via the release table
    assert worker["violations"] == [{
        "rule": "no-training-on-shared-gpu",
        "path": "spec.nodeSelector[nvidia.com/gpu.sharing-strategy]",
        "message": "training pod targets a time-sliced GPU (nvidia.com/gpu.sharing-strategy="
                   "time-slicing); time-slicing makes each training job ~3x slower. Request "
                   "nvidia.com/gpu on a dedicated node pool (sharing none) or MIG, or label the "
                   "pod gpu-admission.io/workload=inference if it only serves",
        "mode": "enforce"}]
    assert worker["patch"] == []
    # the GPU-access guard (NVIDIA_VISIBLE_DEVICES=void) and, changed on purpose in issue 32,
    # the GPU-aware scheduler (spec.scheduling.cpuPods: gpu-aware)
    assert cpu["gpu"] is False
    assert cpu["patch"] == [
        {"op": "add", "path": "/spec/schedulerName", "value": "gpu-aware-scheduler"},
        {"op": "add", "path": "/spec/containers/0/env",
         "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]},
        {"op": "add", "path": "/metadata/annotations",
         "value": {"gpu-admission.io/mutated": "env,schedulerName"}}]


def test_text_output() -> None:
    proc = cli("-f", str(DATA / "mixed.yaml"))
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0] == (f"Deployment team-a/web ({DATA / 'mixed.yaml'} document 1): ALLOWED")
    assert "  workload: inference (default)" in lines
    assert "    add /spec/schedulerName \"gpu-aware-scheduler\"" in lines
    assert any(line.startswith("PyTorchJob ml/mnist Worker (") and line.endswith("DENIED")
               for line in lines)
    assert any(line.startswith("  enforce [no-training-on-shared-gpu] spec.nodeSelector")
               for line in lines)
    # changed on purpose (issue 32): the CPU pod is also routed (spec.scheduling.cpuPods)
    assert ("  not a GPU pod: GPU-access guard and the GPU-aware scheduler "
            "(spec.scheduling.cpuPods)") in lines
    assert ('    add /spec/containers/0/env [{"name":"NVIDIA_VISIBLE_DEVICES","value":"void"}]'
            in lines)


def test_yaml_output_carries_mutated_object() -> None:
    proc = cli("-f", str(DATA / "workloads.yaml"), "-o", "yaml")
    assert proc.returncode == 0, proc.stderr
    docs = list(yaml.safe_load_all(proc.stdout))
    assert [d["kind"] for d in docs] == ["StatefulSet", "DaemonSet", "CronJob", "Job",
                                         "ReplicaSet"]
    assert "&id" not in proc.stdout
    originals = list(yaml.safe_load_all((DATA / "workloads.yaml").read_text()))
    cron = docs[2]["mutated"]
    template = cron["spec"]["jobTemplate"]["spec"]["template"]
    assert template["spec"]["schedulerName"] == "gpu-aware-scheduler"
    assert template["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "nvidia.com/gpu.sharing-strategy", "operator": "NotIn",
                               "values": ["time-slicing", "mps"]}]}]
    assert template["metadata"]["annotations"] == {
        "gpu-admission.io/mutated": "affinity,schedulerName"}
    assert cron["spec"]["schedule"] == originals[2]["spec"]["schedule"]
    # the patch in each result applies to the pod the controller would create
    for doc, original in zip(docs, originals, strict=True):
        pointer = "/" + doc["template"].replace(".", "/")
        tpl = jsonpatch.JsonPointer(pointer).resolve(original)
        pod = {"metadata": dict(tpl.get("metadata", {})), "spec": tpl["spec"]}
        mutated = jsonpatch.apply_patch(pod, doc["patch"])
        assert mutated["spec"] == jsonpatch.JsonPointer(pointer).resolve(doc["mutated"])["spec"]


def test_kubeflow_yaml_mutates_every_replica_template() -> None:
    proc = cli("-f", str(DATA / "mixed.yaml"), "-o", "yaml")
    docs = list(yaml.safe_load_all(proc.stdout))
    job = docs[1]["mutated"]
    assert docs[1]["mutated"] == docs[2]["mutated"]
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["template"]["spec"]["schedulerName"] == "gpu-aware-scheduler"
    assert "schedulerName" not in specs["Worker"]["template"]["spec"]  # denied: not patched


def test_stdin_json_and_namespace_override() -> None:
    text = (DATA / "pod.json").read_text()
    proc = cli("-f", "-", "-o", "json", "--namespace", "other", stdin=text)
    assert proc.returncode == 0, proc.stderr
    [result] = json_lines(proc.stdout)
    assert result["file"] == "-"
    assert result["namespace"] == "other"
    assert (result["cudaVersion"], result["cudaSource"]) == (
        "12.1", "label gpu-admission.io/cuda-version")


def test_list_kind_and_multiple_files() -> None:
    proc = cli("-f", str(DATA / "list.yaml"), "-f", str(DATA / "inference-pod.yaml"),
               "-o", "json")
    assert proc.returncode == 0, proc.stderr
    assert [(Path(r["file"]).name, r["name"]) for r in json_lines(proc.stdout)] == [
        ("list.yaml", "a"), ("list.yaml", "b"), ("inference-pod.yaml", "triton")]


@pytest.mark.parametrize(("args", "extra"), [
    (["--namespace", "kube-system"], {"exempt": "namespace kube-system", "patch": []}),
    (["--policy", str(DATA / "policy-pools.yaml"), "--group", "gpu-admins"],
     {"exempt": "group gpu-admins", "patch": []}),
    (["--policy", str(DATA / "policy-pools.yaml"), "--user", "someone"], {"exempt": ""}),
], ids=["exempt-namespace", "exempt-group", "not-exempt"])
def test_exemption_flags(args: list[str], extra: dict[str, Any]) -> None:
    proc = cli("-f", str(DATA / "mixed.yaml"), "-o", "json", *args)
    worker = json_lines(proc.stdout)[2]
    assert {k: worker[k] for k in extra} == extra
    assert proc.returncode == (1 if not extra["exempt"] else 0)


def test_pools_policy_memory_values() -> None:
    proc = cli("-f", str(DATA / "list.yaml"), "-o", "json", "--policy",
               str(DATA / "policy-pools.yaml"))
    assert proc.returncode == 0, proc.stderr
    first = json_lines(proc.stdout)[0]
    env = next(op for op in first["patch"] if op["path"] == "/spec/containers/0/env")["value"]
    assert env[:2] == [{"name": "NVIDIA_MEM_LIMIT_MB", "value": "20480"},
                       {"name": "GPU_MEMORY_FRACTION", "value": "0.25"}]


def test_validate_stage_never_patches() -> None:
    proc = cli("-f", str(DATA / "mixed.yaml"), "-o", "json", "--stage", "validate")
    assert proc.returncode == 1
    results = json_lines(proc.stdout)
    assert all(r["patch"] == [] for r in results)
    assert [r["allowed"] for r in results] == [True, True, False, True]


@pytest.mark.parametrize(("args", "message"), [
    (["-f", str(DATA / "bad-containers.yaml")],
     f"Error: {DATA / 'bad-containers.yaml'}: document 2 (Deployment): "
     "spec.template.spec.containers[0].resources.limits: expected a mapping, got list\n"),
    (["-f", str(DATA / "bad-syntax.yaml")],
     f"Error: {DATA / 'bad-syntax.yaml'}: invalid YAML/JSON: line 4, column 1: expected ',' "
     "or ']', but got '<stream end>'\n"),
    (["-f", str(DATA / "nope.yaml")], f"Error: {DATA / 'nope.yaml'}: no such file\n"),
    (["-f", str(DATA / "inference-pod.yaml"), "--policy", str(DATA / "bad-policy.yaml")],
     f"Error: policy: {DATA / 'bad-policy.yaml'}: spec.nodePools[1].memoryMiB: expected an "
     'integer > 0, got "lots"\n'),
], ids=["bad-field", "bad-yaml", "missing-file", "bad-policy"])
def test_unusable_input_exit_2(args: list[str], message: str) -> None:
    proc = cli(*args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == message
    assert "Traceback" not in proc.stderr


def test_no_pods_exit_2() -> None:
    proc = cli("-f", str(DATA / "no-pods.yaml"))
    assert proc.returncode == 2
    assert proc.stderr.endswith("Error: no Pod or workload with a pod template in the input\n")


@pytest.mark.parametrize(("stdin", "message"), [
    ("kind: Pod\nmetadata: {name: x}\nspec: {containers: 3}\n",
     "document 1 (Pod): spec.containers: expected a non-empty list of containers"),
    ("hello\n", "document 1: expected a Kubernetes object (a mapping), got str"),
    ("apiVersion: v1\nmetadata: {name: x}\n", "document 1: kind: required field is missing"),
    ("kind: Pod\nspec: {containers: [{name: a, image: b, env: [{value: x}]}]}\n",
     "document 1 (Pod): spec.containers[0].env[0]: expected a mapping with a name"),
    ("kind: CronJob\nspec: {jobTemplate: {spec: {template: []}}}\n",
     "document 1 (CronJob): spec.jobTemplate.spec.template: expected a mapping, got list"),
], ids=["containers-not-a-list", "scalar-document", "no-kind", "env-without-name",
        "template-not-a-mapping"])
def test_bad_documents_on_stdin_exit_2(stdin: str, message: str) -> None:
    proc = cli("-f", "-", stdin=stdin)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == f"Error: -: {message}\n"


def test_console_script_is_wired() -> None:
    proc = subprocess.run([sys.executable, "-m", "gpu_admission", "evaluate", "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0
    assert "-o, --output [text|json|yaml|manifest]" in proc.stdout
    assert "-R, --recursive" in proc.stdout
