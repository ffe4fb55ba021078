"""The GPU-access guard's rule table (gpu_admission.rules.gpu_access) through the engine.

Every row is evaluated with ``tests.policy_helpers.run`` (purity, idempotence of the patch,
warning length), and the outcome is asserted exactly: allowed, the violations (rule, path,
mode) and the pod after the patch.
"""

from __future__ import annotations

from typing import Any

import celpy
import celpy.celtypes
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_admission.core.decision import Decision
from gpu_admission.rules.gpu_access import DEVICE_PATH_PATTERN, is_device_path
from tests.builders import make_container, make_pod
from tests.policy_helpers import DEFAULT_ENV, facts, policy_with, run

CUDA_IMAGE = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"  # bakes NVIDIA_VISIBLE_DEVICES=all
VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
MUTATED = {"gpu-admission.io/mutated": "env"}


def nvd(value: str) -> dict[str, str]:
    return {"name": "NVIDIA_VISIBLE_DEVICES", "value": value}


def cpu(name: str = "app", image: str = CUDA_IMAGE, env: list[Any] | None = None
        ) -> dict[str, Any]:
    return make_container(name, image, gpu=None, env=env)


def host_path_pod(path: str) -> dict[str, Any]:
    return make_pod(containers=[cpu(env=[VOID])],
                    volumes=[{"name": "dev", "hostPath": {"path": path}}])


