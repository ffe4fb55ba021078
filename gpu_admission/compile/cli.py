"""``gpu-admission compile``: the policy as MutatingAdmissionPolicy + ValidatingAdmissionPolicies.

Exit codes: 0 written; 1 the policy has rules CEL cannot express (the message names each rule
and policy field; ``--partial`` compiles the rest); 2 unusable input (policy file, output path).
With ``--partial`` the output also holds what keeps the other rules working: the webhook's
policy ConfigMap (the same policy) and webhook configurations whose ``matchConditions`` send
the webhook only the pods those rules concern (every pod when a rule concerns every pod).
docs/compile.md has the whole story.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from gpu_admission.cli_options import aliases
from gpu_admission.policy.model import Policy, PolicyError, default_policy, load_policy

from .compiler import CompileFailure, compile_policy, webhook_policy
from .guard import (
    DIGEST_ANNOTATION,
    MAP_NAME,
    VAP_NAMES,
    compile_guard,
    guard_digest,
    render_guard,
)
from .render import dump, render
from .rules import WebhookOnly

WEBHOOK_NAMESPACE = "gpu-admission"
WEBHOOK_LABELS = {"app.kubernetes.io/name": "gpu-admission",
                  "app.kubernetes.io/component": "webhook"}


class InputError(click.ClickException):
    exit_code = 2


def webhook_objects(policy: Policy, stays: dict[str, WebhookOnly]) -> list[dict[str, Any]]:
    """The webhook side of a partial compile: its policy and configurations scoped to the
    pods the remaining rules concern (same service, paths and settings as
    webhook-manifests/base)."""
    pods = list(dict.fromkeys(s.pods for s in stays.values()))
    conditions = []
    if None not in pods:
        conditions.append({"name": "kept-by-the-webhook",
                           "expression": " || ".join(f"({p})" for p in pods if p)})
    configmap = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "gpu-admission-policy", "namespace": WEBHOOK_NAMESPACE,
                     "labels": dict(WEBHOOK_LABELS)},
        "data": {"policy.yaml": dump(webhook_policy(policy, stays))}}
    out: list[dict[str, Any]] = [configmap]
    for kind, hook, path, operations in (
            ("MutatingWebhookConfiguration", "mutate.gpu-admission.io", "/mutate", ["CREATE"]),
            ("ValidatingWebhookConfiguration", "validate.gpu-admission.io", "/validate",
             ["CREATE", "UPDATE"])):
        webhook = _webhook(hook, path, {"apiGroups": [""], "apiVersions": ["v1"],
                                        "operations": operations, "resources": ["pods"],
                                        "scope": "Namespaced"},
                           reinvoke=kind.startswith("Mutating"))
        webhook["rules"].append({"apiGroups": [""], "apiVersions": ["v1"],
                                 "operations": ["UPDATE"],
                                 "resources": ["pods/ephemeralcontainers"], "scope": "Namespaced"})
        if conditions:
            webhook["matchConditions"] = conditions
        webhooks = [webhook]
        if kind.startswith("Validating"):
            # The claims webhook of the base install, unchanged: CEL cannot judge a
            # ResourceClaim's sharing either, and an apply without it would drop it.
            claims = _webhook(CLAIMS_HOOK, "/validate", {
                "apiGroups": ["resource.k8s.io"], "apiVersions": ["v1", "v1beta2", "v1beta1"],
                "operations": ["CREATE"],
                "resources": ["resourceclaims", "resourceclaimtemplates"],
                "scope": "Namespaced"}, reinvoke=False)
            claims["matchConditions"] = [{
                "name": "not-an-extended-resource-claim",
                "expression": "!has(object.metadata.annotations) ||\n  !('resource.kubernetes.io/"
                              "extended-resource-claim' in object.metadata.annotations)\n"}]
            webhooks.append(claims)
        out.append({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                    "metadata": {"name": "gpu-admission", "labels": dict(WEBHOOK_LABELS)},
                    "webhooks": webhooks})
    return out


CLAIMS_HOOK = "validate-claims.gpu-admission.io"


_POLICY_PATHS = {"MutatingAdmissionPolicy": "mutatingadmissionpolicies",
                 "ValidatingAdmissionPolicy": "validatingadmissionpolicies"}


def _check_guard(policy: Policy, kubeconfig: Path | None, context: str | None) -> int:
    """Drift between ``policy`` and the guard half installed in the cluster: every guard policy
    present, with this policy's guard digest (an apply or ``helm upgrade`` from another policy
    leaves another digest). Lists through the real ``kubernetes`` client."""
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415 - I/O, CLI only
    from urllib3.exceptions import HTTPError  # noqa: PLC0415

    from gpu_admission.install_certs import InstallError, api_client  # noqa: PLC0415

    want = {(o["kind"], o["metadata"]["name"]) for o in compile_guard(policy).objects
            if o["kind"] in _POLICY_PATHS}
    digest = guard_digest(policy)
    try:
        client = api_client(kubeconfig, context)
    except InstallError as exc:
        raise InputError(str(exc)) from None
    found: dict[tuple[str, str], str] = {}
    with client:
        for kind, plural in _POLICY_PATHS.items():
            path = f"/apis/admissionregistration.k8s.io/v1/{plural}"
            try:
                request = client.param_serialize(
                    method="GET", resource_path=path, auth_settings=["BearerToken"],
                    header_params={"Accept": "application/json"})
                response = client.call_api(*request, _request_timeout=30)
                response.read()  # type: ignore[no-untyped-call]
                if not 200 <= response.status < 300:
                    raise InputError(f"GET {path}: HTTP {response.status}")
                body = json.loads(response.data or b"{}")
            except (ApiException, HTTPError, OSError, ValueError) as exc:
                reason = getattr(exc, "status", None) or exc
                raise InputError(f"GET {path}: {reason}") from None
            for item in (body or {}).get("items") or []:
                meta = item.get("metadata") or {}
                found[(kind, str(meta.get("name")))] = str(
                    (meta.get("annotations") or {}).get(DIGEST_ANNOTATION, ""))
    drift = 0
    for kind, name in sorted(want):
        live = found.get((kind, name))
        if live is None:
            click.echo(f"{kind} {name}: missing (the guard is not in the API server: apply "
                       "`gpu-admission compile --guard` or the webhook fallback)")
            drift += 1
        elif live != digest:
            click.echo(f"{kind} {name}: guard digest {live or '(none)'}, the policy's is "
                       f"{digest}: compile and apply again")
            drift += 1
        else:
            click.echo(f"{kind} {name}: in step ({digest})")
    # a guard policy this policy no longer has (the deny or warn policy exists only while a
    # guard rule is in its mode): `kubectl apply` without --prune leaves it running
    guard_names = {MAP_NAME, *VAP_NAMES.values()}
    for kind, name in sorted(set(found) - want):
        if name in guard_names:
            click.echo(f"{kind} {name}: not part of this policy's guard (no guard rule in its "
                       "mode): delete it with its binding")
            drift += 1
    return 1 if drift else 0


def _write(output: str, text: str) -> None:
    if output == "-":
        click.echo(text, nl=False)
        return
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{output}: cannot write: {exc.strerror or exc}") from None


def _webhook(name: str, path: str, rule: dict[str, Any], *, reinvoke: bool) -> dict[str, Any]:
    """One webhook as webhook-manifests/base writes it (service, settings, namespaceSelector)."""
    webhook: dict[str, Any] = {
        "name": name,
        "clientConfig": {"service": {"name": "gpu-admission", "namespace": WEBHOOK_NAMESPACE,
                                     "path": path, "port": 443}},
        "rules": [rule],
    }
    if reinvoke:
        webhook["reinvocationPolicy"] = "IfNeeded"
    webhook.update({
        "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
        "timeoutSeconds": 5, "matchPolicy": "Equivalent",
        "namespaceSelector": {"matchExpressions": [
            {"key": "gpu-admission.io/enabled", "operator": "In", "values": ["true"]},
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
             "values": ["kube-system", WEBHOOK_NAMESPACE]}]}})
    return webhook


@click.command(name="compile", short_help="Compile the policy into admission policies.")
@click.option("--policy", "policy_path", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="GPUSharingPolicy file (default: the built-in policy).")
@aliases("output", "--out", "-o", "--output")
@click.option("--out", "output", default="-", show_default=True, metavar="FILE|-",
              help="Where to write the YAML stream ('-': stdout).")
@click.option("--partial", is_flag=True,
              help="Compile what CEL can express; keep the other rules with the webhook "
                   "(also writes its scoped configuration).")
@click.option("--guard", "guard", is_flag=True,
              help="Only the guard half: the GPU-access guard for pods without a GPU or DRA "
                   "resource, as the default install runs it next to the webhook "
                   "(webhook-manifests/base/guard-policies.yaml).")
@click.option("--helm-template", is_flag=True, hidden=True,
              help="With --guard: the chart's template (charts/gpu-admission/files/).")
@click.option("--check", is_flag=True,
              help="With --guard: compare the guard objects installed in the cluster with "
                   "this policy's (names and gpu-admission.io/guard-digest); exit 1 on drift.")
@click.option("--kubeconfig", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="With --check: kubeconfig (default: $KUBECONFIG, ~/.kube/config, "
                   "then in-cluster).")
@click.option("--context", default=None, help="With --check: kubeconfig context.")
def compile_command(*, policy_path: Path | None, output: str, partial: bool, guard: bool,
                    helm_template: bool, check: bool, kubeconfig: Path | None,
                    context: str | None) -> None:
    """Compile the policy into MutatingAdmissionPolicy + ValidatingAdmissionPolicies
    (Kubernetes >= 1.36): the same decisions, made inside the API server."""
    try:
        policy = load_policy(policy_path) if policy_path else default_policy()
    except PolicyError as exc:
        raise InputError(f"policy: {exc}") from None
    if helm_template and not guard:
        raise click.UsageError("--helm-template needs --guard")
    if check and not guard:
        raise click.UsageError("--check needs --guard")
    if check:
        sys.exit(_check_guard(policy, kubeconfig, context))
    if guard:
        _write(output, render_guard(policy, helm=helm_template))
        sys.exit(0)
    try:
        result = compile_policy(policy, partial=partial)
    except CompileFailure as exc:
        raise click.ClickException(str(exc)) from None
    objects = list(result.objects)
    comments = list(result.comments)
    if result.stays:
        extra = webhook_objects(policy, result.stays)
        objects += extra
        comments += ["The webhook keeps the rules above, with the same policy (it decides "
                     "the pods the compiled policies leave to it).",
                     "The webhook's mutate stage, only for the pods the remaining rules concern.",
                     "The webhook's validate stage, only for the pods the remaining rules "
                     "concern."]
    _write(output, render(policy, objects, comments, result.stays))
    if result.stays:
        click.echo("rules that stay with the webhook:", err=True)
        for rule, stay in result.stays.items():
            click.echo(f"  {rule}: {stay.field}: {stay.why}", err=True)
    sys.exit(0)
