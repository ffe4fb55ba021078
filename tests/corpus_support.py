"""Every Pod the test suite already uses, as the API server would hand it to admission.

Collected from the parametrized tables of the engine and rule tests (any pod dict inside their
``pytest.param`` values), ``tests/data/evaluate`` (pods and workload templates, through
``gpu_admission.workloads.kinds``) and ``tests/data/hostile`` AdmissionReview bodies (their
``request.object``). Pods the API server could not decode (they fail the Kubernetes Pod
OpenAPI schema) or would reject (duplicate container names) are left out; the rest are
normalised as the API server serialises them: quantities as canonical strings, map keys sorted
(Go's encoding/json sorts map keys).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from gpu_admission.compile.offline import canonical_quantity
from gpu_admission.workloads.kinds import WorkloadError, expand_lists, pod_templates

DATA = Path(__file__).parent / "data"
SCHEMA_VERSION = "1.36.0"
_MODULES = ("tests.admission.test_rules", "tests.admission.test_engine",
            "tests.admission.test_engine_property", "tests.evaluate.test_evaluate_cli",
            "tests.install.test_manifests")


def api_shaped(pod: Any) -> dict[str, Any] | None:
    """The pod as the API server would send it, or None when it would not get that far."""
    if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
        return None
    pod = _drop_nulls(json.loads(json.dumps(pod)))
    pod.setdefault("apiVersion", "v1")
    pod.setdefault("kind", "Pod")
    pod.setdefault("metadata", {"name": "p", "namespace": "team-a"})
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return None
    names: list[str] = []
    for kind in ("containers", "initContainers"):
        items = spec.get(kind)
        if not isinstance(items, list):
            continue
        for container in items:
            if not isinstance(container, dict):
                return None
            names.append(str(container.get("name")))
            resources = container.get("resources")
            if isinstance(resources, dict):
                for key in ("limits", "requests"):
                    values = resources.get(key)
                    if isinstance(values, dict):
                        resources[key] = {k: canonical_quantity(v) for k, v in values.items()}
    if len(names) != len(set(names)):
        return None
    try:
        kubernetes_validate.validate(pod, SCHEMA_VERSION, strict=True)
    except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError):
        return None
    shaped: dict[str, Any] = json.loads(json.dumps(pod, sort_keys=True))
    return shaped


_STRING_MAPS = ("labels", "annotations", "nodeSelector")


def _drop_nulls(value: Any, key: str = "") -> Any:
    """JSON null as Go decodes it into a typed Pod: an omitted field, or "" in a string map."""
    if isinstance(value, dict):
        if key in _STRING_MAPS:
            return {k: "" if v is None else v for k, v in value.items()}
        return {k: _drop_nulls(v, k) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value if v is not None]
    return value


def _pods_in(value: Any, depth: int = 0) -> Iterator[Any]:
    if depth > 4:
        return
    if isinstance(value, dict):
        if value.get("kind", None) == "Pod" or ("spec" in value and "metadata" in value
                                                and isinstance(value.get("spec"), dict)
                                                and "containers" in value["spec"]):
            yield value
        return
    if isinstance(value, list | tuple):
        for item in value:
            yield from _pods_in(item, depth + 1)
    values = getattr(value, "values", None)  # pytest.param
    if isinstance(values, tuple):
        for item in values:
            yield from _pods_in(item, depth + 1)


def _from_modules() -> Iterator[tuple[str, Any]]:
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # pragma: no cover - a module removed by someone else
            continue
        for attr, value in vars(module).items():
            if attr.startswith("_") or callable(value):
                continue
            for index, pod in enumerate(_pods_in(value)):
                yield f"{name.rsplit('.', 1)[-1]}.{attr}[{index}]", pod


def _from_files() -> Iterator[tuple[str, Any]]:
    for path in sorted((DATA / "evaluate").glob("*")):
        if path.suffix not in (".yaml", ".json"):
            continue
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except yaml.YAMLError:
            continue
        for index, doc in enumerate(d for raw in docs for d in expand_lists(raw)):
            try:
                templates = pod_templates(doc)
            except WorkloadError:
                continue
            for tpl in templates:
                yield f"{path.name}[{index}]{tpl.field}", tpl.pod
    for path in sorted((DATA / "hostile" / "bodies").glob("*.json")):
        try:
            body = json.loads(path.read_text())
        except ValueError:
            continue
        request = body.get("request") if isinstance(body, dict) else None
        if isinstance(request, dict):
            yield f"hostile/{path.name}", request.get("object")


@cache
def corpus() -> tuple[tuple[str, str], ...]:
    """(id, pod as JSON) for every distinct API-shaped pod of the test suite."""
    seen: dict[str, str] = {}
    for ident, raw in [*_from_modules(), *_from_files()]:
        pod = api_shaped(raw)
        if pod is None:
            continue
        text = json.dumps(pod, sort_keys=True)
        seen.setdefault(text, ident)
    return tuple((ident, text) for text, ident in seen.items())
