"""Node objects in the three shapes issue 33 names (no tests here): a dedicated A100 node, a
time-sliced T4 node (10 replicas) and a MIG-single A100 node, labelled the way GPU Feature
Discovery labels them (``shared/reference/gpu-facts.md`` §5.3: ``nvidia.com/gpu.memory`` in
MiB, ``-SHARED`` product suffix when replicas > 1 and not renamed), plus the pods the issue
names (an 8-GPU JAX pod, a one-GPU vLLM pod)."""

from __future__ import annotations

from typing import Any

T4_MIB = 15360  # Tesla T4: 16 GB card, GFD reports 15360 MiB
T4_REPLICAS = 10
T4_POOL = "gfd-tesla-t4-shared-time-slicing-x10"


def gfd_node(name: str, product: str, memory_mib: int, *, strategy: str = "none",
             replicas: int = 0, gpus: int = 8, extra: dict[str, str] | None = None,
             resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": product,
              "nvidia.com/gpu.memory": str(memory_mib), "nvidia.com/gpu.count": str(gpus),
              "nvidia.com/gpu.replicas": str(replicas),
              "nvidia.com/gpu.sharing-strategy": strategy, **(extra or {})}
    per_gpu = replicas if replicas > 1 else 1
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "32", "memory": "256Gi",
                                       resource: str(gpus * per_gpu)}}}


def dedicated_node(name: str = "a100-1") -> dict[str, Any]:
    return gfd_node(name, "NVIDIA-A100-SXM4-80GB", 81920)


def t4_node(name: str = "t4-1") -> dict[str, Any]:
    return gfd_node(name, "Tesla-T4-SHARED", T4_MIB, strategy="time-slicing",
                    replicas=T4_REPLICAS, gpus=4)


def mig_node(name: str = "a100-mig-1") -> dict[str, Any]:
    return gfd_node(name, "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", 4864, gpus=7,
                    extra={"nvidia.com/mig.strategy": "single", "nvidia.com/mig.capable": "true"})


def no_gfd_node(name: str = "cpu-1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": "8"}}}


def jax_pod(name: str = "jax-8") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"containers": [{
                "name": "jax", "image": "ghcr.io/nvidia/jax:jax-2024-10-01",
                "env": [{"name": "XLA_PYTHON_CLIENT_MEM_FRACTION", "value": "0.9"}],
                "resources": {"limits": {"nvidia.com/gpu": 8}}}]}}


def vllm_pod(name: str = "vllm", args: list[str] | None = None,
             **container: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"containers": [{
                "name": "vllm", "image": "vllm/vllm-openai:v0.6.3",
                "args": args if args is not None else ["--model", "facebook/opt-125m"],
                "resources": {"limits": {"nvidia.com/gpu": 1}}, **container}]}}


def env_map(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


ROUTE_T4 = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4-SHARED"]},
        {"key": "nvidia.com/gpu.replicas", "operator": "In", "values": ["10"]},
        {"key": "nvidia.com/gpu.sharing-strategy", "operator": "In",
         "values": ["time-slicing"]}]}]}}}
PROTECT = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [
        {"key": "nvidia.com/gpu.sharing-strategy", "operator": "NotIn",
         "values": ["time-slicing", "mps"]}]}]}}}
