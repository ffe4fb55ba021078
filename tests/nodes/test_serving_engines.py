"""Issue 33, "the serving engines' own knobs": a container recognised as vLLM, SGLang, TGI or
TensorRT-LLM on a shared card gets the engine's own memory setting sized to its share (here
a 10-way time-sliced T4: 0.1), upserted like the env vars; an engine the webhook cannot set
gets a warning naming the flag. Every admitted case is re-run on its own output: empty patch."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from gpu_admission.admission.engine import evaluate
from gpu_admission.core.decision import Decision, RequestFacts
from gpu_admission.facts.nodepools import node_view
from gpu_admission.facts.serving_engines import recognise
from gpu_admission.policy.model import Policy, default_policy, policy_from_dict
from tests.nodes_support import env_map, t4_node

FACTS = RequestFacts(namespace="ml")
VLLM = "vllm/vllm-openai:v0.6.3"
SGLANG = "lmsysorg/sglang:v0.4.0-cu124"
TGI = "ghcr.io/huggingface/text-generation-inference:2.4.0"
TRTLLM = "nvcr.io/nvidia/tensorrt-llm/release:0.17.0"


def pod(image: str, **container: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "srv", "namespace": "ml"},
            "spec": {"containers": [{"name": "srv", "image": image,
                                     "resources": {"limits": {"nvidia.com/gpu": 1}},
                                     **container}]}}


def decide(obj: dict[str, Any], policy: Policy | None = None, *, nodes: bool = True
           ) -> tuple[Decision, dict[str, Any]]:
    policy = policy or default_policy()
    view = node_view([t4_node()], policy) if nodes else None
    decision = evaluate(obj, FACTS, policy, nodes=view)
    after = jsonpatch.apply_patch(obj, list(decision.patch), in_place=False)
    if decision.allowed:
        again = evaluate(after, FACTS, policy, nodes=view)
        assert again.patch == (), again.patch
    return decision, after


ADMITTED = [
    # (pod, args after, command after, CUDA_MEMORY_FRACTION after)
    pytest.param(pod(VLLM, args=["--model", "m"]),
                 ["--model", "m", "--gpu-memory-utilization=0.1"], None, None,
                 id="vllm-image-args-appended"),
    pytest.param(pod(VLLM, command=["vllm", "serve", "m"]),
                 ["--gpu-memory-utilization=0.1"], ["vllm", "serve", "m"], None,
                 id="vllm-serve-command-args-created"),
    pytest.param(pod("python:3.11", command=["python3", "-m",
                                             "vllm.entrypoints.openai.api_server"],
                     args=["--model", "m"]),
                 ["--model", "m", "--gpu-memory-utilization=0.1"],
                 ["python3", "-m", "vllm.entrypoints.openai.api_server"], None,
                 id="vllm-module-recognised-by-command"),
    pytest.param(pod(VLLM, args=["--model", "m", "--gpu-memory-utilization", "0.05"]),
                 ["--model", "m", "--gpu-memory-utilization", "0.05"], None, None,
                 id="vllm-lower-value-kept"),
    pytest.param(pod(VLLM, args=["--gpu-memory-utilization=0.1"]),
                 ["--gpu-memory-utilization=0.1"], None, None, id="vllm-equal-value-kept"),
    pytest.param(pod(SGLANG, command=["python3", "-m", "sglang.launch_server"],
                     args=["--model-path", "m"]),
                 ["--model-path", "m", "--mem-fraction-static=0.1"],
                 ["python3", "-m", "sglang.launch_server"], None, id="sglang"),
    pytest.param(pod(TGI, args=["--model-id", "m"]), ["--model-id", "m"], None, "0.1",
                 id="tgi-env-var"),
    pytest.param(pod(TGI, args=["--model-id", "m", "--cuda-memory-fraction=0.08"]),
                 ["--model-id", "m", "--cuda-memory-fraction=0.08"], None, None,
                 id="tgi-lower-flag-kept"),
    pytest.param(pod(TRTLLM, command=["trtllm-serve", "m"]),
                 ["--kv_cache_free_gpu_memory_fraction=0.1"], ["trtllm-serve", "m"], None,
                 id="trtllm-serve"),
    pytest.param(pod("nvidia/cuda:12.4.1-runtime-ubuntu22.04", args=["python", "app.py"]),
                 ["python", "app.py"], None, None, id="not-an-engine"),
]


@pytest.mark.parametrize(("obj", "args", "command", "tgi_env"), ADMITTED)
def test_engine_setting_sized_to_the_share(obj: dict[str, Any], args: list[str] | None,
                                           command: list[str] | None,
                                           tgi_env: str | None) -> None:
    decision, after = decide(obj)
    assert decision.allowed and decision.warnings == (), decision.violations
    container = after["spec"]["containers"][0]
    assert container.get("args") == args
    assert container.get("command") == command
    env = env_map(container)
    assert env.get("CUDA_MEMORY_FRACTION") == tgi_env
    assert env["NVIDIA_MEM_LIMIT_MB"] == "1536"  # the env caps as before, 15,360 MiB / 10


DENIED = [
    pytest.param(pod(VLLM, args=["--model", "m", "--gpu-memory-utilization=0.9"]),
                 "spec.containers[0].args[2]", "--gpu-memory-utilization='0.9' (vLLM)",
                 id="vllm-joined"),
    pytest.param(pod(VLLM, args=["--gpu_memory_utilization", "0.9"]),
                 "spec.containers[0].args[1]", "--gpu_memory_utilization='0.9' (vLLM)",
                 id="vllm-underscore-spelling"),
    pytest.param(pod(VLLM, command=["vllm", "serve", "m", "--gpu-memory-utilization", "0.5"]),
                 "spec.containers[0].command[4]", "--gpu-memory-utilization='0.5' (vLLM)",
                 id="vllm-in-command"),
    pytest.param(pod(SGLANG, command=["python3", "-m", "sglang.launch_server",
                                      "--mem-fraction-static", "0.88"]),
                 "spec.containers[0].command[4]", "--mem-fraction-static='0.88' (SGLang)",
                 id="sglang"),
    pytest.param(pod(TGI, args=["--cuda-memory-fraction", "1.0"]),
                 "spec.containers[0].args[1]", "--cuda-memory-fraction='1.0' (TGI)",
                 id="tgi-flag"),
    pytest.param(pod(TRTLLM, command=["trtllm-serve", "m"],
                     args=["--kv_cache_free_gpu_memory_fraction=0.9"]),
                 "spec.containers[0].args[0]",
                 "--kv_cache_free_gpu_memory_fraction='0.9' (TensorRT-LLM)", id="trtllm"),
]


@pytest.mark.parametrize(("obj", "path", "start"), DENIED)
def test_higher_engine_setting_is_denied_naming_the_way_out(obj: dict[str, Any], path: str,
                                                            start: str) -> None:
    decision, _ = decide(obj)
    assert not decision.allowed
    (violation,) = decision.violations
    assert (violation.rule, violation.path) == ("memory-limit", path)
    assert violation.message.startswith(
        f"{start} exceeds the GPU memory allowed on a shared GPU "
        "(pool gfd-tesla-t4-shared-time-slicing-x10): must be <= 0.1; lower or drop it")


def test_tgi_env_var_above_the_share_is_denied() -> None:
    decision, _ = decide(pod(TGI, env=[{"name": "CUDA_MEMORY_FRACTION", "value": "0.5"}]))
    (violation,) = decision.violations
    assert (violation.rule, violation.path) == ("memory-limit", "spec.containers[0].env[0]")
    assert violation.message.startswith("CUDA_MEMORY_FRACTION='0.5' exceeds")


def test_warn_mode_admits_a_higher_engine_setting_with_a_warning() -> None:
    policy = policy_from_dict({"apiVersion": "gpu-admission.io/v1alpha1",
                               "kind": "GPUSharingPolicy",
                               "spec": {"rules": {"memory-limit": "warn"}}})
    decision, after = decide(pod(VLLM, args=["--gpu-memory-utilization=0.9"]), policy)
    assert decision.allowed
    assert decision.warnings == (
        "memory-limit: --gpu-memory-utilization='0.9' (vLLM) exceeds the GPU memory allowed "
        "on a shared GPU (pool gfd-tesla-t4...",)
    assert after["spec"]["containers"][0]["args"] == ["--gpu-memory-utilization=0.9"]


@pytest.mark.parametrize(("obj", "flag"), [
    pytest.param(pod(VLLM, command=["sh", "-c", "vllm serve m --port 8000"]),
                 "--gpu-memory-utilization=0.1", id="vllm-in-a-shell-string"),
    pytest.param(pod(SGLANG), "--mem-fraction-static=0.1", id="sglang-image-without-command"),
    pytest.param(pod(TRTLLM, command=["/bin/bash", "-c", "trtllm-serve m"]),
                 "--kv_cache_free_gpu_memory_fraction=0.1", id="trtllm-in-bash"),
])
def test_engine_the_webhook_cannot_set_gets_a_warning_naming_the_flag(obj: dict[str, Any],
                                                                       flag: str) -> None:
    decision, after = decide(obj)
    assert decision.allowed
    (violation,) = decision.violations
    assert violation.rule == "memory-limit-unverifiable"
    assert f"add {flag} yourself" in violation.message
    assert after["spec"]["containers"][0].get("command") == obj["spec"]["containers"][0].get(
        "command")
    assert "args" not in after["spec"]["containers"][0]


def test_without_visible_nodes_engines_are_left_alone_as_before() -> None:
    decision, after = decide(pod(VLLM, args=["--model", "m"]), nodes=False)
    assert after["spec"]["containers"][0]["args"] == ["--model", "m"]
    assert env_map(after["spec"]["containers"][0])["NVIDIA_MEM_LIMIT_MB"] == "16000"
    assert decision.placement.startswith("no GPU nodes visible")


@pytest.mark.parametrize(("container", "engine", "settable"), [
    pytest.param({"image": "docker.io/vllm/vllm-openai@sha256:" + "a" * 64}, "vLLM", True,
                 id="vllm-image-by-digest"),
    pytest.param({"image": VLLM, "command": ["python3", "server.py"]}, "vLLM", False,
                 id="vllm-image-other-command"),
    pytest.param({"image": "x", "command": ["/usr/local/bin/text-generation-launcher"]}, "TGI",
                 True, id="tgi-launcher-path"),
    pytest.param({"image": "x", "command": ["bash", "-c", "echo hi"]}, None, False,
                 id="shell-without-engine"),
])
def test_recognise(container: dict[str, Any], engine: str | None, settable: bool) -> None:
    use = recognise(container)
    assert (use.engine.name if use else None, use.settable if use else False) == (engine,
                                                                                 settable)
