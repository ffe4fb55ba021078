"""The pieces every compiled admission policy is built from, the GPU policies
(:mod:`gpu_admission.compile.compiler`) and the guard's (:mod:`gpu_admission.compile.guard`)
alike: the API group, names and labels, the :class:`Compiled` result, the validations, the
variables an object keeps, constant inlining. Below both, so neither imports the other's
building blocks from it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpu_admission.admission.engine import MAX_WARNING
from gpu_admission.core.decision import Mode

from .cel import var
from .rules import WebhookOnly
from .units import Var

GROUP = "admissionregistration.k8s.io/v1"
DOMAIN = "gpu-admission.io"
ACTIONS = {Mode.ENFORCE: ["Deny"], Mode.WARN: ["Warn"], Mode.AUDIT: ["Audit"]}
#: Warning slots of the warn policy; further warnings are joined into the last one.
WARN_SLOTS = 16
ALWAYS_EXCLUDED = ("kube-system", "gpu-admission")
EPHEMERAL_RESOURCE = "pods/ephemeralcontainers"
LABELS = {"app.kubernetes.io/name": "gpu-admission",
          "app.kubernetes.io/component": "compiled-policy"}


@dataclass(slots=True)
class Compiled:
    """The compiler's output: cluster objects in apply order, and what stays with the webhook."""

    objects: list[dict[str, Any]]
    comments: list[str]  # one header comment per object
    stays: dict[str, WebhookOnly] = field(default_factory=dict)  # rule id -> why it stays


def not_exempt(users: str, groups: str) -> dict[str, str]:
    """The exempt users and groups (admission.pod.exemption) as one matchCondition: the API server
    evaluates every condition of a policy, so one expression is one evaluation per pod instead
    of two (``users``, ``groups``: CEL list literals). The evaluator tells a user from a group
    exemption by evaluating it again (evaluator._exemption)."""
    return {"name": "not-exempt",
            "expression": f"!((has(request.userInfo.username) && "
                          f"request.userInfo.username in {users}) || "
                          "(has(request.userInfo.groups) && "
                          f"request.userInfo.groups.exists(g, g in {groups})))"}


def short_warning_cel(v: str) -> str:
    """engine.short_warning: ``<rule>: <message>``, whitespace runs collapsed, <= 120 chars."""
    text = f'({v}.rule + ": " + {v}.message).split(" ").filter(s, s != "").join(" ")'
    cut = MAX_WARNING - 3
    return (f"[{text}].map(t, size(t) <= {MAX_WARNING} ? t : [t.substring(0, {cut})]"
            f'.map(s, s.endsWith(" ") ? s.substring(0, size(s) - 1) : s)[0] + "...")[0]')


def violations_validation(name: str, message: str, *, passes: str = "",
                          reason: str | None = None) -> dict[str, str]:
    """One validation over the violation list ``variables.<name>``: it fails when the list is
    not empty, with the webhook's message (``[rule] path: message; ...``), since the API server
    reports only the first failing validation of a policy. ``passes``: a CEL test that
    answers without the list (the guard's clean pod)."""
    items = var(name)
    out = {"expression": f"{passes + ' || ' if passes else ''}size({items}) == 0",
           "messageExpression": f'{items}.map(v, "[" + v.rule + "] " + v.path + ": " + '
                                'v.message).join("; ")',
           "message": message}
    if reason:
        out["reason"] = reason
    return out


def warning_validations(warnings: str) -> list[dict[str, str]]:
    """One validation per warning slot over the list ``warnings`` (a CEL expression): an
    admission warning each; the last slot joins any further warnings."""
    out = []
    for i in range(WARN_SLOTS):
        last = i == WARN_SLOTS - 1
        out.append({"expression": f"size({warnings}) <= {i}",
                    "messageExpression": (f'{warnings}.slice({i}, size({warnings})).join("; ")'
                                          if last else f"{warnings}[{i}]"),
                    "message": "GPU sharing policy warning (gpu-admission)"})
    return out


def report_validations(mode: Mode) -> list[dict[str, str]]:
    """The validations of the warn policy (one admission warning per slot) or of the audit
    policy (one finding list); the GPU policies and the guard half write them alike."""
    if mode is Mode.WARN:
        return warning_validations(var("warnings"))
    return [violations_validation("audits", "GPU sharing policy audit finding (gpu-admission)")]


