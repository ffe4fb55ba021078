"""Policy -> Kubernetes objects: one MutatingAdmissionPolicy and up to three
ValidatingAdmissionPolicies (one per rule mode), each with its binding.

Why this shape (facts: ``shared/reference/admission-policy-cel.md``):

* The API server runs MutatingAdmissionPolicies before every validation, so the MAP is the
  webhook's mutate stage and the VAPs are its validate stage: they see the mutated Pod.
* A binding's ``validationActions`` apply to every validation of its policy, so the rule modes
  become three policies: ``enforce`` -> ``[Deny]``, ``warn`` -> ``[Warn]``, ``audit`` ->
  ``[Audit]``. Only the *first* failing validation of a policy is reported on a denial
  (kubernetes/kubernetes#115920), so the deny policy has one validation whose message is the
  webhook's whole denial message; the warn policy has one validation per warning slot.
* The webhook never patches a pod it denies; a MAP cannot deny, so its patch is ``[]`` when an
  enforce-mode rule is violated, and the deny policy rejects the unchanged pod.
* Every expression is computed from the same variables (the engine's analysis, then one
  compiler unit per rule, :mod:`gpu_admission.compile.rules`); each object carries only the
  variables its expressions use.
* Scope is the shipped webhook configurations': opted-in namespaces
  (``gpu-admission.io/enabled=true``), never ``kube-system``/``gpu-admission``, nor the
  policy's exempt namespaces (``kubernetes.io/metadata.name``), users and groups
  (``matchConditions``). Pods without a GPU are matched too: the GPU-access guard applies to
  them; the GPU rules test ``variables.isGpu`` themselves.
"""

from __future__ import annotations

from typing import Any

from gpu_admission.core.decision import Mode
from gpu_admission.core.patch import escape
from gpu_admission.core.vocab import CUDA_VERSION_LABEL, MUTATED_ANNOTATION, NAMESPACE_OPT_IN_LABEL
from gpu_admission.policy.model import RULE_IDS, Policy

from .cel import concat, lit, rec, request_field_is, var
from .guard import compile_guard, gpu_or_dra_pod
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
from .rules import UNITS, WEBHOOK_ONLY, WebhookOnly, unit_for
from .units import CompileError, Program, affinity_ops, analysis

MAP_NAME = f"mutate.{DOMAIN}"
VAP_NAMES = {Mode.ENFORCE: f"enforce.{DOMAIN}", Mode.WARN: f"warn.{DOMAIN}",
             Mode.AUDIT: f"audit.{DOMAIN}"}


class CompileFailure(Exception):
    """The policy has rules CEL cannot express (and ``--partial`` was not given)."""

    def __init__(self, stays: dict[str, WebhookOnly]) -> None:
        self.stays = stays
        lines = [f"  {rule}: {s.field}: {s.why}" for rule, s in stays.items()]
        super().__init__("cannot compile these rules into admission policies (without "
                         "--strict they stay with the webhook and the rest is compiled):\n"
                         + "\n".join(lines))


class FractionalPoolsNeedWebhook(CompileFailure):
    """The policy has ``sharing: fractional`` pools: their pods are rewritten (resources, a
    ConfigMap-backed ``NVIDIA_VISIBLE_DEVICES``, annotations from the request UID) for the
    extender's bind, which admission policies cannot do; not even ``--partial`` helps, since
    every pod may ask for a fraction with the annotation (docs/fractional.md)."""

    def __init__(self, fields: list[str]) -> None:
        self.stays = {}
        Exception.__init__(self, "cannot compile a policy with fractional node pools ("
                           + ", ".join(fields) + ": fractional): fractional GPUs need the "
                           "gpu-admission webhook (it rewrites each pod's GPU request and "
                           "writes its ConfigMap reference); use the webhook, or change the "
                           "pool's sharing")


