"""Benchmark ``gpu-admission compile`` and the compiled policies' CEL.

Prints, all measured in this run:

* compile time (policy -> objects -> YAML) of the built-in policy and of a 20-pool policy,
  median of ``--repeat`` runs, with the output size;
* per pod, for a fixed set of representative pods: the engine's decision time (the baseline:
  ``engine.evaluate``, what the webhook runs) and the compiled policies' evaluation in
  cel-python (``gpu_admission.compile.evaluator.admit``: MAP, then every VAP on the mutated
  pod), as a ratio to the engine; and the CEL evaluation steps (AST nodes, a proxy of the API
  server's runtime cost units; PerCallLimit 1,000,000, budget 10,000,000 per policy).

cel-python is an interpreter written in Python; the API server's cel-go is compiled Go. The
celpy figures say what ``evaluate --compiled`` and the tests cost, not what the API server
pays (the issue measured 0.2-0.6 ms for a MAP on a real 1.36 API server).

Then the CEL itself in a compiled evaluator, **cel-cpp** (Google's C++ CEL, ``cel-expr-python``,
the binding the type-check test uses): every expression the API server would evaluate for a
typical GPU pod and a typical CPU pod, the mutating policies first, then the validating
policies on the mutated pod, each policy's matchConditions first (all of them, as the API
server's matcher does; a false one skips the policy), then its validations (a
messageExpression only when the validation fails), audit annotations and mutation, each
variable evaluated lazily on first use, as the API server does; next
to a hand-written *floor* MAP (``schedulerName``, ``NVIDIA_MEM_LIMIT_MB`` and
``GPU_MEMORY_FRACTION`` on GPU containers, no variables). The inputs of each evaluation (the
pod, the request, the variables computed so far) are converted to CEL values before the clock
starts (the binding converts a name on first access, ~3.3 µs for a pod, which the API server
pays once per policy, not per expression), each expression runs once untimed before it is
timed (warm: which evaluations ran cold otherwise depended on the harness), and the time of
an empty expression on the same activation (the binding's call overhead) is subtracted per
evaluation; an evaluation that errs stops the run (a harness fault would otherwise time error
paths). What the API server does once, when it compiles an expression (cel-go
``OptOptimize``: constant list/map literals built once, constant regex patterns compiled
once), is done before the clock too (:func:`plan_time`). The Kubernetes list
``lastIndexOf`` and the regex ``find`` are Python callbacks here (native in cel-go): they
weigh more than in the API server. Then the guard half per policy for the CPU pod (matched or
skipped, conditions, evaluations, µs). ``--objects FILE`` measures another compiled set
(e.g. ``git show main:...``'s output) next to the current one.

    python benchmarks/compile_bench.py [--repeat N] [--objects before.yaml] [--cel-cpp-only]
"""

from __future__ import annotations

import argparse
import functools
import gc
import re
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from gpu_admission.admission.engine import evaluate
from gpu_admission.compile.compiler import compile_policy
from gpu_admission.compile.evaluator import admission_request, admit, counting_cost
from gpu_admission.compile.guard import compile_guard
from gpu_admission.compile.objects import is_constant
from gpu_admission.compile.offline import as_admitted
from gpu_admission.compile.render import render
from gpu_admission.core.decision import RequestFacts
from gpu_admission.core.patch import apply_ops
from gpu_admission.policy.model import Policy, default_policy, policy_from_dict


def pools_policy(count: int) -> Policy:
    doc = default_policy().model_dump(mode="json", by_alias=True)
    doc["metadata"]["name"] = f"{count}-pools"
    doc["spec"]["nodePools"] = [
        {"name": f"pool-{i}", "nodeSelector": {"gpu-admission.io/cuda-version": f"12.{i % 10}",
                                               "pool.example.com/name": f"p{i}"},
         "sharing": ["time-slicing", "mps", "none", "mig"][i % 4], "replicasPerGPU": 1 + i % 7,
         "memoryMiB": 40960 + i, "cudaVersion": f"12.{i % 10}"} for i in range(count)]
    doc["spec"]["cudaRouting"]["driverAffinity"] = True
    return policy_from_dict(doc)


