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
``guardStates``), the warn and audit policies emitted only when a guard rule is in their mode
and skipped (a ``matchCondition``) when every container already says ``void``/``none`` and no
hostPath is mounted (what the mutating policy leaves on a CPU pod); the deny policy, which
also carries the audit annotations, answers such a pod from that one test.

Everything the policy decides enters through five values, so the Helm chart can render the same
objects from its policy values (:func:`render_guard` with ``helm=True`` writes the chart's
``files/guard-policies.yaml.tpl``): the three rules' modes (a CEL map literal, JSON as Helm's
``toJson`` writes it), the excluded namespaces, the exempt users and groups, the scheduler CPU
pods are sent to (``spec.scheduling.cpuPods``, issue 32: the mutating policy also sets
``schedulerName`` on a CPU pod, as the engine's ``_non_gpu`` does), and the
``gpu-admission.io/guard-digest`` annotation (sha256 of the canonical JSON of those inputs,
:func:`guard_inputs`), which ``gpu-admission compile --guard --check`` compares with live objects.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml

from gpu_admission.core.decision import Mode
from gpu_admission.core.patch import escape
from gpu_admission.core.vocab import (
    DEFAULT_SCHEDULER,
    GPU_MEMORY_RESOURCE,
    MUTATED_ANNOTATION,
    NAMESPACE_OPT_IN_LABEL,
)
from gpu_admission.facts.other_systems import HAMI_RESOURCES, KAI_ANNOTATIONS
from gpu_admission.policy.model import Policy
from gpu_admission.rules import gpu_access
from gpu_admission.rules.scheduler import DAEMONSET_KIND

from .cel import lit, rec, srec, var
from .objects import (
    ACTIONS,
    ALWAYS_EXCLUDED,
    DOMAIN,
    EPHEMERAL_RESOURCE,
    GROUP,
    LABELS,
    POLICY_KINDS,
    WARN_SLOTS,
    Compiled,
    inline_constants,
    needed_variables,
    not_exempt,
    report_validations,
    short_warning_cel,
    spec_expressions,
    violations_validation,
)
from .rules.gpu_access import GuardUnit
from .rules.scheduler import cpu_route
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
HELM_CPU_SCHEDULER = "GUARD_CPU_SCHEDULER_JSON"
HELM_OPT_IN_KEY = "GUARD_OPT_IN_KEY"
HELM_OPT_IN_VALUE = "GUARD_OPT_IN_VALUE"
#: The chart renders the guard's warn (audit) policy and binding only when a guard rule is in
#: warn (audit) mode, as compile_guard does for a policy (helper gpu-admission.guard.modeUsed).
HELM_MODE_USED = ('{{{{- if include "gpu-admission.guard.modeUsed" '
                  '(dict "root" . "mode" "{mode}") }}}}')
#: The chart keeps the exempt users/groups condition only when the policy names some, as
#: compile_guard does (helper gpu-admission.guard.exempting): an always-false condition is one
#: more evaluation per pod in each guard object.
HELM_EXEMPTING = '{{- if include "gpu-admission.guard.exempting" . }}'
HELM_INCLUDES = {
    HELM_OPT_IN_KEY: "{{ .Values.webhook.namespaceOptInLabel.key }}",
    HELM_OPT_IN_VALUE: "{{ .Values.webhook.namespaceOptInLabel.value | quote }}",
    HELM_MODES: '{{ include "gpu-admission.guard.modes" . }}',
    HELM_USERS: '{{ include "gpu-admission.guard.users" . }}',
    HELM_GROUPS: '{{ include "gpu-admission.guard.groups" . }}',
    HELM_NAMESPACES: '{{ include "gpu-admission.guard.excludedNamespaces" . }}',
    HELM_DIGEST: '{{ include "gpu-admission.guard.digest" . }}',
    HELM_CPU_SCHEDULER: '{{ include "gpu-admission.guard.cpuScheduler" . | toJson }}',
}

_NVIDIA_NAMES = sorted(["nvidia.com/gpu", "nvidia.com/gpu.shared", *HAMI_RESOURCES])
assert all(n.startswith("nvidia.com/") for n in _NVIDIA_NAMES)
#: One resource name ``r`` is a GPU or DRA one. The nvidia.com/ prefix first: the names of a
#: typical pod (cpu, memory, ephemeral-storage) fail it and one more test, where a flat
#: disjunction compared each with every name (this runs for every pod, in the webhooks'
#: matchConditions and the guard's). HAMi's resources (engine.evaluate's other-system test):
#: rule other-sharing-system is the webhook's.
_GPU_NAMES = ("(r.startsWith('nvidia.com/') ? (r in ["
              + ", ".join(f"'{n}'" for n in _NVIDIA_NAMES)
              + "] || r.startsWith('nvidia.com/mig-')) : "
              f"(r.startsWith('deviceclass.resource.kubernetes.io/') || "
              f"r == '{GPU_MEMORY_RESOURCE}'))")
#: KAI-Scheduler's pod annotations (engine.evaluate's other-system test): such pods are the
#: webhook's too.
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
    """What the guard half depends on: the three rules' modes, the exemptions, the
    namespaces never matched, and the scheduler pods without a GPU get (``spec.scheduling.
    cpuPods``; "" for none). Its canonical JSON (sorted keys, no spaces: Helm's ``toJson``)
    hashes to the guard digest."""
    modes = policy.compiled.modes
    exemptions = policy.spec.exemptions
    return {"cpuScheduler": policy.compiled.cpu_scheduler or "",
            "modes": {rule: str(modes[rule]) for rule in sorted(GUARD_RULES)},
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


def _program(policy: Policy, modes_literal: str, cpu_scheduler: str) -> Program:
    """The guard's variables: GuardUnit (no GPU analysis, modes read from ``variables.modes``,
    a literal that inline_constants writes into its readers), the CPU pods' scheduler
    (``cpu_scheduler``, a CEL string literal) and the per-mode lists, the patch and the audit
    record."""
    prog = Program()
    prog.add("modes", modes_literal, "rule id -> mode of the three guard rules (the policy's)")
    prog.add("cpuScheduler", cpu_scheduler,
             "the scheduler pods without a GPU get (spec.scheduling.cpuPods), \"\" for none")
    prog.add("schedulerOp", f'request.operation == "CREATE" && {_route(var("cpuScheduler"))}',
             "rules/scheduler.cpu_pod_scheduler: a CPU pod CREATE goes to the GPU-aware "
             "scheduler")
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
    _simple_pod(prog, modes_literal)
    simple = var("simple")
    # the void upserts: the direct ones for a simple pod, else the guard's analysis (inline:
    # one variable less to evaluate; each side is a variable, computed once)
    voids = f"({simple} ? {var('simpleOps')} : {var('guardOps')})"
    sched = var("schedulerOp")
    prog.add("mutatedValue",
             f'((size({voids}) > 0 ? ["env"] : []) + ({sched} ? ["schedulerName"] : []) + '
             f'{var("mutatedBefore")}.split(",").filter(k, k != ""))'
             '.distinct().sort().join(",")',
             "engine._annotation_value: the kinds changed merged with the old value")
    # without annotations the merged value is the kinds alone: no variable to evaluate
    kinds_only = (f'({sched} ? (size({voids}) > 0 ? {lit("env,schedulerName")} : '
                  f'{lit("schedulerName")}) : {lit("env")})')
    add_map = rec(op=lit("add"), path=lit("/metadata/annotations"),
                  value="{" + key + ": " + kinds_only + "}")
    add_key = rec(op=lit("add"), path=lit("/metadata/annotations/" + escape(MUTATED_ANNOTATION)),
                  value=var("mutatedValue"))
    set_scheduler = rec(op=lit("add"), path=lit("/spec/schedulerName"),
                        value=var("cpuScheduler"))
    # PatchBuilder.ops() order: the scheduler, then the env upserts
    ops = f"(({sched} ? [{set_scheduler}] : []) + {voids})"
    prog.add("patch",
             f"(!{simple} && size({var('denials')}) > 0) || size({ops}) == 0 ? []\n"
             f"  : !{simple} && {var('ephemeral')} ? {ops}\n"
             f"  : !has({ann}) ? {ops} + [{add_map}]\n"
             f"  : {var('mutatedValue')} != {var('mutatedBefore')} || !({key} in {ann}) "
             f"? {ops} + [{add_key}]\n"
             f"  : {ops}",
             "the scheduler (CPU pods, spec.scheduling.cpuPods), the void upserts and the "
             "gpu-admission.io/mutated annotation (none on an ephemeral-container UPDATE: the "
             "subresource keeps only the containers); nothing when an enforce-mode guard rule "
             "denies")
    prog.add("clean", _clean_pod(),
             "every container void/none and no hostPath: no finding (the audit policy's "
             "shortcut past the analysis)")
    prog.add("auditRecord",
             rec(decision=f'size({var("denials")}) > 0 ? "denied" : "allowed"',
                 violations=f'{var("violations")}.map(v, v.rule + "=" + {modes}[v.rule])'
                            '.join(",")',
                 warnings=f'size({var("warnings")}) > 0 ? string(size({var("warnings")})) '
                          ': ""'),
             "the webhook's audit annotations for a pod without a GPU")
    return prog


def _simple_pod(prog: Program, modes: str) -> None:
    """The typical CPU pod, decided without the guard's per-container analysis (variables are
    evaluated lazily, so ``guardStates`` and the violations are never computed for it): a pod
    CREATE with ``gpu-access-isolation`` in enforce mode, no hostPath volume and no
    NVIDIA_VISIBLE_DEVICES entry in any container or init container. Every container is then
    in the ``isolate`` state, no rule can find anything, and the patch is one void upsert per
    container, in the order GuardUnit's ``guardOps`` writes them (containers, then init
    containers): ``add .../env`` without an env list, ``add .../env/-`` with one."""
    env = lit(gpu_access.ENV)
    kinds = ("containers", "initContainers")
    no_entry = " && ".join(
        f"(!has(object.spec.{k}) || object.spec.{k}.all(c, !has(c.env) || "
        f"!c.env.exists(e, has(e.name) && e.name == {env})))" for k in kinds)
    prog.add("simple",
             f'request.operation == "CREATE" && {modes}[{lit(gpu_access.ISOLATION)}] == '
             f"{lit(str(Mode.ENFORCE))} && !(has(object.spec.volumes) && "
             f"object.spec.volumes.exists(v, has(v.hostPath))) && {no_entry}",
             "a pod CREATE without hostPath and without any NVIDIA_VISIBLE_DEVICES entry, "
             "isolation enforced: every container gets void, nothing else can be found")
    value = srec(name=env, value=lit(gpu_access.VOID))
    parts = []
    for k in kinds:
        lst = f"object.spec.{k}"
        base = f'"/spec/{k}/" + string(i) + "/env"'
        whole = rec(op=lit("add"), path=base, value=f"[{value}]")
        append = rec(op=lit("add"), path=f'{base} + "/-"', value=value)
        parts.append(f"(has({lst}) ? lists.range(size({lst})).map(i, has({lst}[i].env) ? "
                     f"{append} : {whole}) : [])")
    prog.add("simpleOps", " + ".join(parts), "the simple pod's void upserts")


def _needed(prog: Program, expressions: list[str]) -> list[dict[str, str]]:
    return needed_variables(prog.variables, expressions)


def compile_guard(policy: Policy, *, helm: bool = False) -> Compiled:
    """The guard half for ``policy``: a MutatingAdmissionPolicy and the
    ValidatingAdmissionPolicies (deny with the audit annotations; warn and audit when a guard
    rule is in that mode) with their bindings. ``helm``: write the
    policy-dependent values as placeholders for the chart (:data:`HELM_INCLUDES`)."""
    inputs = guard_inputs(policy)
    modes_literal = HELM_MODES if helm else canonical_json(inputs["modes"])
    users = HELM_USERS if helm else canonical_json(inputs["users"])
    groups = HELM_GROUPS if helm else canonical_json(inputs["groups"])
    excluded: list[str] | str = HELM_NAMESPACES if helm else inputs["excludedNamespaces"]
    digest = HELM_DIGEST if helm else guard_digest(policy)
    cpu_scheduler = HELM_CPU_SCHEDULER if helm else lit(inputs["cpuScheduler"])
    prog = _program(policy, modes_literal, cpu_scheduler)
    conditions = [{"name": "not-a-gpu-or-dra-pod", "expression": f"!({gpu_or_dra_pod()})"}]
    if helm or inputs["users"] or inputs["groups"]:  # the chart decides (HELM_EXEMPTING)
        conditions.append(not_exempt(users, groups))
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
    # A pod whose containers all carry only void/none entries gets nothing from the mutating
    # policy (no isolate state, so no upsert) unless it is routed to the GPU-aware scheduler:
    # skipped with one cheap condition, which also ends the reinvocation after its own patch.
    map_conditions = [*conditions, {"name": "not-already-clean",
                                    "expression": f"!({_clean_pod(hostpath=False)}) || "
                                                  f'(request.operation == "CREATE" && '
                                                  f"{_route(cpu_scheduler)})"}]
    objects: list[dict[str, Any]] = [{
        "apiVersion": GROUP, "kind": "MutatingAdmissionPolicy",
        "metadata": _metadata(MAP_NAME, digest),
        "spec": {"failurePolicy": "Fail", "reinvocationPolicy": "IfNeeded",
                 "matchConstraints": constraints, "matchConditions": map_conditions,
                 "variables": _needed(prog, [mutate]),
                 "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": mutate}}]}},
        _binding("MutatingAdmissionPolicy", MAP_NAME, digest, None)]
    comments = ["The GPU-access guard for pods without a GPU or DRA resource (the webhook "
                "decides those): NVIDIA_VISIBLE_DEVICES=void on every container that lacks it, "
                "on CREATE and for ephemeral containers kubectl debug adds; on CREATE, "
                "spec.schedulerName for the pods spec.scheduling.cpuPods sends to the GPU-aware "
                "scheduler.",
                "Binds the guard's mutating policy."]
    # A pod the mutating policy left clean (every container void/none, no hostPath) has no
    # finding: the warn and audit policies skip it with one cheap condition, the deny policy
    # (which records every decision) answers it from the same test (variable ``clean``).
    clean = _clean_pod()
    used = set(inputs["modes"].values())
    for mode in (Mode.ENFORCE, Mode.WARN, Mode.AUDIT):
        name = VAP_NAMES[mode]
        # The deny policy always exists: it carries the audit annotations (the API server
        # publishes them whatever its validations decide, validating/dispatcher.go), so every
        # decision is recorded by the one policy a CPU pod meets. The warn and audit policies
        # exist only when a guard rule is in their mode (the chart: the same test on its
        # modes, HELM_MODE_USED). An absent object costs the API server nothing per pod.
        if mode is not Mode.ENFORCE and not helm and str(mode) not in used:
            continue
        vap_conditions = list(conditions)
        if mode is not Mode.ENFORCE:
            vap_conditions.append({"name": "not-already-clean", "expression": f"!({clean})"})
        validations: list[dict[str, str]] = []
        notes: list[dict[str, str]] = []
        if mode is Mode.ENFORCE:
            # A clean pod (what the mutating policy leaves on a typical CPU pod) cannot be
            # denied: one walk of its env entries answers, the guard's analysis is skipped
            # (variables are evaluated lazily, on first use).
            validations.append(violations_validation(
                "denials", "denied by the GPU sharing policy (gpu-admission)",
                passes=var("clean"), reason="Forbidden"))
            clean_value = {"decision": lit("allowed"), "violations": '""', "warnings": '""'}
            notes = [{"key": key, "valueExpression": f"{var('clean')} ? {clean_value[key]} : "
                                                     f"string({var('auditRecord')}[{lit(key)}])"}
                     for key in ("decision", "violations", "warnings")]
        else:
            validations += report_validations(mode)
        exprs = spec_expressions(validations, notes)
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
                                    "webhook's whole denial message; and the webhook's audit "
                                    "annotations for every decision (read by "
                                    "`gpu-admission audit`).",
                      Mode.WARN: "The guard's rules in warn mode: one admission warning per "
                                 f"validation slot ({WARN_SLOTS}).",
                      Mode.AUDIT: "The guard's rules in audit mode (the API server's "
                                  "validation_failure audit annotation)."}[mode],
                     f"Binds {name} with validationActions {ACTIONS[mode]}."]
    for obj in objects:
        if obj["kind"] in POLICY_KINDS:
            inline_constants(obj["spec"], [HELM_MODES, HELM_CPU_SCHEDULER] if helm else [])
    return Compiled(objects=objects, comments=comments)


