"""Evaluate the compiled admission policies offline, with cel-python, as the API server would.

``gpu-admission evaluate --compiled`` and the differential tests use this: it runs the
emitted objects, not the engine. The steps follow the API server's admission chain (facts
sheet sections 3, 7 and 8): scope (``matchConstraints`` namespace selector, then
``matchConditions``), the MutatingAdmissionPolicy's variables and JSONPatch mutation on Pod
CREATE, then every ValidatingAdmissionPolicy on the *mutated* Pod, with its binding's
``validationActions``. The result is a :class:`~gpu_admission.core.decision.Decision`, so every
output of ``evaluate`` has the same keys in both modes.

cel-python 0.5 lacks some Kubernetes CEL libraries; :data:`FUNCTIONS` provides the ones the
compiler emits with the semantics of their Go sources:

* strings ext v2 (cel-go ``ext/strings.go``, https://github.com/google/cel-go/blob/v0.26.0/ext/strings.go):
  ``split``, ``join``, ``substring``, ``indexOf``, ``lastIndexOf``, ``trim`` (Unicode
  White_Space, as Go's ``strings.TrimSpace``), ``lowerAscii``, ``replace``;
* lists ext v3 (cel-go ``ext/lists.go``): ``lists.range``, ``sort``, ``distinct``,
  ``flatten``, ``slice``;
* Kubernetes ``find`` (regex library) and ``sum`` (list library)
  (https://github.com/kubernetes/apiserver/tree/v0.36.3/pkg/cel/library, ``regex.go``,
  ``lists.go``);
* the ``JSONPatch{op, path, value}`` type of MAP mutations
  (``pkg/cel/mutation/jsonpatch.go``).

``matches`` and ``find`` use RE2 (the ``re2`` module cel-python itself uses), like cel-go.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import celpy
import celpy.adapter
import celpy.celtypes as ct
import celpy.evaluation
import orjson
import re2  # type: ignore[import-untyped]
from celpy.evaluation import CELEvalError

from gpu_admission.core.decision import Decision, Mode, RequestFacts, Violation
from gpu_admission.core.patch import apply_ops, changed_fields

# --------------------------------------------------------------------------- functions
# Unicode White_Space (Go's unicode.IsSpace): Python's isspace() minus U+001C..U+001F.
_WHITE_SPACE = "".join(chr(c) for c in range(0x3001)
                       if chr(c).isspace() and not 0x1C <= c <= 0x1F)


def _s(value: Any) -> str:
    return str(value)


def _split(text: Any, sep: Any, limit: Any = None) -> ct.ListType:
    parts = _s(text).split(_s(sep)) if limit is None else _s(text).split(_s(sep), int(limit) - 1)
    return ct.ListType([ct.StringType(p) for p in parts])


def _join(items: Any, sep: Any = "") -> ct.StringType:
    return ct.StringType(_s(sep).join(_s(i) for i in items))


def _substring(text: Any, start: Any, end: Any = None) -> ct.StringType:
    s = _s(text)
    a = int(start)
    b = len(s) if end is None else int(end)
    if a < 0 or b > len(s) or a > b:
        raise ValueError(f"substring out of range: {a}, {b} of {len(s)}")
    return ct.StringType(s[a:b])


def _index_of(container: Any, item: Any, *rest: Any) -> ct.IntType:
    if isinstance(container, str):
        return ct.IntType(_s(container).find(_s(item), *(int(r) for r in rest)))
    for i, value in enumerate(container):
        if value == item:
            return ct.IntType(i)
    return ct.IntType(-1)


def _last_index_of(container: Any, item: Any) -> ct.IntType:
    if isinstance(container, str):
        return ct.IntType(_s(container).rfind(_s(item)))
    for i in range(len(container) - 1, -1, -1):
        if container[i] == item:
            return ct.IntType(i)
    return ct.IntType(-1)


def _trim(text: Any) -> ct.StringType:
    return ct.StringType(_s(text).strip(_WHITE_SPACE))


def _lower_ascii(text: Any) -> ct.StringType:
    return ct.StringType("".join(c.lower() if "A" <= c <= "Z" else c for c in _s(text)))


def _replace(text: Any, old: Any, new: Any, count: Any = None) -> ct.StringType:
    n = -1 if count is None else int(count)
    return ct.StringType(_s(text).replace(_s(old), _s(new), n))


@functools.lru_cache(maxsize=512)
def _regex(pattern: str) -> Any:
    return re2.compile(pattern)


def _find(text: Any, pattern: Any) -> ct.StringType:
    match = _regex(_s(pattern)).search(_s(text))
    return ct.StringType(match.group(0) if match else "")


def _range(_namespace: Any, n: Any) -> ct.ListType:
    return ct.ListType([ct.IntType(i) for i in range(int(n))])


def _sort(items: Any) -> ct.ListType:
    return ct.ListType(sorted(items))


def _distinct(items: Any) -> ct.ListType:
    out: list[Any] = []
    for item in items:
        if item not in out:
            out.append(item)
    return ct.ListType(out)


def _flatten(items: Any) -> ct.ListType:
    out: list[Any] = []
    for item in items:
        if isinstance(item, list):
            out.extend(item)
        else:
            out.append(item)
    return ct.ListType(out)


def _slice(items: Any, start: Any, end: Any) -> ct.ListType:
    return ct.ListType(list(items)[int(start):int(end)])


def _sum(items: Any) -> ct.IntType:
    return ct.IntType(sum(int(i) for i in items))


def _size(value: Any) -> ct.IntType:
    return ct.IntType(len(value))


FUNCTIONS: dict[str, Any] = {
    "split": _split, "join": _join, "substring": _substring, "indexOf": _index_of,
    "lastIndexOf": _last_index_of, "trim": _trim, "lowerAscii": _lower_ascii,
    "replace": _replace, "find": _find, "range": _range, "sort": _sort,
    "distinct": _distinct, "flatten": _flatten, "slice": _slice, "sum": _sum,
}


class JSONPatch(ct.MapType):
    """``JSONPatch{op, path, from, value}`` of a MutatingAdmissionPolicy mutation."""

    def __init__(self, fields: Any = None) -> None:
        given = dict(fields or {})
        unknown = set(given) - {"op", "path", "from", "value"}
        if unknown:
            raise ValueError(f"unexpected JSONPatchType field: {sorted(unknown)[0]}")
        super().__init__(given)


class _Lists(ct.MapType):
    """The ``lists`` namespace of ``lists.range``."""


_ENV = celpy.Environment()
_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4096)
def program(expression: str) -> celpy.Runner:
    """Compile one CEL expression (cached: the compiled objects repeat their variables)."""
    with _LOCK:
        return _ENV.program(_ENV.compile(expression), functions=FUNCTIONS)


def to_json(value: Any) -> Any:
    """A cel-python value as plain JSON-able Python (for patches and messages)."""
    if isinstance(value, ct.BoolType):
        return bool(value)
    if isinstance(value, ct.IntType | ct.UintType):
        return int(value)
    if isinstance(value, ct.DoubleType):
        return float(value)
    if isinstance(value, ct.StringType):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


class CelError(Exception):
    """An expression failed at run time; under ``failurePolicy: Fail`` the API server rejects
    the request with this text."""


def run(expression: str, activation: Mapping[str, Any]) -> Any:
    try:
        return program(expression).evaluate(dict(activation))
    except CELEvalError as exc:
        raise CelError(f"{expression.splitlines()[-1][:80]}...: {exc.args[0]}") from None


_COST = threading.local()


@contextlib.contextmanager
def counting_cost() -> Iterator[list[int]]:
    """Count evaluation steps (AST nodes visited, one per cel-go cost unit, roughly) of
    everything evaluated inside the block: an estimate of the API server's runtime cost."""
    box = [0]
    original = celpy.evaluation.Evaluator.visit_children

    def visit_children(self: Any, tree: Any) -> Any:
        box[0] += 1
        return original(self, tree)

    celpy.evaluation.Evaluator.visit_children = visit_children  # type: ignore[method-assign]
    try:
        yield box
    finally:
        celpy.evaluation.Evaluator.visit_children = original  # type: ignore[method-assign]