def container(name: str, image: str, gpu: str | None = "1",
              env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": image}
    if gpu:
        out["resources"] = {"limits": {"nvidia.com/gpu": gpu}}
    if env:
        out["env"] = env
    return out


def pods() -> dict[str, dict[str, Any]]:
    def pod(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
        labels = spec.pop("labels", None)
        meta: dict[str, Any] = {"name": "p", "namespace": "team-a"}
        if labels:
            meta["labels"] = labels
        return as_admitted({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                            "spec": {"containers": list(containers), **spec}})

    big_env = [{"name": f"V{i}", "value": "x"} for i in range(30)]
    return {
        "cpu-only": pod(container("web", "nginx:1.27", gpu=None)),
        "inference": pod(container("triton", "nvcr.io/nvidia/tritonserver:24.05-py3")),
        "inference+sidecar": pod(container("m", "vllm/vllm-openai:v0.5.0"),
                                 container("proxy", "envoyproxy/envoy:v1.30", gpu=None)),
        "training": pod(container("t", "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime", "2"),
                        labels={"training.kubeflow.org/job-name": "mnist"}),
        "denied-training-shared": pod(
            container("t", "nvidia/cuda:12.1.1-base", "1"),
            labels={"gpu-admission.io/workload": "training"},
            nodeSelector={"nvidia.com/gpu.sharing-strategy": "time-slicing"}),
        "4-gpu-containers-30-env": pod(*(container(f"c{i}", "nvidia/cuda:12.4.0-base", "1",
                                                   big_env) for i in range(4))),
    }


def timed(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


# ----------------------------------------------------------------------------- cel-cpp
FLOOR_MAP = (
    '[{"op": "add", "path": "/spec/schedulerName", "value": "gpu-aware-scheduler"}] + '
    'lists.range(size(object.spec.containers)).filter(i, '
    'has(object.spec.containers[i].resources) && has(object.spec.containers[i].resources.limits)'
    ' && "nvidia.com/gpu" in object.spec.containers[i].resources.limits).map(i, '
    'has(object.spec.containers[i].env) ? ['
    '{"op": "add", "path": "/spec/containers/" + string(i) + "/env/-", '
    '"value": {"name": "NVIDIA_MEM_LIMIT_MB", "value": "16000"}}, '
    '{"op": "add", "path": "/spec/containers/" + string(i) + "/env/-", '
    '"value": {"name": "GPU_MEMORY_FRACTION", "value": "0.2"}}] : ['
    '{"op": "add", "path": "/spec/containers/" + string(i) + "/env", '
    '"value": [{"name": "NVIDIA_MEM_LIMIT_MB", "value": "16000"}, '
    '{"name": "GPU_MEMORY_FRACTION", "value": "0.2"}]}]).flatten()')


class CelCpp:
    """cel-cpp environments with the 1.36 admission libraries: cel-cpp's strings and lists
    extensions, plus the Kubernetes list ``lastIndexOf``/``sum`` and regex ``find`` (declared
    as the type-check test declares them, implemented in Python: cel-cpp lacks them)."""

    def __init__(self) -> None:
        from cel_expr_python import cel  # noqa: PLC0415 - optional, benchmark only

        self.cel = cel
        functions = [
            # the strings extension owns lastIndexOf; the list overload (Kubernetes' list
            # library) cannot be added to it, so the benchmark renames the list calls
            # (_LIST_LAST_INDEX)
            "  - name: k8sLastIndexOf", "    overloads:",
            # declared on list(string) (every use is a list of env names): cel-expr-python
            # does not dispatch a type-parameterised list overload at run time ("No matching
            # overloads found"), so with list(T) every such expression evaluated to an error
            "      - {id: list_a_last_index_of_int, target: {type_name: list, params: "
            "[{type_name: string}]}, args: [{type_name: string}], return: {type_name: int}}",
            "  - name: sum", "    overloads:",
            "      - {id: list_int_sum_int, target: {type_name: list, params: [{type_name: int}]}"
            ", args: [], return: {type_name: int}}",
            "  - name: find", "    overloads:",
            "      - {id: string_find_string, target: {type_name: string}, "
            "args: [{type_name: string}], return: {type_name: string}}",
            # matches with a constant pattern, precompiled (see plan_time)
            "  - name: k8sMatches", "    overloads:",
            "      - {id: string_k8s_matches_string, target: {type_name: string}, "
            "args: [{type_name: string}], return: {type_name: bool}}"]
        config = "\n".join(["name: bench", "extensions:",
                            "  - {name: lists, version: latest}",
                            "  - {name: strings, version: latest}", "functions:", *functions])
        self.config = cel.NewEnvConfigFromYaml(config)
        self.impls = {
            "list_a_last_index_of_int": lambda items, x: (
                len(items) - 1 - list(reversed(items)).index(x) if x in items else -1),
            "list_int_sum_int": sum,
            "string_find_string": _find,
            "string_k8s_matches_string": _matches,
        }
        self.constants: dict[str, Any] = {}  # k8sConstN -> its value (plan_time)
        self.cache: dict[tuple[str, tuple[str, ...]], tuple[Any, tuple[str, ...]]] = {}
        self.literal_names: dict[str, str] = {}
        self.envs: dict[tuple[str, ...], Any] = {}

    def env(self, declared: tuple[str, ...]) -> Any:
        if declared not in self.envs:
            names = dict.fromkeys(("object", "oldObject", "request", "namespaceObject",
                                   *declared), self.cel.Type.DYN)
            self.envs[declared] = self.cel.NewEnv(config=self.config, variables=names,
                                                  function_impls=self.impls)
        return self.envs[declared]

    def program(self, expr: str, declared: tuple[str, ...]) -> Any:
        key = (expr, declared)
        if key not in self.cache:
            planned, names = plan_time(_LIST_LAST_INDEX.sub(r"\1.k8sLastIndexOf(", expr),
                                       self.literal)
            self.cache[key] = (self.env(declared + names).compile(planned), names)
        return self.cache[key][0]

    def constants_of(self, expr: str, declared: tuple[str, ...]) -> dict[str, Any]:
        """The plan-time constants ``expr`` reads (after :meth:`program`)."""
        return {n: self.constants[n] for n in self.cache[(expr, declared)][1]}

    def literal(self, text: str) -> str:
        """The name of a constant literal's value, evaluated once (outside any clock)."""
        name = self.literal_names.get(text)
        if name is None:
            env = self.env(())
            value = env.compile(text).eval(activation=env.Activation(data={}))
            name = self.literal_names[text] = f"k8sConst{len(self.literal_names)}"
            self.constants[name] = value.plain_value()
        return name

    def activation(self, data: dict[str, Any]) -> Any:
        """The inputs converted to CEL values before the clock starts: the binding converts a
        name's Python value on its first access in an activation (~3.3 µs for the typical
        pod, then 0.2 µs for ``object.metadata.name``), which would charge every expression
        the conversion that the API server does once per policy (the versioned object to
        unstructured, not CEL work) and never between expressions (variables stay CEL
        values). One throw-away expression touching every name warms the activation."""
        declared = tuple(k for k in data if k.startswith(("variables.", "k8sConst")))
        activation = self.env(declared).Activation(data=data)
        self.program(f"size([{', '.join(data)}]) >= 0", declared).eval(activation=activation)
        return activation


#: The list receivers of ``lastIndexOf`` in the compiled expressions (a list of env names):
#: renamed to the Python-implemented list overload; on strings the strings extension's own
#: (native) ``lastIndexOf`` runs, as cel-go's would.
_LIST_LAST_INDEX = re.compile(r"(\bnames|\.map\(e, e\.name\))\.lastIndexOf\(")
_VAR = re.compile(r"variables\.([A-Za-z_][A-Za-z0-9_]*)")
_MISSING = re.compile(r'No value with name "variables\.([A-Za-z_][A-Za-z0-9_]*)"')


class _Missing:
    """An evaluation that needed a variable not computed yet (lazy evaluation)."""

    def __init__(self, name: str) -> None:
        self.name = name


@functools.cache
def _regex(pattern: str) -> Any:
    import re2  # type: ignore[import-untyped]  # noqa: PLC0415

    return re2.compile(pattern)


def _find(text: str, pattern: str) -> str:
    found = _regex(pattern).search(text)
    return found.group(0) if found else ""


def _matches(text: str, pattern: str) -> bool:
    return _regex(pattern).search(text) is not None


# --- what the API server does once, when it compiles an expression -------------------------
# k8s.io/apiserver/pkg/admission/plugin/cel/compile.go builds every program with
# cel.EvalOptions(cel.OptOptimize, ...) and cel.OptimizeRegex(library.ExtensionLibRegex-
# Optimizations...) (environment/base.go likewise). OptOptimize makes cel-go's planner build a
# list or map literal whose entries are all constants once, as a constant (interpreter
# decOptimize: maybeBuildListLiteral / maybeBuildMapLiteral, nested ones first), and, with the
# regex optimizations, compile a constant pattern of matches/find once. cel-expr-python
# exposes no runtime options (cel-cpp has constant_folding and enable_regex_precompilation,
# off by default): it rebuilt a 38-entry map literal on every evaluation (6.4 µs) and
# compiled the pattern on every matches call (4-7 µs). plan_time does the same work up front:
# each constant literal becomes a pre-converted variable, each constant-pattern matches a call
# to a precompiled pattern (a Python callback, ~0.9 µs: still more than cel-go's native
# matcher).
_TOKENS = re.compile(r"""(?P<comment>//[^\n]*)
    |(?P<str>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")
    |(?P<num>\d+(?:\.\d+)?u?)
    |(?P<word>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<ws>\s+)
    |(?P<punct>.)""", re.X | re.S)


def plan_time(expr: str, literal: Callable[[str], str]) -> tuple[str, tuple[str, ...]]:
    """``expr`` with its constant list/map literals replaced by the names ``literal`` gives
    them and ``.matches(<constant>)`` by the precompiled ``.k8sMatches(...)``; returns the text
    and the constant names it reads."""
    tokens = [(m.lastgroup or "", m.group()) for m in _TOKENS.finditer(expr)]
    out: list[str] = []
    names: list[str] = []
    i = 0
    previous = ""  # the last significant token's kind
    while i < len(tokens):
        k, text = tokens[i]
        # a literal opens after an operator, a comma, a parenthesis or "in"; after a name, a
        # closing bracket or a literal, "[" indexes and "{" builds a message
        opener = k == "punct" and text in "[{" and previous not in ("word", ")", "]", "str",
                                                                    "num")
        if opener:
            depth, j = 0, i
            while j < len(tokens):
                t = tokens[j][1] if tokens[j][0] == "punct" else ""
                depth += t in "[{" if t else 0
                depth -= t in "]}" if t else 0
                if depth == 0:
                    break
                j += 1
            inside = "".join(t for _, t in tokens[i:j + 1])
            if j < len(tokens) and is_constant(inside):
                name = literal(inside)
                names.append(name)
                out.append(name)
                previous, i = "word", j + 1
                continue
        if (k == "word" and text == "matches" and previous == "." and i + 2 < len(tokens)
                and tokens[i + 1][1] == "(" and tokens[i + 2][0] == "str"
                and i + 3 < len(tokens) and tokens[i + 3][1] == ")"):
            text = "k8sMatches"
        out.append(text)
        if k not in ("ws", "comment"):
            previous = "in" if text == "in" else k if k in ("word", "str", "num") else text
        i += 1
    return "".join(out), tuple(dict.fromkeys(names))


def _policy_exprs(obj: dict[str, Any]) -> tuple[
        list[str], list[tuple[str, str]], list[tuple[str, str | None]]]:
    """(matchConditions, variables (name, expression), the other expressions: a validation's
    with its messageExpression, evaluated only when the validation fails)."""
    spec = obj["spec"]
    conditions = [c["expression"] for c in spec.get("matchConditions", [])]
    variables = [(v["name"], v["expression"]) for v in spec.get("variables", [])]
    others = [(v["expression"], v.get("messageExpression"))
              for v in spec.get("validations", [])]
    others += [(a["valueExpression"], None) for a in spec.get("auditAnnotations", [])]
    others += [(f"variables.{m['jsonPatch']['expression'].split('variables.')[1].split('.')[0]}",
                None) for m in spec.get("mutations", []) if "jsonPatch" in m]
    return conditions, variables, others


def cel_cpp_run(cpp: CelCpp, objects: list[dict[str, Any]], pod: dict[str, Any],
                timings: list[float],
                per_policy: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """One admission of ``pod`` through ``objects`` in cel-cpp; appends the net time of every
    evaluation to ``timings`` (and, with ``per_policy``, to the evaluating policy's list);
    returns the patched pod.

    As the API server does: every matchCondition of a policy is evaluated (the matcher runs
    them all, then looks for a false one), variables lazily, on first use: an expression is
    evaluated with the variables computed so far, and one that needs another variable
    (cel-cpp answers "No value with name") gets it computed first and is evaluated again;
    only the final evaluation counts."""
    from gpu_admission.compile.evaluator import selector_matches  # noqa: PLC0415

    def run(expr: str, data: dict[str, Any], declared: tuple[str, ...]) -> Any:
        """Net time: the expression minus an empty one on the same activation (the binding's
        call overhead); the inputs are converted before the clock starts
        (:meth:`CelCpp.activation`), and the expression runs once before it, untimed.

        Why the untimed run: a cold evaluation (the program's first touch of its data in
        this run) cost 2-3x a warm one here, and which evaluations ran cold depended on the
        harness, not on the CEL: one that needed a variable not computed yet ran once to learn
        that (an error), then again warm, so moving a constant out of a variable (one
        evaluation fewer in the API server) made its readers look 2-4x slower. Every
        evaluation, the floor's included, is now timed warm: the CEL work, the same way for
        all."""
        program = cpp.program(expr, declared)
        used = {k: v for k, v in data.items()
                if not k.startswith("variables.") or k[10:] in _VAR.findall(expr)}
        used.update(cpp.constants_of(expr, declared))
        empty = cpp.program("true", ())
        activation = cpp.activation(used)
        program.eval(activation=activation)
        start = time.perf_counter()
        empty.eval(activation=activation)
        middle = time.perf_counter()
        value = program.eval(activation=activation)
        end = time.perf_counter()
        missing = _MISSING.search(str(value)) if type(value).__name__ == "Value" else None
        if missing:
            return _Missing(missing.group(1))
        if str(value.type()) == "ERROR":  # a harness fault would time an error path
            raise RuntimeError(f"{expr[:120]!r}: {value}")
        net = max((end - middle) - (middle - start), 0.0)
        timings.append(net)
        if per_policy is not None:
            per_policy.setdefault(current_policy[0], []).append(net)
        return value.plain_value() if hasattr(value, "plain_value") else value

    def lazy(expr: str, data: dict[str, Any], variables: dict[str, str]) -> Any:
        declared = tuple(f"variables.{n}" for n in variables)
        while True:
            value = run(expr, data, declared)
            if not isinstance(value, _Missing):
                return value
            name = value.name
            data[f"variables.{name}"] = lazy(variables[name], data, variables)

    labels = {"kubernetes.io/metadata.name": "team-a", "gpu-admission.io/enabled": "true"}
    # the API server's request (issue 31: omitempty fields such as subResource absent)
    request = admission_request(pod, RequestFacts("team-a", user="alice",
                                                  groups=("system:authenticated",)))
    current = pod
    current_policy = [""]
    for stage in ("MutatingAdmissionPolicy", "ValidatingAdmissionPolicy"):
        for obj in objects:
            if obj["kind"] != stage:
                continue
            selector = obj["spec"]["matchConstraints"].get("namespaceSelector", {})
            if not selector_matches(selector, labels):
                continue
            current_policy[0] = obj["metadata"]["name"]
            data: dict[str, Any] = {"object": current, "oldObject": None, "request": request}
            conditions, variables, others = _policy_exprs(obj)
            results = [run(c, data, ()) for c in conditions]  # every one, as the matcher
            if not all(results):
                continue
            named = dict(variables)
            patch = None
            for expr, message in others:
                value = lazy(expr, data, named)
                if message is not None and value is False:
                    lazy(message, data, named)
                if stage.startswith("Mutating") and expr.startswith("variables."):
                    patch = value
            if patch:
                current = apply_ops(current, patch)
    return current


def cel_cpp_section(objects_by_name: dict[str, list[dict[str, Any]]], repeat: int) -> None:
    # The collector's pauses are not CEL work (the Python callbacks and the harness allocate;
    # a full collection inside a timed evaluation added 0.3-1 ms to one GPU-pod figure): what
    # exists before the section is frozen out of its sight, so its collections stay small.
    gc.collect()
    gc.freeze()
    _cel_cpp_section(objects_by_name, repeat)


def _cel_cpp_section(objects_by_name: dict[str, list[dict[str, Any]]], repeat: int) -> None:
    cpp = CelCpp()
    floor = [{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
              "metadata": {"name": "floor"},
              "spec": {"matchConstraints": {}, "mutations": [
                  {"patchType": "JSONPatch", "jsonPatch": {"expression": "variables.ops.map(o, "
                                                                         "o)"}}],
                       "variables": [{"name": "ops", "expression": FLOOR_MAP}]}}]
    typical = {"gpu (Triton)": pods()["inference"], "cpu (nginx)": pods()["cpu-only"]}

    def measure(objects: list[dict[str, Any]], pod: dict[str, Any]) -> tuple[float, int]:
        best = []
        evaluations = 0
        for _ in range(repeat):
            timings: list[float] = []
            cel_cpp_run(cpp, objects, pod, timings)
            evaluations = len(timings)
            best.append(sum(timings))
        return statistics.median(best), evaluations

    print("\ncel-cpp (cel-expr-python): net CEL time per pod CREATE, median of", repeat)
    print(f"  {'objects':<22}{'pod':<15}{'µs':>9}{'evals':>7}{'x floor':>9}")
    for label, pod in typical.items():
        floor_time, floor_n = measure(floor, pod)
        print(f"  {'floor MAP':<22}{label:<15}{floor_time * 1e6:9.1f}{floor_n:7d}{1.0:8.1f}x")
        for name, objects in objects_by_name.items():
            got, count = measure(objects, pod)
            print(f"  {name:<22}{label:<15}{got * 1e6:9.1f}{count:7d}"
                  f"{got / floor_time:8.1f}x")
    guard = objects_by_name.get("guard half")
    if guard is None:
        return
    print("\n  guard half per policy, cpu (nginx): matchConditions + expressions evaluated, "
          "net µs (median)")
    runs: list[dict[str, list[float]]] = []
    for _ in range(repeat):
        per: dict[str, list[float]] = {}
        cel_cpp_run(cpp, guard, typical["cpu (nginx)"], [], per)
        runs.append(per)
    policies = [o for o in guard if o["kind"].endswith("AdmissionPolicy")]
    for obj in policies:
        name = obj["metadata"]["name"]
        conditions = len(obj["spec"].get("matchConditions", []))
        evals = len(runs[0].get(name, []))
        ran = "runs   " if evals > conditions else "skipped"
        micros = statistics.median(sum(r.get(name, [])) for r in runs) * 1e6
        print(f"    {name:<34}{ran} {conditions:2d} conditions, {evals:3d} evaluations "
              f"{micros:8.1f} µs")


def cost_section(objects_by_name: dict[str, list[dict[str, Any]]]) -> None:
    """CEL steps per policy (cel-python's node count: the proxy the limits test uses for the
    API server's runtime cost units) for the typical pods."""
    from gpu_admission.compile.evaluator import admit as run_admit  # noqa: PLC0415

    print("\nCEL steps per admission (cel-python node count, the cost-limit test's proxy)")
    facts = RequestFacts(namespace="team-a")
    for name, objects in objects_by_name.items():
        for label in ("inference", "cpu-only"):
            with counting_cost() as steps:
                run_admit(objects, pods()[label], facts)
            print(f"  {name:<22}{label:<15}{steps[0]:9d}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--objects", action="append", default=[], metavar="FILE",
                        help="another compiled YAML stream to measure next to the current one")
    parser.add_argument("--cel-cpp-only", action="store_true")
    args = parser.parse_args()
    current = compile_policy(default_policy(), partial=True).objects
    sets: dict[str, list[dict[str, Any]]] = {}
    for path in args.objects:
        sets[Path(path).stem] = [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
    sets["compiled (this tree)"] = current
    sets["guard half"] = compile_guard(default_policy()).objects
    cel_cpp_section(sets, max(args.repeat, 20))
    cost_section(sets)
    if args.cel_cpp_only:
        return
    policies = {"default": default_policy(), "20 pools": pools_policy(20)}
    print("compile (policy -> objects -> YAML), median of", args.repeat)
    for name, policy in policies.items():
        def run(p: Policy = policy) -> str:
            result = compile_policy(p, partial=True)
            return render(p, result.objects, result.comments, result.stays)
        text = run()
        seconds = timed(run, args.repeat)
        print(f"  {name:<10} {seconds * 1000:8.1f} ms   {len(text) / 1024:7.1f} KiB YAML")
    facts = RequestFacts(namespace="team-a")
    for name, policy in policies.items():
        objects = compile_policy(policy, partial=True).objects
        print(f"\nper pod, policy {name}: engine (baseline) vs compiled CEL in cel-python")
        print(f"  {'pod':<26}{'engine µs':>11}{'celpy ms':>10}{'ratio':>9}{'CEL steps':>11}")
        for label, pod in pods().items():
            admit(objects, pod, facts)  # warm the expression cache (parsing is one-off)
            engine = timed(partial(evaluate, pod, facts, policy), max(args.repeat, 200))
            celpy = timed(partial(admit, objects, pod, facts), args.repeat)
            with counting_cost() as steps:
                admit(objects, pod, facts)
            print(f"  {label:<26}{engine * 1e6:11.1f}{celpy * 1e3:10.1f}"
                  f"{celpy / engine:8.0f}x{steps[0]:11d}")


if __name__ == "__main__":
    main()
