"""``gpu-admission compile``: the policy as MutatingAdmissionPolicy + ValidatingAdmissionPolicies.

Exit codes: 0 written; 1 with ``--strict``, the policy has rules CEL cannot express (the message
names each rule and policy field), or a policy whose fractional pools need the webhook; 2
unusable input (policy file, output path). Without ``--strict`` (issue 33) the rules CEL cannot
express stay with the webhook, named on stderr, and the output also holds what keeps them
working: the webhook's
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

from gpu_admission.cli.options import aliases
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


#: The API server's per-policy evaluation counters (k8s.io/apiserver v0.36.3
#: ``pkg/admission/plugin/policy/{validating,mutating}/metrics/metrics.go``: namespace
#: ``apiserver``, subsystem ``validating_admission_policy``/``mutating_admission_policy``, name
#: ``check_total``; labels ``policy``, ``policy_binding``, ``error_type`` and, for VAPs,
#: ``enforcement_action``). ``error_type`` is ``no_error`` or, from ``metrics/errors.go``
#: ``ErrorType``, ``compile_error``, ``invalid_error`` (an expression that failed at run time:
#: ``no such key``) or ``out_of_budget``.
CHECK_METRICS = {"ValidatingAdmissionPolicy": "apiserver_validating_admission_policy_check_total",
                 "MutatingAdmissionPolicy": "apiserver_mutating_admission_policy_check_total"}


def _get(client: Any, path: str, accept: str) -> bytes:
    """GET ``path`` through the API server with the real ``kubernetes`` client (its
    credentials, TLS and proxy settings); an error names the path."""
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415 - I/O, CLI only
    from urllib3.exceptions import HTTPError  # noqa: PLC0415

    try:
        request = client.param_serialize(
            method="GET", resource_path=path, auth_settings=["BearerToken"],
            header_params={"Accept": accept})
        response = client.call_api(*request, _request_timeout=30)
        response.read()
    except (ApiException, HTTPError, OSError, ValueError) as exc:
        reason = getattr(exc, "status", None) or exc
        raise InputError(f"GET {path}: {reason}") from None
    if not 200 <= response.status < 300:
        hint = (" (reading the API server's metrics needs `get` on the non-resource URL "
                "/metrics, e.g. ClusterRole system:monitoring)"
                if path == "/metrics" and response.status == 403 else "")
        raise InputError(f"GET {path}: HTTP {response.status}{hint}")
    return bytes(response.data or b"")


def _list_policies(client: Any) -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for kind, plural in _POLICY_PATHS.items():
        path = f"/apis/admissionregistration.k8s.io/v1/{plural}"
        try:
            body = json.loads(_get(client, path, "application/json") or b"{}")
        except ValueError:
            raise InputError(f"GET {path}: not JSON") from None
        for item in (body or {}).get("items") or []:
            meta = item.get("metadata") or {}
            found[(kind, str(meta.get("name")))] = item
    return found


def evaluation_errors(text: str) -> dict[tuple[str, str], dict[str, int]]:
    """(kind, policy) -> error_type -> count, from the API server's ``/metrics`` text: every
    ``check_total`` sample whose ``error_type`` is not ``no_error`` and whose count is above
    zero (the Prometheus text format, parsed with prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    kinds = {name: kind for kind, name in CHECK_METRICS.items()}
    out: dict[tuple[str, str], dict[str, int]] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise InputError(f"GET /metrics: not the Prometheus text format: {exc}") from None
    for family in families:
        for sample in family.samples:  # by the sample's own name, whatever the family
            kind = kinds.get(sample.name)
            error = sample.labels.get("error_type", "")
            if kind is None or error in ("", "no_error") or sample.value <= 0:
                continue
            per = out.setdefault((kind, sample.labels.get("policy", "")), {})
            per[error] = per.get(error, 0) + int(sample.value)
    return out


def _health(client: Any, found: dict[tuple[str, str], dict[str, Any]],
            names: set[tuple[str, str]]) -> int:
    """Report the policies ``names`` (that exist in ``found``) whose ``status.typeChecking``
    lists warnings (k8s.io/api ``admissionregistration/v1`` ``TypeChecking.expressionWarnings``
    ``{fieldRef, warning}``; only VAPs have a status) or whose evaluations errored
    (:data:`CHECK_METRICS`, read from ``/metrics`` through the API server: the counts since
    that API server instance started). Returns how many problems were printed."""
    problems = 0
    for key in sorted(names & set(found)):
        kind, name = key
        status = found[key].get("status") or {}
        warnings = ((status.get("typeChecking") or {}).get("expressionWarnings")) or []
        for warning in warnings:
            text = " ".join(str(warning.get("warning", "")).split())
            click.echo(f"{kind} {name}: type checking: {warning.get('fieldRef', '?')}: {text}")
            problems += 1
    errors = evaluation_errors(_get(client, "/metrics", "text/plain").decode(
        "utf-8", "replace"))
    for kind, name in sorted(names & set(errors)):
        counts = ", ".join(f"{err} {n}" for err, n in sorted(errors[(kind, name)].items()))
        click.echo(f"{kind} {name}: evaluations failed ({counts}; "
                   f"{CHECK_METRICS[kind]} since the API server started): see its logs, "
                   "or `kubectl create --dry-run=server` a pod to see the error")
        problems += 1
    return problems


def _check_cluster(policy: Policy, kubeconfig: Path | None, context: str | None,
                   *, guard: bool) -> int:
    """``compile --check``: the compiled policies installed in the cluster, read through the
    real ``kubernetes`` client. With ``guard``: drift between ``policy`` and the guard half
    (every guard policy present, with this policy's guard digest: an apply or ``helm upgrade``
    from another policy leaves another digest). Always: the health of every gpu-admission
    admission policy present (:func:`_health`)."""
    from gpu_admission.certs.install import InstallError, api_client  # noqa: PLC0415

    try:
        client = api_client(kubeconfig, context)
    except InstallError as exc:
        raise InputError(str(exc)) from None
    with client:
        found = _list_policies(client)
        ours = {key for key, item in found.items()
                if ((item.get("metadata") or {}).get("labels") or {}).get(
                    "app.kubernetes.io/name") == "gpu-admission"}
        drift = _drift(policy, found) if guard else 0
        problems = _health(client, found, ours)
    if not guard and not ours:
        click.echo("no gpu-admission admission policies in the cluster")
    elif not problems and not guard:
        click.echo(f"{len(ours)} gpu-admission admission policies: no type-checking warnings, "
                   "no failed evaluations")
    return 1 if drift or problems else 0


def _drift(policy: Policy, objects: dict[tuple[str, str], dict[str, Any]]) -> int:
    want = {(o["kind"], o["metadata"]["name"]) for o in compile_guard(policy).objects
            if o["kind"] in _POLICY_PATHS}
    digest = guard_digest(policy)
    found = {key: str((((item.get("metadata") or {}).get("annotations")) or {}).get(
        DIGEST_ANNOTATION, "")) for key, item in objects.items()}
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
    return drift


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
@click.option("--partial", is_flag=True, hidden=True,
              help="The default (kept for scripts): compile what CEL can express.")
@click.option("--strict", is_flag=True,
              help="Fail (exit 1) when a rule cannot run in the API server, instead of "
                   "keeping it with the webhook.")
@click.option("--guard", "guard", is_flag=True,
              help="Only the guard half: the GPU-access guard for pods without a GPU or DRA "
                   "resource, as the default install runs it next to the webhook "
                   "(webhook-manifests/base/guard-policies.yaml).")
@click.option("--helm-template", is_flag=True, hidden=True,
              help="With --guard: the chart's template (charts/gpu-admission/files/).")
@click.option("--check", is_flag=True,
              help="Report installed gpu-admission admission policies with type-checking "
                   "warnings or failed evaluations (API server /metrics); with --guard also "
                   "drift from this policy's guard. Exit 1 on any.")
@click.option("--kubeconfig", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="With --check: kubeconfig (default: $KUBECONFIG, ~/.kube/config, "
                   "then in-cluster).")
@click.option("--context", default=None, help="With --check: kubeconfig context.")
def compile_command(*, policy_path: Path | None, output: str, partial: bool, strict: bool,
                    guard: bool, helm_template: bool, check: bool, kubeconfig: Path | None,
                    context: str | None) -> None:
    """Compile the policy into MutatingAdmissionPolicy + ValidatingAdmissionPolicies
    (Kubernetes >= 1.36): the same decisions, made inside the API server."""
    try:
        policy = load_policy(policy_path) if policy_path else default_policy()
    except PolicyError as exc:
        raise InputError(f"policy: {exc}") from None
    if helm_template and not guard:
        raise click.UsageError("--helm-template needs --guard")
    if partial and strict:
        raise click.UsageError("--partial and --strict contradict each other")
    if check:
        sys.exit(_check_cluster(policy, kubeconfig, context, guard=guard))
    if guard:
        _write(output, render_guard(policy, helm=helm_template))
        sys.exit(0)
    try:
        result = compile_policy(policy, partial=not strict)
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
        click.echo("compiled what runs in the API server; these rules stay with the webhook "
                   "(its scoped configuration is in the output; --strict fails instead):",
                   err=True)
        for rule, stay in result.stays.items():
            click.echo(f"  {rule}: {stay.field}: {stay.why}", err=True)
    sys.exit(0)