# --------------------------------------------------------------------------- admission
def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector as the API server evaluates it (matchLabels AND every
    matchExpression; NotIn and DoesNotExist match an absent key).
    https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors"""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": key not in labels or labels[key] not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


@dataclass(slots=True)
class Outcome:
    """What the API server would do with one Pod request, and what it would record."""

    decision: Decision
    mutated: dict[str, Any]  # the pod after the MutatingAdmissionPolicy
    audit_annotations: dict[str, str] = field(default_factory=dict)
    warnings_sent: list[str] = field(default_factory=list)  # Warning headers, as sent
    denial: str = ""  # the API server's denial message ("" when allowed)


def admission_request(pod: Any, facts: RequestFacts) -> dict[str, Any]:
    """The CEL variable ``request`` exactly as a 1.36 API server builds it for a Pod request.

    ``CreateAdmissionRequest`` (k8s.io/apiserver ``pkg/admission/plugin/cel/condition.go``,
    https://github.com/kubernetes/apiserver/blob/v0.36.3/pkg/admission/plugin/cel/condition.go)
    fills an ``admissionv1.AdmissionRequest``; ``newActivation`` (``activation.go``, same tag)
    turns it into the variable with ``runtime.DefaultUnstructuredConverter.ToUnstructured``
    (``convertObjectToUnstructured``), which drops a field tagged ``omitempty`` when it is
    empty (``structToUnstructured``/``isEmpty`` in k8s.io/apimachinery
    ``pkg/runtime/converter.go`` v0.36.3: "", 0, false, nil pointer, nil or empty map/slice;
    a struct is never empty). The tags are k8s.io/api ``admission/v1/types.go`` v0.36.3. So,
    field by field:

    * ``uid`` (``json:"uid"``): never set by CreateAdmissionRequest, so always ``""``;
    * ``kind``, ``resource`` (no omitempty; metav1.GroupVersionKind/Resource fields have none
      either): ``{group: "", version: "v1", kind: "Pod"}`` / ``{..., resource: "pods"}``;
    * ``subResource`` (omitempty): **absent** for the Pod itself, ``ephemeralcontainers`` for
      ``kubectl debug``;
    * ``requestKind``, ``requestResource`` (omitempty, but non-nil pointers): always present;
    * ``requestSubResource`` (omitempty): as ``subResource``;
    * ``name`` (omitempty): **absent** on a CREATE from ``generateName`` in the mutating stage
      (the name is generated after it; the validating stage gets the generated name,
      ``AdmissionToValidateObjectFunc`` in ``pkg/registry/rest/create.go``). Here it is the
      pod's own ``metadata.name`` in both stages: no emitted expression reads it;
    * ``namespace`` (omitempty): absent only for cluster-scoped objects;
    * ``operation``: always;
    * ``userInfo`` (a struct, always present), of authentication/v1 ``UserInfo``, every field
      omitempty: ``username`` absent when empty, ``groups`` absent when the user has none,
      ``uid`` absent here (not in RequestFacts), ``extra`` absent (an empty map);
    * ``object``, ``oldObject`` (omitempty RawExtension, a struct: kept): both ``null``
      ("Leave Object and OldObject unset": a nil RawExtension marshals to ``null``, which
      structured-merge-diff's ``TypeReflectCacheEntry.ToUnstructured`` stores as nil);
    * ``dryRun`` (omitempty, ``*bool``): CreateAdmissionRequest always passes ``&dryRun``,
      so it is **present**, ``true`` or ``false``;
    * ``options`` (RawExtension of the operation's options): the handlers set its TypeMeta
      (``options.TypeMeta.SetGroupVersionKind(...CreateOptions)`` in
      ``pkg/endpoints/handlers/create.go``, ``UpdateOptions`` in ``update.go``), and
      ``dryRun: ["All"]`` is the options' own omitempty list;
      ``DeleteOptions`` on DELETE.
    """
    gvk = {"group": "", "version": "v1", "kind": "Pod"}
    gvr = {"group": "", "version": "v1", "resource": "pods"}
    request: dict[str, Any] = {"uid": "", "kind": gvk, "resource": gvr}
    if facts.sub_resource:
        request["subResource"] = facts.sub_resource
    request["requestKind"] = dict(gvk)
    request["requestResource"] = dict(gvr)
    if facts.sub_resource:
        request["requestSubResource"] = facts.sub_resource
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    if isinstance(name, str) and name:
        request["name"] = name
    if facts.namespace:
        request["namespace"] = facts.namespace
    request["operation"] = facts.operation
    user: dict[str, Any] = {}
    if facts.user:
        user["username"] = facts.user
    if facts.groups:
        user["groups"] = list(facts.groups)
    request["userInfo"] = user
    request["object"] = None
    request["oldObject"] = None
    request["dryRun"] = facts.dry_run
    kind = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions",
            "DELETE": "DeleteOptions"}.get(facts.operation)
    options: dict[str, Any] | None = None
    if kind is not None:
        options = {"kind": kind, "apiVersion": "meta.k8s.io/v1"}
        if facts.dry_run:
            options["dryRun"] = ["All"]
    request["options"] = options
    return request


def activation_of(pod: Any, facts: RequestFacts, namespace_labels: Mapping[str, str],
                ) -> dict[str, Any]:
    """The variables the API server binds for a policy on ``pod`` (``object``, ``request``,
    ``namespaceObject``, ...); public: :mod:`.offline` evaluates the same expressions.
    ``object`` is ``null`` on DELETE and ``oldObject`` on CREATE (``objectToResolveVal`` of a
    nil object, ``activation.go``); ``request`` is :func:`admission_request`."""
    metadata: dict[str, Any] = {"name": facts.namespace}
    if namespace_labels:  # ObjectMeta.labels is omitempty too
        metadata["labels"] = dict(namespace_labels)
    namespace = {"metadata": metadata}
    activation: dict[str, Any] = dict(cast(Mapping[str, Any], celpy.adapter.json_to_cel(
        {"object": None if facts.operation == "DELETE" else pod,
         "oldObject": _old_object(pod, facts),
         "request": admission_request(pod, facts), "namespaceObject": namespace})))
    activation["lists"] = _Lists({})
    activation["JSONPatch"] = JSONPatch
    return activation


def _old_object(pod: Any, facts: RequestFacts) -> Any:
    """``oldObject``: ``null`` on CREATE; the pod itself on UPDATE and DELETE (on DELETE
    ``object`` is ``null``); for an ephemeral-container UPDATE (the subresource carries the
    whole Pod, docs/guard.md) the pod
    with only the ephemeral containers it already had (``facts.existing_ephemeral``)."""
    if facts.operation not in ("UPDATE", "DELETE"):
        return None
    spec = pod.get("spec") if isinstance(pod, dict) else None
    if facts.sub_resource != "ephemeralcontainers" or not isinstance(spec, dict):
        return pod
    items = spec.get("ephemeralContainers")
    kept = [c for c in items if isinstance(c, dict) and c.get("name") in facts.existing_ephemeral
            ] if isinstance(items, list) else []
    old_spec = {k: v for k, v in spec.items() if k != "ephemeralContainers"}
    if kept:
        old_spec["ephemeralContainers"] = kept
    return {**pod, "spec": old_spec}


def _resource(facts: RequestFacts) -> str:
    return "pods/" + facts.sub_resource if facts.sub_resource else "pods"


class Variables(ct.MapType):
    """``variables`` of one policy evaluation: each computed when first read, as the API server
    does (facts sheet section 2: "evaluated in order and lazily"). ``cache`` maps an expression
    to its value for one object, so the policies that repeat a variable compute it once."""

    def __init__(self, spec: Mapping[str, Any], activation: dict[str, Any],
                 cache: dict[str, Any]) -> None:
        super().__init__({})
        self._defs = {ct.StringType(v["name"]): v["expression"]
                      for v in spec.get("variables") or []}
        self._activation = activation
        self._cache = cache

    def __contains__(self, key: object) -> bool:
        return key in self._defs

    def __getitem__(self, key: Any) -> Any:
        name = ct.StringType(key)
        if not dict.__contains__(self, name):
            if name not in self._defs:
                raise KeyError(key)
            expression = self._defs[name]
            if expression not in self._cache:
                self._cache[expression] = run(expression,
                                              {**self._activation, "variables": self})
            dict.__setitem__(self, name, self._cache[expression])
        return dict.__getitem__(self, name)

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default  # noqa: SIM401 - self.get recurses


def _variables(spec: Mapping[str, Any], activation: dict[str, Any],
               cache: dict[str, Any]) -> Variables:
    return Variables(spec, activation, cache)


def _in_scope(spec: Mapping[str, Any], activation: dict[str, Any], operation: str,
              namespace_labels: Mapping[str, str], resource: str = "pods") -> tuple[bool, str]:
    """(matched, why not): matchConstraints (operation and resource, ``pods`` or
    ``pods/<subresource>``), then matchConditions."""
    constraints = spec.get("matchConstraints") or {}
    rules = constraints.get("resourceRules") or []
    if not any(operation in r.get("operations", []) and resource in r.get("resources", [])
               for r in rules):
        return False, ""
    if not selector_matches(constraints.get("namespaceSelector") or {}, namespace_labels):
        return False, "namespace"
    for condition in spec.get("matchConditions") or []:
        if not bool(run(condition["expression"], activation)):
            return False, condition["name"]
    return True, ""


#: matchConditions that only save work (the guard half: no rule in this policy's mode, a pod
#: already clean): a policy they skip has nothing to say, the request is not exempt.
SHORTCUT_CONDITIONS = ("a-guard-rule-in-", "not-already-clean",
                       # the split between the GPU policies and the guard half: the other
                       # half decides the pod
                       "gpu-or-dra-pod", "not-a-gpu-or-dra-pod")


def _exemption(reason: str, facts: RequestFacts, objects: Sequence[Mapping[str, Any]]) -> str:
    """The engine's exemption text for a request the policies' scope left out."""
    if reason.startswith(SHORTCUT_CONDITIONS):
        return ""
    if reason == "namespace":
        return f"namespace {facts.namespace}"
    if reason == "not-exempt":  # users and groups in one condition: which one matched?
        condition = next(c["expression"] for o in objects
                         for c in o["spec"].get("matchConditions") or []
                         if c["name"] == reason)
        for groups in ((), *((g,) for g in facts.groups)):  # the user alone, then each group
            act = activation_of({}, RequestFacts(facts.namespace, user=facts.user,
                                                 groups=groups), {})
            if not bool(run(condition, act)):
                return f"group {groups[0]}" if groups else f"user {facts.user}"
    return reason


def ignores_errors(policy: Mapping[str, Any]) -> bool:
    """``failurePolicy: Ignore``: a run-time error skips the policy instead of denying."""
    return bool(policy["spec"].get("failurePolicy") == "Ignore")


def namespace_labels(namespace: str) -> dict[str, str]:
    """``gpu-admission evaluate`` assumes the namespace opted in, as the engine does."""
    return {"kubernetes.io/metadata.name": namespace, "gpu-admission.io/enabled": "true"}


def admit(objects: Sequence[Mapping[str, Any]], pod: dict[str, Any], facts: RequestFacts,
          labels: Mapping[str, str] | None = None) -> Outcome:
    """Run the compiled policies on one Pod request (``facts.stage == "validate"`` skips the
    mutating policy, like the webhook's validate stage)."""
    labels = namespace_labels(facts.namespace) if labels is None else labels
    policies = [o for o in objects if o["kind"].endswith("AdmissionPolicy")]
    bindings = {o["spec"]["policyName"]: o for o in objects if o["kind"].endswith("Binding")}
    activation = activation_of(pod, facts, labels)
    audit = next((o for o in policies if "auditAnnotations" in o["spec"]), None)
    facts_view: dict[str, Any] = {}
    before: dict[str, Any] = {}  # expression -> value on the pod as received
    if audit is not None:  # the engine's analysis, on the pod as received
        values = _variables(audit["spec"], activation, before)
        try:
            facts_view = {k: to_json(values[k]) for k in ("gpuPod", "auditRecord")
                          if k in values}
        except CelError:
            if not ignores_errors(audit):
                raise
    gpu = bool(facts_view.get("gpuPod", False))
    record = facts_view.get("auditRecord", {})
    info: dict[str, Any] = {
        "gpu": gpu, "workload": record.get("workload") or None,
        "workload_reason": record.get("workload-reason", ""),
        "cuda_version": record.get("cuda-version") or None,
        "cuda_source": record.get("cuda-source", "")}
    operations = {(op, res) for o in policies
                  for r in o["spec"]["matchConstraints"]["resourceRules"]
                  for op in r["operations"] for res in r["resources"]}
    if (facts.operation, _resource(facts)) not in operations:  # DELETE, CONNECT, pods/status
        return Outcome(Decision(allowed=True), pod)
    mutated = pod
    patch: list[dict[str, Any]] = []
    exempt = ""
    for policy in policies:
        if policy["kind"] != "MutatingAdmissionPolicy" or facts.stage != "mutate":
            continue
        matched, why = _in_scope(policy["spec"], activation, facts.operation, labels,
                                 _resource(facts))
        if not matched:
            exempt = exempt or (why and _exemption(why, facts, policies))
            continue
        values = _variables(policy["spec"], activation, before)
        for mutation in policy["spec"]["mutations"]:
            result = run(mutation["jsonPatch"]["expression"],
                         {**activation, "variables": values})
            ops = [to_json(op) for op in result]
            patch.extend(ops)
            if ops:
                mutated = apply_ops(mutated, ops)
    after = activation_of(mutated, facts, labels) if patch else activation
    cache: dict[str, Any] = before if not patch else {}
    allowed = True
    warnings: list[str] = []
    sent: list[str] = []
    denial = ""
    notes: dict[str, str] = {}
    failures: list[dict[str, Any]] = []
    selected: dict[Mode, list[Any]] = {}
    all_violations: list[Any] = []
    for policy in policies:
        if policy["kind"] != "ValidatingAdmissionPolicy":
            continue
        name = policy["metadata"]["name"]
        matched, why = _in_scope(policy["spec"], after, facts.operation, labels,
                                 _resource(facts))
        if not matched:
            exempt = exempt or (why and _exemption(why, facts, policies))
            continue
        try:
            actions = bindings[name]["spec"]["validationActions"]
            values = _variables(policy["spec"], after, cache)
            act = {**after, "variables": values}
            mode = (Mode.ENFORCE if "Deny" in actions else Mode.WARN if "Warn" in actions
                    else Mode.AUDIT)
            for key, label in (("denials", Mode.ENFORCE), ("warns", Mode.WARN),
                               ("audits", Mode.AUDIT)):
                if label is mode and ct.StringType(key) in values:
                    selected[mode] = to_json(values[ct.StringType(key)])
            if ct.StringType("violations") in values and not all_violations:
                all_violations = to_json(values[ct.StringType("violations")])
            for index, validation in enumerate(policy["spec"].get("validations") or []):
                if bool(run(validation["expression"], act)):
                    continue
                message = str(run(validation["messageExpression"], act))
                if "\n" in message or len(message) > 5 * 1024:
                    message = validation.get("message", "")
                if "Deny" in actions and allowed:
                    allowed = False
                    denial = (f"ValidatingAdmissionPolicy '{name}' with binding '{name}' denied "
                              f"request: {message}")
                if "Warn" in actions:
                    warnings.append(message)
                    sent.append(f"Validation failed for ValidatingAdmissionPolicy '{name}' with "
                                f"binding '{name}': {message}")
                if "Audit" in actions:
                    failures.append({"message": message, "policy": name, "binding": name,
                                     "expressionIndex": index, "validationActions": actions})
            for annotation in policy["spec"].get("auditAnnotations") or []:
                value = run(annotation["valueExpression"], act)
                if value is not None and str(value):
                    notes[f"{name}/{annotation['key']}"] = str(value)
        except CelError:  # this policy's failurePolicy decides
            if not ignores_errors(policy):
                raise
    if failures:
        notes["validation.policy.admission.k8s.io/validation_failure"] = orjson.dumps(
            failures).decode()
    violations = []
    pools = {mode: list(items) for mode, items in selected.items()}
    for item in all_violations:
        found = next((m for m, items in pools.items() if item in items), None)
        if found is None:
            continue
        pools[found].remove(item)
        violations.append(Violation(item["rule"], item["path"], item["message"], found))
    if exempt and (gpu or facts.operation == "CREATE" or facts.sub_resource):
        return Outcome(Decision(allowed=True, exempt=exempt, **(info if gpu else {})), pod)
    decision = Decision(
        allowed=allowed, patch=tuple(patch) if allowed else (), violations=tuple(violations),
        warnings=tuple(warnings), changes=tuple(changed_fields(patch)) if patch and allowed
        else (), **info)
    if not decision.gpu:
        decision = Decision(allowed=decision.allowed, patch=decision.patch,
                            violations=decision.violations, warnings=decision.warnings,
                            changes=decision.changes)
    return Outcome(decision, mutated if allowed else pod, notes, sent, denial)
