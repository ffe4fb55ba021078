"""Helpers shared by the policy-engine tests (not a test module)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch

from gpu_admission.admission.engine import evaluate
from gpu_admission.core.decision import Decision, RequestFacts
from gpu_admission.policy.model import Policy, default_policy, load_policy, policy_from_dict

DATA = Path(__file__).parent / "data" / "evaluate"
REQ = "requiredDuringSchedulingIgnoredDuringExecution"
NOT_SHARED = {"key": "nvidia.com/gpu.sharing-strategy", "operator": "NotIn",
              "values": ["time-slicing", "mps"]}
DEFAULT_ENV = [
    {"name": "NVIDIA_MEM_LIMIT_MB", "value": "16000"},
    {"name": "GPU_MEMORY_FRACTION", "value": "0.2"},
    {"name": "XLA_CLIENT_MEM_FRACTION", "value": "0.2"},
    {"name": "XLA_PYTHON_CLIENT_MEM_FRACTION", "value": "0.2"},
    {"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "true"},
]


def pools_policy() -> Policy:
    return load_policy(DATA / "policy-pools.yaml")


def policy_with(**spec: Any) -> Policy:
    """The default policy with some ``spec`` keys (camelCase, as in the YAML) replaced."""
    doc = default_policy().model_dump(mode="json", by_alias=True)
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(doc["spec"].get(key), dict):
            doc["spec"][key] = {**doc["spec"][key], **value}
        else:
            doc["spec"][key] = value
    return policy_from_dict(doc)


def facts(**kw: Any) -> RequestFacts:
    kw.setdefault("namespace", "team-a")
    return RequestFacts(**kw)


def run(pod: dict[str, Any], policy: Policy | None = None,
        request: RequestFacts | None = None) -> tuple[Decision, dict[str, Any]]:
    """Evaluate; check purity and idempotence; return the decision and the patched pod."""
    policy = policy or default_policy()
    request = request or facts()
    before = copy.deepcopy(pod)
    decision = evaluate(pod, request, policy)
    assert pod == before, "evaluate must not modify its input"
    if not decision.allowed:
        assert decision.patch == (), "a denial carries no patch"
    for warning in decision.warnings:
        assert len(warning) <= 120 and "\n" not in warning
        assert not warning.lower().startswith("warning")
    after = jsonpatch.apply_patch(pod, list(decision.patch), in_place=False)
    if decision.patch:
        again = evaluate(after, request, policy)
        assert again.patch == (), f"not idempotent: {again.patch}"
        assert again.allowed
    return decision, after


def env_of(pod: dict[str, Any], index: int = 0, kind: str = "containers") -> list[Any]:
    return list(pod["spec"][kind][index].get("env", []))


def rules_of(decision: Decision) -> list[tuple[str, str]]:
    return [(v.rule, str(v.mode)) for v in decision.violations]