def _route(target: str) -> str:
    """rules/scheduler.cpu_pod_scheduler for a pod here (never a GPU pod), ``target`` a CEL
    string ("" when CPU pods are not routed)."""
    return f"({cpu_route(target)})"


def _clean_pod(*, hostpath: bool = True) -> str:
    """Every container and init container (and, on an ephemeral-container UPDATE, every
    ephemeral container) has only ``void``/``none`` NVIDIA_VISIBLE_DEVICES entries, at least
    one, and the pod mounts no hostPath: the guard has nothing to say (docs/guard.md).
    ``hostpath=False``: the env part only (the mutating policy's skip: a hostPath volume is
    denied, never mutated)."""
    env = lit(gpu_access.ENV)
    ok = lit(sorted(gpu_access.NO_DEVICE_VALUES))
    # one pass over env (its NVIDIA_VISIBLE_DEVICES entries), then over those few entries
    each = (f"has(c.env) && [c.env.filter(e, has(e.name) && e.name == {env})].all(l, "
            f"size(l) > 0 && l.all(e, has(e.value) && !has(e.valueFrom) && e.value in {ok}))")
    kinds = ["containers", "initContainers", gpu_access.EPHEMERAL_KIND]
    per_kind = " && ".join(f"(!has(object.spec.{k}) || object.spec.{k}.all(c, {each}))"
                           for k in kinds)
    if not hostpath:
        return per_kind
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
        text = ("\n".join(head) + "\n" if index == 0 else "") + f"# {comment}\n" + text
        mode = next((m for m, n in VAP_NAMES.items() if n == obj["metadata"]["name"]), None)
        if helm and mode in (Mode.WARN, Mode.AUDIT):  # the policy, then its binding
            text = (HELM_MODE_USED.format(mode=mode) + "\n" + text
                    if obj["kind"] == "ValidatingAdmissionPolicy" else text + "{{- end }}\n")
        parts.append(text)
    text = "---\n".join(parts)
    if helm:
        text = _helm_exempting(text)
        for placeholder, include in HELM_INCLUDES.items():
            text = text.replace(placeholder, include)
    return text



