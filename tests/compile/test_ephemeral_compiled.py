"""``kubectl debug`` through the compiled policies: the pods/ephemeralcontainers UPDATE the API
server evaluates (whole Pod with ``spec.ephemeralContainers``, ``request.subResource``
``ephemeralcontainers``, ``oldObject`` without the added container) decided by the emitted CEL
in cel-python exactly as the engine decides it (tests/guard/test_ephemeral.py has the engine's
table and the webhook over TLS)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_admission.compile.evaluator import admit
from gpu_admission.core.decision import RequestFacts
from tests.builders import make_container
from tests.compile_support import check, compiled
from tests.guard.test_ephemeral import ALL, ENGINE_CASES, debug_container, running_pod, with_debug

ENVS = [pytest.param(p.values[0], id=p.id) for p in ENGINE_CASES]


def facts(stage: str, namespace: str = "team-a") -> RequestFacts:
    return RequestFacts(namespace=namespace, operation="UPDATE", stage=stage,  # type: ignore[arg-type]
                        sub_resource="ephemeralcontainers",
                        existing_ephemeral=frozenset({"debugger-old"}))


def gpu_pod() -> dict[str, Any]:
    pod = running_pod()
    pod["spec"]["containers"].append(make_container("infer", gpu=1))
    return pod


@pytest.mark.parametrize("stage", ["mutate", "validate"])
@pytest.mark.parametrize("policy", ["default", "modes"])
@pytest.mark.parametrize("base", [running_pod, gpu_pod], ids=["cpu-pod", "gpu-pod"])
@pytest.mark.parametrize("env", ENVS)
def test_compiled_policies_judge_the_added_ephemeral_container_like_the_engine(
        env: list[dict[str, Any]] | None, base: Any, policy: str, stage: str) -> None:
    pod = with_debug(base(), debug_container("debugger-new", env))
    check(policy, pod, facts(stage))


def test_the_api_servers_denial_names_the_debug_container() -> None:
    """A CPU pod: the guard half decides it (a GPU pod's debug container: the GPU policies)."""
    pod = with_debug(running_pod(), debug_container("debugger-new", [ALL]))
    outcome = admit(compiled("default").objects, pod, facts("mutate"))
    assert outcome.denial == (
        "ValidatingAdmissionPolicy 'guard-enforce.gpu-admission.io' with binding "
        "'guard-enforce.gpu-admission.io' denied request: [gpu-visible-devices] "
        "spec.ephemeralContainers[1].env[0]: NVIDIA_VISIBLE_DEVICES='all' without a GPU request "
        "gives this container GPUs outside the scheduler's accounting; request nvidia.com/gpu, "
        "or set NVIDIA_VISIBLE_DEVICES=void")


def test_exempt_namespace_and_other_subresources() -> None:
    pod = with_debug(running_pod(), debug_container("debugger-new", [ALL]))
    check("modes", pod, facts("mutate", namespace="kube-system"))
    status = RequestFacts(namespace="team-a", operation="UPDATE", sub_resource="status")
    check("default", pod, status)


def test_every_policy_matches_the_subresource_on_update_only() -> None:
    for obj in compiled("default").objects:
        if obj["kind"].endswith("AdmissionPolicy"):
            rules = obj["spec"]["matchConstraints"]["resourceRules"]
            assert {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                    "resources": ["pods/ephemeralcontainers"], "scope": "Namespaced"} in rules
