"""Pods of other GPU-sharing systems, declared (``spec.otherSharingSystems``), decided by the
engine: which container is a GPU container, the memory variables capped by the system's
share (pool known and unknown), KAI's ConfigMap shape, malformed requests (issue 22).
End to end (evaluate and the webhook over TLS): tests/admission/test_real_manifests.py."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_admission.admission.engine import evaluate
from gpu_admission.core.decision import RequestFacts
from gpu_admission.facts.fractional import NVIDIA_MEM_LIMIT_MB
from gpu_admission.policy.model import policy_from_dict

POOL = {"name": "a100", "nodeSelector": {"pool": "a100"}, "sharing": "none",
        "memoryMiB": 81920}
SHARED_POOL = {**POOL, "name": "a100-ts", "nodeSelector": {"pool": "a100-ts"},
               "sharing": "time-slicing", "replicasPerGPU": 4}
POLICY = policy_from_dict({"apiVersion": "gpu-admission.io/v1alpha1",
                           "kind": "GPUSharingPolicy",
                           "spec": {"otherSharingSystems": ["kai", "hami"],
                                    "nodePools": [POOL, SHARED_POOL]}})
FACTS = RequestFacts(namespace="ml")


def pod(annotations: dict[str, str] | None = None, *, limits: dict[str, Any] | None = None,
        env: list[dict[str, Any]] | None = None, pool: str | None = "a100-ts",
        init: bool = False) -> dict[str, Any]:
    main: dict[str, Any] = {"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3"}
    if limits:
        main["resources"] = {"limits": limits}
    if env is not None:
        main["env"] = env
    spec: dict[str, Any] = {"containers": [{"name": "side", "image": "busybox"}]}
    if init:
        spec["initContainers"] = [main]
    else:
        spec["containers"].insert(0, main)
    if pool:
        spec["nodeSelector"] = {"pool": pool}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ml", "annotations": annotations or {}},
            "spec": spec}


def env_of(patch: tuple[dict[str, Any], ...], kind: str = "containers") -> dict[str, str]:
    out: dict[str, str] = {}
    for op in patch:
        if op["path"] == f"/spec/{kind}/0/env":
            out.update({e["name"]: e["value"] for e in op["value"]})
        elif op["path"] == f"/spec/{kind}/0/env/-":
            out[op["value"]["name"]] = op["value"]["value"]
    return out


@pytest.mark.parametrize(("the_pod", "mem", "fraction"), [
    # the pool's card is known: KAI's fraction in MiB, its MiB as a fraction
    (pod({"gpu-fraction": "0.5"}), "40960", "0.5"),
    (pod({"gpu-memory": "20480"}), "20480", "0.25"),
    # unknown card: no MiB from a fraction, no fraction from MiB
    (pod({"gpu-fraction": "0.5"}, pool=None), None, "0.5"),
    (pod({"gpu-memory": "20480"}, pool=None), "20480", None),
    # HAMi (the API server writes 3000 as 3k)
    (pod(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3k"}, pool=None), "3000", None),
    (pod(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}), "20480",
     "0.25"),
    (pod(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192"}), "8192", "0.1"),
], ids=["kai-fraction-pool", "kai-memory-pool", "kai-fraction-no-pool", "kai-memory-no-pool",
        "hami-gpumem-3k", "hami-percentage-pool", "hami-gpumem-pool"])
def test_memory_variables_are_the_other_systems_share(the_pod: dict[str, Any], mem: str | None,
                                                      fraction: str | None) -> None:
    decision = evaluate(the_pod, FACTS, POLICY)
    assert decision.allowed, decision.violations
    env = env_of(decision.patch)
    assert env.get(NVIDIA_MEM_LIMIT_MB) == mem
    assert env.get("GPU_MEMORY_FRACTION") == fraction
    assert env.get("XLA_PYTHON_CLIENT_MEM_FRACTION") == fraction
    # a second run on the patched pod changes nothing (idempotent)
    import jsonpatch  # noqa: PLC0415

    patched = jsonpatch.apply_patch(the_pod, list(decision.patch))
    assert evaluate(patched, FACTS, POLICY).patch == ()


def test_a_higher_limit_than_the_other_system_grants_is_refused() -> None:
    decision = evaluate(pod(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"},
                            env=[{"name": NVIDIA_MEM_LIMIT_MB, "value": "16000"}], pool=None),
                        FACTS, POLICY)
    assert [(v.rule, v.path) for v in decision.violations] == [
        ("memory-limit", "spec.containers[0].env[0]")]
    assert "HAMi vGPU nvidia.com/gpumem=3000" in decision.violations[0].message


def test_kai_init_container_and_container_name_annotation() -> None:
    cm = "p-abcdefg-shared-gpu"
    ref = [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {
        "name": f"{cm}-i0", "key": "NVIDIA_VISIBLE_DEVICES"}}}]
    decision = evaluate(pod({"gpu-fraction": "0.3", "gpu-fraction-container-name": "main",
                             "runai/shared-gpu-configmap": cm}, env=ref, init=True),
                        FACTS, POLICY)
    assert decision.allowed and decision.violations == ()
    assert env_of(decision.patch, "initContainers")["GPU_MEMORY_FRACTION"] == "0.3"
    # the container KAI does not serve is voided as usual
    assert {"op": "add", "path": "/spec/containers/0/env",
            "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]} in decision.patch


@pytest.mark.parametrize(("annotations", "path", "says"), [
    ({"gpu-fraction": "2"}, "metadata.annotations[gpu-fraction]",
     "KAI expects a number greater than 0 and smaller than 1"),
    ({"gpu-memory": "lots"}, "metadata.annotations[gpu-memory]", "whole number of MiB"),
    ({"gpu-fraction": "0.5", "gpu-fraction-container-name": "nope"},
     "metadata.annotations[gpu-fraction-container-name]", "names no container"),
], ids=["fraction-out-of-range", "memory-not-a-number", "unknown-container"])
def test_malformed_kai_requests_are_reported(annotations: dict[str, str], path: str,
                                             says: str) -> None:
    decision = evaluate(pod(annotations), FACTS, POLICY)
    assert decision.allowed is False
    (violation,) = [v for v in decision.violations if v.rule == "other-sharing-system"]
    assert violation.path == path
    assert says in violation.message


def test_training_on_a_kai_fraction_is_refused() -> None:
    the_pod = pod({"gpu-fraction": "0.5"}, pool="a100")  # a dedicated pool: KAI shares it
    the_pod["metadata"]["labels"] = {"gpu-admission.io/workload": "training"}
    decision = evaluate(the_pod, FACTS, POLICY)
    assert [v.rule for v in decision.violations] == ["no-training-on-shared-gpu"]
    assert "KAI-Scheduler annotation gpu-fraction=0.5" in decision.violations[0].message