def _helm_exempting(text: str) -> str:
    """Wrap each ``not-exempt`` matchCondition (its item: the name line and the more indented
    lines under it) in :data:`HELM_EXEMPTING`."""
    out: list[str] = []
    inside = False
    for line in text.splitlines(keepends=True):
        if inside and not line.startswith("    "):
            out.append("{{- end }}\n")
            inside = False
        if line == "  - name: not-exempt\n":
            out.append(HELM_EXEMPTING + "\n")
            inside = True
        out.append(line)
    assert not inside, "a not-exempt condition ends the stream"
    return "".join(out)


def webhook_fallback_condition() -> str:
    """The webhooks' ``matchConditions`` when the webhook keeps the guard for every pod (API
    servers without MutatingAdmissionPolicy v1, ``webhook.guard: webhook``, kustomize component
    ``webhook-guard-fallback``): GPU and DRA pods, and every pod creation or ephemeral-container
    UPDATE the guard may change or deny (a container without only-``void``/``none``
    ``NVIDIA_VISIBLE_DEVICES`` entries, or a hostPath volume on CREATE), and every pod creation
    ``spec.scheduling.cpuPods`` may route to the GPU-aware scheduler (``schedulerName`` empty
    or ``default-scheduler``, no ``nodeName``, no DaemonSet owner: whatever the policy, a
    superset)."""
    env = "'NVIDIA_VISIBLE_DEVICES'"
    unclean = (f"!(has(c.env) && c.env.exists(e, has(e.name) && e.name == {env}) && c.env.all(e,\n"
               f"        !has(e.name) || e.name != {env} || (has(e.value) && !has(e.valueFrom) "
               "&& (e.value == 'void' || e.value == 'none'))))")
    per_kind = " ||\n    ".join(
        f"(has(object.spec.{k}) && object.spec.{k}.exists(c,\n      {unclean}))"
        for k in ("containers", "initContainers"))
    eph = gpu_access.EPHEMERAL_KIND
    current = "(has(object.spec.schedulerName) ? object.spec.schedulerName : '')"
    routed = (f"{current} in ['', '{DEFAULT_SCHEDULER}'] &&\n"
              "      !(has(object.spec.nodeName) && object.spec.nodeName != '') &&\n"
              "      !(has(object.metadata.ownerReferences) && object.metadata.ownerReferences"
              f".exists(r, has(r.kind) && r.kind == '{DAEMONSET_KIND}'))")
    return (f"({gpu_or_dra_pod()}) ||\n"
            "(has(object.spec) && request.operation == 'CREATE' && (\n"
            "    (has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.hostPath))) ||\n"
            f"    {per_kind} ||\n"
            f"    ({routed}))) ||\n"
            f"(has(object.spec) && has(request.subResource) && "
            "request.subResource == 'ephemeralcontainers' && "
            f"has(object.spec.{eph}) &&\n"
            f"  object.spec.{eph}.exists(c,\n      {unclean}))")
