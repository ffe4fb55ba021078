"""Shared inputs of the fractional-GPU tests: the policy, pods, and the exact output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_admission.policy.model import Policy, load_policy
from tests.builders import make_container, make_pod

POLICY_FILE = Path(__file__).parent / "policy-fractional.yaml"
VLLM = "vllm/vllm-openai:v0.6.3"  # CUDA 12.4 through the policy's image table
TRAIN = "nvcr.io/nvidia/pytorch:24.05-py3"
UID = "0b9f2c1e-6d0c-4a3e-9a51-0c8f5b9f0d11"
CM = "gpu-admission-gpu-" + UID
SHARE = "16000"  # spec.memoryLimits.defaultMemoryMiB (the pool leaves replicasPerGPU at 1)
FRACTION = "0.347"  # 16000 / 46068, rounded down to 3 decimals


def policy() -> Policy:
    return load_policy(POLICY_FILE)


def vllm_pod(**kw: Any) -> dict[str, Any]:
    """An inference pod (no label: the default class) asking for one GPU, no nodeSelector:
    CUDA routing sends it to the fractional pool."""
    containers = kw.pop("containers", None) or [make_container("vllm", VLLM)]
    return make_pod("llm", namespace="ml-serving", containers=containers, **kw)


def training_pod() -> dict[str, Any]:
    """A training pod pinned to the fractional pool's nodes."""
    return make_pod("trainer", namespace="ml-serving",
                    labels={"gpu-admission.io/workload": "training"},
                    node_selector={"gpu-admission.io/cuda-version": "12.4"},
                    containers=[make_container("train", TRAIN)])


def ref(name: str = CM) -> dict[str, Any]:
    return {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {
        "name": name, "key": "NVIDIA_VISIBLE_DEVICES", "optional": False}}}