def spec_expressions(validations: list[dict[str, str]],
                     annotations: list[dict[str, str]]) -> list[str]:
    """Every CEL expression of a validating policy's validations and audit annotations: what
    :func:`needed_variables` keeps variables for."""
    exprs = [e for v in validations for k, e in v.items() if k.endswith("xpression")]
    return exprs + [a["valueExpression"] for a in annotations]


POLICY_KINDS = ("MutatingAdmissionPolicy", "ValidatingAdmissionPolicy")
_VAR_REF = re.compile(r"variables\.([A-Za-z_][A-Za-z0-9_]*)")


def needed_variables(variables: list[Var], expressions: Iterable[str]) -> list[dict[str, str]]:
    """The variables (in definition order) that ``expressions`` use, transitively."""
    by_name = {v.name: v for v in variables}
    need: set[str] = set()
    todo = [m for e in expressions for m in _VAR_REF.findall(e)]
    while todo:
        name = todo.pop()
        if name in need:
            continue
        need.add(name)
        todo.extend(_VAR_REF.findall(by_name[name].expr))
    return [{"name": v.name, "expression": _with_comment(v)} for v in variables
            if v.name in need]


#: A CEL constant: string, number, bool and null literals in list and map literals (comments
#: allowed), or one of the placeholder words the Helm form substitutes with such a literal.
_CONSTANT_TOKENS = re.compile(r"""\s+|//[^\n]*|'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"
                              |-?\d+(?:\.\d+)?|true|false|null|[\[\]{}:,]""", re.X)
_EXPRESSION_KEYS = ("expression", "messageExpression", "valueExpression")


def is_constant(expr: str, placeholders: Iterable[str] = ()) -> bool:
    """Whether ``expr`` is a constant literal (:data:`_CONSTANT_TOKENS`): what the API server
    builds once, when it compiles an expression (cel-go ``OptOptimize``); benchmarks/
    compile_bench.py asks it of every list and map literal to emulate that."""
    for word in placeholders:
        expr = expr.replace(word, "null")
    return _CONSTANT_TOKENS.sub("", expr) == ""  # nothing but constant tokens


def inline_constants(spec: dict[str, Any], placeholders: Iterable[str] = ()) -> None:
    """Write each constant variable (a policy value: a pool's CUDA version, a memory default,
    the guard's modes) into the expressions that read it and drop the variable.

    The API server evaluates a variable as a program of its own, once per policy and
    request, while it builds a constant literal once, when it compiles the expression (cel-go
    ``OptOptimize``, which k8s.io/apiserver/pkg/admission/plugin/cel/compile.go sets): the
    same meaning, one evaluation fewer per constant per policy. ``placeholders``: words of the
    Helm form that render to literals (compile_guard(helm=True))."""
    words = tuple(placeholders)
    constants = {}
    for variable in spec.get("variables", []):
        body = "\n".join(line for line in variable["expression"].splitlines()
                         if not line.lstrip().startswith("//")).strip()
        if is_constant(body, words):
            constants[variable["name"]] = body
    if not constants:
        return
    pattern = re.compile(r"\bvariables\.(" + "|".join(map(re.escape, constants)) + r")\b")

    def inline(text: str) -> str:
        return pattern.sub(lambda m: f"({constants[m.group(1)]})", text)

    spec["variables"] = [v for v in spec.get("variables", []) if v["name"] not in constants]
    for key in ("matchConditions", "variables", "validations", "auditAnnotations"):
        for item in spec.get(key, []):
            for field_name in _EXPRESSION_KEYS:
                if field_name in item:
                    item[field_name] = inline(item[field_name])
    for mutation in spec.get("mutations", []):
        for kind in ("jsonPatch", "applyConfiguration"):
            if kind in mutation:
                mutation[kind]["expression"] = inline(mutation[kind]["expression"])
    if not spec["variables"]:
        del spec["variables"]


def _with_comment(v: Var) -> str:
    if not v.comment:
        return v.expr
    return f"// {v.comment}\n{v.expr}"
