"""Issue 31: every emitted CEL expression evaluates without error on every request the API
server sends for what it matches, with ``request`` built as the API server builds it
(:func:`gpu_admission.compile.evaluator.admission_request`: Go's ``omitempty`` fields absent
when empty).

The walk evaluates *every* expression of an object (matchConditions, every variable, eagerly,
validations, messageExpressions, auditAnnotations, mutations) on every request shape its
``matchConstraints`` (or a webhook's ``rules``) match, and fails on any evaluation error, not
only on a wrong answer: the built-in policy compiled (what stays with the webhook included),
a policy with every rule in every mode, the guard half (compiled, the shipped
``guard-policies.yaml``, the chart's rendering) and the webhook configurations'
``matchConditions`` (the base install, the guard fallback, the chart's).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_admission.compile.compiler import compile_policy
from gpu_admission.compile.evaluator import (
    CelError,
    Variables,
    activation_of,
    admission_request,
    admit,
    namespace_labels,
    run,
)
from gpu_admission.compile.guard import compile_guard
from gpu_admission.compile.offline import as_admitted
from gpu_admission.core.decision import RequestFacts
from gpu_admission.policy.model import RULE_IDS, Policy, default_policy, policy_from_dict
from tests.builders import make_container, make_pod
from tests.compile_support import modes_policy

ROOT = Path(__file__).resolve().parents[2]
GUARD_YAML = ROOT / "webhook-manifests" / "base" / "guard-policies.yaml"


# --------------------------------------------------------------------------- the request
@pytest.mark.parametrize(("facts", "pod", "absent", "present"), [
    pytest.param(RequestFacts("team-a"), make_pod(),
                 {"subResource", "requestSubResource"},
                 {"uid": "", "name": "pod", "namespace": "team-a", "dryRun": False,
                  "operation": "CREATE", "object": None, "oldObject": None}, id="create"),
    pytest.param(RequestFacts("team-a"), {**make_pod(), "metadata": {"generateName": "web-"}},
                 {"subResource", "requestSubResource", "name"}, {"dryRun": False},
                 id="create-generateName"),
    pytest.param(RequestFacts("team-a", dry_run=True), make_pod(), {"subResource"},
                 {"dryRun": True, "options": {"kind": "CreateOptions",
                                              "apiVersion": "meta.k8s.io/v1",
                                              "dryRun": ["All"]}}, id="dry-run"),
    pytest.param(RequestFacts("team-a", operation="UPDATE", sub_resource="ephemeralcontainers"),
                 make_pod(), set(),
                 {"subResource": "ephemeralcontainers",
                  "requestSubResource": "ephemeralcontainers",
                  "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"}},
                 id="update-ephemeralcontainers"),
])
def test_request_is_the_api_servers(facts: RequestFacts, pod: dict[str, Any],
                                    absent: set[str], present: dict[str, Any]) -> None:
    request = admission_request(pod, facts)
    assert absent.isdisjoint(request), sorted(absent & set(request))
    assert {k: request[k] for k in present} == present
    assert request["kind"] == request["requestKind"] == {"group": "", "version": "v1",
                                                          "kind": "Pod"}


@pytest.mark.parametrize(("user", "groups", "want"), [
    pytest.param("", (), {}, id="no-user"),
    pytest.param("alice", (), {"username": "alice"}, id="no-groups"),
    pytest.param("alice", ("team",), {"username": "alice", "groups": ["team"]}, id="groups"),
])
def test_user_info_omits_empty_fields(user: str, groups: tuple[str, ...],
                                      want: dict[str, Any]) -> None:
    assert admission_request(make_pod(), RequestFacts("team-a", user=user, groups=groups))[
        "userInfo"] == want


# --------------------------------------------------------------------------- shapes
def _cpu(**extra: Any) -> dict[str, Any]:
    return make_pod(containers=[make_container(gpu=None, image="busybox")], **extra)


def _env(value: str) -> dict[str, Any]:
    return make_pod(containers=[make_container(
        gpu=None, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}])])


def _host(path: str) -> dict[str, Any]:
    return _cpu(volumes=[{"name": "v", "hostPath": {"path": path}}])


def _unnamed(pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["metadata"].pop("name")
    pod["metadata"]["generateName"] = "web-"
    return pod


def _debugged(pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["spec"]["ephemeralContainers"] = [{"name": "debugger", "image": "busybox"}]
    return pod


PODS = {name: as_admitted(pod) for name, pod in {
    "cpu": _cpu(),
    "cpu-init": make_pod(containers=[make_container(gpu=None)],
                         init_containers=[make_container("init", gpu=None)]),
    "hostpath-var-log": _host("/var/log"),
    "hostpath-dev-nvidia0": _host("/dev/nvidia0"),
    "visible-devices-all": _env("all"),
    "visible-devices-void": _env("void"),
    "gpu-inference": make_pod(containers=[make_container()],
                              labels={"gpu-admission.io/workload": "inference"}),
    "gpu-training": make_pod(containers=[make_container(gpu=2)], owner_kind="PyTorchJob"),
    "gpu-notebook": make_pod(containers=[make_container(image="jupyter/base-notebook")],
                             labels={"notebook-name": "nb"}),
    "gpu-mig": make_pod(containers=[make_container(resource="nvidia.com/mig-1g.5gb")]),
    "gpu-other-scheduler": make_pod(containers=[make_container()], scheduler_name="volcano"),
    "gpu-shared": make_pod(containers=[make_container(resource="nvidia.com/gpu.shared")],
                           node_selector={"gpu-admission.io/cuda-version": "12.1"}),
}.items()}  # as the API server hands them to admission (quantities as strings)


def shapes() -> Iterator[tuple[str, dict[str, Any], RequestFacts]]:
    """Every request shape the API server sends for what the objects match (CREATE, UPDATE of
    pods and of pods/ephemeralcontainers), each pod named and from generateName."""
    users = (("alice", ("system:authenticated",)), ("", ()))
    for i, (name, pod) in enumerate(PODS.items()):
        user, groups = users[i % 2]  # with and without a username and groups
        yield f"{name}/CREATE", pod, RequestFacts("team-a", user=user, groups=groups)
        user, groups = users[(i + 1) % 2]
        yield (f"{name}/CREATE-generateName", _unnamed(pod),
               RequestFacts("team-a", user=user, groups=groups))
        yield (f"{name}/CREATE-dryRun", pod, RequestFacts("team-a", dry_run=True, user="bob"))
        yield f"{name}/UPDATE", pod, RequestFacts("team-a", operation="UPDATE", user="bob")
        yield (f"{name}/UPDATE-ephemeralcontainers", _debugged(pod),
               RequestFacts("team-a", operation="UPDATE", user="bob",
                            sub_resource="ephemeralcontainers"))
    yield ("cpu/UPDATE-ephemeralcontainers-again", _debugged(PODS["cpu"]),
           RequestFacts("team-a", operation="UPDATE", sub_resource="ephemeralcontainers",
                        existing_ephemeral=frozenset({"debugger"})))


def _matches(rules: list[dict[str, Any]], facts: RequestFacts) -> bool:
    resource = "pods/" + facts.sub_resource if facts.sub_resource else "pods"
    return any(facts.operation in r.get("operations", []) and resource in r.get("resources", [])
               for r in rules)


def walk(objects: list[dict[str, Any]]) -> list[str]:
    """Every evaluation error of every expression of ``objects`` over :func:`shapes`."""
    errors: list[str] = []
    for ident, pod, facts in shapes():
        activation = activation_of(pod, facts, namespace_labels(facts.namespace))
        cache: dict[str, Any] = {}  # the objects repeat variables: each computed once
        for obj in objects:
            name = f"{obj['kind']} {obj['metadata']['name']}"
            if obj["kind"].endswith("WebhookConfiguration"):
                for hook in obj["webhooks"]:
                    if not _matches(hook["rules"], facts):
                        continue
                    for cond in hook.get("matchConditions") or []:
                        errors += _eval(f"{name}/{hook['name']} matchCondition {cond['name']}",
                                        cond["expression"], activation, ident)
                continue
            if not obj["kind"].endswith("AdmissionPolicy"):
                continue
            spec = obj["spec"]
            if not _matches(spec["matchConstraints"]["resourceRules"], facts):
                continue
            values = Variables(spec, activation, cache)
            act = {**activation, "variables": values}
            named: list[tuple[str, str]] = []
            named += [(f"matchCondition {c['name']}", c["expression"])
                      for c in spec.get("matchConditions") or []]
            named += [(f"variable {v['name']}", f"variables.{v['name']}")
                      for v in spec.get("variables") or []]
            for i, v in enumerate(spec.get("validations") or []):
                named.append((f"validations[{i}]", v["expression"]))
                # the API server evaluates a messageExpression only when its validation fails
                if "messageExpression" in v and not _true(v["expression"], act):
                    named.append((f"validations[{i}].messageExpression", v["messageExpression"]))
            named += [(f"auditAnnotation {a['key']}", a["valueExpression"])
                      for a in spec.get("auditAnnotations") or []]
            named += [(f"mutations[{i}]", m["jsonPatch"]["expression"])
                      for i, m in enumerate(spec.get("mutations") or []) if "jsonPatch" in m]
            for what, expression in named:
                errors += _eval(f"{name} {what}", expression, act, ident)
    return errors


def _true(expression: str, activation: dict[str, Any]) -> bool:
    try:
        return bool(run(expression, activation))
    except CelError:
        return True  # reported by the walk itself


def _eval(where: str, expression: str, activation: dict[str, Any], ident: str) -> list[str]:
    try:
        run(expression, activation)
    except CelError as exc:
        return [f"{ident}: {where}: {exc}"]
    return []


def every_rule_in(mode: str) -> Policy:
    doc = modes_policy().model_dump(mode="json", by_alias=True)
    doc["spec"]["rules"] = dict.fromkeys(RULE_IDS, mode)
    doc["metadata"]["name"] = f"all-{mode}"
    return policy_from_dict(doc)


def _shipped_guard() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(GUARD_YAML.read_text()) if d]


def _kustomize_webhooks() -> list[dict[str, Any]]:
    """The base install's webhook configurations, and the fallback component's patches
    applied (its matchConditions are the ones walked)."""
    base = [d for d in yaml.safe_load_all(
        (ROOT / "webhook-manifests" / "base" / "webhooks.yaml").read_text()) if d] \
        if (ROOT / "webhook-manifests" / "base" / "webhooks.yaml").exists() else []
    component = yaml.safe_load((ROOT / "webhook-manifests" / "components" /
                                "webhook-guard-fallback" / "kustomization.yaml").read_text())
    hooks: list[dict[str, Any]] = []
    for patch in component.get("patches") or []:
        for op in yaml.safe_load(patch["patch"]) or []:
            if isinstance(op, dict) and op.get("path", "").endswith("matchConditions"):
                hooks.append({"name": f"fallback {patch['target']['kind']}",
                              "rules": [{"operations": ["CREATE", "UPDATE"],
                                         "resources": ["pods", "pods/ephemeralcontainers"]}],
                              "matchConditions": op["value"]})
    assert hooks, "the fallback component patches the webhooks' matchConditions"
    return [*[d for d in base if d.get("kind", "").endswith("WebhookConfiguration")],
            {"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "fallback"},
             "webhooks": hooks}]


OBJECT_SETS: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "built-in": lambda: compile_policy(default_policy(), partial=True).objects,
    "built-in-guard": lambda: compile_guard(default_policy()).objects,
    "shipped-guard-policies.yaml": _shipped_guard,
    "every-rule-enforce": lambda: compile_policy(every_rule_in("enforce"), partial=True).objects,
    "every-rule-warn": lambda: compile_policy(every_rule_in("warn"), partial=True).objects,
    "every-rule-audit": lambda: compile_policy(every_rule_in("audit"), partial=True).objects,
    "every-rule-guard-warn": lambda: compile_guard(every_rule_in("warn")).objects,
    "every-rule-guard-audit": lambda: compile_guard(every_rule_in("audit")).objects,
    "kustomize-webhooks": _kustomize_webhooks,
    "chart": lambda: _chart(None),
    "chart-every-rule-warn-webhook-guard": lambda: _chart(
        {"policy": {"spec": {"rules": dict.fromkeys(RULE_IDS, "warn")}},
         "webhook": {"guard": "webhook"}}),
}


def _chart(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The chart's admission objects as Helm renders them for a 1.36 API server (its guard
    policies and its webhook configurations' matchConditions)."""
    from tests.chart_support import render_chart  # noqa: PLC0415 - needs the Helm SDK

    docs = [d for d in render_chart(values) if d.get("kind", "").endswith(
        ("AdmissionPolicy", "WebhookConfiguration"))]
    assert docs
    return docs


