"""What real clusters send, round 2 (issue 34): serving platforms, pipelines and training
operators, written from their public formats (tests/data/realworld2/, each file names its
sources), through ``gpu-admission evaluate`` (a subprocess, as a user runs it: ``-f DIR -R``,
``-f -``, ``-o manifest``) and through the webhook over TLS for the pods the controllers
create, which must agree pod for pod.
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

from gpu_admission.workloads.kinds import RuntimeCatalog, pod_templates
from tests.builders import make_container, make_pod, make_review
from tests.builders import patch_env as env_of
from tests.server_support import SecretDir, Server, make_config, new_bundle, running_server

DATA = Path(__file__).parent.parent / "data" / "realworld2"
MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")
AFFINITY_NOT_SHARED = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [{
        "key": "nvidia.com/gpu.sharing-strategy", "operator": "NotIn",
        "values": ["time-slicing", "mps"]}]}]}}}


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_admission", "evaluate", *args],
                          capture_output=True, text=True, timeout=120, input=stdin,
                          check=False)


def json_rows(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]



def op_at(patch: list[dict[str, Any]], path: str) -> Any:
    return next((op["value"] for op in patch if op["path"] == path), None)


@pytest.fixture(scope="module")
def tree() -> subprocess.CompletedProcess[str]:
    """The whole corpus, as ``kubectl apply -f DIR -R`` would read it."""
    return run("-f", str(DATA), "-R", "-o", "json")


@pytest.fixture(scope="module")
def rows(tree: subprocess.CompletedProcess[str]) -> dict[tuple[str, str, str], dict[str, Any]]:
    assert tree.returncode == 0, tree.stderr
    return {(r["kind"], r["name"], r["template"]): r for r in json_rows(tree.stdout)}


# ----------------------------------------------------------------- every kind is read
#: (kind, name, template) -> (gpu, workload, reason, cudaVersion): one row per pod each
#: object's controller creates; the id names the public format the object follows.
CLASSIFIED = [
    pytest.param(("InferenceService", "torchserve-mnist", "spec.predictor"),
                 (True, "inference", "default", None),
                 id="kserve-v1beta1-model-pytorch-default-runtime"),
    pytest.param(("InferenceService", "tf-triton", "spec.predictor"),
                 (True, "inference", "default", "12.1"),
                 id="kserve-v1beta1-model-tensorflow-v2-triton"),
    pytest.param(("InferenceService", "tf-triton", "spec.transformer"),
                 (False, None, "", None), id="kserve-v1beta1-transformer-containers"),
    pytest.param(("InferenceService", "llama-vllm", "spec.predictor"),
                 (True, "inference", "default", "12.4"),
                 id="kserve-v1beta1-containers-shorthand"),
    pytest.param(("InferenceService", "onnx-resnet", "spec.predictor"),
                 (True, "inference", "default", "12.4"),
                 id="kserve-v1beta1-model-on-servingruntime-in-file"),
    pytest.param(("LLMInferenceService", "qwen", "spec.template"),
                 (True, "inference", "default", "12.4"),
                 id="kserve-v1alpha1-llminferenceservice-template"),
    pytest.param(("Service", "whisper", "spec.template"),
                 (True, "inference", "default", "12.3"), id="knative-serving-v1-service"),
    pytest.param(("NIMService", "llama3-8b", "spec"), (True, "inference", "default", None),
                 id="nim-operator-apps-v1alpha1-nimservice"),
    pytest.param(("Workflow", "cuda-check", "spec.templates[1]"),
                 (True, "inference", "default", "12.2"), id="argo-v1alpha1-container-template"),
    pytest.param(("Workflow", "cuda-check", "spec.templates[2]"),
                 (True, "inference", "default", "12.1"),
                 id="argo-v1alpha1-script-template-gpu-from-podSpecPatch"),
    pytest.param(("Workflow", "cuda-check", "spec.templates[3]"), (False, None, "", None),
                 id="argo-v1alpha1-templated-podSpecPatch-unread"),
    pytest.param(("CronWorkflow", "nightly-eval", "spec.workflowSpec.templates[0]"),
                 (True, "training", "label gpu-admission.io/workload", "12.3"),
                 id="argo-v1alpha1-cronworkflow-podMetadata-label"),
    pytest.param(("WorkflowTemplate", "finetune-step", "spec.templates[0]"),
                 (True, "training", "label gpu-admission.io/workload", "12.3"),
                 id="argo-v1alpha1-workflowtemplate-template-metadata-label"),
    pytest.param(("MXJob", "mxnet-gpu", "spec.mxReplicaSpecs.Worker.template"),
                 (True, "training", "owner MXJob/mxnet-gpu", None),
                 id="training-operator-kubeflow-v1-mxjob"),
    pytest.param(("Experiment", "random-lr", "spec.trialTemplate.trialSpec.spec.template"),
                 (True, "training", "owner Job/random-lr (classification.batchJobWorkload)",
                  None), id="katib-v1beta1-experiment-trialSpec-batch-job"),
    pytest.param(("SparkApplication", "spark-rapids", "spec.driver"), (False, None, "", None),
                 id="spark-operator-v1beta2-driver"),
    pytest.param(("SparkApplication", "spark-rapids", "spec.executor"),
                 (True, "inference", "default", "12.4"),
                 id="spark-operator-v1beta2-executor-gpu"),
    pytest.param(("RayClusterFleet", "qwen-fleet",
                  "spec.template.spec.workerGroupSpecs[0].template"),
                 (True, "inference", "default", "12.4"),
                 id="aibrix-orchestration-v1alpha1-rayclusterfleet"),
    pytest.param(("Job", "tf-dist", "spec.tasks[0].template"),
                 (True, "training", "owner Job/tf-dist (classification.batchJobWorkload)",
                  "12.2"), id="volcano-batch-v1alpha1-job-level-scheduler"),
    pytest.param(("PyTorchJob", "nvl-train", "spec.pytorchReplicaSpecs.Worker.template"),
                 (True, "training", "owner PyTorchJob/nvl-train", "12.3"),
                 id="nvidia-dra-computedomain-imex-channel-training"),
    pytest.param(("RayJob", "train-mnist", "spec.rayClusterSpec.workerGroupSpecs[0].template"),
                 (True, "inference", "default", "11.8"),
                 id="kuberay-v1-rayjob-ray-train-unlabelled-ray-ml-2.9-gpu"),
    pytest.param(("RayJob", "train-labelled",
                  "spec.rayClusterSpec.workerGroupSpecs[0].template"),
                 (True, "training", "label gpu-admission.io/workload", "11.8"),
                 id="kuberay-v1-rayjob-ray-train-labelled-ray-ml-2.7-no-suffix"),
    pytest.param(("RayCluster", "rl-finetune", "spec.workerGroupSpecs[0].template"),
                 (True, "training", "label gpu-admission.io/workload", "11.8"),
                 id="kuberay-v1-raycluster-rl-volcano-batch-scheduler"),
    pytest.param(("StatefulSet", "lab", "spec.template"),
                 (True, "notebook", "image quay.io/jupyter/pytorch-notebook:cuda12-python-3.11",
                  None), id="jupyter-docker-stacks-statefulset"),
]


@pytest.mark.parametrize(("key", "expected"), CLASSIFIED)
def test_every_kind_is_read_and_classified(rows: dict[tuple[str, str, str], dict[str, Any]],
                                           key: tuple[str, str, str],
                                           expected: tuple[Any, ...]) -> None:
    row = rows[key]
    assert (row["gpu"], row["workload"], row["workloadReason"], row["cudaVersion"]) == expected
    assert row["allowed"] is True


def test_the_tree_is_read_recursively_with_nothing_skipped(
        tree: subprocess.CompletedProcess[str]) -> None:
    """-R reads every .yaml under the directory; a ComputeDomain is said to be read as the
    channel template it makes; nothing else is skipped and nothing exits 2."""
    assert tree.returncode == 0
    files = sorted({r["file"] for r in json_rows(tree.stdout)})
    assert files == sorted(str(p) for p in DATA.rglob("*.yaml"))
    assert "skipped" not in tree.stderr
    assert "ServingRuntime read as a KServe runtime: its pods are the InferenceServices' " \
        "that select it" in tree.stderr
    assert "ComputeDomain: its IMEX channel ResourceClaimTemplate is read" in tree.stderr


def test_a_directory_without_r_reads_only_its_own_files() -> None:
    top = run("-f", str(DATA), "-o", "json")
    assert top.returncode == 2
    assert "no .json, .yaml or .yml files in the directory (-R reads its subdirectories)" \
        in top.stderr
    assert "Traceback" not in top.stderr
    one = run("-f", str(DATA / "pipelines"), "-o", "json")  # argo.yaml, not training/
    assert one.returncode == 0, one.stderr
    assert {r["file"] for r in json_rows(one.stdout)} == {str(DATA / "pipelines" / "argo.yaml")}


def test_stdin_is_read_like_a_file(rows: dict[tuple[str, str, str], dict[str, Any]]) -> None:
    text = (DATA / "pipelines" / "training" / "jobs.yaml").read_text()
    out = run("-f", "-", "-o", "json", stdin=text)
    assert out.returncode == 0, out.stderr
    for row in json_rows(out.stdout):
        assert row["file"] == "-"
        same = rows[row["kind"], row["name"], row["template"]]
        assert (row["patch"], row["workload"]) == (same["patch"], same["workload"])


# ------------------------------------------------------------- what each platform gets
def test_kserve_says_which_runtime_the_pod_runs(
        rows: dict[tuple[str, str, str], dict[str, Any]]) -> None:
    """A model runs the runtime KServe selects (kserve pkg/apis/serving/v1beta1
    predictor_model.go GetSupportingRuntimes): the namespace's ServingRuntime before the
    cluster's, by format priority and protocol; CUDA comes from that runtime's image."""
    got = {name: rows["InferenceService", name, "spec.predictor"].get("runtime")
           for name in ("torchserve-mnist", "tf-triton", "onnx-resnet", "llama-vllm")}
    assert got == {
        "torchserve-mnist": "KServe's default ClusterServingRuntime kserve-torchserve "
                            "(image pytorch/torchserve-kfs:0.9.0)",
        "tf-triton": "KServe's default ClusterServingRuntime kserve-tritonserver "
                     "(image nvcr.io/nvidia/tritonserver:23.05-py3)",
        "onnx-resnet": "ServingRuntime models/my-triton "
                       "(image nvcr.io/nvidia/tritonserver:24.05-py3)",
        "llama-vllm": None,  # the containers shorthand names its own image
    }
    triton = rows["InferenceService", "tf-triton", "spec.predictor"]
    assert triton["cudaSource"] == ("image nvcr.io/nvidia/tritonserver:23.05-py3 "
                                    "(spec.containers[0])")
    assert op_at(triton["patch"], "/spec/nodeSelector/gpu-admission.io~1cuda-version") == "12.1"
    assert env_of(triton["patch"])["NVIDIA_MEM_LIMIT_MB"] == "16000"


def test_text_names_the_runtime_and_says_a_warning_once() -> None:
    out = run("-f", str(DATA / "serving" / "kserve.yaml"))
    assert out.returncode == 0, out.stderr
    block = out.stdout.split("InferenceService models/torchserve-mnist predictor", 1)[1]
    block = block.split("\nInferenceService ", 1)[0]
    assert "  runtime: KServe's default ClusterServingRuntime kserve-torchserve" in block
    assert block.count("cuda-version-unknown") == 1  # the warn line, no "warning:" repeat
    assert "warning:" not in block


def test_training_operator_pods_carry_the_operator_labels() -> None:
    """Offline pods carry what the training-operator adds online (owner + the
    training.kubeflow.org/* labels), so either alone classes them as the webhook does."""
    doc = next(yaml.safe_load_all((DATA / "pipelines" / "training" / "jobs.yaml").read_text()))
    worker = pod_templates(doc)[1].pod
    assert worker["metadata"]["labels"] == {
        "training.kubeflow.org/job-name": "mxnet-gpu",
        "training.kubeflow.org/operator-name": "mxjob-controller",
        "training.kubeflow.org/replica-type": "worker"}
    assert worker["metadata"]["ownerReferences"][0]["kind"] == "MXJob"


def test_training_gets_a_dedicated_gpu_not_memory_caps(
        rows: dict[tuple[str, str, str], dict[str, Any]]) -> None:
    for key in [("MXJob", "mxnet-gpu", "spec.mxReplicaSpecs.Worker.template"),
                ("Experiment", "random-lr", "spec.trialTemplate.trialSpec.spec.template"),
                ("PyTorchJob", "nvl-train", "spec.pytorchReplicaSpecs.Worker.template")]:
        row = rows[key]
        assert env_of(row["patch"]) == {}, key
        assert op_at(row["patch"], "/spec/affinity") == AFFINITY_NOT_SHARED, key


def test_an_imex_channel_claim_is_not_a_gpu_claim(
        rows: dict[tuple[str, str, str], dict[str, Any]], tmp_path: Path) -> None:
    """A ComputeDomain's channel template (DeviceClass compute-domain-default-channel.
    nvidia.com) is not a GPU: the pods' GPUs are their nvidia.com/gpu, nothing is unknown."""
    for key in [("PyTorchJob", "nvl-train", "spec.pytorchReplicaSpecs.Worker.template"),
                ("Deployment", "nvl-serve", "spec.template")]:
        assert rows[key]["violations"] == [], key
    serve = rows["Deployment", "nvl-serve", "spec.template"]
    assert env_of(serve["patch"])["NVIDIA_MEM_LIMIT_MB"] == "16000"
    # without the ComputeDomain the template is unknown: a training pod cannot be judged
    # (denied, exit 1), a server is warned, and told truly that its limits are set
    docs = list(yaml.safe_load_all((DATA / "dra" / "imex.yaml").read_text()))[1:]
    alone = tmp_path / "pods.yaml"
    alone.write_text(yaml.safe_dump_all(docs))
    out = run("-f", str(alone), "-o", "json")
    assert out.returncode == 1
    train, serve = json_rows(out.stdout)
    assert [v["rule"] for v in train["violations"]] == ["dra-reference-unknown"]
    assert serve["violations"][0]["message"].endswith(
        "sharing not fully checked, memory limits set from the known objects")
    assert env_of(serve["patch"])["NVIDIA_MEM_LIMIT_MB"] == "16000"


def test_a_job_level_scheduler_is_never_overwritten(
        rows: dict[tuple[str, str, str], dict[str, Any]]) -> None:
    """Volcano puts the job's spec.schedulerName into each pod whose template names none
    (volcano pkg/controllers/job createJobPod): the pod keeps it (reported), the template is
    never given gpu-aware-scheduler, the project's own rules still apply."""
    row = rows["Job", "tf-dist", "spec.tasks[0].template"]
    assert op_at(row["patch"], "/spec/schedulerName") is None
    assert [(v["rule"], v["mode"]) for v in row["violations"]] == [("scheduler-name", "warn")]
    assert op_at(row["patch"], "/spec/affinity") == AFFINITY_NOT_SHARED


def test_an_unparsable_pod_spec_patch_is_named_never_exit_2(
        rows: dict[tuple[str, str, str], dict[str, Any]]) -> None:
    row = rows["Workflow", "cuda-check", "spec.templates[3]"]
    assert row["unread"] == [
        "spec.templates[3].podSpecPatch: podSpecPatch uses Argo parameters ({{...}}), "
        "resolved only when the workflow runs: not read"]
    parsed = rows["Workflow", "cuda-check", "spec.templates[2]"]
    assert "unread" not in parsed and parsed["gpu"] is True


@pytest.mark.parametrize("text", [
    pytest.param("containers: [", id="argo-podSpecPatch-invalid-yaml"),
    pytest.param("- a list", id="argo-podSpecPatch-not-a-mapping"),
])
def test_a_broken_pod_spec_patch_is_a_note(tmp_path: Path, text: str) -> None:
    wf = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
          "metadata": {"name": "w", "namespace": "argo"},
          "spec": {"entrypoint": "t", "podSpecPatch": text, "templates": [
              {"name": "t", "container": make_container(image="nvidia/cuda:12.2.0-base")}]}}
    path = tmp_path / "wf.yaml"
    path.write_text(yaml.safe_dump(wf))
    out = run("-f", str(path), "-o", "json")
    assert out.returncode == 0, out.stderr
    (row,) = json_rows(out.stdout)
    assert row["unread"][0].startswith("spec.podSpecPatch: podSpecPatch is not ")
    assert row["gpu"] is True


# ---------------------------------------------------------------------- -o manifest
@pytest.fixture(scope="module")
def manifest() -> tuple[subprocess.CompletedProcess[str], list[Any]]:
    out = run("-f", str(DATA), "-R", "-o", "manifest")
    return out, list(yaml.safe_load_all(out.stdout))


def test_manifest_is_every_object_mutated_and_idempotent(
        manifest: tuple[subprocess.CompletedProcess[str], list[Any]]) -> None:
    """Every object read comes back (ComputeDomain and runtimes included), in order; the
    stream is ready for ``kubectl apply -f -``: evaluated again, nothing changes."""
    out, objects = manifest
    assert out.returncode == 0, out.stderr
    count = sum(len(list(yaml.safe_load_all(p.read_text()))) for p in DATA.rglob("*.yaml"))
    assert len(objects) == count
    again = run("-f", "-", "-o", "json", stdin=out.stdout)
    assert again.returncode == 0, again.stderr
    assert [(r["kind"], r["name"], r["template"]) for r in json_rows(again.stdout)
            if r["patch"]] == []


def by_name(objects: list[Any], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def test_manifest_writes_each_change_where_the_platform_reads_it(
        manifest: tuple[subprocess.CompletedProcess[str], list[Any]]) -> None:
    _, objects = manifest
    isvc = by_name(objects, "InferenceService", "tf-triton")["spec"]
    assert isvc["predictor"]["schedulerName"] == "gpu-aware-scheduler"
    assert isvc["predictor"]["nodeSelector"]["gpu-admission.io/cuda-version"] == "12.1"
    assert {e["name"] for e in isvc["predictor"]["model"]["env"]} >= {"NVIDIA_MEM_LIMIT_MB"}
    assert "image" not in isvc["predictor"]["model"]  # the runtime's image is not copied
    assert isvc["predictor"]["annotations"]["gpu-admission.io/mutated"] == \
        "env,nodeSelector,schedulerName"
    wf = by_name(objects, "Workflow", "cuda-check")["spec"]["templates"]
    assert "NVIDIA_MEM_LIMIT_MB" in {e["name"] for e in wf[2]["script"]["env"]}
    assert "name" not in wf[1]["container"]  # Argo names it main; nothing invented
    volcano = by_name(objects, "Job", "tf-dist")["spec"]
    assert "schedulerName" not in volcano["tasks"][0]["template"]["spec"]
    assert volcano["schedulerName"] == "volcano"
    spark = by_name(objects, "SparkApplication", "spark-rapids")["spec"]
    assert "NVIDIA_MEM_LIMIT_MB" in {e["name"] for e in spark["executor"]["env"]}
    assert spark["executor"]["gpu"] == {"name": "nvidia.com/gpu", "quantity": 1}
    nim = by_name(objects, "NIMService", "llama3-8b")["spec"]
    assert nim["schedulerName"] == "gpu-aware-scheduler"
    assert by_name(objects, "ComputeDomain", "nvl-domain")["spec"]["numNodes"] == 2


def test_manifest_reports_denials_on_stderr_and_exits_1(tmp_path: Path) -> None:
    pod = make_pod(labels={"gpu-admission.io/workload": "training"},
                   containers=[make_container(resource="nvidia.com/gpu.shared")])
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    out = run("-f", str(path), "-o", "manifest")
    assert out.returncode == 1
    assert yaml.safe_load(out.stdout) == pod  # denied: not patched
    assert "DENIED" in out.stderr and "[no-training-on-shared-gpu]" in out.stderr


# ---------------------------------------------------------------------- the webhook
def controller_pods() -> list[tuple[str, dict[str, Any]]]:
    """(file, pod) for every pod the corpus's controllers create, as they create it."""
    docs = [(p, d) for p in sorted(DATA.rglob("*.yaml")) for d in yaml.safe_load_all(
        p.read_text()) if d is not None]
    catalog = RuntimeCatalog()
    for _, doc in docs:
        catalog.add(doc)
    return [(str(p), tpl.pod) for p, doc in docs for tpl in pod_templates(doc, None, catalog)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    secret = SecretDir(tmp_path_factory.mktemp("realworld2") / "certs", new_bundle())
    async with running_server(make_config(secret), secret.bundles[0].ca_pem) as srv:
        yield srv


async def post(server: Server, path: str, review: dict[str, Any]) -> dict[str, Any]:
    status, body, _ = await server.post(path, review)
    assert status == 200, body
    response: dict[str, Any] = body["response"]
    return response


@MODULE_LOOP
async def test_the_webhook_decides_every_controller_pod_as_evaluate(
        server: Server, tree: subprocess.CompletedProcess[str]) -> None:
    """Pod for pod, the webhook (no DRA cache: the DRA pods are left to tests/dra) gives
    each pod the controllers create the verdict, patch and warnings evaluate gave."""
    expected = [r for r in json_rows(tree.stdout) if "dra" not in Path(r["file"]).parts]
    pods = [pod for file, pod in controller_pods() if "dra" not in Path(file).parts]
    assert len(pods) == len(expected)
    for pod, row in zip(pods, expected, strict=True):
        response = await post(server, "/mutate", make_review(pod))
        label = (row["kind"], row["name"], row["template"])
        assert response["allowed"] is row["allowed"], label
        raw = response.get("patch")
        assert (orjson.loads(base64.b64decode(raw)) if raw else []) == row["patch"], label
        assert response.get("warnings", []) == row["warnings"], label


# ------------------------------------------------------------- warnings said once
UNKNOWN_CUDA = make_pod(containers=[make_container(image="example.com/llm/server:v1")])
UNKNOWN_WARNING = ("cuda-version-unknown: CUDA version unknown; set label "
                   "gpu-admission.io/cuda-version; not routed to a CUDA pool")


@MODULE_LOOP
async def test_a_warning_is_said_by_the_mutating_stage_only(server: Server) -> None:
    mutate = await post(server, "/mutate", make_review(UNKNOWN_CUDA))
    assert mutate["warnings"] == [UNKNOWN_WARNING]
    validate = await post(server, "/validate", make_review(UNKNOWN_CUDA))
    assert "warnings" not in validate
    assert validate["auditAnnotations"]["violations"] == "cuda-version-unknown=warn"


@MODULE_LOOP
async def test_kubectl_label_pod_is_not_warned_again(server: Server) -> None:
    labelled = make_pod(containers=UNKNOWN_CUDA["spec"]["containers"],
                        labels={"team": "search"})
    for path in ("/mutate", "/validate"):
        response = await post(server, path, make_review(labelled, operation="UPDATE",
                                                         old=UNKNOWN_CUDA))
        assert response["allowed"] is True and "warnings" not in response, path


@MODULE_LOOP
async def test_an_update_that_brings_a_new_warning_says_it(server: Server) -> None:
    known = make_pod(containers=[make_container(image="nvidia/cuda:12.2.0-base-ubuntu22.04")])
    response = await post(server, "/mutate", make_review(UNKNOWN_CUDA, operation="UPDATE",
                                                         old=known))
    assert response["warnings"] == [UNKNOWN_WARNING]


# ------------------------------------------------------------------ KubeRay and Jupyter
def test_a_ray_train_job_without_the_label_is_told_how_to_say_it(
        rows: dict[tuple[str, str, str], dict[str, Any]]) -> None:
    """KubeRay never puts a RayJob's labels on pods, so the webhook cannot see that it runs
    Ray Train; evaluate decides the pod as the webhook will and says how to label it."""
    worker = rows["RayJob", "train-mnist", "spec.rayClusterSpec.workerGroupSpecs[0].template"]
    assert worker["hints"] == [
        "the RayJob's entrypoint runs Ray Train, but spec.rayClusterSpec.workerGroupSpecs[0]"
        ".template has no gpu-admission.io/workload label: KubeRay never puts the RayJob's "
        "labels on pods, so the webhook cannot tell; label the template "
        "gpu-admission.io/workload: training"]
    assert "hints" not in rows["RayJob", "train-mnist", "spec.rayClusterSpec.headGroupSpec"
                               ".template"]  # no GPU
    assert "hints" not in rows["RayJob", "train-labelled",
                               "spec.rayClusterSpec.workerGroupSpecs[0].template"]
    rl = rows["RayCluster", "rl-finetune", "spec.workerGroupSpecs[0].template"]
    assert [(v["rule"], v["mode"]) for v in rl["violations"]] == [("scheduler-name", "warn")]
    assert op_at(rl["patch"], "/spec/affinity") == AFFINITY_NOT_SHARED


NOTEBOOK_PODS = [
    pytest.param(make_pod(containers=[make_container(
        image="quay.io/jupyter/pytorch-notebook:cuda12-python-3.11")]), "notebook",
                 id="jupyter-docker-stacks-quay"),
    pytest.param(make_pod(containers=[make_container(
        image="jupyter/tensorflow-notebook:2023-10-20")]), "notebook",
                 id="jupyter-docker-stacks-docker-hub"),
    pytest.param(make_pod(containers=[make_container(gpu=None, image="nginx:1.25"),
                                      make_container(name="lab", image="jupyter/base-notebook")]),
                 "notebook", id="jupyter-beside-a-sidecar"),
    pytest.param(make_pod(containers=[make_container(image="jupyter/base-notebook")],
                          labels={"gpu-admission.io/workload": "training"}), "training",
                 id="jupyter-label-wins"),
    pytest.param(make_pod(containers=[make_container(image="quay.io/jupyterhub/k8s-hub:3.0")]),
                 "inference", id="jupyterhub-hub-is-not-a-notebook-image"),
]


@pytest.mark.parametrize(("pod", "workload"), NOTEBOOK_PODS)
def test_notebook_images_class_the_pod_in_engine_and_compiled(pod: dict[str, Any],
                                                             workload: str) -> None:
    """The engine and the compiled admission policies (the differential oracle) agree."""
    from gpu_admission.admission.engine import evaluate  # noqa: PLC0415
    from gpu_admission.core.decision import RequestFacts  # noqa: PLC0415
    from gpu_admission.policy.model import default_policy  # noqa: PLC0415
    from tests.compile_support import check  # noqa: PLC0415

    facts = RequestFacts(namespace="team-a")
    assert evaluate(pod, facts, default_policy()).workload == workload
    check("default", pod, facts)
    check("modes", pod, facts)


# ------------------------------------------------------------------- bad input, exit 2
def _isvc(predictor: Any) -> dict[str, Any]:
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": "m", "namespace": "models"}, "spec": {"predictor": predictor}}


BAD = [
    pytest.param(_isvc("x"), "document 1 (InferenceService): spec.predictor: expected a "
                 "mapping, got str", id="kserve-predictor-not-a-mapping"),
    pytest.param(_isvc({"minReplicas": 1}), "spec.predictor: expected a model or containers",
                 id="kserve-predictor-empty"),
    pytest.param(_isvc({"containers": {"name": "x"}}), "spec.predictor.containers: expected a "
                 "list", id="kserve-containers-not-a-list"),
    pytest.param({"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                  "metadata": {"name": "w"}, "spec": {"templates": {"a": 1}}},
                 "spec.templates: expected a list", id="argo-templates-not-a-list"),
    pytest.param({"apiVersion": "argoproj.io/v1alpha1", "kind": "CronWorkflow",
                  "metadata": {"name": "c"}, "spec": {"schedule": "* * * * *"}},
                 "spec.workflowSpec: expected a mapping", id="argo-cronworkflow-no-spec"),
    pytest.param({"apiVersion": "kubeflow.org/v1beta1", "kind": "Experiment",
                  "metadata": {"name": "e"}, "spec": {"trialTemplate": []}},
                 "spec.trialTemplate: expected a mapping", id="katib-trialtemplate-list"),
    pytest.param({"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
                  "metadata": {"name": "s"}, "spec": {"executor": "big"}},
                 "spec.executor: expected a mapping", id="spark-executor-not-a-mapping"),
    pytest.param({"apiVersion": "apps.nvidia.com/v1alpha1", "kind": "NIMService",
                  "metadata": {"name": "n"}, "spec": {"image": "nvcr.io/nim/x:1"}},
                 "spec.image: expected a mapping", id="nim-image-a-string"),
]


@pytest.mark.parametrize(("doc", "message"), BAD)
def test_malformed_platform_objects_exit_2_naming_the_field(tmp_path: Path, doc: Any,
                                                            message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = run("-f", str(path))
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_an_explainer_built_from_kserve_config_is_not_an_error() -> None:
    """An ``art`` explainer has no containers in the object (KServe's configured image)."""
    doc = _isvc({"model": {"modelFormat": {"name": "sklearn"},
                           "storageUri": "gs://kfserving-examples/models/sklearn/1.0/model"}})
    doc["spec"]["explainer"] = {"art": {"type": "SquareAttack"}}
    assert [t.field for t in pod_templates(doc)] == ["spec.predictor"]


def test_a_katib_trial_of_a_training_operator_job() -> None:
    """katib examples/v1beta1/kubeflow-training-operator: trialSpec is a PyTorchJob; its
    pods are owned and labelled as the training-operator does, and written back in place."""
    worker = {"replicas": 1, "template": {"spec": {"containers": [make_container(
        name="pytorch", image="docker.io/kubeflowkatib/pytorch-mnist-gpu:v0.17.0")]}}}
    exp = {"apiVersion": "kubeflow.org/v1beta1", "kind": "Experiment",
           "metadata": {"name": "tune", "namespace": "ml"},
           "spec": {"trialTemplate": {"primaryContainerName": "pytorch", "trialSpec": {
               "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
               "spec": {"pytorchReplicaSpecs": {"Worker": worker}}}}}}
    (tpl,) = pod_templates(exp)
    assert tpl.pointer == "/spec/trialTemplate/trialSpec/spec/pytorchReplicaSpecs/Worker/template"
    assert tpl.pod["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob"
    assert tpl.pod["metadata"]["labels"]["training.kubeflow.org/replica-type"] == "worker"
    from gpu_admission.admission.engine import evaluate  # noqa: PLC0415
    from gpu_admission.core.decision import RequestFacts  # noqa: PLC0415
    from gpu_admission.core.patch import apply_ops  # noqa: PLC0415
    from gpu_admission.policy.model import default_policy  # noqa: PLC0415
    from gpu_admission.workloads.kinds import with_mutated_template  # noqa: PLC0415

    decision = evaluate(tpl.pod, RequestFacts(namespace="ml"), default_policy())
    assert decision.workload == "training"
    out = with_mutated_template(exp, tpl, apply_ops(tpl.pod, decision.patch))
    written = out["spec"]["trialTemplate"]["trialSpec"]["spec"]["pytorchReplicaSpecs"][
        "Worker"]["template"]["spec"]
    assert written["affinity"] == AFFINITY_NOT_SHARED


def test_kserve_framework_fields_and_cluster_runtimes_in_the_files() -> None:
    """A predictor framework field (``pytorch:``, v1beta1 PredictorSpec) is a model of that
    format; a ClusterServingRuntime in the input replaces KServe's defaults; a runtime the
    model names is used even when it does not auto-select the format."""
    catalog = RuntimeCatalog()
    catalog.add({"apiVersion": "serving.kserve.io/v1alpha1", "kind": "ClusterServingRuntime",
                 "metadata": {"name": "site-torch"},
                 "spec": {"supportedModelFormats": [{"name": "pytorch", "version": "1",
                                                     "autoSelect": True}],
                          "containers": [{"name": "kserve-container",
                                          "image": "pytorch/torchserve-kfs:0.9.0-gpu"}]}})
    old_style = _isvc({"pytorch": {"storageUri": "gs://models/mnist",
                                   "resources": {"limits": {"nvidia.com/gpu": 1}}}})
    (tpl,) = pod_templates(old_style, None, catalog)
    assert tpl.runtime == "ClusterServingRuntime site-torch (image pytorch/torchserve-kfs:" \
        "0.9.0-gpu)"
    container = tpl.pod["spec"]["containers"][0]
    assert (container["name"], container["image"]) == ("kserve-container",
                                                        "pytorch/torchserve-kfs:0.9.0-gpu")
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert tpl.places is not None and tpl.places.containers[0] == "/spec/predictor/pytorch"
    named = _isvc({"model": {"modelFormat": {"name": "pytorch"}, "runtime": "kserve-tritonserver"}})
    assert pod_templates(named)[0].runtime.startswith(
        "KServe's default ClusterServingRuntime kserve-tritonserver")
    unknown = _isvc({"model": {"modelFormat": {"name": "caffe"}}})
    (tpl,) = pod_templates(unknown)
    assert tpl.runtime == ("no ServingRuntime supports model format 'caffe': the pod's image "
                           "is unknown (add the runtime's file)")


def test_the_compiled_policies_decide_every_controller_pod_alike() -> None:
    """The compiled admission policies (``gpu-admission compile``, evaluated with cel-python
    through the API server's steps) decide each non-DRA pod of the corpus as the engine."""
    from gpu_admission.core.decision import RequestFacts  # noqa: PLC0415
    from tests.compile_support import check  # noqa: PLC0415

    for file, pod in controller_pods():
        if "dra" not in Path(file).parts:
            check("default", pod, RequestFacts(namespace=pod["metadata"]["namespace"]))


@pytest.mark.parametrize(("names", "expected"), [
    pytest.param([None], ["user-container"], id="knative-one-unnamed"),
    pytest.param([None, "sidecar", None], ["user-container-0", "sidecar", "user-container-1"],
                 id="knative-multi-container-suffixes"),
    pytest.param([None, "user-container-0"], ["user-container-1", "user-container-0"],
                 id="knative-suffix-skips-a-name-in-use"),
])
def test_knative_names_unnamed_containers_as_its_defaulting_does(
        names: list[str | None], expected: list[str]) -> None:
    containers = [{"image": "nvcr.io/nvidia/pytorch:24.01-py3"} if n is None
                  else {"name": n, "image": "busybox"} for n in names]
    ksvc = {"apiVersion": "serving.knative.dev/v1", "kind": "Service",
            "metadata": {"name": "s", "namespace": "serving"},
            "spec": {"template": {"spec": {"containers": containers}}}}
    (tpl,) = pod_templates(ksvc)
    assert [c["name"] for c in tpl.pod["spec"]["containers"]] == expected
