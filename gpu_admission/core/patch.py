"""The one place that writes RFC 6902 (JSON Patch) operations against a Pod.

Why a builder instead of ``jsonpatch.make_patch(pod, mutated_copy)``: a deep copy plus the diff
costs more than the whole decision (the budget is 50 µs per pod for decision + patch) and
jsonpatch's list diff is unreliable on lists of equal items (python-json-patch issues #160,
#179). Rules *declare* what they want (an env
var upserted by name, a nodeSelector label, a node-affinity requirement, ...); :meth:`ops`
renders the minimal operations against the pod as received, reading it but never modifying it.

RFC 6902 details handled here (https://www.rfc-editor.org/rfc/rfc6902):

* ``add`` needs the parent to exist, so a missing ``env`` array / ``nodeSelector`` map /
  ``affinity`` object is added whole (section 4.1: "the target location MUST reference ... a
  member to add to an existing object").
* ``add`` on an existing object member replaces it; ``/-`` appends to an array.
* Keys are escaped per RFC 6901 section 3 (``~`` -> ``~0``, ``/`` -> ``~1``); label keys such as
  ``gpu-admission.io/cuda-version`` contain ``/``.

Node-affinity semantics (https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/):
``nodeSelectorTerms`` are ORed and the ``matchExpressions`` of one term are ANDed, so a
requirement that must always hold is added to *every* term, and an OR-group of alternatives
is distributed over the terms (cross product).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Final

from gpu_admission.core.quantity import quantity_value

Op = dict[str, Any]
Term = dict[str, Any]

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_REQUIRED_PTR = "/spec/affinity/nodeAffinity/" + REQUIRED


_NAME = operator.itemgetter("name")
#: Entries: from here the C-level pass of :func:`last_indexes` costs less than its Python loop
#: (measured with five names: 0.7 vs 1.4 µs at 5 entries, 2.1 vs 2.0 at 25, ~17 vs ~5 at 200).
LONG_ENV: Final = 24


def last_indexes(env: Sequence[Any], names: Collection[str]) -> dict[str, int]:
    """The index of the last entry of an env list named each of ``names`` that it has (the
    last duplicate is the one the container gets); an entry that is not an object with a
    string ``name`` is skipped (the API server rejects such a pod; offline input may have
    one). The patch builder, the memory rule and the guard look env vars up by name with it.

    From :data:`LONG_ENV` entries the names are read in one C-level pass
    (``operator.itemgetter``): 200 entries cost ~5 µs where the loop costs ~17; a shorter
    list, or one with an entry that pass cannot read, takes the loop."""
    if len(env) >= LONG_ENV:
        try:
            env_names = list(map(_NAME, env))
            present = set(names).intersection(env_names)
        except (KeyError, TypeError):  # a non-object entry, a missing or unhashable name
            pass
        else:
            last = len(env_names) - 1
            backwards = env_names[::-1]
            return {name: last - backwards.index(name) for name in present}
    out: dict[str, int] = {}
    for i, entry in enumerate(env):
        if entry.__class__ is dict:
            name = entry.get("name")
            if name.__class__ is str and name in names:
                out[name] = i
    return out


def escape(token: str) -> str:
    """RFC 6901 reference token: ``~`` -> ``~0`` first, then ``/`` -> ``~1``."""
    if "~" in token or "/" in token:
        return token.replace("~", "~0").replace("/", "~1")
    return token


def _mapping(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, dict) else None


class PatchBuilder:
    """Collects declared changes to one pod; :meth:`ops` renders them as RFC 6902 operations.

    The builder never mutates the pod. Values placed in the operations are fresh objects (the
    pod's own sub-objects are copied shallowly where they are re-emitted).
    """

    __slots__ = ("_alternatives", "_annotations", "_args", "_env", "_node_selector", "_pod",
                 "_requirements", "_resources", "_scheduler")

    def __init__(self, pod: Mapping[str, Any]) -> None:
        self._pod = pod
        self._scheduler: str | None = None
        self._node_selector: dict[str, str] = {}
        # (kind, index) -> {env name: literal value, or the whole entry (valueFrom)};
        # kind is "containers" or "initContainers"
        self._env: dict[tuple[str, int], dict[str, str | dict[str, Any]]] = {}
        # (kind, index, "requests"|"limits") -> {resource name: quantity, or None = remove}
        self._resources: dict[tuple[str, int, str], dict[str, str | None]] = {}
        self._annotations: dict[str, str] = {}
        # (kind, index, "args"|"command") -> {position: new element, or None: appended}
        self._args: dict[tuple[str, int, str], list[tuple[int | None, str]]] = {}
        self._requirements: list[dict[str, Any]] = []
        self._alternatives: list[tuple[list[list[dict[str, Any]]], Callable[[Term], bool]]] = []

    # --- declarations --------------------------------------------------------------
    def set_scheduler_name(self, name: str) -> None:
        self._scheduler = name

    def set_node_selector(self, key: str, value: str) -> None:
        self._node_selector[key] = value

    def upsert_env(self, kind: str, index: int, name: str, value: str) -> None:
        """Set env var ``name`` of ``spec.<kind>[index]`` to a literal ``value`` (by name)."""
        self._env.setdefault((kind, index), {})[name] = value

    def upsert_env_entry(self, kind: str, index: int, entry: dict[str, Any]) -> None:
        """Set env var ``entry["name"]`` of ``spec.<kind>[index]`` to exactly ``entry`` (e.g. a
        ``valueFrom`` entry), by name."""
        self._env.setdefault((kind, index), {})[entry["name"]] = entry

    def set_resource(self, kind: str, index: int, section: str, name: str,
                     quantity: str | None) -> None:
        """Set ``resources.<section>[name]`` of ``spec.<kind>[index]`` to ``quantity`` (a
        Kubernetes quantity string, compared by value: ``16k`` equals ``16000``), or remove
        it (``None``). ``section``: ``requests`` or ``limits``."""
        self._resources.setdefault((kind, index, section), {})[name] = quantity

    def set_argument(self, kind: str, index: int, field: str, position: int | None,
                     value: str) -> None:
        """Set element ``position`` of ``spec.<kind>[index].<field>`` (``args`` or
        ``command``) to ``value``, or append ``value`` (``position`` None; the list is
        created when absent). A serving engine's own memory flag (rules/memory.py)."""
        wanted = self._args.setdefault((kind, index, field), [])
        if (position, value) not in wanted:
            wanted.append((position, value))

    def set_annotation(self, key: str, value: str) -> None:
        """Set one ``metadata.annotations`` entry (rendered by :meth:`ops`)."""
        self._annotations[key] = value

    def require_node_expression(self, requirement: dict[str, Any]) -> None:
        """AND ``requirement`` into every required node-affinity term (skipped where present)."""
        if requirement not in self._requirements:
            self._requirements.append(requirement)

    def require_any_node_terms(self, alternatives: list[list[dict[str, Any]]],
                               present: Callable[[Term], bool]) -> None:
        """AND the OR-group ``alternatives`` into every term for which ``present`` is false."""
        self._alternatives.append((alternatives, present))

    @property
    def empty(self) -> bool:
        return not (self._scheduler is not None or self._node_selector or self._env
                    or self._requirements or self._alternatives or self._resources
                    or self._annotations or self._args)

    # --- rendering -----------------------------------------------------------------
    def ops(self) -> list[Op]:
        """The RFC 6902 operations, in a fixed order: scheduler, selector, affinity,
        resources, env, annotations."""
        pod = self._pod
        spec = _mapping(pod.get("spec")) or {}
        out: list[Op] = []
        if self._scheduler is not None and spec.get("schedulerName") != self._scheduler:
            out.append({"op": "add", "path": "/spec/schedulerName", "value": self._scheduler})
        if self._node_selector:
            _map_ops(out, "/spec/nodeSelector", _mapping(spec.get("nodeSelector")),
                     self._node_selector)
        if self._requirements or self._alternatives:
            self._affinity_ops(out, spec)
        for place, resources in self._resources.items():
            _resource_ops(out, place, spec, resources)
        for (kind, index), wanted in self._env.items():
            _env_ops(out, kind, index, spec, wanted)
        for place, elements in self._args.items():
            _argument_ops(out, place, spec, elements)
        if self._annotations:
            self._annotation_map_ops(out, self._annotations)
        return out

    def _annotation_map_ops(self, out: list[Op], wanted: Mapping[str, str]) -> None:
        meta = _mapping(self._pod.get("metadata"))
        if meta is None:
            out.append({"op": "add", "path": "/metadata", "value": {"annotations": dict(wanted)}})
        else:
            _map_ops(out, "/metadata/annotations", _mapping(meta.get("annotations")), wanted)

    def annotation_ops(self, key: str, value: str) -> list[Op]:
        """Operations setting one ``metadata.annotations`` entry (rendered on its own so the
        engine can first see whether anything else changes)."""
        meta = _mapping(self._pod.get("metadata"))
        out: list[Op] = []
        current = _mapping(meta.get("annotations")) if meta is not None else None
        if current is None and self._annotations:
            # ops() has created the map with the declared annotations: add a member
            return [{"op": "add", "path": f"/metadata/annotations/{escape(key)}",
                     "value": value}]
        if meta is None:
            out.append({"op": "add", "path": "/metadata", "value": {"annotations": {key: value}}})
        else:
            _map_ops(out, "/metadata/annotations", _mapping(meta.get("annotations")),
                     {key: value})
        return out

    def _affinity_ops(self, out: list[Op], spec: Mapping[str, Any]) -> None:
        affinity = _mapping(spec.get("affinity"))
        node_affinity = _mapping(affinity.get("nodeAffinity")) if affinity else None
        required = _mapping(node_affinity.get(REQUIRED)) if node_affinity else None
        raw_terms = required.get("nodeSelectorTerms") if required else None
        terms: list[Mapping[str, Any]] = (
            [t for t in raw_terms if isinstance(t, dict)]
            if isinstance(raw_terms, list) else [])
        had_terms = bool(terms) and len(terms) == len(raw_terms or [])
        base: list[Term] = [dict(t) for t in terms] if had_terms else [{}]
        crossed = False
        for alternatives, present in self._alternatives:
            new_base: list[Term] = []
            for term in base:
                if present(term):
                    new_base.append(term)
                    continue
                crossed = True
                for alt in alternatives:
                    new_base.append({**term, "matchExpressions": [
                        *_expressions(term), *(_copy_expr(e) for e in alt)]})
            base = new_base
        appended: list[list[dict[str, Any]]] = []
        for term in base:
            exprs = _expressions(term)
            extra = [_copy_expr(r) for r in self._requirements if r not in exprs]
            appended.append(extra)
            if extra:
                term["matchExpressions"] = [*exprs, *extra]
        if not crossed and not any(appended) and had_terms:
            return
        new_required = {"nodeSelectorTerms": [_fresh_term(t) for t in base]}
        if affinity is None:
            out.append({"op": "add", "path": "/spec/affinity",
                        "value": {"nodeAffinity": {REQUIRED: new_required}}})
        elif node_affinity is None:
            out.append({"op": "add", "path": "/spec/affinity/nodeAffinity",
                        "value": {REQUIRED: new_required}})
        elif required is None:
            out.append({"op": "add", "path": _REQUIRED_PTR, "value": new_required})
        elif crossed or not had_terms:
            out.append({"op": "add", "path": _REQUIRED_PTR + "/nodeSelectorTerms",
                        "value": new_required["nodeSelectorTerms"]})
        else:
            for index, (old, extra) in enumerate(zip(terms, appended, strict=True)):
                if not extra:
                    continue
                ptr = f"{_REQUIRED_PTR}/nodeSelectorTerms/{index}/matchExpressions"
                if isinstance(old.get("matchExpressions"), list):
                    out.extend({"op": "add", "path": ptr + "/-", "value": e} for e in extra)
                else:
                    out.append({"op": "add", "path": ptr, "value": extra})


def _expressions(term: Mapping[str, Any]) -> list[dict[str, Any]]:
    exprs = term.get("matchExpressions")
    return list(exprs) if isinstance(exprs, list) else []


def _copy_expr(expr: Any) -> Any:
    """Copy a node-selector requirement two levels deep (its ``values`` list included)."""
    if not isinstance(expr, dict):
        return expr
    return {k: list(v) if isinstance(v, list) else v for k, v in expr.items()}


def _fresh_term(term: Mapping[str, Any]) -> Term:
    out: Term = {}
    for key, value in term.items():
        out[key] = [_copy_expr(v) for v in value] if isinstance(value, list) else value
    return out


def _map_ops(out: list[Op], pointer: str, current: Mapping[str, Any] | None,
             wanted: Mapping[str, str]) -> None:
    """Set string members of a map; add the whole map when it is absent (or null)."""
    if current is None:
        out.append({"op": "add", "path": pointer, "value": dict(wanted)})
        return
    for key, value in wanted.items():
        if current.get(key) != value:
            out.append({"op": "add", "path": f"{pointer}/{escape(key)}", "value": value})


def _resource_ops(out: list[Op], place: tuple[str, int, str], spec: Mapping[str, Any],
                  wanted: Mapping[str, str | None]) -> None:
    """Set or remove entries of one container's ``resources.<section>`` map (``place``:
    kind, index, section); quantities are compared by value (the API server stores
    ``16000`` as ``16k``)."""
    kind, index, section = place
    containers = spec.get(kind)
    container = containers[index] if isinstance(containers, Sequence) else {}
    resources = _mapping(container.get("resources")) if isinstance(container, dict) else None
    current = _mapping(resources.get(section)) if resources is not None else None
    base = f"/spec/{kind}/{index}/resources"
    adds = {n: q for n, q in wanted.items() if q is not None
            and (current is None or n not in current
                 or quantity_value(current[n]) != quantity_value(q))}
    if current is not None:
        for name, quantity in wanted.items():
            if quantity is None and name in current:
                out.append({"op": "remove", "path": f"{base}/{section}/{escape(name)}"})
    if not adds:
        return
    if resources is None:
        out.append({"op": "add", "path": base, "value": {section: adds}})
    elif current is None:
        out.append({"op": "add", "path": f"{base}/{section}", "value": adds})
    else:
        for name, quantity in adds.items():
            out.append({"op": "add", "path": f"{base}/{section}/{escape(name)}",
                        "value": quantity})


def _env_ops(out: list[Op], kind: str, index: int, spec: Mapping[str, Any],
             wanted: Mapping[str, str | dict[str, Any]]) -> None:
    """Upsert env vars by name: replace the (last) entry with that name, else append.
    A ``str`` is a literal value; a ``dict`` is the whole entry to have."""
    containers = spec.get(kind)
    container = containers[index] if isinstance(containers, Sequence) else {}
    env = container.get("env") if isinstance(container, dict) else None
    base = f"/spec/{kind}/{index}/env"
    if not isinstance(env, list):
        out.append({"op": "add", "path": base,
                    "value": [_env_entry(n, v) for n, v in wanted.items()]})
        return
    position = last_indexes(env, wanted)
    for name, value in wanted.items():
        at = position.get(name)
        if at is None:
            out.append({"op": "add", "path": base + "/-", "value": _env_entry(name, value)})
        elif value.__class__ is str:
            if env[at].get("value") != value or "valueFrom" in env[at]:
                out.append({"op": "replace", "path": f"{base}/{at}",
                            "value": {"name": name, "value": value}})
        elif env[at] != value:
            out.append({"op": "replace", "path": f"{base}/{at}", "value": _env_entry(name, value)})


def _argument_ops(out: list[Op], place: tuple[str, int, str], spec: Mapping[str, Any],
                  elements: list[tuple[int | None, str]]) -> None:
    """Replace elements of a container's ``args``/``command`` in place, append the others
    (``add .../-``, or the whole list when the container has none)."""
    kind, index, field = place
    containers = spec.get(kind)
    container = containers[index] if isinstance(containers, Sequence) else {}
    current = container.get(field) if isinstance(container, dict) else None
    base = f"/spec/{kind}/{index}/{field}"
    appended = [value for position, value in elements if position is None]
    for position, value in elements:
        if position is not None and isinstance(current, list) and position < len(current) \
                and current[position] != value:
            out.append({"op": "replace", "path": f"{base}/{position}", "value": value})
    if not appended:
        return
    if not isinstance(current, list):
        out.append({"op": "add", "path": base, "value": appended})
        return
    out.extend({"op": "add", "path": base + "/-", "value": value} for value in appended)


def _env_entry(name: str, value: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, str):
        return {"name": name, "value": value}
    entry: dict[str, Any] = _deep_copy(value)
    return entry


def _deep_copy(value: Any) -> Any:
    """A fresh copy of a small JSON value (a declared env entry) for the operations."""
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def changed_fields(ops: Sequence[Op]) -> list[str]:
    """Short names of the pod fields some operation touches, in order, e.g.
    ``spec.schedulerName``, ``spec.containers[0].env``, ``metadata.annotations``.

    The paths of a review's operations repeat across reviews (pods of one shape get the same
    operations), so the names are memoised per tuple of paths (:func:`_cached_fields`); only
    short tuples, so a huge pod cannot fill the memo with huge keys."""
    paths = tuple([op["path"] for op in ops])
    return list(_cached_fields(paths) if len(paths) <= _MEMO_OPS else _fields_of(paths))


_MEMO_OPS = 32  # operations: a typical review has 2-10


def _fields_of(paths: tuple[str, ...]) -> tuple[str, ...]:
    fields: dict[str, None] = {}
    for path in paths:
        parts = path.split("/")[1:]
        if parts[0] == "spec" and len(parts) >= 4 and parts[1] in ("containers", "initContainers",
                                                                 "ephemeralContainers"):
            fields[f"spec.{parts[1]}[{parts[2]}].{parts[3]}"] = None
        elif parts[0] == "metadata":
            fields["metadata.annotations"] = None
        else:
            fields[".".join(parts[:2])] = None
    return tuple(fields)


_cached_fields = functools.lru_cache(maxsize=1024)(_fields_of)


def apply_ops(doc: Any, ops: Sequence[Op]) -> Any:
    """Apply operations with jsonpatch (tests, the CLI's ``-o yaml``); returns a new document."""
    import jsonpatch  # noqa: PLC0415 - only needed off the hot path

    return jsonpatch.apply_patch(doc, list(ops), in_place=False)
