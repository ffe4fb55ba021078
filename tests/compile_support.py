"""Shared helpers for the compiled-policy tests: the policies, pod strategies and the
differential check (the engine is the oracle)."""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from typing import Any

from hypothesis import strategies as st

from gpu_admission.admission.engine import evaluate
from gpu_admission.compile.compiler import compile_policy
from gpu_admission.compile.evaluator import Outcome, admit
from gpu_admission.compile.objects import Compiled
from gpu_admission.compile.offline import as_admitted
from gpu_admission.core.decision import Decision, RequestFacts
from gpu_admission.core.patch import apply_ops
from gpu_admission.policy.model import Policy, default_policy, policy_from_dict
from tests.corpus_support import api_shaped
from tests.policy_helpers import pools_policy

DIGEST = "sha256:" + "ab" * 32


@cache
def modes_policy() -> Policy:
    """The pools example with every rule mode, driver affinity, an image table, exemptions."""
    doc = pools_policy().model_dump(mode="json", by_alias=True)
    spec = doc["spec"]
    spec["rules"].update({"memory-limit": "warn", "scheduler-name": "enforce",
                          "workload-label": "audit", "cuda-version-unknown": "audit",
                          "memory-limit-unverifiable": "audit", "gpu-visible-devices": "warn",
                          "gpu-access-isolation": "audit", "cuda-node-selector-conflict": "warn"})
    spec["cudaRouting"]["driverAffinity"] = True
    spec["cudaRouting"]["images"] = [
        {"repository": "myorg/infer", "tags": "v1.*", "cudaVersion": "12.4"},
        {"repository": "ghcr.io/acme/llm", "digests": [DIGEST], "cudaVersion": "11.8"},
        {"repository": "acme/any", "cudaVersion": "12.1"}]
    spec["classification"]["notebookLabels"] = ["notebook-name", "jupyter"]
    spec["classification"]["defaultWorkload"] = "notebook"
    spec["memoryLimits"]["defaultFraction"] = 0.3333
    doc["metadata"]["name"] = "modes"
    return policy_from_dict(doc)


POLICIES = {"default": default_policy, "modes": modes_policy}


@cache
def compiled(name: str) -> Compiled:
    return compile_policy(POLICIES[name](), partial=True)


