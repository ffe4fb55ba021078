"""The install artefacts: webhook-manifests/ (base + overlays), the companion manifests and the
Dockerfile, checked offline.

What is real here and what is not:
- Rendering uses the real kustomize (``kubectl kustomize``; kubectl ships kustomize v5).
- Built-in kinds are validated against the Kubernetes OpenAPI schemas with
  ``kubernetes-validate`` (strict: unknown fields fail) for the oldest Kubernetes version we
  support (1.30: matchConditions GA) and the newest the library ships.
- CRD kinds (cert-manager Certificate/Issuer, PrometheusRule) and the KubeSchedulerConfiguration
  file have no schema there: they are checked structurally against the fields their projects
  define (cited at each check), their PromQL parses (``promql-parser``) and the alerts are
  unit-tested with Prometheus' own ``promtool test rules``.
- Cross-references go to the real code: the webhook paths and probe paths must be routes of
  ``create_app`` / ``create_probe_app``, built from the ConfigMap's policy and a real
  certificate; the ConfigMap policy loads with ``load_policy``; the container args parse with
  the real click commands; the CEL matchConditions are compiled and evaluated with cel-python
  (``celpy``) on AdmissionRequest-shaped objects and compared with the engine's own GPU
  detection.
- The Dockerfile is checked statically (no Docker engine here): stages, USER, ENTRYPOINT/CMD
  against the Deployment, EXPOSE against the container ports, .dockerignore.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, cast

import celpy
import celpy.adapter
import click
import kubernetes_validate
import promql_parser
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_admission.admission.engine import evaluate
from gpu_admission.admission.pod import gpu_containers
from gpu_admission.certs.bundle import generate_bundle, service_dns_names, write_bundle
from gpu_admission.certs.install import install_certs
from gpu_admission.core import vocab
from gpu_admission.core.decision import RequestFacts
from gpu_admission.kube.dra import RESOURCES as DRA_RESOURCES
from gpu_admission.kube.nodes import NODES
from gpu_admission.policy.model import default_policy, load_policy
from gpu_admission.server.app import create_app, create_probe_app
from gpu_admission.server.cli import serve
from gpu_admission.server.config import ServerConfig
from tests.builders import make_container, make_pod
from tests.kube_api_support import api_in_thread
from tests.server_support import free_port, sigterm_and_collect

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "webhook-manifests"
COMPANION = MANIFESTS / "companion"
TARGETS = {"default": MANIFESTS, "base": MANIFESTS / "base",
           "cert-manager": MANIFESTS / "overlays" / "cert-manager",
           # API servers before 1.36: the webhook keeps the guard for every pod
           "fallback": MANIFESTS / "overlays" / "webhook-guard-fallback"}
#: The compiled guard (base/guard-policies.yaml): admissionregistration.k8s.io/v1
#: MutatingAdmissionPolicy is served from 1.36 on, so those objects validate from 1.36.
POLICY_K8S_VERSION = "1.36.0"
GUARD_OBJECTS = [f"{kind}/{name}" for name, kinds in (
    ("guard.gpu-admission.io", ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")),
    *((f"guard-{m}.gpu-admission.io", ("ValidatingAdmissionPolicy",
                                        "ValidatingAdmissionPolicyBinding"))
      # no guard-warn, no guard-audit: the built-in policy has no guard rule in those modes
      # (guard-enforce carries the audit annotations)
      for m in ("enforce",))) for kind in kinds]
K8S_VERSIONS = ["1.30.0", "1.37.0"]  # matchConditions are GA from 1.30
BUILTIN_GROUPS = {"v1", "apps/v1", "batch/v1", "policy/v1", "rbac.authorization.k8s.io/v1",
                  "admissionregistration.k8s.io/v1"}
NS = "gpu-admission"


# --------------------------------------------------------------------------- rendering
@cache
def _render(target: str) -> tuple[str, ...]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if os.environ.get("CI"):
            pytest.fail("kubectl (with built-in kustomize) is required in CI to render "
                        "webhook-manifests/")
        pytest.skip("kubectl not installed: cannot render kustomizations")
    out = subprocess.run([kubectl, "kustomize", str(TARGETS[target])], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, f"kustomize {target} failed:\n{out.stderr}"
    return tuple(json.dumps(d) for d in yaml.safe_load_all(out.stdout) if d)


def render(target: str) -> list[dict[str, Any]]:
    return [json.loads(d) for d in _render(target)]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind
             and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def companion(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((COMPANION / name).read_text()) if d]


def pod_templates(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for d in docs:
        if d["kind"] in ("Deployment", "Job"):
            out.append((f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]))
        elif d["kind"] == "CronJob":
            out.append((f"CronJob/{d['metadata']['name']}",
                        d["spec"]["jobTemplate"]["spec"]["template"]))
    return out


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


# --------------------------------------------------------------------------- schemas
@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("target", list(TARGETS))
def test_builtin_kinds_match_kubernetes_openapi_schema(target: str, version: str) -> None:
    docs = render(target)
    builtin = [d for d in docs if d["apiVersion"] in BUILTIN_GROUPS]
    for doc in builtin:
        at = (max(version, POLICY_K8S_VERSION, key=lambda v: tuple(map(int, v.split("."))))
              if "AdmissionPolicy" in doc["kind"] else version)
        try:
            kubernetes_validate.validate(doc, at, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} invalid for {version}: "
                        f"{exc.message} at {list(exc.path)}")
    # everything else is a kind checked structurally below; nothing slips through unchecked
    others = {d["kind"] for d in docs if d["apiVersion"] not in BUILTIN_GROUPS}
    assert others <= {"Certificate", "Issuer"}


def test_strict_schema_check_catches_a_typo() -> None:
    """Guard against a validator that accepts anything: a misspelt field must fail."""
    deployment = copy.deepcopy(one(render("base"), "Deployment", "gpu-admission"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)


def test_default_target_is_the_base() -> None:
    assert render("default") == render("base")


# the gpu-aware-scheduler install (checked in tests/extender/test_scheduler_manifests.py)
SCHEDULER_AUTH_READER = "gpu-aware-scheduler-extension-apiserver-authentication-reader"
SCHEDULER_OBJECTS = [
    "ServiceAccount/gpu-aware-scheduler", "ConfigMap/gpu-aware-scheduler-config",
    "ClusterRoleBinding/gpu-aware-scheduler-as-kube-scheduler",
    "ClusterRoleBinding/gpu-aware-scheduler-as-volume-scheduler",
    f"RoleBinding/{SCHEDULER_AUTH_READER}", "Role/gpu-aware-scheduler-lease",
    "RoleBinding/gpu-aware-scheduler-lease", "Deployment/gpu-aware-scheduler",
    "PodDisruptionBudget/gpu-aware-scheduler",
    # fractional GPU pools: the extender's ledger and bind, reservation pods
    "ClusterRole/gpu-aware-scheduler-fractional",
    "ClusterRoleBinding/gpu-aware-scheduler-fractional",
    "Role/gpu-aware-scheduler-reservations", "RoleBinding/gpu-aware-scheduler-reservations",
    "ServiceAccount/gpu-admission-reservation", "Role/gpu-admission-reservation",
    "RoleBinding/gpu-admission-reservation"]
# gpu-admission reclaim (checked in tests/reclaim/test_reclaim_manifests.py)
RECLAIM_OBJECTS = [
    "ServiceAccount/gpu-admission-reclaim", "ClusterRole/gpu-admission-reclaim",
    "ClusterRoleBinding/gpu-admission-reclaim", "Role/gpu-admission-reclaim-lease",
    "RoleBinding/gpu-admission-reclaim-lease", "Deployment/gpu-admission-reclaim"]


def test_base_kinds_and_namespaces() -> None:
    docs = render("base")
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
    assert kinds == sorted([
        "Namespace/gpu-admission", "ServiceAccount/gpu-admission",
        "ServiceAccount/gpu-admission-install-certs", "Role/gpu-admission-install-certs",
        "RoleBinding/gpu-admission-install-certs", "ClusterRole/gpu-admission-install-certs",
        "ClusterRoleBinding/gpu-admission-install-certs", "ConfigMap/gpu-admission-policy",
        "ClusterRole/gpu-admission-dra-reader", "ClusterRoleBinding/gpu-admission-dra-reader",
        "Service/gpu-admission", "Deployment/gpu-admission", "PodDisruptionBudget/gpu-admission",
        "MutatingWebhookConfiguration/gpu-admission",
        "ValidatingWebhookConfiguration/gpu-admission", "Job/gpu-admission-install-certs",
        "CronJob/gpu-admission-install-certs",
        *SCHEDULER_OBJECTS, *RECLAIM_OBJECTS, *GUARD_OBJECTS])
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding",
                      "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
                      "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
                      "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    for d in docs:
        # the scheduler's delegated-authentication RoleBinding must live next to its Role
        expected = "kube-system" if d["metadata"]["name"] == SCHEDULER_AUTH_READER else NS
        assert d["metadata"].get("namespace") == (
            None if d["kind"] in cluster_scoped else expected), \
            f"{d['kind']}/{d['metadata']['name']}"


# --------------------------------------------------------------------------- webhooks
def webhooks(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(d["kind"], w) for d in docs
            if d["kind"].endswith("WebhookConfiguration") for w in d["webhooks"]]


CLAIMS_HOOK = "validate-claims.gpu-admission.io"


@pytest.mark.parametrize("target", ["base", "cert-manager", "fallback"])
def test_webhook_configuration_safety_settings(target: str) -> None:
    docs = render(target)
    namespace = one(docs, "Namespace")["metadata"]["name"]
    seen = {}
    for kind, hook in webhooks(docs):
        if hook["name"] != CLAIMS_HOOK:
            seen[kind] = hook
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["sideEffects"] == "None"
        assert hook["failurePolicy"] == "Fail"
        assert 1 <= hook["timeoutSeconds"] <= 5
        assert hook["matchPolicy"] == "Equivalent"
        assert "objectSelector" not in hook
        exprs = {e["key"]: e for e in hook["namespaceSelector"]["matchExpressions"]}
        assert exprs[vocab.NAMESPACE_OPT_IN_LABEL] == {
            "key": vocab.NAMESPACE_OPT_IN_LABEL, "operator": "In", "values": ["true"]}
        excluded = exprs["kubernetes.io/metadata.name"]
        assert excluded["operator"] == "NotIn"
        assert set(excluded["values"]) == {"kube-system", namespace}
        if hook["name"] == CLAIMS_HOOK:  # DRA's second rule set (docs/dra.md)
            assert (kind, hook["rules"]) == ("ValidatingWebhookConfiguration", [{
                "apiGroups": ["resource.k8s.io"],
                "apiVersions": ["v1", "v1beta2", "v1beta1"],
                "operations": ["CREATE"], "resources": ["resourceclaims",
                                                        "resourceclaimtemplates"],
                "scope": "Namespaced"}])
            continue
        # kubectl debug: ephemeral containers enter through the subresource (docs/guard.md)
        assert [r["resources"] for r in hook["rules"]] == [["pods"], ["pods/ephemeralcontainers"]]
        assert [r["apiGroups"] for r in hook["rules"]] == [[""], [""]]
        assert hook["rules"][1]["operations"] == ["UPDATE"]
    assert set(seen) == {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    mutating, validating = seen["MutatingWebhookConfiguration"], \
        seen["ValidatingWebhookConfiguration"]
    assert mutating["rules"][0]["operations"] == ["CREATE"]
    assert mutating["reinvocationPolicy"] == "IfNeeded"
    assert validating["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert mutating["matchConditions"] == validating["matchConditions"]


@pytest.fixture(scope="module")
def server_apps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """The real server app (and its plain-HTTP probe app) built from the ConfigMap policy."""
    tmp = tmp_path_factory.mktemp("server")
    write_bundle(generate_bundle("gpu-admission", NS), tmp / "certs")
    policy = tmp / "policy.yaml"
    policy.write_text(
        one(render("base"), "ConfigMap", "gpu-admission-policy")["data"]["policy.yaml"])
    app = create_app(ServerConfig(cert_file=tmp / "certs" / "tls.crt",
                                  key_file=tmp / "certs" / "tls.key", policy_path=policy))
    return app, create_probe_app(app)


def routes(app: Any) -> set[str]:
    """Exact paths the app serves (the catch-all 404 route is not one of them)."""
    return {r.canonical for r in app.router.resources() if "{" not in r.canonical}


@pytest.mark.parametrize("target", ["base", "cert-manager"])
def test_webhooks_point_at_the_service_and_real_server_paths(
        target: str, server_apps: tuple[Any, Any]) -> None:
    docs = render(target)
    service = one(docs, "Service")
    https = next(p for p in service["spec"]["ports"] if p["name"] == "https")
    expected_paths = {"MutatingWebhookConfiguration": "/mutate",
                      "ValidatingWebhookConfiguration": "/validate"}
    for kind, hook in webhooks(docs):
        ref = hook["clientConfig"]["service"]
        assert ref["name"] == service["metadata"]["name"]
        assert ref["namespace"] == service["metadata"]["namespace"]
        assert ref["port"] == https["port"] == 443
        assert ref["path"] == expected_paths[kind]
        assert ref["path"] in routes(server_apps[0]), f"server has no route {ref['path']}"
        assert "caBundle" not in hook["clientConfig"]  # filled in by install-certs/cainjector


# --------------------------------------------------------------------------- CEL
@cache
def cel_program(expression: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression))


def cel_match(pod: dict[str, Any] | None, operation: str = "CREATE", target: str = "base",
              sub_resource: str = "") -> bool:
    """Evaluate every matchCondition as the API server does: variables object, oldObject,
    request; all must be true for the webhook to be called."""
    hook = webhooks(render(target))[0][1]
    activation = celpy.adapter.json_to_cel({
        "object": pod, "oldObject": pod if operation == "UPDATE" else None,
        "request": {"operation": operation, "subResource": sub_resource,
                    "kind": {"group": "", "version": "v1", "kind": "Pod"}}})
    results = []
    for condition in hook["matchConditions"]:
        assert re.fullmatch(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]", condition["name"])
        value = cel_program(condition["expression"]).evaluate(activation)
        assert isinstance(value, celpy.celtypes.BoolType), f"not a bool: {value!r}"
        results.append(bool(value))
    return all(results)


def no_spec_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}


CEL_CASES = [
    ("gpu-limit", make_pod(containers=[make_container(gpu=1)]), True),
    ("gpu-request-only", make_pod(containers=[make_container(gpu=1, requests_only=True)]), True),
    ("shared-gpu", make_pod(containers=[make_container(resource="nvidia.com/gpu.shared")]),
     True),
    ("mig-slice", make_pod(containers=[make_container(resource="nvidia.com/mig-1g.5gb")]), True),
    ("mig-shared", make_pod(containers=[make_container(
        resource="nvidia.com/mig-2g.10gb.shared")]), True),
    ("gpu-in-second-container", make_pod(containers=[
        make_container("a", gpu=None), make_container("b", gpu=1)]), True),
    ("gpu-in-init-container", make_pod(containers=[make_container(gpu=None)],
                                       init_containers=[make_container("init", gpu=1)]), True),
    ("cpu-only", make_pod(containers=[{"name": "c", "image": "busybox",
                                       "resources": {"limits": {"cpu": "1", "memory": "1Gi"},
                                                     "requests": {"cpu": "1"}}}]), False),
    ("no-resources", make_pod(containers=[make_container(gpu=None)]), False),
    ("empty-resources", make_pod(containers=[{"name": "c", "image": "x", "resources": {}}]),
     False),
    ("empty-limits", make_pod(containers=[{"name": "c", "image": "x",
                                           "resources": {"limits": {}}}]), False),
    ("lookalike-resource", make_pod(containers=[make_container(
        resource="nvidia.com/gpu-memory")]), False),
    ("other-vendor", make_pod(containers=[make_container(resource="amd.com/gpu")]), False),
    # DRA (docs/dra.md): a claim entry, or a DeviceClass named as an extended resource
    ("dra-claim", make_pod(containers=[{"name": "c", "image": "x", "resources": {
        "claims": [{"name": "gpu"}]}}], resourceClaims=[
            {"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]), True),
    ("dra-deviceclass-resource", make_pod(containers=[make_container(
        resource="deviceclass.resource.kubernetes.io/gpu.nvidia.com")]), True),
]
# Pods without a GPU resource that the GPU-access guard needs on CREATE unless they already
# carry NVIDIA_VISIBLE_DEVICES=void|none everywhere and no hostPath: (id, pod, sent on CREATE).
VOID_ENV = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
GUARD_CEL_CASES = [
    *[(name, pod, True) for name, pod, gpu in CEL_CASES if not gpu],
    # Changed on purpose (issue 32): a clean pod whose scheduler is empty or default-scheduler
    # is sent on CREATE, since spec.scheduling.cpuPods may route it to the GPU-aware scheduler
    ("cpu-void", make_pod(containers=[make_container(gpu=None, env=VOID_ENV)]), True),
    ("cpu-none", make_pod(containers=[make_container(gpu=None, env=[
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}])]), True),
    ("cpu-void-among-others", make_pod(containers=[make_container(gpu=None, env=[
        {"name": "A", "value": "1"}, *VOID_ENV])]), True),
    # ... and one that nothing routes stays with the API server
    ("cpu-void-own-scheduler", make_pod(containers=[make_container(gpu=None, env=VOID_ENV)],
                                        scheduler_name="volcano"), False),
    ("cpu-void-already-routed", make_pod(containers=[make_container(gpu=None, env=VOID_ENV)],
                                         scheduler_name="gpu-aware-scheduler"), False),
    ("cpu-void-daemonset", make_pod(containers=[make_container(gpu=None, env=VOID_ENV)],
                                    owner_kind="DaemonSet", owner_api_version="apps/v1"), False),
    ("cpu-void-node-name", make_pod(containers=[make_container(gpu=None, env=VOID_ENV)],
                                    nodeName="node-1"), False),
    ("cpu-all", make_pod(containers=[make_container(gpu=None, env=[
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])]), True),
    ("cpu-void-then-all", make_pod(containers=[make_container(gpu=None, env=[
        *VOID_ENV, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])]), True),
    ("cpu-value-from", make_pod(containers=[make_container(gpu=None, env=[
        {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.name"}}}])]), True),
    ("one-container-not-void", make_pod(containers=[
        make_container("a", gpu=None, env=VOID_ENV), make_container("b", gpu=None)]), True),
    ("init-container-not-void", make_pod(containers=[make_container(gpu=None, env=VOID_ENV)],
                                         init_containers=[make_container("i", gpu=None)]), True),
    ("void-but-host-path", make_pod(containers=[make_container(gpu=None, env=VOID_ENV)],
                                    volumes=[{"name": "d", "hostPath": {"path": "/dev/dri"}}]),
     True),
    ("void-and-empty-dir", make_pod(containers=[make_container(gpu=None, env=VOID_ENV)],
                                    volumes=[{"name": "d", "emptyDir": {}}],
                                    scheduler_name="volcano"), False),
    ("no-containers-field", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                             "spec": {"schedulerName": "volcano"}}, False),
    ("no-containers-field-routed", {"apiVersion": "v1", "kind": "Pod",
                                    "metadata": {"name": "x"}, "spec": {}}, True),
    ("no-spec", no_spec_pod(), False),
]


@pytest.mark.parametrize(("pod", "expected"), [c[1:] for c in CEL_CASES if c[2]],
                         ids=[c[0] for c in CEL_CASES if c[2]])
@pytest.mark.parametrize("target", ["base", "fallback"])
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_match_conditions_always_send_gpu_pods(pod: dict[str, Any], expected: bool,
                                               operation: str, target: str) -> None:
    assert cel_match(pod, operation, target) is expected


@pytest.mark.parametrize(("pod", "on_create"), [c[1:] for c in GUARD_CEL_CASES],
                         ids=[c[0] for c in GUARD_CEL_CASES])
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_match_conditions_send_non_gpu_pods_only_to_the_guard_on_create(
        pod: dict[str, Any], on_create: bool, operation: str) -> None:
    """The fallback (webhook keeps the guard); the default install never sends them: the
    compiled guard decides them inside the API server (tests/install/test_guard_split.py)."""
    assert cel_match(pod, operation, "fallback") is (on_create and operation == "CREATE")
    assert cel_match(pod, operation, "base") is False


RESOURCE_NAMES = ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb",
                  "nvidia.com/mig-3g.40gb.shared", "cpu", "memory", "ephemeral-storage",
                  "nvidia.com/gpu-memory", "example.com/fpga"]
quantities = st.sampled_from([0, 1, 2, "0", "1", "500m"])
resource_maps = st.dictionaries(st.sampled_from(RESOURCE_NAMES), quantities, max_size=3)
nvd_entries = st.sampled_from([
    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"},
    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"},
    {"name": "NVIDIA_VISIBLE_DEVICES", "value": ""},
    {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    {"name": "OTHER", "value": "void"}])
containers = st.builds(
    lambda i, limits, requests, has_resources, env: {
        "name": f"c{i}", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
        **({"resources": {**({"limits": limits} if limits is not None else {}),
                          **({"requests": requests} if requests is not None else {})}}
           if has_resources else {}),
        **({"env": env} if env is not None else {})},
    st.integers(0, 99), st.none() | resource_maps, st.none() | resource_maps, st.booleans(),
    st.none() | st.lists(nvd_entries, max_size=2))
volumes = st.lists(st.sampled_from([
    {"name": "v", "hostPath": {"path": "/dev/nvidia0"}}, {"name": "v", "hostPath": {"path": "/"}},
    {"name": "v", "hostPath": {"path": "/var/log"}}, {"name": "v", "emptyDir": {}}]), max_size=2)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(containers, min_size=0, max_size=3), st.lists(containers, max_size=2), volumes,
       st.sampled_from(["CREATE", "UPDATE"]))
def test_match_conditions_never_skip_a_pod_the_engine_would_change_or_deny(
        main: list[dict[str, Any]], init: list[dict[str, Any]], vols: list[dict[str, Any]],
        operation: str) -> None:
    """A pod the CEL filter skips is one the engine would neither change nor deny nor warn
    about, at either webhook (so the filter is a superset of what matters); on UPDATE it
    sends exactly the pods naming a GPU resource (zero-quantity ones too, harmlessly)."""
    spec: dict[str, Any] = {"containers": main}
    if init:
        spec["initContainers"] = init
    if vols:
        spec["volumes"] = vols
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}
    named_gpu = any(
        name in ("nvidia.com/gpu", "nvidia.com/gpu.shared") or name.startswith("nvidia.com/mig-")
        for c in main + init for key in ("limits", "requests")
        for name in (c.get("resources", {}).get(key) or {}))
    matched = cel_match(pod, operation, "fallback")
    assert cel_match(pod, operation, "base") is named_gpu
    if operation == "UPDATE":
        assert matched is named_gpu
    if gpu_containers(spec):
        assert matched
    if not matched:
        for stage in ("mutate", "validate"):
            decision = evaluate(pod, RequestFacts(namespace="team-a", operation=operation,
                                                  stage=stage), default_policy())
            assert (decision.allowed, decision.patch, decision.violations) == (True, (), ()), \
                (stage, decision)


# --------------------------------------------------------------------------- Deployment & co
def test_service_selects_the_deployment_pods_and_ports_resolve() -> None:
    docs = render("base")
    service, deployment = one(docs, "Service"), one(docs, "Deployment", "gpu-admission")
    template = deployment["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    pdb = one(docs, "PodDisruptionBudget", "gpu-admission")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    container = template["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    args = container["args"]
    assert ports == {"https": int(flag(args, "--port")),
                     "metrics": int(flag(args, "--metrics-port"))}
    assert ports["https"] == 8443
    for port in service["spec"]["ports"]:
        target = port["targetPort"]
        assert (ports[target] if isinstance(target, str) else target) in ports.values()
    assert {p["name"]: ports[p["targetPort"]] for p in service["spec"]["ports"]} == {
        "https": 8443, "metrics": ports["metrics"]}
    for spread in template["spec"]["topologySpreadConstraints"]:
        assert spread["labelSelector"]["matchLabels"].items() <= labels.items()


def test_availability_settings() -> None:
    docs = render("base")
    deployment = one(docs, "Deployment", "gpu-admission")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert one(docs, "PodDisruptionBudget", "gpu-admission")["spec"]["minAvailable"] == 1
    keys = {s["topologyKey"] for s in
            deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]}
    assert "kubernetes.io/hostname" in keys


def test_probes_hit_real_endpoints_on_the_plain_http_port(
        server_apps: tuple[Any, Any]) -> None:
    container = one(render("base"), "Deployment", "gpu-admission")[
        "spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probes = {k: container[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for name, probe in probes.items():
        get = probe["httpGet"]
        assert get.get("scheme", "HTTP") == "HTTP", name
        assert ports[get["port"]] == int(flag(container["args"], "--metrics-port")), name
        assert get["path"] in routes(server_apps[1]), f"{name}: probe app has no {get['path']}"


def known_options(command: click.Command, args: list[str]) -> dict[str, str | bool]:
    """Check ``args`` against the command's real options (names, flag vs value) without
    touching the filesystem (the in-container paths do not exist here)."""
    options = {opt: param for param in command.params if isinstance(param, click.Option)
               for opt in param.opts}
    parsed: dict[str, str | bool] = {}
    rest = list(args)
    while rest:
        token = rest.pop(0)
        assert token in options, f"{command.name} has no option {token}"
        param = options[token]
        if param.is_flag:
            parsed[token] = True
        else:
            value = rest.pop(0)
            if not isinstance(param.type, click.Path):
                param.type.convert(value, param, None)  # ints, ranges, choices
            parsed[token] = value
    return parsed


@pytest.fixture
def kube_api(tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig for a test API serving the DRA resources (for ``--kubeconfig``)."""
    with api_in_thread(tmp_path) as kubeconfig:
        yield kubeconfig


