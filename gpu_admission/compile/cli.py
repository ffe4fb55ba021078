"""``gpu-admission compile``: the policy as MutatingAdmissionPolicy + ValidatingAdmissionPolicies.

Exit codes: 0 written; 1 the policy has rules CEL cannot express (the message names each rule
and policy field; ``--partial`` compiles the rest); 2 unusable input (policy file, output path).
With ``--partial`` the output also holds what keeps the other rules working: the webhook's
policy ConfigMap (the same policy) and webhook configurations whose ``matchConditions`` send
the webhook only the pods those rules concern (every pod when a rule concerns every pod).
docs/compile.md has the whole story.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from gpu_admission.policy.model import Policy, PolicyError, default_policy, load_policy

from .compiler import CompileFailure, compile_policy, webhook_policy
from .render import dump, render
from .units import WebhookOnly

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


@click.command(name="compile")
@click.option("--policy", "policy_path", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="GPUSharingPolicy file (default: the built-in policy).")
@click.option("-o", "--output", default="-", show_default=True, metavar="FILE|-",
              help="Where to write the YAML stream ('-': stdout).")
@click.option("--partial", is_flag=True,
              help="Compile what CEL can express; keep the other rules with the webhook "
                   "(also writes its scoped configuration).")
def compile_command(*, policy_path: Path | None, output: str, partial: bool) -> None:
    """Compile the policy into MutatingAdmissionPolicy + ValidatingAdmissionPolicies
    (Kubernetes >= 1.36): the same decisions, made inside the API server."""
    try:
        policy = load_policy(policy_path) if policy_path else default_policy()
    except PolicyError as exc:
        raise InputError(f"policy: {exc}") from None
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
    text = render(policy, objects, comments, result.stays)
    if output == "-":
        click.echo(text, nl=False)
    else:
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise InputError(f"{output}: cannot write: {exc.strerror or exc}") from None
    if result.stays:
        click.echo("rules that stay with the webhook:", err=True)
        for rule, stay in result.stays.items():
            click.echo(f"  {rule}: {stay.field}: {stay.why}", err=True)
    sys.exit(0)
