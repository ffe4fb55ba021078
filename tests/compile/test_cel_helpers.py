"""The pieces the compiler builds CEL from, held to their Python/Go counterparts."""

from __future__ import annotations

import fnmatch
import re
from typing import Any, cast

import celpy
import celpy.adapter
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_admission.compile.cel import glob_to_re2, lit, pyrepr
from gpu_admission.compile.evaluator import program
from gpu_admission.compile.units import serving_image_rows
from gpu_admission.core.cuda import serving_rules

# Printable text as env values and labels carry it; Python escapes non-printable characters
# as \xNN, which the CEL form does not (docs/compile.md, "Differences").
TEXT = st.text(alphabet=st.characters(codec="utf-8", categories=["L", "N", "P", "S", "Zs"])
               | st.sampled_from(["'", '"', "\\", "\n", "\t", "\r", " "]), max_size=30)


def cel(expression: str, **values: object) -> object:
    return program(expression).evaluate(cast(Any, celpy.adapter.json_to_cel(values)))


@settings(max_examples=300, deadline=None)
@given(text=TEXT.filter(lambda s: s.isprintable() or set(s) & set("\n\t\r")))
def test_pyrepr_is_pythons_repr(text: str) -> None:
    printable = all(c.isprintable() or c in "\n\t\r" for c in text)
    if not printable:
        return
    assert cel(pyrepr("s"), s=text) == repr(text)


@pytest.mark.parametrize("glob", ["v0.5.0", "2.9.*-gpu", "v1.?", "[0-9]*", "[!a]x", "a*b*c",
                                  "**", "x.[a-c]-*"])
@given(tag=st.text(alphabet="abcxv0159.-_*?[]!", max_size=10))
@settings(max_examples=80, deadline=None)
def test_tag_globs_match_like_fnmatch(glob: str, tag: str) -> None:
    expected = fnmatch.fnmatchcase(tag, glob)
    assert bool(cel(f"t.matches({lit(glob_to_re2(glob))})", t=tag)) is expected


def test_serving_rows_are_the_engines_serving_rules() -> None:
    rows = serving_image_rows()
    rules = serving_rules()
    assert [(r.registry, r.repository, r.cuda_version) for r in rows] == [
        (r.registry, r.repository, r.cuda_version) for r in rules]
    for row, rule in zip(rows, rules, strict=True):
        assert row.glob is not None and rule.tags is not None
        sample = re.sub(r"\[([^]!])[^]]*\]", r"\1", row.glob)  # [4-9] -> 4
        assert rule.tags.match(sample.replace("*", "x").replace("?", "y")) is not None


@pytest.mark.parametrize(("expression", "expected"), [
    ('"  a b \\u00a0\\u2003".trim()', "a b"),  # Go strings.TrimSpace: Unicode White_Space
    ('"\\u001ca\\u001c".trim()', "\x1ca\x1c"),  # not White_Space (Python's strip would cut it)
    ('"ABC-é".lowerAscii()', "abc-é"),
    ('"a,b,,c".split(",")', ["a", "b", "", "c"]),
    ('["a", "b"].join(", ")', "a, b"),
    ('"hello".substring(1, 3)', "el"),
    ('"a:b:c".lastIndexOf(":")', 3),
    ('["x", "y", "x"].lastIndexOf("x")', 2),
    ('"tag-cu121-x".find("(^|[-_.+])cu[0-9]{2,3}($|[-_.+])")', "-cu121-"),
    ('"abc".find("[0-9]+")', ""),
    ("lists.range(3)", [0, 1, 2]),
    ('["b", "a", "b"].distinct().sort()', ["a", "b"]),
    ("[[1], [2, 3]].flatten()", [1, 2, 3]),
    ("[1, 2, 3].slice(1, 3)", [2, 3]),
    ("[1, 2, 3].sum()", 6),
], ids=lambda v: v if isinstance(v, str) and "(" in v else None)
def test_kubernetes_cel_functions_the_evaluator_provides(expression: str, expected: object) -> None:
    value = program(expression).evaluate({"lists": celpy.celtypes.MapType({})})
    assert value == expected


def test_constant_variables_are_written_into_the_expressions_that_read_them() -> None:
    """compiler.inline_constants: a literal variable (one evaluation per policy in the API
    server) becomes a literal (built once, when the API server compiles the expression); the
    others stay, and the meaning does not change."""
    from gpu_admission.compile.objects import inline_constants  # noqa: PLC0415

    spec: dict[str, Any] = {
        "matchConditions": [{"name": "c", "expression": "variables.pool != 'x'"}],
        "variables": [
            {"name": "pool", "expression": "// the pool\n\"a100\""},
            {"name": "table", "expression": '{"12.1": ["a", "b"], "x": -1, "y": true}'},
            {"name": "modes", "expression": "MODES_PLACEHOLDER"},
            {"name": "name", "expression": "object.metadata.name"},
            {"name": "poolName", "expression": "variables.pool + variables.name"},
            {"name": "looksConstant", "expression": '"a" + "b"'}],
        "validations": [{"expression": "variables.table['x'] < 0",
                         "messageExpression": "variables.modes['r'] + variables.poolName"}],
        "mutations": [{"jsonPatch": {"expression": "[variables.pool]"}}]}
    inline_constants(spec, ["MODES_PLACEHOLDER"])
    assert [v["name"] for v in spec["variables"]] == ["name", "poolName", "looksConstant"]
    assert spec["variables"][1]["expression"] == '("a100") + variables.name'
    assert spec["matchConditions"][0]["expression"] == "(\"a100\") != 'x'"
    assert spec["validations"] == [{
        "expression": '({"12.1": ["a", "b"], "x": -1, "y": true})[\'x\'] < 0',
        "messageExpression": "(MODES_PLACEHOLDER)['r'] + variables.poolName"}]
    assert spec["mutations"][0]["jsonPatch"]["expression"] == '[("a100")]'
    assert bool(cel(spec["validations"][0]["expression"])) is True
