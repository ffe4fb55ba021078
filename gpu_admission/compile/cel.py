"""Small builders of CEL source text, so the compiler units read like the rules they mirror.

Everything here returns a *string of CEL*. CEL has no local bindings in the Kubernetes base
environment (``cel.bind`` is not there, facts sheet section 5), so these helpers inline a
sub-expression where it is needed; the compiler keeps repeated work in ``variables``.

Only functions the Kubernetes 1.36 CEL environment has are emitted (facts sheet section 6):
standard macros, ``matches``, the k8s regex library (``find``), the k8s list library
(``sum``), strings ext v2 (``split``, ``join``, ``substring``, ``lastIndexOf``, ``indexOf``,
``trim``, ``lowerAscii``, ``replace``) and lists ext v3 (``lists.range``, ``sort``,
``distinct``, ``flatten``); no optional types, no ``Object{}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def lit(value: Any) -> str:
    """A CEL literal: strings double-quoted (JSON escapes are CEL escapes too), maps and lists
    recursively. Maps whose values are not all of one type get ``dyn()`` values, as the API
    server checks literals with ``HomogeneousAggregateLiterals``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        return text if ("." in text or "e" in text) else text + ".0"
    if isinstance(value, Mapping):
        kinds = {type(v) for v in value.values()}
        mixed = len(kinds) > 1
        items = ", ".join(f"{lit(k)}: {dyn(lit(v)) if mixed else lit(v)}"
                          for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(lit(v) for v in value) + "]"
    raise TypeError(f"no CEL literal for {type(value).__name__}")


def dyn(expr: str) -> str:
    return f"dyn({expr})"


def rec(**fields: str) -> str:
    """A map literal of already-rendered CEL values (``dyn`` on each, so types may mix)."""
    return "{" + ", ".join(f"{lit(k)}: dyn({v})" for k, v in fields.items()) + "}"


def srec(**fields: str) -> str:
    """A map literal whose values are all CEL strings (no ``dyn`` needed)."""
    return "{" + ", ".join(f"{lit(k)}: {v}" for k, v in fields.items()) + "}"


def let(value: str, name: str, body: str) -> str:
    """``body`` with ``name`` bound to ``value``, computed once (CEL has no let; ``cel.bind`` is
    not in the Kubernetes environment): a one-element list mapped and indexed."""
    return f"[{value}].map({name}, {body})[0]"


def var(name: str) -> str:
    return f"variables.{name}"


def concat(parts: Iterable[str]) -> str:
    """List concatenation of CEL list expressions (``[]`` when there are none)."""
    items = [p for p in parts if p]
    if not items:
        return "[]"
    return "\n  + ".join(f"({p})" if "?" in p else p for p in items)


def trunc(expr: str, n: int) -> str:
    """``expr[:n]`` (code points, as Python slices and cel-go ``substring`` count)."""
    return f"(size({expr}) > {n} ? {expr}.substring(0, {n}) : {expr})"


def pyrepr(expr: str) -> str:
    """Python's ``repr()`` of a string, as the engine puts it into messages with ``!r``.

    Python quotes with ``'`` unless the text has a ``'`` and no ``"``; it escapes ``\\``,
    newline, carriage return, tab and the quote it uses. Other non-printable characters
    (which Python shows as ``\\xNN``) are not escaped here: docs/compile.md, "Differences".
    """
    esc = (f'{expr}.replace("\\\\", "\\\\\\\\").replace("\\n", "\\\\n")'
           f'.replace("\\r", "\\\\r").replace("\\t", "\\\\t")')
    return (f"({expr}.contains(\"'\") && !{expr}.contains('\"') "
            f"? '\"' + {esc} + '\"' : \"'\" + {esc}.replace(\"'\", \"\\\\'\") + \"'\")")


def norm_version(expr: str) -> str:
    """``"012.1"`` -> ``"12.1"`` for a string known to be ``<digits>.<digits>``."""
    return (f'string(int({expr}.split(".")[0])) + "." + '
            f'string(int({expr}.split(".")[1]))')


def has_path(root: str, *fields: str) -> str:
    """``has(a.b) && has(a.b.c) ...`` for a chain of field selections."""
    out = []
    current = root
    for name in fields:
        current = f"{current}.{name}"
        out.append(f"has({current})")
    return " && ".join(out)


def glob_to_re2(glob: str) -> str:
    """An ``fnmatch`` glob (as ``gpu_admission.core.cuda.compile_tag_glob`` accepts it: letters,
    digits, ``_ . -`` and ``* ? [...]``) as an anchored RE2 pattern with the same meaning as
    Python's ``fnmatch.translate``."""
    out = []
    i = 0
    while i < len(glob):
        char = glob[i]
        if char == "*":
            while i + 1 < len(glob) and glob[i + 1] == "*":
                i += 1
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[":
            end = glob.index("]", i + 1)
            body = glob[i + 1:end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end
        elif char.isalnum() or char == "_":
            out.append(char)
        else:
            out.append("\\" + char)
        i += 1
    return "^(?s:" + "".join(out) + ")$"


def request_field_is(field: str, value: str) -> str:
    """``request.<field> == value`` for a field the API server leaves out when empty.

    ``request`` is the ``AdmissionRequest`` converted to unstructured, so its ``omitempty``
    fields (``subResource``, ``requestSubResource``, ``name``, ``namespace``,
    ``userInfo.username``, ``userInfo.groups``) are *absent* when empty and reading one without
    ``has()`` is an evaluation error (issue 31; the field list is
    :func:`gpu_admission.compile.evaluator.admission_request`). cel-python has no optional
    types, so ``has()`` rather than ``.?``/``orValue``: both evaluators accept it."""
    return f"(has(request.{field}) && request.{field} == {value})"