@pytest.mark.parametrize("name", list(OBJECT_SETS))
def test_no_expression_errors_on_any_request_shape(name: str) -> None:
    errors = walk(OBJECT_SETS[name]())
    assert not errors, f"{len(errors)} evaluation errors, first:\n" + "\n".join(errors[:10])


def test_partial_compile_keeps_the_webhook_configurations() -> None:
    """What a partial compile writes for the webhook is walked too (its matchConditions)."""
    from gpu_admission.compile.cli import webhook_objects  # noqa: PLC0415

    result = compile_policy(every_rule_in("enforce"), partial=True)
    objects = webhook_objects(every_rule_in("enforce"), result.stays) if result.stays else []
    assert not walk(objects)


# --------------------------------------------------------------------------- the issue's table
@pytest.mark.parametrize(("pod", "allowed", "message"), [
    pytest.param("cpu", True, "", id="plain-container"),
    pytest.param("hostpath-var-log", True, "", id="hostpath-var-log"),
    pytest.param("hostpath-dev-nvidia0", False, "/dev/nvidia0", id="hostpath-dev-nvidia0"),
    pytest.param("visible-devices-all", False, "NVIDIA_VISIBLE_DEVICES", id="visible-all"),
])
@pytest.mark.parametrize("named", [True, False], ids=["named", "generateName"])
def test_issue_table_through_the_shipped_guard(pod: str, allowed: bool, message: str,
                                               named: bool) -> None:
    """The shipped guard half (webhook-manifests/base/guard-policies.yaml) on a pod without a
    GPU request, through the API server's steps with its ``request``: the guard's own answer,
    never a CEL error."""
    subject = PODS[pod] if named else _unnamed(PODS[pod])
    outcome = admit(_shipped_guard(), subject, RequestFacts("team-a", user="alice"))
    assert outcome.decision.allowed is allowed, outcome.denial
    if allowed:
        voids = [op for op in outcome.decision.patch if "void" in str(op.get("value"))]
        assert voids, outcome.decision.patch
    else:
        assert "ValidatingAdmissionPolicy 'guard-enforce.gpu-admission.io'" in outcome.denial
        assert message in outcome.denial


