"""``kubectl debug`` and the guard: ephemeral containers added through the
``pods/ephemeralcontainers`` subresource (an UPDATE whose ``request.object`` is the whole Pod with
``spec.ephemeralContainers``, ``request.oldObject`` the pod before), in the engine and through
the real webhook over TLS (``tests.server_support``).

A debug container cannot request a GPU (ephemeral containers have no ``resources``), so a CUDA
image (which bakes in ``NVIDIA_VISIBLE_DEVICES=all``) gets ``void`` and an explicit
``NVIDIA_VISIBLE_DEVICES`` granting GPUs is refused; the containers the pod already had are
immutable and never judged again.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import orjson
import pytest
import yaml

from gpu_admission.admission.engine import evaluate
from gpu_admission.core.decision import Mode, RequestFacts
from gpu_admission.policy.model import default_policy
from tests.builders import make_container, make_pod, make_review, patch_ops
from tests.server_support import Server, serving

CUDA_IMAGE = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"
VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
ALL = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
DENIAL = ("[gpu-visible-devices] spec.ephemeralContainers[1].env[0]: "
          "NVIDIA_VISIBLE_DEVICES='all' without a GPU request gives this container GPUs outside "
          "the scheduler's accounting; request nvidia.com/gpu, or set NVIDIA_VISIBLE_DEVICES=void")


def running_pod() -> dict[str, Any]:
    """A CPU pod as stored after our CREATE patch, with one earlier debug container that set
    ``NVIDIA_VISIBLE_DEVICES=all`` before the namespace opted in (immutable now)."""
    pod = make_pod("web", namespace="ml-serving", containers=[
        make_container("app", "python:3.12", gpu=None, env=[VOID])])
    pod["metadata"]["uid"] = "7f4c1c7e-0000-4000-8000-000000000001"
    pod["spec"]["ephemeralContainers"] = [{
        "name": "debugger-old", "image": CUDA_IMAGE, "env": [ALL],
        "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}]
    pod["status"] = {"phase": "Running"}
    return pod


def debug_container(name: str, env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What ``kubectl debug -it web --image=<cuda> --target=app`` adds (kubectl
    ``pkg/cmd/debug/debug.go`` generateDebugContainer)."""
    container: dict[str, Any] = {
        "name": name, "image": CUDA_IMAGE, "imagePullPolicy": "IfNotPresent",
        "stdin": True, "tty": True, "terminationMessagePolicy": "File",
        "targetContainerName": "app", "resources": {}}
    if env is not None:
        container["env"] = env
    return container


