"""The floors of gpu_admission and the import directions between them, written down once
(:data:`FLOORS`; docs/architecture.md describes them), and an AST walk over every module
that fails when an import breaks them.

Rules checked, per module of ``gpu_admission/`` (lazy imports inside functions included):

1. every module has a floor (a new module cannot slip in unassigned), and every entry of the
   table names a module that exists;
2. a module imports from its own floor or below, never above;
3. no module uses another module's private (``_underscore``) name: not ``from m import _x``,
   ``m._x`` through an imported module, nor ``C._x`` of a class ``C`` imported from it; what
   two modules share is a public function of the lower one;
4. the core and pure floors import no I/O library (:data:`IO_LIBRARIES`), except the few
   written in :data:`EXCEPTIONS` with the reason.

No new dependency: ``ast`` and ``pathlib`` only.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
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
        "", "vocab", "decision", "cuda", "quantity", "patch", "fractional", "timeframe",
        "policy.*")),
    ("pure", "decisions and computations: pod, objects, metrics and policy in, values out", (
        "engine", "workloads", "sharing_systems", "rules.*", "dra.*", "placement.*",
        "compile", "compile.cel", "compile.units", "compile.compiler", "compile.render",
        "compile.evaluator", "compile.offline", "compile.guard", "compile.rules.*",
        "report", "report.data", "report.compute", "report.sharing", "report.render",
        "report.html",
        "reclaim", "reclaim.plan", "reclaim.names",
        "auditlog", "auditlog.entry", "auditlog.record", "auditlog.query", "auditlog.report",
        "images", "images.scan")),
    ("io", "talks to the world or speaks its wire format: API server, Prometheus, registries, "
     "files, TLS, logs, metrics", (
        "kube.*", "prom", "certs", "manifests", "report.query", "images.registry",
        "auditlog.reader", "auditlog.writer", "extender.gpustate", "extender.binder",
        "reclaim.kube", "reclaim.lease",
        "server", "server.wire", "server.config", "server.tls", "server.logs", "server.metrics",
        "server.reload")),
    ("faces", "what a user or the cluster runs: commands, servers, controllers", (
        "__main__", "cli", "cli_options", "evaluate_cli", "install_certs", "reserve",
        "server.app", "server.run", "server.cli", "extender", "extender.app", "extender.cli",
        "compile.cli", "report.cli", "reclaim.controller", "reclaim.cli", "images.cli",
        "auditlog.cli")),
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


def _tree(**files: str) -> dict[str, Source]:
    """A made-up package of plain modules: ``rules__memory`` is ``gpu_admission.rules.memory``."""
    out: dict[str, Source] = {}
    for key, text in files.items():
        name = key.replace("__", ".")
        out[name] = Source(text, False, f"{PACKAGE}/{name.replace('.', '/')}.py")
    return out


@pytest.mark.parametrize(("files", "expected"), [
    ({"engine": "from gpu_admission.kube.client import api_client\n"},
     ["gpu_admission/engine.py:1: gpu_admission.engine (floor 1 pure) imports "
      "gpu_admission.kube.client (floor 2 io): a module imports only from its own floor or "
      "below"]),
    ({"vocab": "def f():\n    from gpu_admission import engine\n"},
     ["gpu_admission/vocab.py:2: gpu_admission.vocab (floor 0 core) imports "
      "gpu_admission.engine (floor 1 pure): a module imports only from its own floor or "
      "below"]),
    ({"dra__claims": "from ..engine import _classify\n"},
     ["gpu_admission/dra/claims.py:1: gpu_admission.dra.claims (floor 1 pure) uses the private "
      "name gpu_admission.engine._classify: make it a public function of gpu_admission.engine"]),
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
    ({"report__compute": "import urllib3.util\n"},
     ["gpu_admission/report/compute.py:1: gpu_admission.report.compute (floor 1 pure) imports "
      "the I/O library urllib3: only the io floor and above may (or add a reasoned entry to "
      "EXCEPTIONS)"]),
    ({"placement__score": "from threading import Lock\n"},
     ["gpu_admission/placement/score.py:1: gpu_admission.placement.score (floor 1 pure) "
      "imports the I/O library threading: only the io floor and above may (or add a reasoned "
      "entry to EXCEPTIONS)"]),
], ids=["upward", "upward-lazy", "private-from", "private-attribute", "private-class-attribute",
        "private-sibling", "io-library", "io-library-from"])
def test_the_check_catches(files: dict[str, str], expected: list[str]) -> None:
    tree = _tree(**{"engine": "", "kube__client": "", "rules__base": "", "rules__memory": "",
                    **files})
    assert violations(tree) == expected


@pytest.mark.parametrize("files", [
    {"server__app": "from gpu_admission.engine import evaluate\nimport aiohttp\n"},
    {"engine": "from gpu_admission import vocab\nfrom . import decision\n"},
    {"rules__memory": "import gpu_admission\nv = gpu_admission.__version__\n"},
    {"compile__evaluator": "import threading\n"},
], ids=["face-imports-down", "same-floor-and-below", "dunder-is-public", "reasoned-exception"])
def test_the_check_allows(files: dict[str, str]) -> None:
    assert violations(_tree(**{"engine": "", "vocab": "", "decision": "", **files})) == []


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