def is_dra(pod: dict[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):
        return True
    return any(k.startswith("deviceclass.resource.kubernetes.io/")
               for kind in ("containers", "initContainers") for c in spec.get(kind) or []
               for key in ("limits", "requests")
               for k in ((c.get("resources") or {}).get(key) or {}))


def check(policy_name: str, pod: dict[str, Any], facts: RequestFacts) -> tuple[Decision, Outcome]:
    """Engine and compiled policies agree on one request (exact decision and patched pod)."""
    pod = as_admitted(pod)  # as the API server hands it to admission (quantities as strings)
    policy = POLICIES[policy_name]()
    # placement: the engine's word on which pool it assumed (issue 33); the CEL sees no nodes
    # and always uses the declared pools, as the engine does without nodes: not compared
    expected = dataclasses.replace(evaluate(pod, facts, policy), placement="")
    outcome = admit(compiled(policy_name).objects, pod, facts)
    got = outcome.decision
    assert got.violations == expected.violations, _diff(pod, expected, got)
    assert got == expected, _diff(pod, expected, got)
    if expected.patch:
        assert outcome.mutated == apply_ops(pod, expected.patch)
    return expected, outcome


def _diff(pod: dict[str, Any], expected: Decision, got: Decision) -> str:
    return (f"\npod: {json.dumps(pod, sort_keys=True)}\nengine:   {expected}\ncompiled: {got}")


# ------------------------------------------------------------------ hypothesis strategies
IMAGES = ["nvidia/cuda:12.1.1-runtime-ubuntu22.04", "nvidia/cuda:11.8.0-base", "nvidia/cuda:latest",
          "mirror.corp/nvidia/cuda:12.4.0-devel", "docker.io/nvidia/cuda:012.01-base",
          "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime", "pytorch/pytorch:latest",
          "nvcr.io/nvidia/tritonserver:24.05-py3", "nvcr.io/nvidia/pytorch:25.12-py3",
          "nvcr.io/nvidia/mxnet:24.06-py3", "nvcr.io/nvidia/tritonserver:99.01-py3",
          "tensorflow/tensorflow:2.15.0-gpu", "tensorflow/tensorflow:2.99.0-gpu",
          "tensorflow/tensorflow:2.15.0", "vllm/vllm-openai:v0.5.0", "rayproject/ray:2.9.3-gpu",
          "ghcr.io/huggingface/text-generation-inference:1.3.4", "myorg/infer:v1.2",
          "registry.local:5000/myorg/infer:v1.0", "myorg/infer:v2", f"ghcr.io/acme/llm@{DIGEST}",
          f"ghcr.io/acme/llm:x@{DIGEST}", "acme/any", "lmsysorg/sglang:v0.4.1-cu124",
          "custom:build-cuda11.8.2", "custom:cu92", "custom:xcu121", "busybox",
          "localhost/library/busybox:1.36", "docker.io/library/python:3.11", ""]
ENV_NAMES = ["NVIDIA_MEM_LIMIT_MB", "GPU_MEMORY_FRACTION", "XLA_CLIENT_MEM_FRACTION",
             "XLA_PYTHON_CLIENT_MEM_FRACTION", "TF_FORCE_GPU_ALLOW_GROWTH",
             "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "OTHER"] * 3 + ["NVIDIA_VISIBLE_DEVICES"]
ENV_VALUES = ["", " ", "8000", "16000", "99999", "+5", "-1", "0", "1_000", " 12 ", "abc",
              "0.1", "0.2", "0.25", "0.9", "1e-1", ".05", "1_0.0", "inf", "-Infinity", "nan",
              "true", "TRUE", "false", "0=4096M", "0=100G", "0=1GiB,1=512mb", "0=x", ",",
              "void", "none", "all", "0", "it's", 'say "hi"', "tab\there", "line\nbreak",
              "back\\slash", "a   b", "ünïcode", "x" * 130]
GPU_KEYS = ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb", "cpu"]
QUANTITIES = ["0", "1", "2", "3", "500m"]
POOL_LABELS = [("pool.example.com/name", "h100-dedicated"), ("pool.example.com/name", "a100-mig"),
               ("gpu-admission.io/cuda-version", "12.1"), ("gpu-admission.io/cuda-version", "12.4"),
               ("gpu-admission.io/cuda-version", "11.8"),
               ("nvidia.com/gpu.sharing-strategy", "time-slicing"),
               ("nvidia.com/gpu.sharing-strategy", "none"),
               ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB-SHARED"),
               ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB")]
NOT_SHARED = {"key": "nvidia.com/gpu.sharing-strategy", "operator": "NotIn",
              "values": ["time-slicing", "mps"]}


def _env_entry() -> st.SearchStrategy[dict[str, Any]]:
    value = st.builds(lambda n, v: {"name": n, "value": v}, st.sampled_from(ENV_NAMES),
                      st.sampled_from(ENV_VALUES))
    bare = st.builds(lambda n: {"name": n}, st.sampled_from(ENV_NAMES))
    field_ref = {"fieldRef": {"fieldPath": "metadata.name"}}
    ref = st.builds(lambda n: {"name": n, "valueFrom": field_ref}, st.sampled_from(ENV_NAMES))
    return st.one_of(value, value, bare, ref)


def _resources() -> st.SearchStrategy[dict[str, Any]]:
    amounts = st.dictionaries(st.sampled_from(GPU_KEYS), st.sampled_from(QUANTITIES), max_size=2)
    gpu = st.builds(lambda n: {"limits": {"nvidia.com/gpu": n}}, st.sampled_from(["1", "2"]))
    return st.one_of(gpu, gpu, st.fixed_dictionaries(
        {}, optional={"limits": amounts, "requests": amounts}))


def _container() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"image": st.sampled_from(IMAGES)},
        optional={"resources": _resources(), "env": st.lists(_env_entry(), max_size=4)})


def _term() -> st.SearchStrategy[dict[str, Any]]:
    expr = st.one_of(
        st.builds(lambda kv, op: {"key": kv[0], "operator": op, "values": [kv[1]]},
                  st.sampled_from(POOL_LABELS), st.sampled_from(["In", "In", "NotIn"])),
        st.just(NOT_SHARED),
        st.just({"key": "nvidia.com/cuda.runtime-version.major", "operator": "Gt",
                 "values": ["11"]}),
        st.just({"key": "kubernetes.io/arch", "operator": "Exists"}))
    return st.fixed_dictionaries({}, optional={
        "matchExpressions": st.lists(expr, max_size=3),
        "matchFields": st.just([{"key": "metadata.name", "operator": "In", "values": ["n1"]}])})


def _affinity() -> st.SearchStrategy[dict[str, Any]]:
    req = "requiredDuringSchedulingIgnoredDuringExecution"
    return st.one_of(
        st.just({}), st.just({"nodeAffinity": {}}),
        st.builds(lambda terms: {"nodeAffinity": {req: {"nodeSelectorTerms": terms}}},
                  st.lists(_term(), max_size=3)),
        st.just({"podAntiAffinity": {}}))


def _labels() -> st.SearchStrategy[dict[str, str]]:
    keys = st.sampled_from(["gpu-admission.io/workload", "gpu-admission.io/cuda-version",
                            "training.kubeflow.org/job-name", "trainer.kubeflow.org/x",
                            "notebook-name", "jupyter", "app"])
    values = st.sampled_from(["training", "Training", "inference", "notebook", "", "12.1",
                              "12.01", "11.8", "1.2.3", "abc", "x-y_z.1"])
    return st.dictionaries(keys, values, max_size=3)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    """A Pod as a user would write it (the API server normalises it, see api_shaped)."""
    count = draw(st.integers(1, 3))
    init = draw(st.integers(0, 2))
    containers = [{"name": f"c{i}", **draw(_container())} for i in range(count)]
    inits = [{"name": f"i{i}", **draw(_container())} for i in range(init)]
    for c in containers + inits:
        if c.get("image") == "":
            del c["image"]
    meta: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    labels = draw(_labels())
    if labels:
        meta["labels"] = labels
    if draw(st.booleans()):
        meta["annotations"] = {"gpu-admission.io/mutated": draw(st.sampled_from(
            ["", "env", "zzz,env", "schedulerName,env"]))}
    if draw(st.sampled_from([False] * 4 + [True])):
        kind = draw(st.sampled_from(["PyTorchJob", "ReplicaSet", "Job", "Job"]))
        meta["ownerReferences"] = [{"apiVersion": draw(st.sampled_from(
            ["batch/v1", "batch.volcano.sh/v1alpha1"])) if kind == "Job" else "kubeflow.org/v1",
                                    "kind": kind, "name": "owner", "uid": "u1"}]
    spec: dict[str, Any] = {"containers": containers}
    if inits:
        spec["initContainers"] = inits
    selector = draw(st.lists(st.sampled_from(POOL_LABELS), max_size=2))
    empty_selector: bool = draw(st.booleans())
    if selector or empty_selector:
        spec["nodeSelector"] = dict(selector)
    affinity = draw(st.one_of(st.none(), _affinity()))
    if affinity is not None:
        spec["affinity"] = affinity
    scheduler = draw(st.sampled_from([None, "default-scheduler", "gpu-aware-scheduler",
                                      "volcano", "it's"]))
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if draw(st.sampled_from([False] * 9 + [True])):
        spec["nodeName"] = "node-1"
    if draw(st.sampled_from([False] * 9 + [True])):
        spec["volumes"] = [{"name": "v", "hostPath": {"path": draw(st.sampled_from(
            ["/dev/nvidia0", "/dev/dri/card0", "/data", "/dev", "//dev/./nvidiactl"]))}}]
    pod = api_shaped({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
    assert pod is not None, spec
    return pod


def request_facts() -> st.SearchStrategy[RequestFacts]:
    return st.builds(
        RequestFacts, namespace=st.sampled_from(["team-a"] * 12 + ["kube-system",
                                                                 "gpu-operator"]),
        operation=st.sampled_from(["CREATE"] * 6 + ["UPDATE"]),
        user=st.sampled_from(["alice"] * 12 + ["system:serviceaccount:ci:deployer"]),
        groups=st.sampled_from([()] * 6 + [("team",), ("team", "gpu-admins")]))