def test_deployment_args_start_the_real_server(tmp_path: Path, kube_api: Path) -> None:
    """Run ``gpu-admission`` with the Deployment's args (mount paths and ports mapped to this
    machine): it must start, answer the probes on the plain-HTTP port, and exit 0 on SIGTERM."""
    docs = render("base")
    container = one(docs, "Deployment", "gpu-admission")[
        "spec"]["template"]["spec"]["containers"][0]
    args = list(container["args"])
    assert args[0] == "serve"
    known_options(serve, args[1:])
    write_bundle(generate_bundle("gpu-admission", NS), tmp_path / "certs")
    policy_dir = tmp_path / "policy"
    policy_dir.mkdir()
    for key, text in one(docs, "ConfigMap", "gpu-admission-policy")["data"].items():
        (policy_dir / key).write_text(text)
    https_port, metrics_port = free_port(), free_port()
    mapping = {flag(args, "--cert-dir"): str(tmp_path / "certs"),
               flag(args, "--policy"): str(policy_dir / Path(flag(args, "--policy")).name),
               flag(args, "--port"): str(https_port),
               flag(args, "--metrics-port"): str(metrics_port),
               flag(args, "--kubeconfig"): str(kube_api)}
    local = [mapping.get(a, a) for a in args]
    proc = subprocess.Popen([sys.executable, "-m", "gpu_admission", *local, "--host",
                             "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        status: dict[str, int] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(status) < 2:
            for path in ("/healthz", "/readyz"):
                try:
                    with urllib.request.urlopen(
                            f"http://127.0.0.1:{metrics_port}{path}", timeout=2) as resp:
                        status[path] = resp.status
                except OSError:
                    time.sleep(0.2)
            assert proc.poll() is None, proc.communicate()[1]
        assert status == {"/healthz": 200, "/readyz": 200}
    finally:
        err = sigterm_and_collect(proc)
    assert proc.returncode == 0, err


def test_mounts_match_the_paths_the_server_is_given() -> None:
    docs = render("base")
    spec = one(docs, "Deployment", "gpu-admission")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    args = container["args"]
    cert_mount = mounts[flag(args, "--cert-dir")]
    assert cert_mount["readOnly"] is True
    assert "subPath" not in cert_mount  # subPath mounts never see Secret updates
    secret = volumes[cert_mount["name"]]["secret"]["secretName"]
    policy_path = Path(flag(args, "--policy"))
    policy_mount = mounts[str(policy_path.parent)]
    assert "subPath" not in policy_mount  # subPath mounts never see ConfigMap updates
    configmap = volumes[policy_mount["name"]]["configMap"]["name"]
    cm = one(docs, "ConfigMap", configmap)
    assert policy_path.name in cm["data"]
    assert configmap == "gpu-admission-policy"  # plain name: no generator hash suffix
    job_args = one(docs, "Job")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert flag(job_args, "--secret") == secret


def test_every_container_is_hardened_and_bounded() -> None:
    docs = render("base")
    templates = pod_templates(docs)
    assert {name for name, _ in templates} == {
        "Deployment/gpu-admission", "Job/gpu-admission-install-certs",
        "CronJob/gpu-admission-install-certs", "Deployment/gpu-aware-scheduler",
        "Deployment/gpu-admission-reclaim"}
    for name, template in templates:
        pod_sc = template["spec"]["securityContext"]
        assert pod_sc["runAsNonRoot"] is True, name
        assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert isinstance(pod_sc["runAsUser"], int) and pod_sc["runAsUser"] > 0, name
        for c in template["spec"]["containers"] + template["spec"].get("initContainers", []):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert sc.get("privileged") is not True, name
            for key in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][key]), f"{name} {key}"