def memory_env(share: str = SHARE, fraction: str = FRACTION) -> list[dict[str, Any]]:
    return [{"name": "NVIDIA_MEM_LIMIT_MB", "value": share},
            {"name": "GPU_MEMORY_FRACTION", "value": fraction},
            {"name": "XLA_CLIENT_MEM_FRACTION", "value": fraction},
            {"name": "XLA_PYTHON_CLIENT_MEM_FRACTION", "value": fraction},
            {"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "true"},
            {"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": f"{share}m"}]


def vllm_patch(cm: str = CM) -> list[dict[str, Any]]:
    """The exact RFC 6902 patch of :func:`vllm_pod` (request UID -> ``cm``)."""
    return [
        {"op": "add", "path": "/spec/schedulerName", "value": "gpu-aware-scheduler"},
        {"op": "add", "path": "/spec/nodeSelector",
         "value": {"gpu-admission.io/cuda-version": "12.4"}},
        {"op": "add", "path": "/spec/containers/0/resources/requests",
         "value": {"gpu-admission.io/gpu-memory": SHARE}},
        {"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu"},
        {"op": "add", "path": "/spec/containers/0/resources/limits/gpu-admission.io~1gpu-memory",
         "value": SHARE},
        {"op": "add", "path": "/spec/containers/0/env", "value": [*memory_env(), ref(cm)]},
        # issue 33: vLLM's own setting, sized like GPU_MEMORY_FRACTION (the share of the card)
        {"op": "add", "path": "/spec/containers/0/args",
         "value": [f"--gpu-memory-utilization={FRACTION}"]},
        {"op": "add", "path": "/metadata/annotations",
         "value": {"gpu-admission.io/gpu-memory": SHARE, "gpu-admission.io/gpu-configmap": cm}},
        {"op": "add", "path": "/metadata/annotations/gpu-admission.io~1mutated",
         "value": "args,env,nodeSelector,resources,schedulerName"},
    ]


# --- the bad-input table (engine and evaluate tests) ---------------------------------------
LIMIT = "memory-limit"
ANN = "metadata.annotations[gpu-admission.io/gpu-memory]"


BAD_INPUT: list[tuple[dict[str, Any], list[tuple[str, str, str]]]] = [
    (vllm_pod(annotations={"gpu-admission.io/gpu-memory": "lots"}),
     [(LIMIT, ANN, 'expected a positive integer count of MiB as a string, e.g. "4096", '
       "got 'lots'")]),
    (vllm_pod(annotations={"gpu-admission.io/gpu-memory": "0"}),
     [(LIMIT, ANN, "expected a positive integer count of MiB, got '0'")]),
    (vllm_pod(annotations={"gpu-admission.io/gpu-memory": "-4096"}),
     [(LIMIT, ANN, 'expected a positive integer count of MiB as a string, e.g. "4096", '
       "got '-4096'")]),
    (vllm_pod(annotations={"gpu-admission.io/gpu-memory": "4Gi"}),
     [(LIMIT, ANN, 'expected a positive integer count of MiB as a string, e.g. "4096", '
       "got '4Gi'")]),
    (vllm_pod(annotations={"gpu-admission.io/gpu-memory": "46068"}),
     [(LIMIT, ANN, "a share of 46068 MiB does not fit one GPU of pool l40s-frac-cuda124: at "
       "most memoryMiB 46068 - spec.placement.memoryHeadroomMiB 1024 = 45044 MiB")]),
    (vllm_pod(annotations={"gpu-admission.io/gpu-memory": "4096"},
              containers=[make_container("vllm", VLLM, gpu=2)]),
     [(LIMIT, ANN, "a GPU fraction is a share of one GPU, but the pod asks for 2 GPUs; ask "
       "for one GPU or remove the annotation")]),
    (vllm_pod(annotations={"gpu-admission.io/gpu-memory": "4096"},
              containers=[make_container("vllm", VLLM, resource="nvidia.com/mig-1g.10gb")]),
     [(LIMIT, ANN, "a GPU fraction cannot be combined with MIG; remove the annotation or the "
       "MIG resource")]),
    (vllm_pod(annotations={"gpu-admission.io/gpu-memory": "4096"},
              node_selector={"gpu-admission.io/cuda-version": "12.1"},
              labels={"gpu-admission.io/cuda-version": "12.1"}),
     [(LIMIT, ANN, "pool a100-ts-cuda121 is sharing time-slicing; a GPU fraction needs a pool "
       "with sharing: fractional")]),
    (make_pod("t", namespace="ml-serving", labels={"gpu-admission.io/workload": "training"},
              annotations={"gpu-admission.io/gpu-memory": "4096"},
              node_selector={"gpu-admission.io/cuda-version": "12.4"},
              containers=[make_container("t", VLLM)]),
     [("no-training-on-shared-gpu", ANN,
       "training pod targets a time-sliced GPU (a GPU fraction (gpu-admission.io/gpu-memory)); "
       "time-slicing makes each training job ~3x slower. Request nvidia.com/gpu on a dedicated "
       "node pool (sharing none) or MIG, or label the pod gpu-admission.io/workload=inference "
       "if it only serves")]),
    (vllm_pod(nodeName="node-7"),
     [("gpu-visible-devices", "spec.nodeName",
       "a fractional GPU pod must be bound by the GPU-aware scheduler, which chooses its GPU; "
       "remove spec.nodeName (use a nodeSelector)")]),
    (vllm_pod(scheduler_name="my-scheduler"),
     [("scheduler-name", "spec.schedulerName",
       "keeps scheduler 'my-scheduler', not 'gpu-aware-scheduler' (GPU packing off)"),
      ("gpu-visible-devices", "spec.schedulerName",
       "a fractional GPU pod must use scheduler 'gpu-aware-scheduler' (its bind chooses the "
       "GPU), not 'my-scheduler'")]),

]
BAD_INPUT_IDS = ["unparsable", "zero", "negative", "quantity-suffix", "larger-than-the-card",
                 "fraction-and-two-gpus", "fraction-and-mig", "time-sliced-pool", "training",
                 "node-name-preset", "foreign-scheduler"]
