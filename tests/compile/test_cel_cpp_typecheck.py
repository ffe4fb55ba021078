"""Every emitted CEL expression parses and type-checks in a second, independent CEL
implementation: cel-cpp (Google's C++ CEL, the ``cel-expr-python`` binding), declared with
the Kubernetes 1.36 admission environment.

Why: cel-python, which the differential tests run, is lenient: it parses some syntax cel-go
refuses and resolves functions only when called, so an expression that mentions a function
the API server does not have, or calls one with the wrong arguments, passes there and is
refused by ``kubectl apply`` (or fails at run time, a denial under ``failurePolicy: Fail``).
cel-cpp checks like cel-go: every function must be declared with a matching overload.

The environment declares exactly the libraries a 1.36 API server gives admission policies
(``k8s.io/apiserver/pkg/cel/environment/base.go``; facts sheet ``admission-policy-cel.md``
section 6): CEL's standard functions and macros, cel-go's lists extension v3 (``lists.range``,
``sort``, ``distinct``, ``flatten``, ``slice``: cel-cpp's ``lists`` extension), the strings
extension v2 and the Kubernetes list and regex libraries (declared below with cel-go's
signatures: ``ext/strings.go``, ``pkg/cel/library/lists.go``, ``regex.go``), and in
mutations only ``JSONPatch`` and ``jsonpatch.escapeKey`` (``pkg/cel/library/jsonpatch.go``,
``pkg/cel/mutation/jsonpatch.go``). The request variables are ``dyn``, as the API server
compiles them before it has type information. A function outside this list fails the test:
that is the point.

The API server also refuses list and map literals whose elements are not of one type
(``cel.ValidateHomogeneousAggregateLiterals``, 1.29+: cel-go ``cel/validator.go``, which
compares with ``Type.IsEquivalentType``, so ``dyn`` and ``string`` differ). cel-cpp has no such
option; :func:`literal_mismatches` applies the same rule to cel-cpp's checked AST (the
``cel.expr.CheckedExpr`` it serializes, decoded with the few message types declared below).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from cel_expr_python import cel
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory, struct_pb2

from gpu_admission.compile.cli import webhook_objects
from gpu_admission.compile.guard import compile_guard
from gpu_admission.policy.model import default_policy
from tests.compile_support import POLICIES, compiled
from tests.install.test_manifests import render


def _overloads(name: str, *sigs: tuple[str, str | None, list[str], str]) -> str:
    lines = [f"  - name: {name}", "    overloads:"]
    for oid, target, args, ret in sigs:
        parts = [f"id: {oid}"]
        if target:
            parts.append(f"target: {target}")
        parts.append("args: [" + ", ".join(args) + "]")
        parts.append(f"return: {ret}")
        lines.append("      - {" + ", ".join(parts) + "}")
    return "\n".join(lines)


S = "{type_name: string}"
INT = "{type_name: int}"
BOOL = "{type_name: bool}"
DBL = "{type_name: double}"
T = "{type_name: T, is_type_param: true}"
LIST_S = "{type_name: list, params: [{type_name: string}]}"
LIST_T = "{type_name: list, params: [" + T + "]}"
LIST_I = "{type_name: list, params: [{type_name: int}]}"
LIST_D = "{type_name: list, params: [{type_name: double}]}"

# cel-go ext/strings.go (version 2, what 1.29+ API servers load) and the Kubernetes list and
# regex libraries. indexOf/lastIndexOf are one function with string and list overloads.
K8S_FUNCTIONS = "\n".join([
    _overloads("charAt", ("string_char_at_int", S, [INT], S)),
    _overloads("indexOf", ("string_index_of_string", S, [S], INT),
               ("string_index_of_string_int", S, [S, INT], INT),
               ("list_a_index_of_int", LIST_T, [T], INT)),
    _overloads("lastIndexOf", ("string_last_index_of_string", S, [S], INT),
               ("string_last_index_of_string_int", S, [S, INT], INT),
               ("list_a_last_index_of_int", LIST_T, [T], INT)),
    _overloads("lowerAscii", ("string_lower_ascii", S, [], S)),
    _overloads("upperAscii", ("string_upper_ascii", S, [], S)),
    _overloads("replace", ("string_replace_string_string", S, [S, S], S),
               ("string_replace_string_string_int", S, [S, S, INT], S)),
    _overloads("split", ("string_split_string", S, [S], LIST_S),
               ("string_split_string_int", S, [S, INT], LIST_S)),
    _overloads("substring", ("string_substring_int", S, [INT], S),
               ("string_substring_int_int", S, [INT, INT], S)),
    _overloads("trim", ("string_trim", S, [], S)),
    _overloads("join", ("list_join", LIST_S, [], S), ("list_join_string", LIST_S, [S], S)),
    _overloads("strings.quote", ("strings_quote", None, [S], S)),
    _overloads("isSorted", ("list_a_is_sorted_bool", LIST_T, [], BOOL)),
    _overloads("sum", ("list_int_sum_int", LIST_I, [], INT),
               ("list_double_sum_double", LIST_D, [], DBL)),
    _overloads("min", ("list_a_min_a", LIST_T, [], T)),
    _overloads("max", ("list_a_max_a", LIST_T, [], T)),
    _overloads("find", ("string_find_string", S, [S], S)),
    _overloads("findAll", ("string_find_all_string", S, [S], LIST_S),
               ("string_find_all_string_int", S, [S, INT], LIST_S)),
])
JSONPATCH_FUNCTIONS = _overloads("jsonpatch.escapeKey", ("string_jsonpatch_escapekey", None,
                                                         [S], S))

#: The request variables, ``dyn`` as the API server declares ``object`` and ``oldObject``
#: (``request`` and ``namespaceObject`` are typed there: ``dyn`` here is the lenient side).
REQUEST_VARIABLES = ("object", "oldObject", "request", "params", "namespaceObject",
                     "authorizer")
#: cel-cpp's parser stops at a fixed nesting depth of 32; cel-go's default is 250 and the API
#: server sets no ``ParserRecursionLimit`` (``pkg/cel/environment/base.go``). Expressions
#: deeper than 32 are parsed by cel-python only (the differential tests) and counted here.
CPP_DEPTH_ERROR = "Exceeded max recursion depth of 32"
BOOL_T, STR_T = ("BOOL",), ("STRING",)


def _config(mutation: bool) -> str:
    return "\n".join([
        "name: kubernetes-1.36-admission",
        "extensions:",
        "  - {name: lists, version: latest}",
        "functions:",
        K8S_FUNCTIONS,
        *([JSONPATCH_FUNCTIONS] if mutation else []),
    ])


def _jsonpatch_pool() -> Any:
    """A descriptor pool with the ``JSONPatch`` type as the API server declares it: string
    ``op``, ``path``, ``from`` and a dynamic ``value`` (cel ``dyn``, JSON on the wire)."""
    pool = descriptor_pool.DescriptorPool()
    struct_file = descriptor_pb2.FileDescriptorProto()
    struct_pb2.DESCRIPTOR.CopyToProto(struct_file)
    pool.Add(struct_file)
    patch_file = descriptor_pb2.FileDescriptorProto(
        name="k8s_jsonpatch.proto", syntax="proto3",
        dependency=["google/protobuf/struct.proto"])
    msg = patch_file.message_type.add(name="JSONPatch")
    string, message, optional = 9, 11, 1  # FieldDescriptorProto TYPE_STRING, TYPE_MESSAGE
    for number, name in enumerate(("op", "path", "from"), start=1):
        msg.field.add(name=name, number=number, type=string, label=optional, json_name=name)
    msg.field.add(name="value", number=4, type=message, label=optional,
                  type_name=".google.protobuf.Value", json_name="value")
    pool.Add(patch_file)
    return pool


# --------------------------------------------------------------------------- homogeneous literals
def _checked_expr_class() -> Any:
    """``cel.expr.CheckedExpr`` as far as the literal check reads it: the type map and the
    expression tree (field numbers of cel-spec ``proto/cel/expr/checked.proto`` and
    ``syntax.proto``; constants and identifiers are leaves, so left out)."""
    proto = descriptor_pb2.FieldDescriptorProto
    msg_t, str_t, i64, i32, bool_t = (proto.TYPE_MESSAGE, proto.TYPE_STRING, proto.TYPE_INT64,
                                      proto.TYPE_INT32, proto.TYPE_BOOL)
    file = descriptor_pb2.FileDescriptorProto(name="cel_expr_checked_subset.proto",
                                              package="cel.expr", syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, str]) -> Any:
        """fields: (name, number, type, message type or "" ; a leading "*" = repeated)."""
        msg = file.message_type.add(name=name)
        for fname, number, ftype, type_name in fields:
            field = msg.field.add(name=fname.lstrip("*"), number=number, type=ftype,
                                  label=proto.LABEL_REPEATED if fname.startswith("*")
                                  else proto.LABEL_OPTIONAL)
            if type_name:
                field.type_name = f".cel.expr.{type_name}"
        return msg

    message("Empty")
    message("Type", ("dyn", 1, msg_t, "Empty"), ("null", 2, i32, ""), ("primitive", 3, i32, ""),
            ("wrapper", 4, i32, ""), ("well_known", 5, i32, ""),
            ("list_type", 6, msg_t, "ListType"), ("map_type", 7, msg_t, "MapType"),
            ("message_type", 9, str_t, ""), ("type_param", 10, str_t, ""),
            ("type", 11, msg_t, "Type"), ("error", 12, msg_t, "Empty"),
            ("abstract_type", 14, msg_t, "AbstractType"))
    message("ListType", ("elem_type", 1, msg_t, "Type"))
    message("MapType", ("key_type", 1, msg_t, "Type"), ("value_type", 2, msg_t, "Type"))
    message("AbstractType", ("name", 1, str_t, ""), ("*parameter_types", 2, msg_t, "Type"))
    message("Select", ("operand", 1, msg_t, "Expr"), ("field", 2, str_t, ""))
    message("Call", ("target", 1, msg_t, "Expr"), ("function", 2, str_t, ""),
            ("*args", 3, msg_t, "Expr"))
    message("CreateList", ("*elements", 1, msg_t, "Expr"), ("*optional_indices", 2, i32, ""))
    message("Entry", ("id", 1, i64, ""), ("field_key", 2, str_t, ""),
            ("map_key", 3, msg_t, "Expr"), ("value", 4, msg_t, "Expr"),
            ("optional_entry", 5, bool_t, ""))
    message("CreateStruct", ("message_name", 1, str_t, ""), ("*entries", 2, msg_t, "Entry"))
    message("Comprehension", ("iter_var", 1, str_t, ""), ("iter_range", 2, msg_t, "Expr"),
            ("accu_var", 3, str_t, ""), ("accu_init", 4, msg_t, "Expr"),
            ("loop_condition", 5, msg_t, "Expr"), ("loop_step", 6, msg_t, "Expr"),
            ("result", 7, msg_t, "Expr"))
    message("Expr", ("id", 2, i64, ""), ("select_expr", 5, msg_t, "Select"),
            ("call_expr", 6, msg_t, "Call"), ("list_expr", 7, msg_t, "CreateList"),
            ("struct_expr", 8, msg_t, "CreateStruct"),
            ("comprehension_expr", 9, msg_t, "Comprehension"))
    entry = message("TypeMapEntry", ("key", 1, i64, ""), ("value", 2, msg_t, "Type"))
    entry.options.map_entry = True
    message("CheckedExpr", ("*type_map", 3, msg_t, "TypeMapEntry"), ("expr", 4, msg_t, "Expr"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("cel.expr.CheckedExpr"))


CHECKED_EXPR = _checked_expr_class()


def _equivalent_key(typ: Any) -> bytes:
    """A key equal for types cel-go's ``IsEquivalentType`` calls equivalent: same kind, name
    and parameters, type-parameter names ignored."""
    copy_ = type(typ).FromString(typ.SerializeToString())

    def strip(t: Any) -> None:
        if t.type_param:
            t.type_param = "T"
        for sub in (t.list_type.elem_type, t.map_type.key_type, t.map_type.value_type, t.type):
            if sub.ByteSize():
                strip(sub)
        for param in t.abstract_type.parameter_types:
            strip(param)

    strip(copy_)
    return bytes(copy_.SerializeToString(deterministic=True))


def literal_mismatches(serialized: bytes) -> list[str]:
    """cel-go's homogeneous-literal validator over cel-cpp's checked AST: every element of a
    list literal, every key and every value of a map literal, of one type (arguments of
    ``format`` exempt, as there)."""
    checked = CHECKED_EXPR.FromString(any_pb2.Any.FromString(serialized).value)
    types = checked.type_map
    found: list[str] = []

    def same(kind: str, exprs: list[Any], literal: int) -> None:
        keys = [_equivalent_key(types[e.id]) for e in exprs]
        for e, key in zip(exprs[1:], keys[1:], strict=True):
            if key != keys[0]:
                first, other = (str(types[x.id]).split() for x in (exprs[0], e))
                found.append(f"literal #{literal}: {kind} {' '.join(first)} vs {' '.join(other)}")
                return

    def walk(e: Any, exempt: bool) -> None:
        if e.HasField("list_expr"):
            if not exempt and e.list_expr.elements:
                same("element", list(e.list_expr.elements), e.id)
            for element in e.list_expr.elements:
                walk(element, exempt)
        elif e.HasField("struct_expr"):
            entries = list(e.struct_expr.entries)
            if not exempt and entries and not e.struct_expr.message_name:
                same("key", [x.map_key for x in entries], e.id)
                same("value", [x.value for x in entries], e.id)
            for x in entries:
                walk(x.map_key, exempt)
                walk(x.value, exempt)
        elif e.HasField("call_expr"):
            walk(e.call_expr.target, False)
            for arg in e.call_expr.args:
                walk(arg, e.call_expr.function == "format")
        elif e.HasField("select_expr"):
            walk(e.select_expr.operand, False)
        elif e.HasField("comprehension_expr"):
            c = e.comprehension_expr
            for sub in (c.iter_range, c.accu_init, c.loop_condition, c.loop_step, c.result):
                walk(sub, False)

    walk(checked.expr, False)
    return found


class Checker:
    """Compiles one policy's expressions the way the API server does: variables in order,
    each declared for the later ones with its checked type (``variables.<name>``, as the
    API server's composition environment does), ``matchConditions`` without ``variables``,
    ``JSONPatch`` only in mutations."""

    def __init__(self) -> None:
        self.configs = {m: cel.NewEnvConfigFromYaml(_config(m)) for m in (False, True)}
        self.pool = _jsonpatch_pool()
        self.failures: list[str] = []
        self.too_deep: list[str] = []
        self.checked = 0

    def env(self, declared: dict[str, Any], mutation: bool) -> Any:
        names = dict.fromkeys(REQUEST_VARIABLES, cel.Type.DYN) | declared
        if mutation:
            return cel.NewEnv(descriptor_pool=self.pool, config=self.configs[True],
                              variables=names)
        return cel.NewEnv(config=self.configs[False], variables=names)

    def compile(self, env: Any, where: str, expr: str, returns: tuple[str, ...] = ()) -> Any:
        """The checked result type, or None (the failure recorded). ``returns``: the types
        the API server accepts for this field, compared exactly as it does
        (``admission/plugin/cel/compile.go``: ``ast.OutputType() == returnType``, so a ``dyn``
        validation or audit value is refused: "must evaluate to one of [string null_type]")."""
        try:
            out = env.compile(expr)
        except Exception as exc:
            if CPP_DEPTH_ERROR in str(exc):
                self.too_deep.append(where)
            else:
                self.failures.append(f"{where}: {str(exc)[:500]}")
            return None
        self.checked += 1
        self.failures += [f"{where}: {m}" for m in literal_mismatches(out.serialize())]
        typ = out.return_type()
        if returns and typ.name() not in returns:
            self.failures.append(f"{where}: returns {typ.name()}, expected {returns}")
        return typ

    def policy(self, obj: dict[str, Any]) -> None:
        spec, name = obj["spec"], f"{obj['kind']}/{obj['metadata']['name']}"
        plain = self.env({}, mutation=False)
        for i, cond in enumerate(spec.get("matchConditions", [])):
            self.compile(plain, f"{name} matchConditions[{i}]", cond["expression"], BOOL_T)
        declared: dict[str, Any] = {}
        for i, variable in enumerate(spec.get("variables", [])):
            typ = self.compile(self.env(declared, mutation=False),
                               f"{name} variables[{i}] {variable['name']}",
                               variable["expression"])
            declared[f"variables.{variable['name']}"] = typ or cel.Type.DYN
        env = self.env(declared, mutation=False)
        for key in ("validations", "auditAnnotations"):
            for i, item in enumerate(spec.get(key, [])):
                for field, returns in (("expression", BOOL_T), ("messageExpression", STR_T),
                                       ("valueExpression", (*STR_T, "NULL"))):
                    if field in item:
                        self.compile(env, f"{name} {key}[{i}].{field}", item[field], returns)
        if spec.get("mutations"):
            menv = self.env(declared, mutation=True)
            for i, mutation in enumerate(spec["mutations"]):
                body = mutation.get("jsonPatch") or mutation.get("applyConfiguration")
                patch: tuple[str, ...] = ("LIST<JSONPatch>",) if "jsonPatch" in mutation else ()
                self.compile(menv, f"{name} mutations[{i}]", body["expression"], patch)


@pytest.mark.parametrize("policy", ["default", "modes"])
def test_every_expression_type_checks_in_cel_cpp(policy: str) -> None:
    checker = Checker()
    for obj in compiled(policy).objects:
        if obj["kind"] in ("MutatingAdmissionPolicy", "ValidatingAdmissionPolicy"):
            checker.policy(obj)
    assert checker.checked > 200  # the whole program, not an empty walk
    assert not checker.failures, "\n\n".join(checker.failures)
    # Only the per-container memory table of a policy with an MPS pool (five env vars
    # chained) nests deeper than cel-cpp parses; its four-variable form is checked above.
    assert all("memEnv" in where for where in checker.too_deep), checker.too_deep


@pytest.fixture(scope="module")
def envs() -> dict[bool, Any]:
    checker = Checker()
    return {m: checker.env({}, mutation=m) for m in (False, True)}


@pytest.mark.parametrize(("expr", "mutation"), [
    pytest.param("math.greatest(1, size(object.spec.containers))", False,
                 id="extension-kubernetes-does-not-load"),
    pytest.param('variables.x == "a"', False, id="undeclared-variable"),
    pytest.param('[JSONPatch{op: "add", path: "/x", value: 1}]', False,
                 id="jsonpatch-outside-mutations"),
    pytest.param('"a".split("/", "b")', False, id="wrong-overload"),
    pytest.param('object.spec.containers.map(c, c.name', False, id="syntax"),
    pytest.param('[JSONPatch{op: "add", paht: "/x"}]', True, id="unknown-jsonpatch-field"),
])
def test_the_check_refuses(expr: str, mutation: bool, envs: dict[bool, Any]) -> None:
    """The environment is strict enough to catch what cel-python lets through."""
    with pytest.raises(Exception):  # noqa: B017 (the binding's errors are untyped)
        envs[mutation].compile(expr)


def test_the_check_accepts_what_kubernetes_documents(envs: dict[bool, Any]) -> None:
    """The facts sheet's JSONPatch example (section 5) and the list/regex/string libraries."""
    envs[True].compile(
        '[JSONPatch{op: "add", value: "shared", path: "/spec/nodeSelector/" + '
        'jsonpatch.escapeKey("gpushare.example.com/pool")}]')
    envs[False].compile(
        'object.spec.containers.map(c, c.name).lastIndexOf("x") + '
        '"a-b".split("-").join("").indexOf("b") + lists.range(3).sum() + '
        'size("v12.4".find("[0-9]+")) + ["b", "a"].sort().size()')


def test_a_type_error_between_variables_is_caught() -> None:
    """Variables are typed for the later ones, as in the API server: an int variable joined
    to a string without ``string()`` is refused."""
    obj = copy.deepcopy(next(o for o in compiled("default").objects
                             if o["kind"] == "MutatingAdmissionPolicy"))
    obj["spec"]["variables"] += [
        {"name": "gpuCount", "expression": "size(variables.gpu)"},
        {"name": "gpuText", "expression": '"gpus: " + variables.gpuCount'}]
    checker = Checker()
    checker.policy(obj)
    assert any("gpuText" in f and "_+_" in f for f in checker.failures), checker.failures
    assert not any(" gpuCount:" in f for f in checker.failures)


@pytest.mark.parametrize(("expr", "found"), [
    pytest.param('["a", object.metadata.name]', "element", id="string-and-dyn"),
    pytest.param('{"a": 1, "b": "x"}', "value", id="int-and-string-values"),
    pytest.param('[1, 2].map(i, {"i": i, "s": string(i)})', "value", id="inside-a-macro"),
])
def test_the_literal_check_refuses_what_the_api_server_refuses(
        expr: str, found: str, envs: dict[bool, Any]) -> None:
    (mismatch,) = literal_mismatches(envs[False].compile(expr).serialize())
    assert f": {found} " in mismatch


def test_the_literal_check_accepts_dyn_wrapped_and_uniform_literals(
        envs: dict[bool, Any]) -> None:
    for expr in ('{"a": dyn(1), "b": dyn("x")}', '["a", "b"]', '[[1], []]',
                 '[object.spec, object.metadata]', '{"k": [1], "l": [2]}'):
        assert literal_mismatches(envs[False].compile(expr).serialize()) == [], expr


def test_a_dyn_audit_annotation_value_is_caught() -> None:
    """Without ``string()`` the audit values are ``dyn`` (the record map holds dyn values), which
    the API server refuses for a ``valueExpression``."""
    obj = copy.deepcopy(next(o for o in compiled("default").objects
                             if o["metadata"]["name"] == "enforce.gpu-admission.io"
                             and o["kind"] == "ValidatingAdmissionPolicy"))
    for note in obj["spec"]["auditAnnotations"]:
        note["valueExpression"] = note["valueExpression"].removeprefix("string(")[:-1]
    checker = Checker()
    checker.policy(obj)
    assert any("auditAnnotations[0].valueExpression: returns DYN" in f
               for f in checker.failures), checker.failures


def test_an_unwrapped_mixed_map_in_the_compiled_program_is_caught() -> None:
    """Drop one ``dyn()`` the compiler writes into a record map: the API server would refuse
    the policy (int beside dyn values), and so does this check."""
    obj = copy.deepcopy(next(o for o in compiled("default").objects
                             if o["kind"] == "MutatingAdmissionPolicy"))
    for variable in obj["spec"]["variables"]:
        variable["expression"] = variable["expression"].replace('"at": dyn(at)', '"at": at')
    checker = Checker()
    checker.policy(obj)
    assert any("memEnv" in f and "value dyn" in f and "primitive: 2" in f
               for f in checker.failures), checker.failures


@pytest.mark.parametrize("source", ["webhook-manifests", "compile --partial"])
def test_webhook_match_conditions_type_check_as_bool(source: str) -> None:
    """The shipped webhook configurations' ``matchConditions`` and the scoped ones
    ``compile --partial`` writes are compiled by the API server too (bool, no variables)."""
    result = compiled("default")
    docs = render("default") if source == "webhook-manifests" else \
        webhook_objects(default_policy(), result.stays)
    checker = Checker()
    plain = checker.env({}, mutation=False)
    hooks = [(d["metadata"]["name"], w) for d in docs
             if d["kind"].endswith("WebhookConfiguration") for w in d["webhooks"]]
    assert hooks
    for config, hook in hooks:
        for cond in hook.get("matchConditions", []):
            checker.compile(plain, f"{config}/{hook['name']} {cond['name']}", cond["expression"],
                            BOOL_T)
    assert checker.checked >= len(hooks)
    assert not checker.failures, "\n\n".join(checker.failures)


@pytest.mark.parametrize("policy", ["default", "modes"])
def test_the_guard_half_type_checks_in_cel_cpp(policy: str) -> None:
    """``compile --guard`` (webhook-manifests/base/guard-policies.yaml, the chart's template)
    and the fallback webhook configurations (components/webhook-guard-fallback)."""
    checker = Checker()
    for obj in compile_guard(POLICIES[policy]()).objects:
        if obj["kind"] in ("MutatingAdmissionPolicy", "ValidatingAdmissionPolicy"):
            checker.policy(obj)
    plain = checker.env({}, mutation=False)
    for target in ("base", "fallback"):
        for doc in render(target):
            for hook in doc.get("webhooks", []):
                for cond in hook.get("matchConditions", []):
                    checker.compile(plain, f"{target} {hook['name']} {cond['name']}",
                                    cond["expression"], BOOL_T)
    expressions = sum(len(o["spec"].get(k, [])) for o in compile_guard(POLICIES[policy]()).objects
                      if "AdmissionPolicy" in o["kind"] and "Binding" not in o["kind"]
                      for k in ("matchConditions", "variables", "validations",
                                "auditAnnotations", "mutations"))
    assert checker.checked > expressions > 20  # every one of them, not an empty walk
    assert not checker.failures, "\n\n".join(checker.failures)
    assert not checker.too_deep