def with_debug(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    new = copy.deepcopy(pod)
    new["spec"]["ephemeralContainers"].append(container)
    return new


def debug_review(old: dict[str, Any], new: dict[str, Any], uid: str) -> dict[str, Any]:
    """The AdmissionReview the API server sends for ``PATCH pods/web/ephemeralcontainers``."""
    review = make_review(new, operation="UPDATE", old=old, uid=uid)
    review["request"]["subResource"] = "ephemeralcontainers"
    review["request"]["options"] = {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"}
    return review


def facts(stage: str = "mutate", namespace: str = "ml-serving") -> RequestFacts:
    return RequestFacts(namespace=namespace, operation="UPDATE", stage=stage,  # type: ignore[arg-type]
                        sub_resource="ephemeralcontainers",
                        existing_ephemeral=frozenset({"debugger-old"}))


ENGINE_CASES = [
    pytest.param(None, True,
                 [{"op": "add", "path": "/spec/ephemeralContainers/1/env", "value": [VOID]}], [],
                 id="cuda-image-gets-void"),
    pytest.param([{"name": "TERM", "value": "xterm"}], True,
                 [{"op": "add", "path": "/spec/ephemeralContainers/1/env/-", "value": VOID}], [],
                 id="env-without-the-variable-gets-void-appended"),
    pytest.param([{"name": "NVIDIA_VISIBLE_DEVICES", "value": ""}], True,
                 [{"op": "replace", "path": "/spec/ephemeralContainers/1/env/0", "value": VOID}],
                 [], id="empty-value-replaced"),
    pytest.param([ALL], False, [], ["gpu-visible-devices"], id="all-refused"),
    pytest.param([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}], False, [],
                 ["gpu-visible-devices"], id="indexes-refused"),
    pytest.param([{"name": "NVIDIA_VISIBLE_DEVICES",
                   "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}], False, [],
                 ["gpu-visible-devices"], id="valueFrom-refused"),
    pytest.param([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}], True, [], [],
                 id="none-kept"),
    pytest.param([VOID], True, [], [], id="void-kept"),
]


@pytest.mark.parametrize(("env", "allowed", "patch", "rules"), ENGINE_CASES)
def test_engine_judges_only_the_added_ephemeral_container(
        env: list[dict[str, Any]] | None, allowed: bool, patch: list[dict[str, Any]],
        rules: list[str]) -> None:
    pod = with_debug(running_pod(), debug_container("debugger-new", env))
    decision = evaluate(pod, facts(), default_policy())
    assert (decision.allowed, list(decision.patch), [v.rule for v in decision.violations]) == (
        allowed, patch, rules)
    assert decision.gpu is False
    if patch:  # idempotent: the patched pod needs nothing more
        again = evaluate(jsonpatch.apply_patch(pod, patch), facts(), default_policy())
        assert (again.allowed, again.patch, again.violations) == (True, (), ())
    validated = evaluate(pod, facts("validate"), default_policy())
    assert (validated.allowed, validated.patch) == (allowed, ())


def test_engine_leaves_other_subresources_and_exempt_namespaces_alone() -> None:
    pod = with_debug(running_pod(), debug_container("debugger-new", [ALL]))
    status = RequestFacts(namespace="ml-serving", operation="UPDATE", sub_resource="status")
    assert evaluate(pod, status, default_policy()).violations == ()
    exempt = evaluate(pod, facts(namespace="kube-system"), default_policy())
    assert (exempt.allowed, exempt.exempt, exempt.patch) == (True, "namespace kube-system", ())


def test_engine_warn_mode_reports_instead_of_mutating() -> None:
    policy = default_policy()
    doc = policy.model_dump(mode="json", by_alias=True)
    doc["spec"]["rules"]["gpu-access-isolation"] = "warn"
    warn = type(policy).model_validate(doc)
    pod = with_debug(running_pod(), debug_container("debugger-new"))
    decision = evaluate(pod, facts(), warn)
    assert decision.patch == ()
    assert [(v.rule, v.path, v.mode) for v in decision.violations] == [
        ("gpu-access-isolation", "spec.ephemeralContainers[1]", Mode.WARN)]


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    async with serving(tmp_path) as srv:
        yield srv


async def test_kubectl_debug_with_a_cuda_image_gets_void_over_tls(server: Server) -> None:
    old = running_pod()
    new = with_debug(old, debug_container("debugger-new"))
    status, body, _ = await server.post("/mutate?timeout=10s",
                                        debug_review(old, new, "u-debug"))
    assert status == 200
    response = body["response"]
    ops = [{"op": "add", "path": "/spec/ephemeralContainers/1/env", "value": [VOID]}]
    assert response == {
        "uid": "u-debug", "allowed": True, "patchType": "JSONPatch",
        "patch": response["patch"],
        "auditAnnotations": {"decision": "allowed", "patch": "spec.ephemeralContainers[1].env"}}
    assert patch_ops(response) == ops
    patched = jsonpatch.apply_patch(new, ops)
    kubernetes_validate.validate(patched, "1.30", strict=True)
    # the validating webhook sees the mutated pod (the old debugger is not judged again)
    status, body, _ = await server.post("/validate", debug_review(old, patched, "u-debug-v"))
    assert body["response"] == {"uid": "u-debug-v", "allowed": True,
                                "auditAnnotations": {"decision": "allowed"}}


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
async def test_kubectl_debug_granting_gpus_is_refused_over_tls(server: Server, path: str) -> None:
    old = running_pod()
    new = with_debug(old, debug_container("debugger-new", [ALL]))
    status, body, _ = await server.post(path, debug_review(old, new, "u-debug-all"))
    assert (status, body["response"]) == (200, {
        "uid": "u-debug-all", "allowed": False,
        "status": {"status": "Failure", "code": 403, "reason": "Forbidden", "message": DENIAL},
        "auditAnnotations": {"decision": "denied", "violations": "gpu-visible-devices=enforce"}})


async def test_other_pod_subresources_are_skipped_over_tls(server: Server) -> None:
    old = running_pod()
    new = with_debug(old, debug_container("debugger-new", [ALL]))
    review = debug_review(old, new, "u-status")
    review["request"]["subResource"] = "status"
    status, body, _ = await server.post("/validate", review)
    assert (status, body["response"]) == (200, {"uid": "u-status", "allowed": True})


@pytest.mark.parametrize("compiled", [False, True], ids=["engine", "compiled"])
def test_evaluate_debug_container(tmp_path: Path, compiled: bool) -> None:
    """``gpu-admission evaluate --debug-container`` (the last ephemeral container is the one
    kubectl debug adds), with the engine and with the compiled policies (cel-python)."""
    cuda = with_debug(running_pod(), debug_container("debugger-new"))
    granting = with_debug(running_pod(), debug_container("debugger-all", [ALL]))
    pods = tmp_path / "pods.yaml"
    pods.write_text(yaml.safe_dump_all([cuda, granting]))
    proc = subprocess.run([sys.executable, "-m", "gpu_admission", "evaluate", "-f", str(pods),
                           "--debug-container", "-o", "json",
                           *(["--compiled"] if compiled else [])],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1, proc.stderr  # the second is refused
    void, refused = (orjson.loads(line) for line in proc.stdout.splitlines())
    assert (void["allowed"], void["patch"], void["changes"]) == (
        True, [{"op": "add", "path": "/spec/ephemeralContainers/1/env", "value": [VOID]}],
        ["spec.ephemeralContainers[1].env"])
    assert (refused["allowed"], [(v["rule"], v["path"]) for v in refused["violations"]]) == (
        False, [("gpu-visible-devices", "spec.ephemeralContainers[1].env[0]")])


def test_evaluate_debug_container_needs_an_ephemeral_container(tmp_path: Path) -> None:
    pods = tmp_path / "pod.yaml"
    pods.write_text(yaml.safe_dump(make_pod("plain")))
    proc = subprocess.run([sys.executable, "-m", "gpu_admission", "evaluate", "-f", str(pods),
                           "--debug-container"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("Error: --debug-container: pod 'plain' has no "
                           "spec.ephemeralContainers (the container kubectl debug adds)\n")
