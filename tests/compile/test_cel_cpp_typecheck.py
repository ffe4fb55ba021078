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
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from cel_expr_python import cel
from google.protobuf import descriptor_pb2, descriptor_pool, struct_pb2

from tests.compile_support import compiled


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
        """The checked result type, or None (the failure recorded). ``returns``: the type
        names the API server accepts for this field (it refuses e.g. a ``messageExpression``
        that is not a string); ``dyn`` is always accepted, as there."""
        try:
            out = env.compile(expr)
        except Exception as exc:
            if CPP_DEPTH_ERROR in str(exc):
                self.too_deep.append(where)
            else:
                self.failures.append(f"{where}: {str(exc)[:500]}")
            return None
        self.checked += 1
        typ = out.return_type()
        if returns and typ.name() not in (*returns, "DYN"):
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
    for variable in obj["spec"]["variables"]:
        variable["expression"] = variable["expression"].replace(
            '"<= " + string(variables.memMiB)', '"<= " + variables.memMiB')
    checker = Checker()
    checker.policy(obj)
    assert any("memEnv" in f and "_+_" in f for f in checker.failures), checker.failures
