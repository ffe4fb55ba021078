"""Benchmark ``gpu-admission compile`` and the compiled policies' CEL.

Prints, all measured in this run:

* compile time (policy -> objects -> YAML) of the built-in policy and of a 20-pool policy,
  median of ``--repeat`` runs, with the output size;
* per pod, for a fixed set of representative pods: the engine's decision time (the baseline:
  ``engine.evaluate``, what the webhook runs) and the compiled policies' evaluation in
  cel-python (``gpu_admission.compile.evaluator.admit``: MAP, then every VAP on the mutated
  pod), as a ratio to the engine; and the CEL evaluation steps (AST nodes, a proxy of the API
  server's runtime cost units; PerCallLimit 1,000,000, budget 10,000,000 per policy).

cel-python is an interpreter written in Python; the API server's cel-go is compiled Go. The
celpy figures say what ``evaluate --compiled`` and the tests cost, not what the API server
pays (the issue measured 0.2-0.6 ms for a MAP on a real 1.36 API server).

    python benchmarks/compile_bench.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from gpu_admission.compile.compiler import compile_policy
from gpu_admission.compile.evaluator import admit, counting_cost
from gpu_admission.compile.offline import as_admitted
from gpu_admission.compile.render import render
from gpu_admission.decision import RequestFacts
from gpu_admission.engine import evaluate
from gpu_admission.policy.model import Policy, default_policy, policy_from_dict


def pools_policy(count: int) -> Policy:
    doc = default_policy().model_dump(mode="json", by_alias=True)
    doc["metadata"]["name"] = f"{count}-pools"
    doc["spec"]["nodePools"] = [
        {"name": f"pool-{i}", "nodeSelector": {"gpu-admission.io/cuda-version": f"12.{i % 10}",
                                               "pool.example.com/name": f"p{i}"},
         "sharing": ["time-slicing", "mps", "none", "mig"][i % 4], "replicasPerGPU": 1 + i % 7,
         "memoryMiB": 40960 + i, "cudaVersion": f"12.{i % 10}"} for i in range(count)]
    doc["spec"]["cudaRouting"]["driverAffinity"] = True
    return policy_from_dict(doc)


def container(name: str, image: str, gpu: str | None = "1",
              env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": image}
    if gpu:
        out["resources"] = {"limits": {"nvidia.com/gpu": gpu}}
    if env:
        out["env"] = env
    return out


def pods() -> dict[str, dict[str, Any]]:
    def pod(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
        labels = spec.pop("labels", None)
        meta: dict[str, Any] = {"name": "p", "namespace": "team-a"}
        if labels:
            meta["labels"] = labels
        return as_admitted({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                            "spec": {"containers": list(containers), **spec}})

    big_env = [{"name": f"V{i}", "value": "x"} for i in range(30)]
    return {
        "cpu-only": pod(container("web", "nginx:1.27", gpu=None)),
        "inference": pod(container("triton", "nvcr.io/nvidia/tritonserver:24.05-py3")),
        "inference+sidecar": pod(container("m", "vllm/vllm-openai:v0.5.0"),
                                 container("proxy", "envoyproxy/envoy:v1.30", gpu=None)),
        "training": pod(container("t", "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime", "2"),
                        labels={"training.kubeflow.org/job-name": "mnist"}),
        "denied-training-shared": pod(
            container("t", "nvidia/cuda:12.1.1-base", "1"),
            labels={"gpu-admission.io/workload": "training"},
            nodeSelector={"nvidia.com/gpu.sharing-strategy": "time-slicing"}),
        "4-gpu-containers-30-env": pod(*(container(f"c{i}", "nvidia/cuda:12.4.0-base", "1",
                                                   big_env) for i in range(4))),
    }


def timed(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    policies = {"default": default_policy(), "20 pools": pools_policy(20)}
    print("compile (policy -> objects -> YAML), median of", args.repeat)
    for name, policy in policies.items():
        def run(p: Policy = policy) -> str:
            result = compile_policy(p, partial=True)
            return render(p, result.objects, result.comments, result.stays)
        text = run()
        seconds = timed(run, args.repeat)
        print(f"  {name:<10} {seconds * 1000:8.1f} ms   {len(text) / 1024:7.1f} KiB YAML")
    facts = RequestFacts(namespace="team-a")
    for name, policy in policies.items():
        objects = compile_policy(policy, partial=True).objects
        print(f"\nper pod, policy {name}: engine (baseline) vs compiled CEL in cel-python")
        print(f"  {'pod':<26}{'engine µs':>11}{'celpy ms':>10}{'ratio':>9}{'CEL steps':>11}")
        for label, pod in pods().items():
            admit(objects, pod, facts)  # warm the expression cache (parsing is one-off)
            engine = timed(partial(evaluate, pod, facts, policy), max(args.repeat, 200))
            celpy = timed(partial(admit, objects, pod, facts), args.repeat)
            with counting_cost() as steps:
                admit(objects, pod, facts)
            print(f"  {label:<26}{engine * 1e6:11.1f}{celpy * 1e3:10.1f}"
                  f"{celpy / engine:8.0f}x{steps[0]:11d}")


if __name__ == "__main__":
    main()