def test_rbac_is_least_privilege() -> None:
    docs = render("base")
    server_sa = one(docs, "Deployment", "gpu-admission")[
        "spec"]["template"]["spec"]["serviceAccountName"]
    job_spec = one(docs, "Job")["spec"]["template"]["spec"]
    job_sa = job_spec["serviceAccountName"]
    assert server_sa != job_sa
    assert one(docs, "ServiceAccount", server_sa)["automountServiceAccountToken"] is False
    # only the webhook's pods mount the token: its DRA cache reads (docs/dra.md)
    assert one(docs, "Deployment", "gpu-admission")["spec"]["template"]["spec"][
        "automountServiceAccountToken"] is True
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
                # the scheduler's, the reservation pods' and reclaim's own: tests/extender,
                # tests/reclaim
                and not d["metadata"]["name"].startswith(("gpu-aware-scheduler",
                                                          "gpu-admission-reservation",
                                                          "gpu-admission-reclaim"))]
    bound = {s["name"] for b in bindings for s in b["subjects"]}
    assert bound == {job_sa, server_sa}
    server_refs = [b["roleRef"] for b in bindings
                   if any(s["name"] == server_sa for s in b["subjects"])]
    assert server_refs == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "gpu-admission-dra-reader"}]
    reader = one(docs, "ClusterRole", "gpu-admission-dra-reader")["rules"]
    assert reader == [
        {"apiGroups": ["resource.k8s.io"],
         "resources": ["deviceclasses", "resourceclaims", "resourceclaimtemplates"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        # issue 33: the Node cache (serve --kubeconfig, gpu_admission/kube/nodes.py)
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    # exactly what the caches watch: nothing more, nothing less
    assert {r.name for r in DRA_RESOURCES} | {NODES.name} == {
        x for rule in reader for x in rule["resources"]}

    args = job_spec["containers"][0]["args"]
    secret, config = flag(args, "--secret"), flag(args, "--webhook-config")
    role = one(docs, "Role", "gpu-admission-install-certs")
    assert sorted((tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"]),
                   tuple(r.get("resourceNames", ()))) for r in role["rules"]) == [
        (("",), ("secrets",), ("create",), ()),
        (("",), ("secrets",), ("get", "update"), (secret,))]
    cluster_role = one(docs, "ClusterRole", "gpu-admission-install-certs")
    assert cluster_role["rules"] == [{
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
        "resourceNames": [config], "verbs": ["get", "patch"]}]
    names = {d["metadata"]["name"] for d in docs if d["kind"].endswith("WebhookConfiguration")}
    assert names == {config}
    for b in bindings:
        ref = b["roleRef"]
        assert one(docs, ref["kind"], ref["name"])


def test_install_certs_job_args_parse_and_match_the_objects() -> None:
    docs = render("base")
    service = one(docs, "Service")
    for _, template in [t for t in pod_templates(docs) if "install-certs" in t[0]]:
        args = template["spec"]["containers"][0]["args"]
        assert args[0] == "install-certs"
        with click.Context(install_certs) as ctx:
            assert install_certs.parse_args(ctx, list(args[1:])) == []
        assert ctx.params["namespace"] == service["metadata"]["namespace"]
        assert ctx.params["service"] == service["metadata"]["name"]
        assert ctx.params["renew_before"] < ctx.params["days"]
        assert "--kubeconfig" not in args  # in-cluster credentials from the ServiceAccount


# --------------------------------------------------------------------------- policy ConfigMap
def test_configmap_policy_loads_in_the_real_model(tmp_path: Path) -> None:
    text = one(render("base"), "ConfigMap", "gpu-admission-policy")["data"]["policy.yaml"]
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    policy = load_policy(path)
    # it is the built-in default, so installing changes no behaviour by itself
    assert policy.digest == default_policy().digest


def test_commented_example_node_pools_are_valid(tmp_path: Path) -> None:
    text = one(render("base"), "ConfigMap", "gpu-admission-policy")["data"]["policy.yaml"]
    begin, end = "# BEGIN example nodePools", "# END example nodePools"
    head, rest = text.split(begin)
    block, tail = rest.split(end)
    uncommented = re.sub(r"^(\s*)# ?", r"\1", block, flags=re.MULTILINE)
    head = head.replace("  nodePools: []\n", "")
    path = tmp_path / "policy.yaml"
    path.write_text(head + uncommented + tail)
    policy = load_policy(path)
    pools = {p.name: p for p in policy.spec.node_pools}
    assert set(pools) == {"inference-shared", "training-dedicated"}
    assert pools["inference-shared"].shared and not pools["training-dedicated"].shared
    # the example's replicas agree with the companion device-plugin config
    dp = yaml.safe_load(companion("nvidia-device-plugin-config.yaml")[0]["data"]["time-sliced-4"])
    assert pools["inference-shared"].replicas_per_gpu == \
        dp["sharing"]["timeSlicing"]["resources"][0]["replicas"]


# --------------------------------------------------------------------------- cert-manager
def test_cert_manager_overlay() -> None:
    base, docs = render("base"), render("cert-manager")
    kinds = {f"{d['kind']}/{d['metadata']['name']}" for d in docs}
    assert not {k for k in kinds if "install-certs" in k}, "self-managed pieces must be gone"
    # everything else from the base is unchanged except the injection annotation
    for d in base:
        if "install-certs" in d["metadata"]["name"]:
            continue
        rendered = one(docs, d["kind"], d["metadata"]["name"])
        if d["kind"].endswith("WebhookConfiguration"):
            ann = rendered["metadata"].pop("annotations")
            ns, name = ann["cert-manager.io/inject-ca-from"].split("/")
            cert = one(docs, "Certificate", name)
            assert cert["metadata"]["namespace"] == ns
        assert rendered == d

    # Certificate/Issuer structure (cert-manager.io/v1 API: Certificate.spec.secretName,
    # dnsNames, issuerRef{name,kind,group}, isCA; Issuer.spec.selfSigned | ca.secretName)
    issuers = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Issuer"}
    certs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}
    for d in [*issuers.values(), *certs.values()]:
        assert d["apiVersion"] == "cert-manager.io/v1"
        assert d["metadata"]["namespace"] == NS
    for issuer in issuers.values():
        assert len(issuer["spec"]) == 1 and set(issuer["spec"]) <= {"selfSigned", "ca"}
        if "ca" in issuer["spec"]:
            secret = issuer["spec"]["ca"]["secretName"]
            assert any(c["spec"]["secretName"] == secret and c["spec"].get("isCA")
                       for c in certs.values())
    for cert in certs.values():
        ref = cert["spec"]["issuerRef"]
        assert ref["kind"] == "Issuer" and ref["group"] == "cert-manager.io"
        assert ref["name"] in issuers
    serving = certs["gpu-admission-tls"]["spec"]
    secret = one(docs, "Deployment", "gpu-admission")[
        "spec"]["template"]["spec"]["volumes"][0]["secret"]
    assert serving["secretName"] == secret["secretName"]
    assert serving["dnsNames"] == service_dns_names("gpu-admission", NS)
    assert not serving.get("isCA")
    assert issuers[serving["issuerRef"]["name"]]["spec"].get("ca"), \
        "serving cert must come from the CA issuer so renewals keep the same caBundle"


# --------------------------------------------------------------------------- companion
def test_device_plugin_config() -> None:
    (cm,) = companion("nvidia-device-plugin-config.yaml")
    kubernetes_validate.validate(cm, K8S_VERSIONS[-1], strict=True)
    assert cm["metadata"]["name"] == "nvidia-plugin-configs"
    # keys from NVIDIA/k8s-device-plugin api/config/v1 (reference sheet section 5.1)
    top, sharing_keys = {"version", "flags", "sharing"}, {"timeSlicing", "mps"}
    replicated = {"renameByDefault", "failRequestsGreaterThanOne", "resources"}
    resource_keys = {"name", "rename", "replicas", "devices"}
    for key, text in cm["data"].items():
        config = yaml.safe_load(text)
        assert config["version"] == "v1", key
        assert set(config) <= top, key
        assert config["flags"]["migStrategy"] in ("none", "single", "mixed"), key
        for method, spec in config.get("sharing", {}).items():
            assert method in sharing_keys and set(spec) <= replicated, key
            for res in spec["resources"]:
                assert set(res) <= resource_keys, key
                assert res["name"] == vocab.GPU_RESOURCE or \
                    res["name"].startswith(vocab.MIG_RESOURCE_PREFIX)
                assert isinstance(res["replicas"], int) and res["replicas"] >= 2
    sliced = yaml.safe_load(cm["data"]["time-sliced-4"])["sharing"]["timeSlicing"]
    assert sliced["renameByDefault"] is False
    assert sliced["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    assert "sharing" not in yaml.safe_load(cm["data"]["dedicated"])


def test_scheduler_configuration() -> None:
    """The gpu-aware-scheduler ships in the base now (no scheduler-plugins companion); its
    KubeSchedulerConfiguration is checked in depth in tests/extender/test_scheduler_manifests.py."""
    assert not (COMPANION / "gpu-aware-scheduler-config.yaml").exists()
    cm = one(render("base"), "ConfigMap", "gpu-aware-scheduler-config")
    config = yaml.safe_load(cm["data"]["config.yaml"])
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == default_policy().spec.scheduler_name


DCGM_DEFAULT_COUNTERS = {  # NVIDIA/dcgm-exporter etc/default-counters.csv (gauges used here)
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"}


def selectors(node: Any) -> set[str]:
    """Metric names referenced by a parsed PromQL expression."""
    names: set[str] = set()
    if isinstance(node, promql_parser.VectorSelector) and node.name:
        names.add(node.name)
    for attr in ("expr", "lhs", "rhs", "vector_selector", "param"):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, str | int | float):
            names |= selectors(child)
    for arg in getattr(node, "args", None) or []:
        names |= selectors(arg)
    return names


def prometheus_rule() -> dict[str, Any]:
    (rule,) = companion("gpu-alerts-prometheusrule.yaml")
    return rule


def test_prometheus_rule_structure_and_promql() -> None:
    rule = prometheus_rule()
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["kind"] == "PrometheusRule"
    records = {r["record"] for g in rule["spec"]["groups"] for r in g["rules"] if "record" in r}
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert set(alerts) == {"GPUIdleDuringWorkingHours", "GPUNodeFramebufferLow"}
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            assert set(r) <= {"record", "alert", "expr", "for", "labels", "annotations"}
            expr = promql_parser.parse(r["expr"])  # raises on a syntax error
            used = selectors(expr) - records
            assert used <= DCGM_DEFAULT_COUNTERS, f"not a default DCGM metric: {used}"
    assert alerts["GPUIdleDuringWorkingHours"]["for"] == "2h"
    idle = alerts["GPUIdleDuringWorkingHours"]["expr"]
    assert "hour()" in idle and "day_of_week()" in idle and "< 10" in idle


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool (Debian package prometheus) is required in CI")
        pytest.skip("promtool not installed")
    return tool


def test_alerts_fire_as_documented_with_promtool(tmp_path: Path) -> None:
    """Prometheus' own rule unit tests. promtool's clock starts at 1970-01-01 00:00 UTC, a
    Thursday; day_of_week() is 4 then, 6 on day 2 (Saturday)."""
    promtool = _promtool()
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": prometheus_rule()["spec"]["groups"]}))
    idle = {"gpu": "0", "Hostname": "node-a", "modelName": "A100", "namespace": "dev",
            "pod": "notebook-0"}
    busy = {"gpu": "1", "Hostname": "node-a", "modelName": "A100", "namespace": "prod",
            "pod": "triton-0"}

    def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
        sel = ",".join(f'{k}="{v}"' for k, v in labels.items())
        return {"series": f"{name}{{{sel}}}", "values": values}

    def alert(at: str, name: str, firing: list[dict[str, str]]) -> dict[str, Any]:
        # mypy binds `annotations` here to the __future__ import, not the dict defined below
        rendered = cast(dict[str, dict[str, str]], annotations)
        return {"eval_time": at, "alertname": name,
                "exp_alerts": [{"exp_labels": {**labels, "severity": "warning"},
                                "exp_annotations": rendered[name]} for labels in firing]}

    annotations = {  # the rendered templates, as an on-call engineer reads them
        "GPUIdleDuringWorkingHours": {
            "summary": "GPU 0 on node-a under 10% for 2h",
            "description": "GPU 0 (A100) on node node-a averaged 3.0% utilisation and has "
                           "stayed under 10% for two working hours. Allocated to pod "
                           "dev/notebook-0 (empty when unallocated). A forgotten notebook? "
                           "Consider time-slicing this node."},
        "GPUNodeFramebufferLow": {
            "summary": "Node node-a has under 10% GPU memory free",
            "description": "Only 5% of the GPU framebuffer on node node-a is free. Pods "
                           "sharing these GPUs by time-slicing have no memory isolation and "
                           "may run out of memory."},
    }

    days = 3 * 24 * 60  # samples at 1m for three days
    tests = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            series("DCGM_FI_DEV_GPU_UTIL", idle, f"3+0x{days}"),
            series("DCGM_FI_DEV_GPU_UTIL", busy, f"60+0x{days}"),
            series("DCGM_FI_DEV_FB_FREE", {"gpu": "0", "Hostname": "node-a"}, f"500+0x{days}"),
            series("DCGM_FI_DEV_FB_USED", {"gpu": "0", "Hostname": "node-a"}, f"9500+0x{days}"),
            series("DCGM_FI_DEV_FB_FREE", {"gpu": "0", "Hostname": "node-b"}, f"3000+0x{days}"),
            series("DCGM_FI_DEV_FB_USED", {"gpu": "0", "Hostname": "node-b"}, f"7000+0x{days}"),
            series("DCGM_FI_DEV_FB_FREE", {"gpu": "1", "Hostname": "node-b"}, f"1000+0x{days}"),
            series("DCGM_FI_DEV_FB_USED", {"gpu": "1", "Hostname": "node-b"}, f"9000+0x{days}"),
        ],
        "alert_rule_test": [
            alert("7h", "GPUIdleDuringWorkingHours", []),  # before working hours
            alert("9h50m", "GPUIdleDuringWorkingHours", []),  # idle < 2h inside hours
            alert("10h05m", "GPUIdleDuringWorkingHours", [idle]),  # Thursday 10:05 UTC
            alert("17h55m", "GPUIdleDuringWorkingHours", [idle]),
            alert("18h05m", "GPUIdleDuringWorkingHours", []),  # after hours
            alert("1d10h05m", "GPUIdleDuringWorkingHours", [idle]),  # Friday
            alert("2d12h", "GPUIdleDuringWorkingHours", []),  # Saturday
            alert("30m", "GPUNodeFramebufferLow", [{"Hostname": "node-a"}]),
        ],
        "promql_expr_test": [{
            "expr": "node:dcgm_fb_free:ratio", "eval_time": "1h",
            "exp_samples": [{"labels": 'node:dcgm_fb_free:ratio{Hostname="node-a"}',
                             "value": 0.05},
                            # (3000 + 1000) / (10000 + 10000): sum/sum, not a sum of ratios
                            {"labels": 'node:dcgm_fb_free:ratio{Hostname="node-b"}',
                             "value": 0.2}]}],
    }]}
    test_file = tmp_path / "tests.yaml"
    test_file.write_text(yaml.safe_dump(tests))
    out = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