@pytest.mark.parametrize("pod", [p for p in PODS if p.startswith("gpu-")])
@pytest.mark.parametrize("named", [True, False], ids=["named", "generateName"])
def test_partial_compile_admits_gpu_pods(pod: str, named: bool) -> None:
    """``compile`` (what runs in the API server) of the built-in policy on GPU pods: the
    MutatingAdmissionPolicy answers (a patch) instead of a CEL error."""
    subject = PODS[pod] if named else _unnamed(PODS[pod])
    outcome = admit(compile_policy(default_policy(), partial=True).objects, subject,
                    RequestFacts("team-a", user="alice"))
    assert outcome.decision.gpu
    assert outcome.decision.allowed or outcome.decision.violations, outcome.denial


def test_issue_table_through_evaluate_compiled(tmp_path: Path) -> None:
    """The same table as a user runs it: ``gpu-admission evaluate --compiled`` on the pods
    (the compiled policies evaluated offline with the API server's ``request``) answers like
    the webhook (``evaluate``), row by row, with no CEL error."""
    from click.testing import CliRunner  # noqa: PLC0415

    from gpu_admission.cli import main  # noqa: PLC0415

    rows = ["cpu", "hostpath-var-log", "hostpath-dev-nvidia0", "visible-devices-all",
            "gpu-inference"]
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump_all([{**PODS[r], "metadata": {"name": r,
                                                                 "namespace": "team-a"}}
                                        for r in rows]))
    args = ["evaluate", "-o", "json", "-f", str(path)]
    engine = CliRunner().invoke(main, args)
    compiled = CliRunner().invoke(main, [*args, "--compiled"])
    assert "resulted in error" not in compiled.output and "no such" not in compiled.output
    got = [json.loads(line) for line in compiled.stdout.splitlines()]
    want = [json.loads(line) for line in engine.stdout.splitlines()]
    for row in (*got, *want):  # each face's own word on the pools it assumed (issue 33)
        row.pop("placement")
    assert got == want
    assert [d["allowed"] for d in got] == [True, True, False, False, True]
