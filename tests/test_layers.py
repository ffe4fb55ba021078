"""The floors and the floor plan of gpu_admission and the import directions between them,
written down once (:data:`FLOORS` per module, :data:`PACKAGES` per package;
docs/architecture.md describes them), and an AST walk over every module that fails when an
import breaks them.

Rules checked, per module of ``gpu_admission/`` (lazy imports inside functions included):

1. every module has a floor (a new module cannot slip in unassigned), and every entry of the
   table names a module that exists;
2. a module imports from its own floor or below, never above;
3. no module uses another module's private (``_underscore``) name: not ``from m import _x``,
   ``m._x`` through an imported module, nor ``C._x`` of a class ``C`` imported from it; what
   two modules share is a public function of the lower one;
4. the core and pure floors import no I/O library (:data:`IO_LIBRARIES`), except the few
   written in :data:`EXCEPTIONS` with the reason.

And per top-level package, the floor plan (:data:`PACKAGES`; the README's "How it is built"):

5. every module is in a package of the plan (no loose modules at the top);
6. a package imports only packages of its own storey or below;
7. no two packages import each other, directly or round a loop; nor do two modules.

No new dependency: ``ast`` and ``pathlib`` only.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

PACKAGE: Final = "gpu_admission"
ROOT: Final = Path(__file__).resolve().parents[1] / PACKAGE

#: (name, what lives there, modules): floor 0 first. A module is named relative to
#: ``gpu_admission`` ("" is the package itself); ``pkg.*`` covers the package ``pkg`` and every
#: module under it, for packages whose modules all share one floor. Packages that mix floors
#: list each module, so a module added there has no floor until someone gives it one.
FLOORS: Final[tuple[tuple[str, str, tuple[str, ...]], ...]] = (
    ("core", "values and small pure helpers every floor reads", (
        "", "core.*", "policy.*")),
    ("pure", "decisions and computations: pod, objects, metrics and policy in, values out", (
        "dra.*", "facts.*", "workloads", "workloads.kinds", "rules.*", "admission.*",
        "evaluate", "evaluate.dra", "placement.*",
        "compile", "compile.cel", "compile.units", "compile.objects", "compile.compiler",
        "compile.render", "compile.evaluator", "compile.offline", "compile.guard",
        "compile.rules.*",
        "usage", "usage.data", "usage.compute", "usage.sharing",
        "report", "report.render", "report.html",
        "reclaim", "reclaim.plan", "reclaim.names",
        "auditlog", "auditlog.entry", "auditlog.record", "auditlog.query", "auditlog.report",
        "images", "images.scan", "simulate", "simulate.trace", "simulate.core")),
    ("io", "talks to the world or speaks its wire format: API server, Prometheus, registries, "
     "files, TLS, logs, metrics", (
        "kube.*", "usage.prom", "usage.query", "certs", "certs.bundle", "workloads.files",
        "images.registry", "auditlog.reader", "auditlog.writer", "extender.gpustate",
        "extender.binder", "reclaim.kube", "reclaim.lease",
        "server", "server.wire", "server.config", "server.tls", "server.logs", "server.metrics",
        "server.reload")),
    ("faces", "what a user or the cluster runs: commands, servers, controllers", (
        "__main__", "cli.*", "evaluate.cli", "certs.install", "server.app", "server.run",
        "server.cli", "extender", "extender.app", "extender.cli", "extender.reserve",
        "compile.cli", "report.cli", "reclaim.controller", "reclaim.cli", "images.cli",
        "auditlog.cli", "simulate.cli")),
)

#: The floor plan: (storey, what lives there, top-level packages), lowest first. A package
#: imports only packages of its own storey or below, and no two packages import each other,
#: directly or round a longer loop (:func:`package_cycles`). "" is ``gpu_admission/__init__.py``
#: (the version); a loose module at the top is a package of its own and has no storey.
PACKAGES: Final[tuple[tuple[str, str, tuple[str, ...]], ...]] = (
    ("vocabulary", "the policy's words and values, pure helpers, the policy model", (
        "", "core", "policy")),
    ("pod facts", "what a pod is and asks for: DRA analysis, the fractional plan, other "
     "sharing systems, node pools, serving engines, the workloads that carry pods", (
        "dra", "facts", "workloads")),
    ("admission core", "the rules, and the engine that runs them on a pod's facts", (
        "rules", "admission")),
    ("clients", "the cluster (list/watch, caches) and Prometheus (GPU usage)", (
        "kube", "usage")),
    ("faces", "what a user or the cluster runs: the command line, webhook server, compiler, "
     "evaluate, placement and extender, simulate, report, reclaim, audit, images, certificates", (
        "cli", "auditlog", "certs", "server", "compile", "evaluate", "images", "placement",
        "extender", "simulate", "reclaim", "report", "__main__")),
)

#: Libraries that do I/O or run threads, event loops or servers: never below the io floor.
IO_LIBRARIES: Final = frozenset({
    "aiohttp", "asyncio", "click", "concurrent", "glob", "gzip", "http", "kubernetes",
    "multiprocessing", "prometheus_client", "pynvml", "queue", "requests", "shutil", "signal",
    "socket", "socketserver", "ssl", "structlog", "subprocess", "tempfile", "threading",
    "urllib", "urllib3",
})

#: (module, library): why a pure module may import that library anyway.
EXCEPTIONS: Final[Mapping[tuple[str, str], str]] = {
    ("compile.evaluator", "threading"): "a lock around cel-python's compiler (not "
    "thread-safe) and a per-thread cost counter; no I/O",
}

PURE_FLOORS: Final = 2  # floors below this one import no I/O library


def covers(entry: str, module: str) -> bool:
    if entry.endswith(".*"):
        package = entry.removesuffix(".*")
        return module == package or module.startswith(package + ".")
    return module == entry


def floor_of(module: str) -> int | None:
    """The floor of ``module`` (relative name), from its most specific entry; None if none."""
    best: tuple[int, int] | None = None  # (entry length, floor); an exact name beats pkg.*
    for floor, (_, _, entries) in enumerate(FLOORS):
        for entry in entries:
            rank = len(entry) + (1000 if not entry.endswith(".*") else 0)
            if covers(entry, module) and (best is None or rank > best[0]):
                best = (rank, floor)
    return None if best is None else best[1]


def label(floor: int) -> str:
    return f"floor {floor} {FLOORS[floor][0]}"


@dataclass(frozen=True)
class Source:
    text: str
    is_package: bool  # an __init__.py
    path: str  # for messages


def package_sources(root: Path = ROOT) -> dict[str, Source]:
    """Every module of the package by relative name ("" for ``gpu_admission`` itself)."""
    out: dict[str, Source] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = Source(path.read_text(encoding="utf-8"), is_package,
                                      str(path.relative_to(root.parent)))
    return out


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@dataclass(frozen=True)
class Import:
    line: int
    target: str | None  # relative module name inside the package; None: another library
    library: str | None  # top-level name of another library
    private: str | None  # a private name taken from ``target``


def imports(module: str, source: Source, modules: Mapping[str, Source]) -> Iterator[Import]:
    """Every import in ``source`` (at any depth), resolved against ``modules``."""
    package = module if source.is_package else module.rpartition(".")[0]
    tree = ast.parse(source.text)
    aliases: dict[str, str] = {}  # local name -> module of the package it is bound to
    names: dict[str, tuple[str, str]] = {}  # local name -> (module, name) it was taken from

    def inside(absolute: str) -> str | None:
        if absolute == PACKAGE:
            return ""
        if absolute.startswith(PACKAGE + "."):
            return absolute[len(PACKAGE) + 1:]
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                rel = inside(alias.name)
                if rel is None:
                    yield Import(node.lineno, None, alias.name.partition(".")[0], None)
                    continue
                yield Import(node.lineno, rel, None, None)
                if alias.asname:
                    aliases[alias.asname] = rel
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[:len(base) - node.level + 1]
                rel = ".".join([*base, *([node.module] if node.module else [])])
            else:
                found = inside(node.module or "")
                if found is None:
                    if node.module != "__future__":
                        yield Import(node.lineno, None, (node.module or "").partition(".")[0],
                                     None)
                    continue
                rel = found
            for alias in node.names:
                sub = f"{rel}.{alias.name}" if rel else alias.name
                if sub in modules:  # a module, not a name
                    yield Import(node.lineno, sub, None, None)
                    aliases[alias.asname or alias.name] = sub
                else:
                    yield Import(node.lineno, rel, None,
                                 alias.name if is_private(alias.name) else None)
                    names[alias.asname or alias.name] = (rel, alias.name)
    for node in ast.walk(tree):  # m._x of an imported module m, C._x of an imported class C
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and is_private(node.attr)):
            if node.value.id in aliases:
                yield Import(node.lineno, aliases[node.value.id], None, node.attr)
            elif node.value.id in names:
                owner, name = names[node.value.id]
                yield Import(node.lineno, owner, None, f"{name}.{node.attr}")


def unassigned(modules: Mapping[str, Source]) -> list[str]:
    return [f"{s.path}: {PACKAGE}.{m}".rstrip(".") + " has no floor: add it to FLOORS in "
            "tests/test_layers.py (and to docs/architecture.md)"
            for m, s in modules.items() if floor_of(m) is None]


def violations(modules: Mapping[str, Source]) -> list[str]:
    """One message per import that breaks the floors (rules 2-4 of the module docstring)."""
    out: list[str] = []
    for module, source in modules.items():
        floor = floor_of(module)
        if floor is None:
            continue  # reported by unassigned()
        name = f"{PACKAGE}.{module}".rstrip(".")
        for imp in imports(module, source, modules):
            where = f"{source.path}:{imp.line}: {name} ({label(floor)})"
            if imp.library is not None:
                if (floor < PURE_FLOORS and imp.library in IO_LIBRARIES
                        and (module, imp.library) not in EXCEPTIONS):
                    out.append(f"{where} imports the I/O library {imp.library}: only the io "
                               "floor and above may (or add a reasoned entry to EXCEPTIONS)")
                continue
            assert imp.target is not None
            target = f"{PACKAGE}.{imp.target}".rstrip(".")
            if imp.private is not None and imp.target != module:
                out.append(f"{where} uses the private name {target}.{imp.private}: make it a "
                           f"public function of {target}")
            other = floor_of(imp.target)
            if other is not None and other > floor:
                out.append(f"{where} imports {target} ({label(other)}): a module imports only "
                           "from its own floor or below")
    return list(dict.fromkeys(out))  # one message for several names of one import


def package_of(module: str) -> str:
    """The top-level package of ``module`` ("" for ``gpu_admission`` itself); a loose module
    at the top is a package of its own (and has no storey)."""
    return module.partition(".")[0]


def storey_of(package: str) -> int | None:
    for storey, (_, _, packages) in enumerate(PACKAGES):
        if package in packages:
            return storey
    return None


def storey_label(storey: int) -> str:
    return f"storey {storey} {PACKAGES[storey][0]}"


def pretty(package: str) -> str:
    return f"{PACKAGE}.{package}".rstrip(".")


def import_graph(modules: Mapping[str, Source]) -> dict[str, dict[str, str]]:
    """module -> {imported module of the package: where (``path:line``), the first import}."""
    graph: dict[str, dict[str, str]] = {}
    for module, source in modules.items():
        out = graph.setdefault(module, {})
        for imp in imports(module, source, modules):
            if imp.target is not None and imp.target != module and imp.target in modules:
                out.setdefault(imp.target, f"{source.path}:{imp.line}")
    return graph


def cycles(graph: Mapping[str, Mapping[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted: the
    nodes that import each other, directly or round a loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, {}):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def loop_message(what: str, component: list[str], graph: Mapping[str, Mapping[str, str]],
                 name: Callable[[str], str]) -> str:
    inside = set(component)
    edges = "; ".join(f"{name(a)} -> {name(b)} ({where})" for a in component
                      for b, where in sorted(graph.get(a, {}).items()) if b in inside)
    return (f"{what} {', '.join(name(c) for c in component)} import each other: {edges}; "
            "move what they share into the lower one")


def package_violations(modules: Mapping[str, Source]) -> list[str]:
    """The floor plan (:data:`PACKAGES`): every top-level package has a storey, imports only
    packages of its storey or below, and no packages import each other."""
    out: list[str] = []
    graph: dict[str, dict[str, str]] = {}
    for module, targets in import_graph(modules).items():
        package = package_of(module)
        if storey_of(package) is None:
            out.append(f"{modules[module].path}: {pretty(module)} is in no package of the floor "
                       "plan: put it in a package of PACKAGES in tests/test_layers.py (and the "
                       "README's floor plan)")
        edges = graph.setdefault(package, {})
        for target, where in targets.items():
            other = package_of(target)
            if other != package:
                edges.setdefault(other, f"{where}: {pretty(module)} imports {pretty(target)}")
    for package, edges in sorted(graph.items()):
        storey = storey_of(package)
        for other, where in sorted(edges.items()):
            above = storey_of(other)
            if storey is not None and above is not None and above > storey:
                out.append(f"{where}: package {pretty(package)} ({storey_label(storey)}) "
                           f"imports package {pretty(other)} ({storey_label(above)}): a "
                           "package imports only packages of its storey or below")
    out.extend(loop_message("packages", c, graph, pretty) for c in cycles(graph))
    return list(dict.fromkeys(out))


def module_cycles(modules: Mapping[str, Source]) -> list[str]:
    graph = import_graph(modules)
    return [loop_message("modules", c, graph, pretty) for c in cycles(graph)]


def test_every_module_has_a_floor() -> None:
    missing = unassigned(package_sources())
    assert not missing, "\n".join(missing)


def test_every_floor_entry_names_a_module() -> None:
    modules = package_sources()
    stale = [f"FLOORS names {PACKAGE}.{entry}, which does not exist" for _, _, entries in FLOORS
             for entry in entries if entry.removesuffix(".*") not in modules]
    assert not stale, "\n".join(stale)


def test_imports_follow_the_floors() -> None:
    found = violations(package_sources())
    assert not found, "imports that break the floors (docs/architecture.md):\n" + "\n".join(
        found)


def test_exceptions_are_still_needed() -> None:
    modules = package_sources()
    unused = [f"EXCEPTIONS allows {PACKAGE}.{m} to import {lib}, which it no longer does"
              for (m, lib) in EXCEPTIONS
              if m not in modules or lib not in {i.library for i in imports(m, modules[m],
                                                                             modules)}]
    assert not unused, "\n".join(unused)


def test_every_package_entry_names_a_package() -> None:
    packages = {package_of(m) for m in package_sources()}
    stale = [f"PACKAGES names {pretty(p)}, which does not exist" for _, _, entries in PACKAGES
             for p in entries if p not in packages]
    assert not stale, "\n".join(stale)


def test_packages_follow_the_floor_plan() -> None:
    found = package_violations(package_sources())
    assert not found, "imports that break the floor plan (README, How it is built):\n" + \
        "\n".join(found)


def test_no_modules_import_each_other() -> None:
    found = module_cycles(package_sources())
    assert not found, "\n".join(found)


def _tree(**files: str) -> dict[str, Source]:
    """A made-up package of plain modules: ``rules__memory`` is ``gpu_admission.rules.memory``."""
    out: dict[str, Source] = {}
    for key, text in files.items():
        name = key.replace("__", ".")
        out[name] = Source(text, False, f"{PACKAGE}/{name.replace('.', '/')}.py")
    return out


@pytest.mark.parametrize(("files", "expected"), [
    ({"admission__engine": "from gpu_admission.kube.client import api_client\n"},
     ["gpu_admission/admission/engine.py:1: gpu_admission.admission.engine (floor 1 pure) "
      "imports "
      "gpu_admission.kube.client (floor 2 io): a module imports only from its own floor or "
      "below"]),
    ({"core__vocab": "def f():\n    from gpu_admission.admission import engine\n"},
     ["gpu_admission/core/vocab.py:2: gpu_admission.core.vocab (floor 0 core) imports "
      "gpu_admission.admission.engine (floor 1 pure): a module imports only from its own floor or "
      "below"]),
    ({"admission__claims": "from .engine import _classify\n"},
     ["gpu_admission/admission/claims.py:1: gpu_admission.admission.claims (floor 1 pure) uses "
      "the private name gpu_admission.admission.engine._classify: make it a public function of "
      "gpu_admission.admission.engine"]),
    ({"rules__dra": "from gpu_admission.rules import memory\nx = memory._wanted\n"},
     ["gpu_admission/rules/dra.py:2: gpu_admission.rules.dra (floor 1 pure) uses the private "
      "name gpu_admission.rules.memory._wanted: make it a public function of "
      "gpu_admission.rules.memory"]),
    ({"rules__dra": "from .memory import MemoryLimit\nMemoryLimit._container(1)\n"},
     ["gpu_admission/rules/dra.py:2: gpu_admission.rules.dra (floor 1 pure) uses the private "
      "name gpu_admission.rules.memory.MemoryLimit._container: make it a public function of "
      "gpu_admission.rules.memory"]),
    ({"rules__memory": "from .base import _x\n"},
     ["gpu_admission/rules/memory.py:1: gpu_admission.rules.memory (floor 1 pure) uses the "
      "private name gpu_admission.rules.base._x: make it a public function of "
      "gpu_admission.rules.base"]),
    ({"usage__compute": "import urllib3.util\n"},
     ["gpu_admission/usage/compute.py:1: gpu_admission.usage.compute (floor 1 pure) imports "
      "the I/O library urllib3: only the io floor and above may (or add a reasoned entry to "
      "EXCEPTIONS)"]),
    ({"placement__score": "from threading import Lock\n"},
     ["gpu_admission/placement/score.py:1: gpu_admission.placement.score (floor 1 pure) "
      "imports the I/O library threading: only the io floor and above may (or add a reasoned "
      "entry to EXCEPTIONS)"]),
], ids=["upward", "upward-lazy", "private-from", "private-attribute", "private-class-attribute",
        "private-sibling", "io-library", "io-library-from"])
def test_the_check_catches(files: dict[str, str], expected: list[str]) -> None:
    tree = _tree(**{"admission__engine": "", "kube__client": "", "rules__base": "",
                    "rules__memory": "", **files})
    assert violations(tree) == expected


@pytest.mark.parametrize("files", [
    {"server__app": "from gpu_admission.admission.engine import evaluate\nimport aiohttp\n"},
    {"admission__engine": "from gpu_admission.core import vocab\nfrom ..core import decision\n"},
    {"rules__memory": "import gpu_admission\nv = gpu_admission.__version__\n"},
    {"compile__evaluator": "import threading\n"},
], ids=["face-imports-down", "same-floor-and-below", "dunder-is-public", "reasoned-exception"])
def test_the_check_allows(files: dict[str, str]) -> None:
    assert violations(_tree(**{"admission__engine": "", "core__vocab": "", "core__decision": "",
                                  **files})) == []


@pytest.mark.parametrize(("module", "floor"), [
    ("quotas", None),  # a new top-level module
    ("extender.kubestate", None),  # a new module of a package that mixes floors
    ("compile.vap", None),
    ("rules.quota", 1),  # rules.*: every rule is pure
    ("kube.nodes", 2),
    ("extender.cli", 3),
    ("policy", 0),
])
def test_a_new_module_needs_a_floor(module: str, floor: int | None) -> None:
    assert floor_of(module) == floor
    found = unassigned(_tree(**{module.replace(".", "__"): ""}))
    path = module.replace(".", "/")
    assert found == ([] if floor is not None else [
        f"gpu_admission/{path}.py: gpu_admission.{module} has no floor: add it to FLOORS in "
        "tests/test_layers.py (and to docs/architecture.md)"])


@pytest.mark.parametrize(("files", "expected"), [
    ({"facts__nodepools": "from gpu_admission.admission.engine import classify\n"},
     ["gpu_admission/facts/nodepools.py:1: gpu_admission.facts.nodepools imports "
      "gpu_admission.admission.engine: package gpu_admission.facts (storey 1 pod facts) "
      "imports package gpu_admission.admission (storey 2 admission core): a package imports "
      "only packages of its storey or below"]),
    ({"report__cli": "from gpu_admission.reclaim.plan import preview\n",
      "reclaim__plan": "def f():\n    from gpu_admission.report import html\n"},
     ["packages gpu_admission.reclaim, gpu_admission.report import each other: "
      "gpu_admission.reclaim -> gpu_admission.report (gpu_admission/reclaim/plan.py:2: "
      "gpu_admission.reclaim.plan imports gpu_admission.report.html); gpu_admission.report -> "
      "gpu_admission.reclaim (gpu_admission/report/cli.py:1: gpu_admission.report.cli imports "
      "gpu_admission.reclaim.plan); move what they share into the lower one"]),
    ({"quotas": "from gpu_admission.core import vocab\n"},
     ["gpu_admission/quotas.py: gpu_admission.quotas is in no package of the floor plan: put it "
      "in a package of PACKAGES in tests/test_layers.py (and the README's floor plan)"]),
], ids=["package-upward", "packages-import-each-other", "loose-module"])
def test_the_package_check_catches(files: dict[str, str], expected: list[str]) -> None:
    tree = _tree(**{"admission__engine": "", "core__vocab": "", "reclaim__plan": "",
                    "report__html": "", **files})
    assert package_violations(tree) == expected


def test_the_module_check_catches_a_loop() -> None:
    tree = _tree(compile__compiler="from .guard import compile_guard\n",
                 compile__guard="from .units import Program\n",
                 compile__units="def f():\n    from .compiler import GROUP\n")
    assert module_cycles(tree) == [
        "modules gpu_admission.compile.compiler, gpu_admission.compile.guard, "
        "gpu_admission.compile.units import each other: gpu_admission.compile.compiler -> "
        "gpu_admission.compile.guard (gpu_admission/compile/compiler.py:1); "
        "gpu_admission.compile.guard -> gpu_admission.compile.units "
        "(gpu_admission/compile/guard.py:1); gpu_admission.compile.units -> "
        "gpu_admission.compile.compiler (gpu_admission/compile/units.py:2); move what they "
        "share into the lower one"]