# --------------------------------------------------------------------------- Dockerfile
def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """Instructions per stage: (INSTRUCTION, arguments), continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text()
    logical: list[str] = []
    buf = ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    stages: list[list[tuple[str, str]]] = []
    for line in logical:
        instruction, _, rest = line.strip().partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction.upper(), rest.strip()))
    return stages


def test_dockerfile_multi_stage_non_root_and_matches_the_deployment() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2
    build, final = stages[0], stages[-1]
    assert " AS build" in build[0][1]
    assert any(i == "RUN" and "pip wheel" in a for i, a in build), "wheel built in stage 1"
    final_runs = " ".join(a for i, a in final if i == "RUN")
    assert "--no-index" in final_runs and "from=build" in final_runs
    for tool in ("apt-get", "gcc", "build-essential", "pip wheel", "python -m build"):
        assert tool not in final_runs, f"build tooling in the final image: {tool}"
    assert not any(i in ("COPY", "ADD") for i, _ in final), "final stage copies no sources"
    assert "slim" in (ROOT / "Dockerfile").read_text().split("PYTHON_IMAGE=")[1].split()[0]

    (user,) = [a for i, a in final if i == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or gid.isdigit())
    entrypoint = json.loads(next(a for i, a in final if i == "ENTRYPOINT"))
    cmd = json.loads(next(a for i, a in final if i == "CMD"))
    assert entrypoint == ["gpu-admission"]
    exposed = {int(p) for a in (a for i, a in final if i == "EXPOSE") for p in a.split()}

    deployment = one(render("base"), "Deployment", "gpu-admission")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsUser"] == int(uid)
    if gid:
        assert pod["securityContext"]["runAsGroup"] == int(gid)
    assert "command" not in container  # the image ENTRYPOINT runs
    # the Deployment spells out the CMD and only adds the explicit ports and the DRA cache
    assert container["args"][:len(cmd)] == cmd
    assert container["args"][len(cmd):] == ["--port", "8443", "--metrics-port", "8080",
                                            "--kubeconfig", "in-cluster"]
    assert exposed == {p["containerPort"] for p in container["ports"]}
    known_options(serve, cmd[1:])
    # every file the build copies exists in the repository
    for _, args in (x for x in build if x[0] == "COPY"):
        for src in shlex.split(args)[:-1]:
            assert (ROOT / src).exists(), f"Dockerfile COPY source missing: {src}"


def test_dockerignore_keeps_secrets_and_vcs_out_but_not_the_sources() -> None:
    patterns = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    for must in (".git", "certs", "**/*.key"):
        assert must in patterns
    for needed in ("pyproject.toml", "README.md", "gpu_admission"):
        assert needed not in patterns
