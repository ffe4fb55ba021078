"""Issue 32: the compiled policies route CPU pods as the engine does (the engine is the
oracle). A pod without a GPU meets the guard half (``guard.gpu-admission.io``); one naming a
GPU resource at zero quantity, or KAI's annotations, meets the GPU half; both are held to
``tests/admission/test_cpu_pods_scheduler.py``'s table, on a second pass too (idempotent)."""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from gpu_admission.admission.engine import evaluate
from gpu_admission.compile.compiler import compile_policy
from gpu_admission.compile.evaluator import admit
from gpu_admission.compile.guard import compile_guard, guard_digest
from gpu_admission.compile.offline import as_admitted
from gpu_admission.core.decision import RequestFacts
from gpu_admission.core.patch import apply_ops
from gpu_admission.policy.model import Policy, default_policy
from tests.admission.test_cpu_pods_scheduler import (
    TABLE,
    clean_cpu_pod,
    evaluate_cpu_workloads,
    routed,
)
from tests.policy_helpers import policy_with


@cache
def _policy(spec: str) -> Policy:
    overrides = json.loads(spec)
    return policy_with(**overrides) if overrides else default_policy()


@cache
def _objects(spec: str) -> list[dict[str, Any]]:
    return compile_policy(_policy(spec), partial=True).objects


def _agree(pod: dict[str, Any], spec: dict[str, Any], facts: RequestFacts) -> dict[str, Any]:
    key = json.dumps(spec, sort_keys=True)
    pod = as_admitted(pod)
    expected = dataclasses.replace(evaluate(pod, facts, _policy(key)), placement="")
    outcome = admit(_objects(key), pod, facts)
    assert outcome.decision == expected, f"\nengine:   {expected}\ncompiled: {outcome.decision}"
    if expected.patch:
        assert outcome.mutated == apply_ops(pod, expected.patch)
    return outcome.mutated


@pytest.mark.parametrize(("pod", "spec"), [t[1:3] for t in TABLE], ids=[t[0] for t in TABLE])
def test_compiled_policies_route_cpu_pods_as_the_engine(pod: dict[str, Any],
                                                        spec: dict[str, Any]) -> None:
    facts = RequestFacts(namespace="team-a")
    mutated = _agree(pod, spec, facts)
    again = _agree(mutated, spec, facts)  # the MAP reinvoked on its own output
    assert again == mutated


@pytest.mark.parametrize("facts", [
    pytest.param(RequestFacts(namespace="team-a", stage="validate"), id="validate-stage"),
    pytest.param(RequestFacts(namespace="team-a", operation="UPDATE"), id="update"),
], )
def test_no_routing_outside_a_pod_creation(facts: RequestFacts) -> None:
    assert _agree(clean_cpu_pod(), {}, facts) == as_admitted(clean_cpu_pod())


def test_a_namespace_not_opted_in_is_untouched() -> None:
    pod = as_admitted(clean_cpu_pod())
    outcome = admit(_objects("{}"), pod, RequestFacts(namespace="legacy"),
                    {"kubernetes.io/metadata.name": "legacy"})
    assert outcome.mutated == pod and outcome.decision.patch == ()


def test_the_guard_digest_follows_cpu_pods() -> None:
    """compile --guard --check sees a changed spec.scheduling.cpuPods (the guard's input)."""
    routed, kept = default_policy(), policy_with(scheduling={"cpuPods": "default"})
    assert guard_digest(routed) != guard_digest(kept)
    assert guard_digest(kept) == guard_digest(policy_with(schedulerName=None))
    mutating = next(o for o in compile_guard(kept).objects
                    if o["kind"] == "MutatingAdmissionPolicy")
    assert '"" != ""' in mutating["spec"]["matchConditions"][-1]["expression"]


def test_evaluate_compiled_routes_a_cpu_deployment_and_keeps_a_daemonset(tmp_path: Path) -> None:
    """``evaluate --compiled`` (the compiled policies, cel-python) answers as ``evaluate``."""
    deployment, daemonset = evaluate_cpu_workloads(tmp_path, "--compiled")
    assert deployment["patch"] == list(routed())
    assert daemonset["patch"] == []
