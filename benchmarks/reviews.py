"""The realistic review mix the benchmarks send, and the policy they run under.

An admission webhook sees whatever the cluster creates, so the mix is not "one GPU pod"
repeated: it is inference pods (most of a time-sliced cluster's GPU traffic), training pods
(some on dedicated hardware, some wrongly asking for a time-sliced GPU and denied), plain CPU
pods (the bulk of any namespace), multi-container pods with sidecars and pods with long env
lists (large objects are where JSON parsing and patching cost shows).

Every AdmissionReview is built the way the API server sends it
(https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#request),
with the same small builders the tests use, but kept here so the benchmark does not import the
test package.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

UID_PLACEHOLDER = "00000000-0000-4000-8000-00000000beef"  # replaced per request by the client

# Pool labels follow NVIDIA GPU Feature Discovery (nvidia.com/gpu.sharing-strategy) and our
# own gpu-admission.io/cuda-version label (gpu_admission/core/vocab.py).
BENCH_POLICY_YAML = """\
# Policy used by the benchmark: two time-sliced inference pools (one per CUDA version) and a
# dedicated training pool, so routing, memory-limit and training rules all fire.
apiVersion: gpu-admission.io/v1alpha1
kind: GPUSharingPolicy
metadata:
  name: bench
spec:
  schedulerName: gpu-aware-scheduler
  nodePools:
    - name: inference-cu124     # time-sliced A100 80GB, 4 replicas per card
      nodeSelector: {gpu-admission.io/cuda-version: "12.4", gpu-pool: inference}
      sharing: time-slicing
      replicasPerGPU: 4
      memoryMiB: 81920            # MiB per physical GPU (GFD nvidia.com/gpu.memory)
      cudaVersion: "12.4"
    - name: inference-cu121
      nodeSelector: {gpu-admission.io/cuda-version: "12.1", gpu-pool: inference}
      sharing: time-slicing
      replicasPerGPU: 4
      memoryMiB: 81920
      cudaVersion: "12.1"
    - name: training            # dedicated whole GPUs
      nodeSelector: {gpu-pool: training}
      sharing: none
      memoryMiB: 81920