# (id, pod, expected violations [(rule, path)], expected env of spec.containers[0] after)
ENV_TABLE = [
    ("cpu-cuda-image-gets-void", make_pod(containers=[cpu()]), [], [VOID]),
    ("appended-to-existing-env", make_pod(containers=[cpu(env=[{"name": "A", "value": "1"}])]),
     [], [{"name": "A", "value": "1"}, VOID]),
    ("void-kept", make_pod(containers=[cpu(env=[VOID])]), [], [VOID]),
    ("none-kept", make_pod(containers=[cpu(env=[nvd("none")])]), [], [nvd("none")]),
    ("empty-value-replaced", make_pod(containers=[cpu(env=[nvd("")])]), [], [VOID]),
    ("value-missing-replaced", make_pod(containers=[cpu(env=[{
        "name": "NVIDIA_VISIBLE_DEVICES"}])]), [], [VOID]),
    ("all-denied", make_pod(containers=[cpu(env=[nvd("all")])]),
     [("gpu-visible-devices", "spec.containers[0].env[0]")], None),
    ("indexes-denied", make_pod(containers=[cpu(env=[nvd("0,1")])]),
     [("gpu-visible-devices", "spec.containers[0].env[0]")], None),
    ("uuid-denied", make_pod(containers=[cpu(env=[
        nvd("GPU-8f1c6a5e-1b2c-4d3e-9f00-123456789abc")])]),
     [("gpu-visible-devices", "spec.containers[0].env[0]")], None),
    ("void-is-case-sensitive", make_pod(containers=[cpu(env=[nvd("VOID")])]),
     [("gpu-visible-devices", "spec.containers[0].env[0]")], None),
    ("value-from-denied", make_pod(containers=[cpu(env=[{
        "name": "NVIDIA_VISIBLE_DEVICES",
        "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "visible"}}}])]),
     [("gpu-visible-devices", "spec.containers[0].env[0]")], None),
    ("last-duplicate-wins-void", make_pod(containers=[cpu(env=[nvd("all"), VOID])]), [],
     [nvd("all"), VOID]),
    ("last-duplicate-wins-all", make_pod(containers=[cpu(env=[VOID, nvd("all")])]),
     [("gpu-visible-devices", "spec.containers[0].env[1]")], None),
    ("gpu-container-setting-it-denied", make_pod(containers=[make_container(env=[nvd("0")])]),
     [("gpu-visible-devices", "spec.containers[0].env[0]")], None),
    ("gpu-container-even-void-denied", make_pod(containers=[make_container(env=[VOID])]),
     [("gpu-visible-devices", "spec.containers[0].env[0]")], None),
    ("gpu-container-untouched", make_pod(containers=[make_container()]), [], DEFAULT_ENV),
    ("zero-gpu-is-no-gpu", make_pod(containers=[make_container(gpu=0)]), [], [VOID]),
    ("other-vendor-is-no-gpu", make_pod(containers=[make_container(resource="amd.com/gpu")]),
     [], [VOID]),
]


@pytest.mark.parametrize(("pod", "violations", "env"), [c[1:] for c in ENV_TABLE],
                         ids=[c[0] for c in ENV_TABLE])
def test_env_table(pod: dict[str, Any], violations: list[tuple[str, str]],
                   env: list[Any] | None) -> None:
    decision, after = run(pod)
    assert [(v.rule, v.path, str(v.mode)) for v in decision.violations] == [
        (rule, path, "enforce") for rule, path in violations]
    assert decision.allowed is (not violations)
    if env is not None:
        assert after["spec"]["containers"][0].get("env") == env


def test_gpu_pod_sidecar_and_init_container_get_void_gpu_container_memory_env() -> None:
    pod = make_pod(containers=[make_container("model"), cpu("proxy", image="envoyproxy/envoy:v1")],
                   init_containers=[cpu("fetch", image="busybox:1.36")])
    decision, after = run(pod)
    assert decision.allowed and decision.gpu and decision.violations == ()
    assert after["spec"]["containers"][0]["env"] == DEFAULT_ENV
    assert after["spec"]["containers"][1]["env"] == [VOID]
    assert after["spec"]["initContainers"][0]["env"] == [VOID]
    assert "spec.containers[1].env" in decision.changes
    assert after["metadata"]["annotations"]["gpu-admission.io/mutated"] == (
        "env,nodeSelector,schedulerName")


def test_non_gpu_decision_shape() -> None:
    """What a non-GPU pod's Decision looks like: gpu False, no workload/CUDA, the patch.
    Changed on purpose (issue 32): the patch now starts with the GPU-aware scheduler (the
    default spec.scheduling.cpuPods: gpu-aware), in PatchBuilder's order."""
    decision, after = run(make_pod(containers=[cpu()]))
    mutated = {"gpu-admission.io/mutated": "env,schedulerName"}
    assert decision == Decision(
        allowed=True, gpu=False, changes=("spec.schedulerName", "spec.containers[0].env",
                                          "metadata.annotations"),
        patch=({"op": "add", "path": "/spec/schedulerName", "value": "gpu-aware-scheduler"},
               {"op": "add", "path": "/spec/containers/0/env", "value": [VOID]},
               {"op": "add", "path": "/metadata/annotations", "value": mutated}))
    assert after["metadata"]["annotations"] == mutated


def test_non_gpu_decision_shape_without_cpu_routing() -> None:
    """spec.scheduling.cpuPods: default: only the guard's void, as before issue 32."""
    decision, after = run(make_pod(containers=[cpu()]),
                          policy_with(scheduling={"cpuPods": "default"}))
    assert decision == Decision(
        allowed=True, gpu=False, changes=("spec.containers[0].env", "metadata.annotations"),
        patch=({"op": "add", "path": "/spec/containers/0/env", "value": [VOID]},
               {"op": "add", "path": "/metadata/annotations", "value": MUTATED}))
    assert after["metadata"]["annotations"] == MUTATED


def test_denial_lists_every_problem_with_the_fix() -> None:
    pod = make_pod(containers=[cpu(env=[nvd("all")]), make_container("gpu", env=[nvd("1")])],
                   volumes=[{"name": "d", "hostPath": {"path": "/dev/nvidia0"}}])
    decision, _ = run(pod)
    assert not decision.allowed
    assert decision.denial_message() == (
        "[gpu-visible-devices] spec.containers[0].env[0]: NVIDIA_VISIBLE_DEVICES='all' without "
        "a GPU request gives this container GPUs outside the scheduler's accounting; request "
        "nvidia.com/gpu, or set NVIDIA_VISIBLE_DEVICES=void; "
        "[gpu-visible-devices] spec.containers[1].env[0]: NVIDIA_VISIBLE_DEVICES is set in a "
        "container that requests a GPU; the device plugin chooses its GPU: remove "
        "NVIDIA_VISIBLE_DEVICES from env; "
        "[gpu-device-hostpath] spec.volumes[0].hostPath.path: hostPath '/dev/nvidia0' exposes "
        "GPU device nodes (/dev/nvidia*, /dev/dri) outside the device plugin; request "
        "nvidia.com/gpu instead")


HOST_PATHS = [
    ("/dev/nvidia0", True), ("/dev/nvidiactl", True), ("/dev/nvidia-uvm", True),
    ("/dev/nvidia-caps/nvidia-cap1", True), ("/dev/dri", True), ("/dev/dri/", True),
    ("/dev/dri/renderD128", True), ("/dev", True), ("/dev/", True), ("/", True),
    ("//dev//nvidia0", True), ("/dev/./dri/card0", True), ("/./dev", True),
    ("/dev/shm", False), ("/devices", False), ("/dev/drivers", False), ("/var/lib/x", False),
    ("/.dev/nvidia0", False), ("/home/dev/nvidia0", False), ("dev/nvidia0", False),
    ("/dev/fuse", False), ("", False), ("/dev/nvidia0\n", True), ("/dev/dri\n", False),
    ("/dev/..", False), ("/" * 4096, True), ("/" * 4097, False),
]


@pytest.mark.parametrize(("path", "denied"), HOST_PATHS,
                         ids=[repr(p)[1:-1][:24] or "empty" for p, _ in HOST_PATHS])
def test_host_path_table(path: str, denied: bool) -> None:
    assert is_device_path(path) is denied
    decision, _ = run(host_path_pod(path))
    assert [(v.rule, v.path) for v in decision.violations] == (
        [("gpu-device-hostpath", "spec.volumes[0].hostPath.path")] if denied else [])


def _components_oracle(path: str) -> bool:
    """The documented meaning, written independently: drop empty and "." components; the
    rest is [], [dev], [dev, nvidia*, ...] or [dev, dri, ...]."""
    if not path.startswith("/") or len(path) > 4096:
        return False
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return (parts == [] or (parts[:1] == ["dev"] and (
        len(parts) == 1 or parts[1] == "dri" or parts[1].startswith("nvidia"))))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["/", "//", ".", "..", "dev", "nvidia0", "nvidiactl", "dri",
                                 "drivers", "card0", "x", "\n", "/."]), max_size=7))
def test_device_path_matches_its_documented_meaning(pieces: list[str]) -> None:
    path = "".join(pieces)
    assert is_device_path(path) is _components_oracle(path), path


CEL_DEVICE_PATH = "size(p) > 0 && size(p) <= 4096 && p.matches('^(?:' + pattern + ')$')"


def test_device_path_pattern_in_cel_agrees_with_the_engine() -> None:
    """The CEL form documented for compiled policies (cel-python, RE2 semantics), evaluated
    on every row of the table, gives the engine's answer."""
    env = celpy.Environment()
    program = env.program(env.compile(CEL_DEVICE_PATH))
    for path, denied in HOST_PATHS:
        value = program.evaluate({"p": celpy.celtypes.StringType(path),
                                  "pattern": celpy.celtypes.StringType(DEVICE_PATH_PATTERN)})
        assert bool(value) is denied, path


@pytest.mark.parametrize("request_facts", [
    pytest.param(facts(namespace="kube-system"), id="exempt-namespace"),
    pytest.param(facts(user="system:serviceaccount:gpu-operator:nvidia-dcgm-exporter"),
                 id="exempt-user"),
    pytest.param(facts(groups=("system:serviceaccounts:gpu-operator",)), id="exempt-group"),
])
def test_exempt_system_workloads_stay_untouched(request_facts: Any) -> None:
    """dcgm-exporter / the device plugin: NVIDIA_VISIBLE_DEVICES=all and /dev hostPaths."""
    policy = policy_with(exemptions={
        "namespaces": ["kube-system"],
        "users": ["system:serviceaccount:gpu-operator:nvidia-dcgm-exporter"],
        "groups": ["system:serviceaccounts:gpu-operator"]})
    pod = make_pod(containers=[cpu("dcgm-exporter", "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5",
                                   env=[nvd("all")])],
                   volumes=[{"name": "dev", "hostPath": {"path": "/dev"}}])
    decision, after = run(pod, policy, request_facts)
    assert decision.allowed and decision.patch == () and decision.violations == ()
    assert decision.exempt
    assert after == pod


def test_update_is_not_rejudged() -> None:
    """Containers, env and volumes are immutable: an UPDATE of a pod created before the
    namespace opted in (finalizer removal, labels) is allowed."""
    pod = make_pod(containers=[cpu(env=[nvd("all")])])
    for stage in ("mutate", "validate"):
        decision = run(pod, request=facts(operation="UPDATE", stage=stage))[0]
        assert decision == Decision(allowed=True)


def test_validate_stage_denies_but_never_mutates() -> None:
    assert run(make_pod(containers=[cpu()]), request=facts(stage="validate"))[0] == Decision(
        allowed=True)
    denied = run(make_pod(containers=[cpu(env=[nvd("all")])]),
                 request=facts(stage="validate"))[0]
    assert not denied.allowed and denied.patch == ()


MODES = [
    ("isolation-warn", {"gpu-access-isolation": "warn"}, make_pod(containers=[cpu()]),
     True, [("gpu-access-isolation", "warn")], 1),
    ("isolation-audit", {"gpu-access-isolation": "audit"}, make_pod(containers=[cpu()]),
     True, [("gpu-access-isolation", "audit")], 0),
    ("visible-devices-warn", {"gpu-visible-devices": "warn"},
     make_pod(containers=[cpu(env=[nvd("all")])]), True, [("gpu-visible-devices", "warn")], 1),
    ("hostpath-audit", {"gpu-device-hostpath": "audit"}, host_path_pod("/dev/dri"),
     True, [("gpu-device-hostpath", "audit")], 0),
]


@pytest.mark.parametrize(("modes", "pod", "allowed", "violations", "warnings"),
                         [m[1:] for m in MODES], ids=[m[0] for m in MODES])
def test_modes(modes: dict[str, str], pod: dict[str, Any], allowed: bool,
               violations: list[tuple[str, str]], warnings: int) -> None:
    decision, _ = run(pod, policy_with(rules=modes))
    assert decision.allowed is allowed
    assert [(v.rule, str(v.mode)) for v in decision.violations] == violations
    assert len(decision.warnings) == warnings
    # warn/audit report instead of mutating the env; the scheduler (issue 32, cpuPods:
    # gpu-aware) is no guard rule and is set whatever the guard's modes (changed on purpose)
    assert [op["path"] for op in decision.patch] == ["/spec/schedulerName",
                                                     "/metadata/annotations"]
