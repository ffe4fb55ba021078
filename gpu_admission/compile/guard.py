"""The guard half: the GPU-access guard (:mod:`gpu_admission.rules.gpu_access`) for the pods the
webhook does not see, compiled into admission policies the API server runs in-process.

Why (issue 21): the guard must see every pod of an opted-in namespace (a CPU pod whose image
bakes in ``NVIDIA_VISIBLE_DEVICES=all`` gets ``void``), so with the webhook alone an outage of
its pods refuses *every* pod there, CPU services included. Split in two halves by one CEL
predicate, :func:`gpu_or_dra_pod` (the webhooks' ``matchConditions``):

* GPU and DRA pods go to the webhook (all rules, the guard included, decided by the engine);
* every other pod meets only the guard, here, as a MutatingAdmissionPolicy (the ``void``
  upserts) and ValidatingAdmissionPolicies (the denials, warnings, audit findings), whose
  ``matchConditions`` are the predicate negated: no pod falls between the halves and none is
  mutated by both (``tests/install/test_guard_split.py`` property-tests it against the engine).

The objects are cheap by construction: no GPU analysis (a pod here has no GPU container), each
container's last ``NVIDIA_VISIBLE_DEVICES`` entry computed once per object (variable
``guardStates``), the validating policies skipped outright when no guard rule is in their mode
(a constant ``matchCondition``) and, for the deny policy, when every container already says
``void``/``none`` and no hostPath is mounted (what the mutating policy leaves on a CPU pod).

Everything the policy decides enters through four values, so the Helm chart can render the same
objects from its policy values (:func:`render_guard` with ``helm=True`` writes the chart's
``files/guard-policies.yaml.tpl``): the three rules' modes (a CEL map literal, JSON as Helm's
``toJson`` writes it), the excluded namespaces, the exempt users and groups, and the
``gpu-admission.io/guard-digest`` annotation (sha256 of the canonical JSON of those inputs,
:func:`guard_inputs`), which ``gpu-admission compile --guard --check`` compares with live objects.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml

from gpu_admission.decision import Mode
from gpu_admission.patch import escape
from gpu_admission.policy.model import Policy
from gpu_admission.rules import gpu_access
from gpu_admission.sharing_systems import HAMI_RESOURCES, KAI_ANNOTATIONS
from gpu_admission.vocab import GPU_MEMORY_RESOURCE, MUTATED_ANNOTATION, NAMESPACE_OPT_IN_LABEL

from .cel import lit, rec, var
from .compiler import (
    ACTIONS,
    ALWAYS_EXCLUDED,
    DOMAIN,
    EPHEMERAL_RESOURCE,
    GROUP,
    LABELS,
    WARN_SLOTS,
    Compiled,
    needed_variables,
    short_warning_cel,
)
from .rules.gpu_access import GuardUnit
from .units import Program

GUARD_RULES = (gpu_access.ISOLATION, gpu_access.VISIBLE_DEVICES, gpu_access.DEVICE_HOSTPATH)
MAP_NAME = f"guard.{DOMAIN}"
VAP_NAMES = {Mode.ENFORCE: f"guard-enforce.{DOMAIN}", Mode.WARN: f"guard-warn.{DOMAIN}",
             Mode.AUDIT: f"guard-audit.{DOMAIN}"}
DIGEST_ANNOTATION = f"{DOMAIN}/guard-digest"
#: Placeholders of the Helm form (render_guard(helm=True)); the chart's helpers fill them.
HELM_MODES = "GUARD_MODES_JSON"
HELM_USERS = "GUARD_EXEMPT_USERS_JSON"
HELM_GROUPS = "GUARD_EXEMPT_GROUPS_JSON"
HELM_NAMESPACES = "GUARD_EXCLUDED_NAMESPACES"
HELM_DIGEST = "GUARD_DIGEST"
HELM_OPT_IN_KEY = "GUARD_OPT_IN_KEY"
HELM_OPT_IN_VALUE = "GUARD_OPT_IN_VALUE"
HELM_INCLUDES = {
    HELM_OPT_IN_KEY: "{{ .Values.webhook.namespaceOptInLabel.key }}",
    HELM_OPT_IN_VALUE: "{{ .Values.webhook.namespaceOptInLabel.value | quote }}",
    HELM_MODES: '{{ include "gpu-admission.guard.modes" . }}',
    HELM_USERS: '{{ include "gpu-admission.guard.users" . }}',
    HELM_GROUPS: '{{ include "gpu-admission.guard.groups" . }}',
    HELM_NAMESPACES: '{{ include "gpu-admission.guard.excludedNamespaces" . }}',
    HELM_DIGEST: '{{ include "gpu-admission.guard.digest" . }}',
}

_GPU_NAMES = ("(r == 'nvidia.com/gpu' || r == 'nvidia.com/gpu.shared' || "
              "r.startsWith('nvidia.com/mig-') || "
              "r.startsWith('deviceclass.resource.kubernetes.io/') || "
              f"r == '{GPU_MEMORY_RESOURCE}' || "
              # HAMi's resources (engine._maybe_other): rule other-sharing-system is the webhook's
              + " || ".join(f"r == '{name}'" for name in HAMI_RESOURCES) + ")")
#: KAI-Scheduler's pod annotations (engine._maybe_other): such pods are the webhook's too.
_KAI = " || ".join(f"'{key}' in object.metadata.annotations" for key in KAI_ANNOTATIONS)


def gpu_or_dra_pod() -> str:
    """The split: a pod naming a GPU resource (``nvidia.com/gpu``, ``nvidia.com/gpu.shared``,
    ``nvidia.com/mig-*``, the fractional pools' ``gpu-admission.io/gpu-memory``, HAMi's
    ``nvidia.com/gpumem*``/``gpucores``) or a DRA one (``deviceclass.resource.kubernetes.io/*``,
    any ``spec.resourceClaims``) in a container or init container, whatever the quantity, or
    KAI-Scheduler's ``gpu-fraction``/``gpu-memory`` annotation (other sharing systems are
    judged by the webhook, rule ``other-sharing-system``). A
    superset of the engine's GPU pods (a zero quantity goes to the webhook, which decides it
    as a non-GPU pod), so the guard half never sees a pod the engine treats as a GPU pod.
    Every access is guarded with ``has()`` (an error under ``Fail`` would refuse the pod)."""
    per_kind = []
    for kind in ("containers", "initContainers"):
        lst = f"object.spec.{kind}"
        keys = " ||\n      ".join(
            f"(has(c.resources.{key}) && c.resources.{key}.exists(r, {_GPU_NAMES}))"
            for key in ("limits", "requests"))
        per_kind.append(f"(has({lst}) && {lst}.exists(c, has(c.resources) && (\n      "
                        f"{keys})))")
    return ("has(object.spec) && (\n  (has(object.spec.resourceClaims) && "
            "size(object.spec.resourceClaims) > 0) ||\n  "
            f"(has(object.metadata.annotations) && ({_KAI})) ||\n  "
            + " ||\n  ".join(per_kind) + ")")


def guard_inputs(policy: Policy) -> dict[str, Any]:
    """What the guard half depends on: the three rules' modes, the exemptions, and the
    namespaces never matched. Its canonical JSON (sorted keys, no spaces: Helm's ``toJson``)
    hashes to the guard digest."""
    modes = policy.compiled.modes
    exemptions = policy.spec.exemptions
    return {"modes": {rule: str(modes[rule]) for rule in sorted(GUARD_RULES)},
            "excludedNamespaces": sorted(set(ALWAYS_EXCLUDED) | set(exemptions.namespaces)),
            "users": sorted(set(exemptions.users)), "groups": sorted(set(exemptions.groups))}


def canonical_json(value: Any) -> str:
    """JSON as Go's ``encoding/json`` (Helm's ``toJson``) writes it: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def guard_digest(policy: Policy) -> str:
    text = canonical_json(guard_inputs(policy))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _metadata(name: str, digest: str) -> dict[str, Any]:
    return {"name": name, "labels": {**LABELS, "app.kubernetes.io/component": "compiled-guard"},
            "annotations": {DIGEST_ANNOTATION: digest}}


def _program(policy: Policy, modes_literal: str) -> Program:
    """The guard's variables: GuardUnit (no GPU analysis, modes read from ``variables.modes``)
    and the per-mode lists, the patch and the audit record."""
    prog = Program()
    prog.add("modes", modes_literal, "rule id -> mode of the three guard rules (the policy's)")
    GuardUnit(gpu=False, modes=var("modes")).emit(policy, prog)
    modes = var("modes")
    prog.add("violations", var("guardViolations"), "every violation, in the engine's order")
    for mode, name in ((Mode.ENFORCE, "denials"), (Mode.WARN, "warns"), (Mode.AUDIT, "audits")):
        prog.add(name, f"{var('violations')}.filter(v, {modes}[v.rule] == {lit(str(mode))})",
                 f"the guard's violations in {mode} mode")
    prog.add("warnings", f"{var('warns')}.map(v, {short_warning_cel('v')}).distinct()",
             "engine.short_warning per warn-mode violation, duplicates dropped")
    ann = "object.metadata.annotations"
    key = lit(MUTATED_ANNOTATION)
    prog.add("mutatedBefore", f"has({ann}) && {key} in {ann} ? {ann}[{key}] : \"\"")
    prog.add("mutatedValue",
             f'(["env"] + {var("mutatedBefore")}.split(",").filter(k, k != ""))'
             '.distinct().sort().join(",")',
             "engine._annotation_value: the env kind merged with the old value")
    add_map = rec(op=lit("add"), path=lit("/metadata/annotations"),
                  value="{" + key + ": " + var("mutatedValue") + "}")
    add_key = rec(op=lit("add"), path=lit("/metadata/annotations/" + escape(MUTATED_ANNOTATION)),
                  value=var("mutatedValue"))
    ops = var("guardOps")
    prog.add("patch",
             f"size({var('denials')}) > 0 || size({ops}) == 0 ? []\n"
             f"  : {var('ephemeral')} ? {ops}\n"
             f"  : !has({ann}) ? {ops} + [{add_map}]\n"
             f"  : {var('mutatedValue')} != {var('mutatedBefore')} || !({key} in {ann}) "
             f"? {ops} + [{add_key}]\n"
             f"  : {ops}",
             "the void upserts and the gpu-admission.io/mutated annotation (none on an "
             "ephemeral-container UPDATE: the subresource keeps only the containers); nothing "
             "when an enforce-mode guard rule denies")
    prog.add("auditRecord",
             rec(decision=f'size({var("denials")}) > 0 ? "denied" : "allowed"',
                 violations=f'{var("violations")}.map(v, v.rule + "=" + {modes}[v.rule])'
                            '.join(",")',
                 warnings=f'size({var("warnings")}) > 0 ? string(size({var("warnings")})) '
                          ': ""'),
             "the webhook's audit annotations for a pod without a GPU")
    return prog


def _needed(prog: Program, expressions: list[str]) -> list[dict[str, str]]:
    return needed_variables(prog.variables, expressions)


def compile_guard(policy: Policy, *, helm: bool = False) -> Compiled:
    """The guard half for ``policy``: a MutatingAdmissionPolicy and three
    ValidatingAdmissionPolicies (deny, warn, audit) with their bindings. ``helm``: write the
    policy-dependent values as placeholders for the chart (:data:`HELM_INCLUDES`)."""
    inputs = guard_inputs(policy)
    modes_literal = HELM_MODES if helm else canonical_json(inputs["modes"])
    users = HELM_USERS if helm else canonical_json(inputs["users"])
    groups = HELM_GROUPS if helm else canonical_json(inputs["groups"])
    excluded: list[str] | str = HELM_NAMESPACES if helm else inputs["excludedNamespaces"]
    digest = HELM_DIGEST if helm else guard_digest(policy)
    prog = _program(policy, modes_literal)
    conditions = [
        {"name": "not-a-gpu-or-dra-pod", "expression": f"!({gpu_or_dra_pod()})"},
        {"name": "not-exempt-user", "expression": f"!(request.userInfo.username in {users})"},
        {"name": "not-exempt-group",
         "expression": "!(has(request.userInfo.groups) && "
                       f"request.userInfo.groups.exists(g, g in {groups}))"}]
    constraints = {
        "resourceRules": [
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
             "resources": ["pods"], "scope": "Namespaced"},
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
             "resources": [EPHEMERAL_RESOURCE], "scope": "Namespaced"}],
        "matchPolicy": "Equivalent",
        "namespaceSelector": {"matchExpressions": [
            {"key": HELM_OPT_IN_KEY if helm else NAMESPACE_OPT_IN_LABEL, "operator": "In",
             "values": [HELM_OPT_IN_VALUE if helm else "true"]},
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": excluded}]}}
    mutate = f"{var('patch')}.map(o, JSONPatch{{op: o.op, path: o.path, value: o.value}})"
    objects: list[dict[str, Any]] = [{
        "apiVersion": GROUP, "kind": "MutatingAdmissionPolicy",
        "metadata": _metadata(MAP_NAME, digest),
        "spec": {"failurePolicy": "Fail", "reinvocationPolicy": "IfNeeded",
                 "matchConstraints": constraints, "matchConditions": conditions,
                 "variables": _needed(prog, [mutate]),
                 "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": mutate}}]}},
        _binding("MutatingAdmissionPolicy", MAP_NAME, digest, None)]
    comments = ["The GPU-access guard for pods without a GPU or DRA resource (the webhook "
                "decides those): NVIDIA_VISIBLE_DEVICES=void on every container that lacks it, "
                "on CREATE and for ephemeral containers kubectl debug adds.",
                "Binds the guard's mutating policy."]
    # A pod the mutating policy left clean (every container void/none, no hostPath) cannot
    # violate an enforce rule: the deny policy skips it with one cheap condition.
    clean = _clean_pod()
    for mode in (Mode.ENFORCE, Mode.WARN, Mode.AUDIT):
        name = VAP_NAMES[mode]
        in_mode = f"{modes_literal}.exists(r, {modes_literal}[r] == {lit(str(mode))})"
        vap_conditions = list(conditions)
        if mode is not Mode.AUDIT:  # the audit policy also writes the audit annotations
            vap_conditions.append({"name": f"a-guard-rule-in-{mode}-mode", "expression": in_mode})
        if mode is Mode.ENFORCE:
            vap_conditions.append({"name": "not-already-clean", "expression": f"!({clean})"})
        validations: list[dict[str, str]] = []
        notes: list[dict[str, str]] = []
        if mode is Mode.ENFORCE:
            validations.append({
                "expression": f"size({var('denials')}) == 0",
                "messageExpression": f'{var("denials")}.map(v, "[" + v.rule + "] " + v.path + '
                                     '": " + v.message).join("; ")',
                "message": "denied by the GPU sharing policy (gpu-admission)",
                "reason": "Forbidden"})
        elif mode is Mode.WARN:
            warnings = var("warnings")
            for i in range(WARN_SLOTS):
                last = i == WARN_SLOTS - 1
                validations.append({
                    "expression": f"size({warnings}) <= {i}",
                    "messageExpression": (f'{warnings}.slice({i}, size({warnings})).join("; ")'
                                          if last else f"{warnings}[{i}]"),
                    "message": "GPU sharing policy warning (gpu-admission)"})
        else:
            validations.append({
                "expression": f"size({var('audits')}) == 0",
                "messageExpression": f'{var("audits")}.map(v, "[" + v.rule + "] " + v.path + '
                                     '": " + v.message).join("; ")',
                "message": "GPU sharing policy audit finding (gpu-admission)"})
            notes = [{"key": key, "valueExpression": f"string({var('auditRecord')}[{lit(key)}])"}
                     for key in ("decision", "violations", "warnings")]
        exprs = [e for v in validations for k, e in v.items() if k.endswith("xpression")]
        exprs += [n["valueExpression"] for n in notes]
        spec: dict[str, Any] = {
            "failurePolicy": "Fail" if mode is Mode.ENFORCE else "Ignore",
            "matchConstraints": constraints, "matchConditions": vap_conditions,
            "variables": _needed(prog, exprs), "validations": validations}
        if notes:
            spec["auditAnnotations"] = notes
        objects.append({"apiVersion": GROUP, "kind": "ValidatingAdmissionPolicy",
                        "metadata": _metadata(name, digest), "spec": spec})
        objects.append(_binding("ValidatingAdmissionPolicy", name, digest, ACTIONS[mode]))
        comments += [{Mode.ENFORCE: "The guard's rules in enforce mode: one validation with the "
                                    "webhook's whole denial message.",
                      Mode.WARN: "The guard's rules in warn mode: one admission warning per "
                                 f"validation slot ({WARN_SLOTS}).",
                      Mode.AUDIT: "The guard's rules in audit mode, and the webhook's audit "
                                  "annotations (audit.gpu-admission.io style, read by "
                                  "`gpu-admission audit`)."}[mode],
                     f"Binds {name} with validationActions {ACTIONS[mode]}."]
    return Compiled(objects=objects, comments=comments)


def _clean_pod() -> str:
    """Every container and init container (and, on an ephemeral-container UPDATE, every
    ephemeral container) has only ``void``/``none`` NVIDIA_VISIBLE_DEVICES entries, at least
    one, and the pod mounts no hostPath: the guard has nothing to say (docs/guard.md)."""
    env = lit(gpu_access.ENV)
    ok = lit(sorted(gpu_access.NO_DEVICE_VALUES))
    each = (f"has(c.env) && c.env.exists(e, has(e.name) && e.name == {env}) && c.env.all(e, "
            f"!has(e.name) || e.name != {env} || (has(e.value) && !has(e.valueFrom) && "
            f"e.value in {ok}))")
    kinds = ["containers", "initContainers", gpu_access.EPHEMERAL_KIND]
    per_kind = " && ".join(f"(!has(object.spec.{k}) || object.spec.{k}.all(c, {each}))"
                           for k in kinds)
    return ("!(has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.hostPath))) && "
            + per_kind)


def _binding(kind: str, name: str, digest: str, actions: list[str] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"policyName": name}
    if actions is not None:
        spec["validationActions"] = actions
    return {"apiVersion": GROUP, "kind": kind + "Binding", "metadata": _metadata(name, digest),
            "spec": spec}


class _BlockDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _block(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    """CEL (anything with a parenthesis, a brace or a placeholder) as a literal block: a Helm
    include may put quotes and brackets into it, and ``!(`` must not read as a YAML tag."""
    if "\n" in value or "(" in value or "{" in value:
        text = "\n".join(line.rstrip() for line in value.splitlines())
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_BlockDumper.add_representer(str, _block)


def render_guard(policy: Policy, *, helm: bool = False) -> str:
    """The YAML stream ``gpu-admission compile --guard`` writes (``helm``: the chart's
    ``files/guard-policies.yaml.tpl``, its placeholders replaced by the chart's includes)."""
    result = compile_guard(policy, helm=helm)
    if helm:
        head = ["# Generated by `gpu-admission compile --guard --helm-template`: do not edit.",
                "# Rendered by templates/guard-policies.yaml with `tpl`; the includes fill in",
                "# the policy values (modes, exemptions) from .Values (docs/compile.md)."]
    else:
        head = [f"# The GPU-access guard of GPUSharingPolicy {policy.metadata.name!r} "
                f"(guard digest {guard_digest(policy)}),",
                "# generated by `gpu-admission compile --guard`: do not edit (docs/compile.md).",
                "# Requires Kubernetes >= 1.36 (admissionregistration.k8s.io/v1 "
                "MutatingAdmissionPolicy)."]
    parts = []
    for index, (obj, comment) in enumerate(zip(result.objects, result.comments, strict=True)):
        text = yaml.dump(obj, Dumper=_BlockDumper, sort_keys=False, allow_unicode=True,
                         width=100, default_flow_style=False)
        parts.append(("\n".join(head) + "\n" if index == 0 else "") + f"# {comment}\n" + text)
    text = "---\n".join(parts)
    if helm:
        for placeholder, include in HELM_INCLUDES.items():
            text = text.replace(placeholder, include)
    return text



def webhook_fallback_condition() -> str:
    """The webhooks' ``matchConditions`` when the webhook keeps the guard for every pod (API
    servers without MutatingAdmissionPolicy v1, ``webhook.guard: webhook``, kustomize component
    ``webhook-guard-fallback``): GPU and DRA pods, and every pod creation or ephemeral-container
    UPDATE the guard may change or deny (a container without only-``void``/``none``
    ``NVIDIA_VISIBLE_DEVICES`` entries, or a hostPath volume on CREATE)."""
    env = "'NVIDIA_VISIBLE_DEVICES'"
    unclean = (f"!(has(c.env) && c.env.exists(e, has(e.name) && e.name == {env}) && c.env.all(e,\n"
               f"        !has(e.name) || e.name != {env} || (has(e.value) && !has(e.valueFrom) "
               "&& (e.value == 'void' || e.value == 'none'))))")
    per_kind = " ||\n    ".join(
        f"(has(object.spec.{k}) && object.spec.{k}.exists(c,\n      {unclean}))"
        for k in ("containers", "initContainers"))
    eph = gpu_access.EPHEMERAL_KIND
    return (f"({gpu_or_dra_pod()}) ||\n"
            "(has(object.spec) && request.operation == 'CREATE' && (\n"
            "    (has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.hostPath))) ||\n"
            f"    {per_kind})) ||\n"
            f"(has(object.spec) && request.subResource == 'ephemeralcontainers' && "
            f"has(object.spec.{eph}) &&\n"
            f"  object.spec.{eph}.exists(c,\n      {unclean}))")