"""


def container(name: str = "main", image: str = "nvcr.io/nvidia/tritonserver:24.05-py3", *,
              gpu: int | str | None = 1, resource: str = "nvidia.com/gpu",
              env: list[dict[str, Any]] | None = None,
              cpu: str | None = "2", memory: str | None = "8Gi") -> dict[str, Any]:
    """One container; ``gpu=None`` means no GPU resource at all. CPU in cores, memory in
    Kubernetes quantities (Gi = 2**30 bytes)."""
    limits: dict[str, Any] = {}
    if cpu is not None:
        limits["cpu"] = cpu
    if memory is not None:
        limits["memory"] = memory
    if gpu is not None:
        limits[resource] = gpu
    c: dict[str, Any] = {"name": name, "image": image,
                         "resources": {"limits": limits, "requests": dict(limits)},
                         "terminationMessagePath": "/dev/termination-log",
                         "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}
    if env is not None:
        c["env"] = env
    return c


def pod(name: str, namespace: str = "team-a", *, containers: list[dict[str, Any]],
        labels: dict[str, str] | None = None, owner_kind: str | None = None,
        node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    """A Pod as the API server sends it in ``request.object`` after defaulting."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace,
                                "labels": dict(labels or {"app": name}),
                                "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
                                "creationTimestamp": None}
    if owner_kind is not None:
        metadata["ownerReferences"] = [{
            "apiVersion": "kubeflow.org/v1", "kind": owner_kind, "name": f"{name}-job",
            "uid": "00000000-0000-0000-0000-000000000001", "controller": True,
            "blockOwnerDeletion": True}]
    spec: dict[str, Any] = {
        "containers": copy.deepcopy(containers), "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default", "schedulerName": "default-scheduler",
        "securityContext": {}, "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority", "priority": 0,
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
             "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
             "effect": "NoExecute", "tolerationSeconds": 300}],
        "volumes": [{"name": "kube-api-access", "projected": {"sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}],
    }
    if node_selector is not None:
        spec["nodeSelector"] = dict(node_selector)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec,
            "status": {}}


def review(obj: dict[str, Any], *, operation: str = "CREATE",
           uid: str = UID_PLACEHOLDER) -> dict[str, Any]:
    """An ``admission.k8s.io/v1`` AdmissionReview request for a Pod."""
    meta = obj.get("metadata", {})
    return {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": meta.get("name", ""), "namespace": meta.get("namespace", "team-a"),
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                         "uid": "u-1", "groups": ["system:serviceaccounts",
                                                  "system:serviceaccounts:kube-system",
                                                  "system:authenticated"]},
            "object": obj, "oldObject": None, "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def _env(n: int) -> list[dict[str, Any]]:
    return [{"name": f"APP_SETTING_{i:03d}", "value": f"value-{i}-" + "x" * 24} for i in range(n)]


def inference_pod() -> dict[str, Any]:
    """Triton on one time-sliced GPU; CUDA comes from the NGC tag (24.05 -> CUDA 12.4)."""
    return pod("triton-7d9f", containers=[container(env=[{"name": "MODEL", "value": "resnet"}])],
               labels={"app": "triton", "gpu-admission.io/workload": "inference"})


def inference_cu121_pod() -> dict[str, Any]:
    """vLLM-style pod whose CUDA is in a cuXYZ tag (cu121 -> CUDA 12.1)."""
    return pod("llm-5c6d", containers=[container(image="registry.local/llm-server:1.4-cu121")],
               labels={"app": "llm"})


def training_dedicated_pod() -> dict[str, Any]:
    """A PyTorchJob worker on whole GPUs: protected, allowed."""
    return pod("bert-worker-0", owner_kind="PyTorchJob", node_selector={"gpu-pool": "training"},
               containers=[container(image="nvcr.io/nvidia/pytorch:24.05-py3", gpu=8,
                                     cpu="32", memory="256Gi")],
               labels={"training.kubeflow.org/job-name": "bert",
                       "training.kubeflow.org/replica-type": "worker"})


def training_shared_pod() -> dict[str, Any]:
    """A training pod asking for a time-sliced GPU (``nvidia.com/gpu.shared``): denied."""
    return pod("resnet-train", containers=[container(image="nvcr.io/nvidia/pytorch:24.05-py3",
                                                     resource="nvidia.com/gpu.shared")],
               labels={"gpu-admission.io/workload": "training"})


def cpu_pod() -> dict[str, Any]:
    """An ordinary web pod: no GPU; the GPU-access guard adds NVIDIA_VISIBLE_DEVICES=void."""
    return pod("web-6b7c", containers=[container(image="nginx:1.27", gpu=None, cpu="500m",
                                                 memory="256Mi")])


def cpu_cuda_image_pod() -> dict[str, Any]:
    """A CPU-only batch pod on a CUDA image (which bakes NVIDIA_VISIBLE_DEVICES=all), with a
    few env vars: the guard's non-GPU path, appending to an existing env list."""
    return pod("etl-2x9k", containers=[container(
        "etl", image="nvidia/cuda:12.4.1-runtime-ubuntu22.04", gpu=None, cpu="2", memory="4Gi",
        env=[{"name": "INPUT", "value": "s3://bucket/in"}, {"name": "THREADS", "value": "2"}])])


def multi_container_pod() -> dict[str, Any]:
    """Two GPU containers plus a logging sidecar."""
    return pod("ensemble-4f2a", containers=[
        container("encoder", gpu=1), container("decoder", gpu=1),
        container("fluent-bit", image="fluent/fluent-bit:3.0", gpu=None, cpu="100m",
                  memory="64Mi")])


def long_env_pod() -> dict[str, Any]:
    """An inference pod with 200 env vars (ConfigMap-heavy apps)."""
    return pod("configured-9a8b", containers=[container(env=_env(200))])


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of review in the mix: how often it appears and on which webhook path."""

    name: str
    build: Callable[[], dict[str, Any]]
    weight: int  # relative frequency in the mix
    # Whether the API server sends this kind to the webhooks with the default install: since
    # the GPU-access guard's CPU-pod half runs in the API server as compiled policies (issue
    # 21, docs/guard.md), the webhooks' matchConditions send only GPU, DRA, fractional, KAI
    # and HAMi pods; a CPU-only pod never reaches the webhook.
    reaches_webhook: bool = True


KINDS: tuple[Kind, ...] = (
    Kind("inference", inference_pod, 30),
    Kind("inference-cu121", inference_cu121_pod, 10),
    Kind("training-dedicated", training_dedicated_pod, 5),
    Kind("training-shared-denied", training_shared_pod, 5),
    Kind("cpu", cpu_pod, 30, reaches_webhook=False),
    Kind("cpu-cuda-image", cpu_cuda_image_pod, 5, reaches_webhook=False),
    Kind("multi-container", multi_container_pod, 10),
    Kind("long-env", long_env_pod, 10),
)
TYPICAL_KIND = "inference"

# Which reviews a load run sends. ``webhook`` (the default): what the API server sends the
# webhooks with the default install, where the guard's CPU-pod half runs in the API server
# (the kinds above with ``reaches_webhook``, same relative weights). ``all``: every kind,
# the mix before the guard moved (and what a fallback install without the
# MutatingAdmissionPolicy API, which sends every pod to the webhook, receives).
MIXES = ("webhook", "all")


def mix_kinds(mix: str = "webhook") -> tuple[Kind, ...]:
    """The kinds a ``mix`` (one of :data:`MIXES`) sends."""
    if mix not in MIXES:
        raise ValueError(f"mix: expected one of {', '.join(MIXES)}, got {mix!r}")
    return tuple(k for k in KINDS if mix == "all" or k.reaches_webhook)


def request_mix(mutated: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                mix: str = "webhook") -> list[dict[str, str]]:
    """The mix as a list of ``{"path", "body"}`` (body = JSON text with the uid placeholder),
    each kind once for ``/mutate`` and once for ``/validate``, repeated by its weight and
    interleaved so that any window of the list has roughly the same mix.

    The validating webhook runs after all mutations, so when ``mutated`` is given (a function
    returning the pod as our own ``/mutate`` left it) ``/validate`` gets that object."""
    bodies: list[tuple[str, str, int]] = []
    for kind in mix_kinds(mix):
        obj = kind.build()
        bodies.append(("/mutate", orjson.dumps(review(obj)).decode(), kind.weight))
        final = mutated(obj) if mutated is not None else obj
        bodies.append(("/validate", orjson.dumps(review(final)).decode(), kind.weight))
    out: list[dict[str, str]] = []
    counts = [0] * len(bodies)
    for _ in range(sum(w for _, _, w in bodies)):  # smooth weighted round robin, deterministic
        i = min(range(len(bodies)), key=lambda j: (counts[j] + 1) / bodies[j][2])
        counts[i] += 1
        out.append({"path": bodies[i][0], "body": bodies[i][1]})
    return out


def write_mix(path: Path, mutated: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
              mix: str = "webhook") -> int:
    """Write the mix as JSON lines for the load generators; return the number of entries."""
    entries = request_mix(mutated, mix)
    path.write_bytes(b"".join(orjson.dumps(entry) + b"\n" for entry in entries))
    return len(entries)