def refuse_fractional(policy: Policy) -> None:
    """Raise :class:`FractionalPoolsNeedWebhook` naming ``spec.nodePools[i].sharing``."""
    fields = [f"spec.nodePools[{i}].sharing" for i, pool in enumerate(policy.spec.node_pools)
              if pool.fractional]
    if fields:
        raise FractionalPoolsNeedWebhook(fields)


def _metadata(name: str, policy: Policy) -> dict[str, Any]:
    return {"name": name, "labels": dict(LABELS),
            "annotations": {f"{DOMAIN}/policy-name": policy.metadata.name,
                            f"{DOMAIN}/policy-digest": policy.digest}}


def _match_constraints(policy: Policy, operations: list[str]) -> dict[str, Any]:
    excluded = sorted(set(ALWAYS_EXCLUDED) | set(policy.spec.exemptions.namespaces))
    return {
        # kubectl debug adds containers through pods/ephemeralcontainers (UPDATE): the only
        # way a container enters an existing pod (docs/guard.md).
        "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": operations,
                           "resources": ["pods"], "scope": "Namespaced"},
                          {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                           "resources": [EPHEMERAL_RESOURCE], "scope": "Namespaced"}],
        "matchPolicy": "Equivalent",
        "namespaceSelector": {"matchExpressions": [
            {"key": NAMESPACE_OPT_IN_LABEL, "operator": "In", "values": ["true"]},
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": excluded}]},
    }


def match_conditions(policy: Policy) -> list[dict[str, str]]:
    """The policy's exempt users and groups (admission.pod.exemption) as a matchCondition."""
    users = policy.spec.exemptions.users
    groups = policy.spec.exemptions.groups
    if not users and not groups:
        return []
    return [not_exempt(lit(sorted(users)), lit(sorted(groups)))]


def build_program(policy: Policy, *, partial: bool
                  ) -> tuple[Program, dict[str, WebhookOnly]]:
    """Run the analysis and every unit; collect the rules that stay with the webhook."""
    refuse_fractional(policy)
    prog = Program()
    analysis(policy, prog)
    stays: dict[str, WebhookOnly] = {}
    for rule in RULE_IDS:
        if rule in WEBHOOK_ONLY:
            stays[rule] = WEBHOOK_ONLY[rule]
        elif unit_for(rule) is None:
            stays[rule] = WebhookOnly(f"spec.rules.{rule}", "no compiler unit for this rule "
                                      "(gpu_admission/compile/rules/)", None)
    for unit in UNITS:
        if any(rule in stays for rule in unit.ids):
            continue
        attempt = Program()
        attempt.variables = list(prog.variables)
        try:
            unit.emit(policy, attempt)
        except CompileError as exc:
            for rule in unit.ids:
                stays[rule] = WebhookOnly(exc.field, exc.why, exc.pods)
            continue
        prog.variables = attempt.variables
        prog.violations += attempt.violations
        prog.violation_ids += [unit.ids] * len(attempt.violations)
        prog.ops += attempt.ops
        prog.env_ops += attempt.env_ops
        prog.kinds += attempt.kinds
    if stays and not partial:
        raise CompileFailure(stays)
    names = {v.name for v in prog.variables}
    for name, default in (("protect", "false"), ("driverOn", "false"), ("schedulerOp", "false"),
                          ("nodeSelectorOp", "false"), ("cudaOk", "false"),
                          ("ephemeral", request_field_is("subResource", '"ephemeralcontainers"')),
                          ("guardViolations", "[]"), ("guardOps", "[]")):
        if name not in names:
            prog.add(name, default, "rule compiled out (stays with the webhook)")
    _finish(policy, prog, stays)
    return prog, stays


def _finish(policy: Policy, prog: Program, stays: dict[str, WebhookOnly]) -> None:
    modes = {rule: mode for rule, mode in policy.compiled.modes.items() if rule not in stays}
    prog.add("violations", f"{var('ephemeral')} ? {var('guardViolations')}\n"
                           f"  : {concat(prog.violations)}",
             "every violation {rule, path, message}, in the engine's rule order (only the "
             "guard's for an ephemeral-container UPDATE)")
    for mode, name in ((Mode.ENFORCE, "denials"), (Mode.WARN, "warns"), (Mode.AUDIT, "audits")):
        ids = sorted(r for r, m in modes.items() if m is mode)
        # Only the units with a rule in this mode, so the policy of one mode does not evaluate
        # the others' rules (a unit with rules in several modes is filtered); the same list,
        # in the same order, as violations.filter(v, v.rule in ids).
        parts = []
        for expr, unit_ids in zip(prog.violations, prog.violation_ids, strict=True):
            mine = [r for r in unit_ids if modes.get(r) is mode]
            if not mine:
                continue
            if len(mine) == len([r for r in unit_ids if r in modes]):
                parts.append(expr)
            else:
                parts.append(f"({expr}).filter(v, v.rule in {lit(sorted(mine))})")
        prog.add(name, f"{var('ephemeral')} ? {var('guardViolations')}.filter(v, v.rule in "
                       f"{lit(ids)})\n  : {concat(parts)}",
                 f"violations of the rules in {mode} mode (only those rules are evaluated)")
    prog.add("warnings", f"{var('warns')}.map(v, {short_warning_cel('v')}).distinct()",
             "engine.short_warning per warn-mode violation, duplicates dropped")
    target = policy.spec.scheduler_name
    set_scheduler = rec(op=lit("add"), path=lit("/spec/schedulerName"), value=lit(target or ""))
    sched = f"{var('schedulerOp')} ? [{set_scheduler}] : []"
    version = var("cudaVersion")
    add_label = rec(op=lit("add"), path=lit("/spec/nodeSelector/" + escape(CUDA_VERSION_LABEL)),
                    value=version)
    add_selector = rec(op=lit("add"), path=lit("/spec/nodeSelector"),
                       value="{" + lit(CUDA_VERSION_LABEL) + ": " + version + "}")
    ns_op = (f"!{var('nodeSelectorOp')} ? []\n"
             f"  : has(object.spec.nodeSelector) ? [{add_label}]\n"
             f"  : [{add_selector}]")
    affinity_ops(policy, prog)
    prog.add("envOps", concat(prog.env_ops) if prog.env_ops else "[]",
             "env upserts by name: memory limits (GPU containers), then the guard's void")
    ops = [sched, ns_op, *prog.ops, var("envOps")]
    prog.add("denied", f"size({var('denials')}) > 0",
             "the webhook never patches a pod it denies")
    prog.add("ops", f"{var('denied')} ? [] : {concat(ops)}",
             "PatchBuilder.ops(): scheduler, nodeSelector, affinity, env")
    kinds = [(var("schedulerOp"), "schedulerName"), (var("nodeSelectorOp"), "nodeSelector"),
             *prog.kinds, (f"size({var('envOps')}) > 0", "env")]
    kind_list = concat(f"{cond} ? [{lit(kind)}] : []" for cond, kind in kinds)
    ann = "object.metadata.annotations"
    key = lit(MUTATED_ANNOTATION)
    prog.add("mutatedBefore", f"has({ann}) && {key} in {ann} ? {ann}[{key}] : \"\"")
    prog.add("mutatedValue",
             f'({kind_list}\n  + {var("mutatedBefore")}.split(",").filter(k, k != ""))'
             '.distinct().sort().join(",")',
             "engine._annotation_value: sorted kinds of mutated fields, merged with the old value")
    add_map = rec(op=lit("add"), path=lit("/metadata/annotations"),
                  value="{" + key + ": " + var("mutatedValue") + "}")
    add_key = rec(op=lit("add"), path=lit("/metadata/annotations/" + escape(MUTATED_ANNOTATION)),
                  value=var("mutatedValue"))
    annotation = f"!has({ann}) ? [{add_map}]\n  : [{add_key}]"
    prog.add("patch", f"{var('ephemeral')} ? ({var('denied')} ? [] : {var('guardOps')})\n"
                      f"  : size({var('ops')}) == 0 ? []\n"
                      f"  : {var('mutatedValue')} != {var('mutatedBefore')} || "
                      f"!(has({ann}) && {key} in {ann}) ? {var('ops')} + ({annotation})\n"
                      f"  : {var('ops')}",
             "the RFC 6902 operations, with the gpu-admission.io/mutated annotation (an "
             "ephemeral-container UPDATE: only the void upserts, the subresource keeps nothing "
             "else)")
    mode_of = {rule: str(mode) for rule, mode in modes.items()}
    prog.add("gpuPod", f"!{var('ephemeral')} && {var('isGpu')}",
             "Decision.gpu: an ephemeral-container UPDATE meets only the guard")
    prog.add("auditRecord",
             rec(decision=f'{var("denied")} ? "denied" : "allowed"',
                 workload=f'{var("gpuPod")} ? {var("workload")} : ""',
                 **{"workload-reason": f'{var("gpuPod")} ? {var("workloadReason")} : ""',
                    "cuda-version": f'{var("gpuPod")} ? {var("cudaVersion")} : ""',
                    "cuda-source": f'{var("gpuPod")} && {var("cudaVersion")} != "" ? '
                                   f'{var("cudaSource")} : ""',
                    "violations": f'{var("violations")}.map(v, v.rule + "=" + '
                                  f'{lit(mode_of)}[v.rule]).join(",")',
                    "warnings": f'size({var("warnings")}) > 0 ? string(size({var("warnings")})) '
                                ': ""'}),
             "the webhook's audit annotations (gpu_admission.auditlog.record)")


def _binding(kind: str, name: str, policy: Policy, actions: list[str] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"policyName": name}
    if actions is not None:
        spec["validationActions"] = actions
    return {"apiVersion": GROUP, "kind": kind + "Binding", "metadata": _metadata(name, policy),
            "spec": spec}


def compile_policy(policy: Policy, *, partial: bool = False) -> Compiled:
    """The admission policies and bindings for ``policy``; raises CompileFailure naming the
    rules CEL cannot express unless ``partial``."""
    prog, stays = build_program(policy, partial=partial)
    conditions = match_conditions(policy)
    for index, pods in enumerate(dict.fromkeys(s.pods for s in stays.values() if s.pods)):
        conditions.append({"name": f"not-for-the-webhook-{index + 1}",
                           "expression": f"!({pods})"})
    # The GPU rules never run for a CPU pod: these policies see GPU pods only, the guard half
    # (compile_guard, appended below) every other pod, split by one predicate.
    conditions.append({"name": "gpu-or-dra-pod", "expression": gpu_or_dra_pod()})
    objects: list[dict[str, Any]] = []
    comments: list[str] = []
    mutate_expr = (f"{var('patch')}.map(o, "
                   "JSONPatch{op: o.op, path: o.path, value: o.value})")
    objects.append({
        "apiVersion": GROUP, "kind": "MutatingAdmissionPolicy",
        "metadata": _metadata(MAP_NAME, policy),
        "spec": {
            "failurePolicy": "Fail",
            # Recomputed from the current object, so a second run adds nothing (idempotent).
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": _match_constraints(policy, ["CREATE"]),
            **({"matchConditions": conditions} if conditions else {}),
            "variables": needed_variables(prog.variables, [mutate_expr]),
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": mutate_expr}}],
        }})
    comments.append("The webhook's mutate stage (Pod CREATE): scheduler name, CUDA routing, "
                    "training protection, memory env vars, NVIDIA_VISIBLE_DEVICES=void, the "
                    f"{MUTATED_ANNOTATION} annotation. No patch when an enforce rule is broken.")
    objects.append(_binding("MutatingAdmissionPolicy", MAP_NAME, policy, None))
    comments.append("Binds the mutating policy (scope: the policy's matchConstraints).")
    modes = {m for r, m in policy.compiled.modes.items() if r not in stays}
    for mode in (Mode.ENFORCE, Mode.WARN, Mode.AUDIT):
        # The enforce policy always exists: it carries the audit annotations (the API server
        # publishes a policy's annotations whatever its validations decide,
        # validating/dispatcher.go), so no policy recomputes the analysis only to record it.
        # The warn and audit policies exist only when a rule is in their mode.
        if mode not in modes and mode is not Mode.ENFORCE:
            continue
        name = VAP_NAMES[mode]
        validations: list[dict[str, Any]] = []
        audit_annotations: list[dict[str, str]] = []
        if mode is Mode.ENFORCE:
            if mode in modes:
                validations.append(violations_validation(
                    "denials", "denied by the GPU sharing policy (gpu-admission)",
                    reason="Forbidden"))
            # string(): the record's values are dyn (a homogeneous map literal), and the API
            # server refuses a valueExpression whose checked type is not string or null
            # (admission/plugin/cel/compile.go: "must evaluate to one of [string null_type]").
            for key in ("decision", "workload", "workload-reason", "cuda-version",
                        "cuda-source", "violations", "warnings"):
                audit_annotations.append({
                    "key": key,
                    "valueExpression": f"string({var('auditRecord')}[{lit(key)}])"})
        else:
            validations += report_validations(mode)
        exprs = spec_expressions(validations, audit_annotations)
        spec: dict[str, Any] = {
            # A run-time error (a cost limit, say) denies under Fail whatever the binding's
            # actions (validating/dispatcher.go): only enforce may deny, as with the webhook,
            # so warn and audit ignore errors.
            "failurePolicy": "Fail" if mode is Mode.ENFORCE else "Ignore",
            "matchConstraints": _match_constraints(policy, ["CREATE", "UPDATE"]),
            **({"matchConditions": conditions} if conditions else {}),
            "variables": needed_variables(prog.variables, exprs),
        }
        if validations:
            spec["validations"] = validations
        if audit_annotations:
            spec["auditAnnotations"] = audit_annotations
        objects.append({"apiVersion": GROUP, "kind": "ValidatingAdmissionPolicy",
                        "metadata": _metadata(name, policy), "spec": spec})
        comments.append({
            Mode.ENFORCE: "Rules in enforce mode: one validation whose message is the "
                          "webhook's whole denial message (the API server reports only the "
                          "first failing validation); and the webhook's audit annotations "
                          "(published as enforce.gpu-admission.io/<key> in the audit log).",
            Mode.WARN: f"Rules in warn mode: one admission warning per validation slot "
                       f"({WARN_SLOTS}; the last joins any further warnings).",
            Mode.AUDIT: "Rules in audit mode (the API server's validation_failure audit "
                        "annotation).",
        }[mode])
        objects.append(_binding("ValidatingAdmissionPolicy", name, policy, ACTIONS[mode]))
        comments.append(f"Binds {name} with validationActions {ACTIONS[mode]}.")
    for obj in objects:
        if obj["kind"] in POLICY_KINDS:
            inline_constants(obj["spec"])
    guard = compile_guard(policy)
    return Compiled(objects=objects + guard.objects, comments=comments + guard.comments,
                    stays=stays)


def webhook_policy(policy: Policy, stays: dict[str, WebhookOnly]) -> dict[str, Any]:
    """The policy for the webhook that keeps the rules CEL cannot express: the same policy.

    When every rule that stays concerns only some pods (DRA pods), the webhook sees only those
    pods, which the compiled policies skip, so it must apply every rule in full. When one
    concerns every pod, the webhook sees every pod next to the compiled policies: mutations are
    idempotent and denials agree, only warnings appear twice (docs/compile.md).
    """
    del stays
    doc: dict[str, Any] = policy.model_dump(mode="json", by_alias=True)
    return doc
