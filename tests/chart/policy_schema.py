"""The ``policy`` part of charts/gpu-admission/values.schema.json, generated from the pydantic
``Policy`` model so the chart's install-time type check and the server's load-time validation
cannot disagree on field names or types (tests/chart/test_chart.py compares them).

Regenerate after a model change: ``python -m tests.chart.policy_schema``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpu_admission.policy.model import Policy

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "charts" / "gpu-admission" / \
    "values.schema.json"


def _strip_titles(node: Any) -> Any:
    """Drop pydantic's generated ``title`` annotations (noise in a hand-read file); a property
    that happens to be called ``title`` is a dict and stays."""
    if isinstance(node, dict):
        return {k: _strip_titles(v) for k, v in node.items()
                if not (k == "title" and isinstance(v, str))}
    if isinstance(node, list):
        return [_strip_titles(v) for v in node]
    return node


def policy_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """(schema of ``.Values.policy``, the ``$defs`` it references). The model's ``$defs`` move
    to the root of values.schema.json: ``#/$defs/...`` references resolve against the root."""
    schema = _strip_titles(Policy.model_json_schema(by_alias=True, mode="validation"))
    defs = schema.pop("$defs", {})
    return schema, defs


def updated(current: dict[str, Any]) -> dict[str, Any]:
    """``current`` (the whole values schema) with its policy part regenerated."""
    schema, defs = policy_schema()
    out = dict(current)
    out["properties"] = {**current["properties"], "policy": schema}
    out["$defs"] = defs
    return out


if __name__ == "__main__":
    text = json.dumps(updated(json.loads(SCHEMA_FILE.read_text())), indent=2) + "\n"
    SCHEMA_FILE.write_text(text)
    print(f"wrote {SCHEMA_FILE}")
