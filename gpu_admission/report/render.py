"""Rendering of ``gpu-admission report`` as table, CSV and JSON.

Table and CSV are drawn from the JSON document (:func:`gpu_admission.usage.compute.to_json`),
so every face shows the same, identically rounded figures.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any, Final

import orjson

CSV_COLUMNS: Final = (
    "scope", "node", "gpu", "uuid", "model", "namespace", "gpus",
    "meanUtilizationPercent", "p95UtilizationPercent", "meanFramebufferUsedMiB",
    "idleHoursWorking", "gpuHoursHeld", "gpuHoursUsed", "idleGpuHours",
    "allocatedGpuUtilizationPercent", "gpusNeeded", "utilizationPercent", "namespaces",
    "pods", "partial")


def render_json(doc: dict[str, Any]) -> str:
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"


def fmt(value: Any) -> str:
    """One cell: numbers as JSON prints them, ``null`` as ``-``, lists joined by spaces."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value)


def render_csv(doc: dict[str, Any]) -> str:
    """One tidy CSV: a ``scope`` column (fleet, gpu, namespace, node, sharingEstimate,
    sharingBefore, fractionalEstimate) and the figures of that scope; empty cells where a
    figure does not apply."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    fleet = doc["fleet"]
    writer.writerow(_csv_row({"scope": "fleet", "gpus": fleet["gpus"],
                              "allocatedGpuUtilizationPercent":
                                  fleet["allocatedGpuUtilizationPercent"],
                              "idleHoursWorking": fleet["idleGpuHoursWorking"],
                              "gpuHoursHeld": fleet["gpuHoursHeld"],
                              "gpuHoursUsed": fleet["gpuHoursUsed"],
                              "partial": doc["partial"]}))
    for g in doc["gpus"]:
        writer.writerow(_csv_row({"scope": "gpu", **{k: g[k] for k in CSV_COLUMNS if k in g}}))
    for n in doc["namespaces"]:
        writer.writerow(_csv_row({"scope": "namespace", **n}))
    for n in doc["nodes"]:
        writer.writerow(_csv_row({"scope": "node", **n}))
    s = doc["sharingEstimate"]
    writer.writerow(_csv_row({"scope": "sharingBefore", "gpus": s["gpusBefore"],
                              "utilizationPercent": s["utilizationPercentBefore"]}))
    writer.writerow(_csv_row({"scope": "sharingEstimate", "gpusNeeded": s["gpusNeeded"],
                              "utilizationPercent": s["utilizationPercent"]}))
    f = s.get("fractional")
    if f is not None:
        writer.writerow(_csv_row({"scope": "fractionalEstimate", "gpusNeeded": f["gpusNeeded"],
                                  "utilizationPercent": f["utilizationPercent"]}))
    return out.getvalue()


def _csv_row(values: dict[str, Any]) -> dict[str, str]:
    """Cells as :func:`fmt` prints them, but a missing or ``null`` figure is an empty cell."""
    return {k: "" if values.get(k) is None else fmt(values[k]) for k in CSV_COLUMNS}


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], numeric: set[int]) -> str:
    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(widths[i]) if i in numeric else v.ljust(widths[i])
                         for i, v in enumerate(values)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]),
                      *(line(r) for r in cells)])


def render_table(doc: dict[str, Any]) -> str:
    rng, fleet, s, st = doc["range"], doc["fleet"], doc["sharingEstimate"], doc["settings"]
    f = s.get("fractional")  # the fractional estimate (gpu_admission.usage.sharing)
    fractional_rows = ([["after, fractional (estimate)", f["gpusNeeded"],
                         f["utilizationPercent"]]] if f is not None else [])
    parts = [
        f"GPU usage {rng['start']} .. {rng['end']} (step {rng['step']}); working hours "
        f"{st['workingHours']} {st['tz']}; idle = under {fmt(st['idleBelowPercent'])} % SM "
        f"for >= {fmt(st['minIdleHours'])} h",
    ]
    if doc["partial"]:
        parts.append("PARTIAL: " + "\n         ".join(doc["warnings"]))
    parts += [
        "",
        _table(["fleet", "gpus", "allocated GPU util %", "idle GPU-h (working)", "GPU-h held",
                "GPU-h used"],
               [["all", fleet["gpus"], fleet["allocatedGpuUtilizationPercent"],
                 fleet["idleGpuHoursWorking"], fleet["gpuHoursHeld"], fleet["gpuHoursUsed"]]],
               {1, 2, 3, 4, 5}),
        "",
        _table(["node", "gpu", "uuid", "model", "mean %", "p95 %", "fb MiB", "idle h",
                "namespaces", "pods"],
               [[g["node"], g["gpu"], g["uuid"], g["model"], g["meanUtilizationPercent"],
                 g["p95UtilizationPercent"], g["meanFramebufferUsedMiB"], g["idleHoursWorking"],
                 g["namespaces"], g["pods"]] for g in doc["gpus"]], {1, 4, 5, 6, 7}),
        "",
        _table(["namespace", "gpus", "GPU-h held", "GPU-h used", "idle GPU-h"],
               [[n["namespace"], n["gpus"], n["gpuHoursHeld"], n["gpuHoursUsed"],
                 n["idleGpuHours"]] for n in doc["namespaces"]], {1, 2, 3, 4}),
        "",
        _table(["node", "gpus", "GPU-h held", "GPU-h used", "idle GPU-h"],
               [[n["node"], n["gpus"], n["gpuHoursHeld"], n["gpuHoursUsed"], n["idleGpuHours"]]
                for n in doc["nodes"]], {1, 2, 3, 4}),
        "",
        "What sharing would give (ESTIMATE):",
        _table(["", "gpus", "utilization %"],
               [["before (held)", s["gpusBefore"], s["utilizationPercentBefore"]],
                ["after (estimate)", s["gpusNeeded"], s["utilizationPercent"]],
                *fractional_rows], {1, 2}),
        "method: " + s["method"],
        *(["fractional method: " + f["method"]] if f is not None else []),
    ]
    if doc.get("reclaim"):
        parts += [
            "",
            "What `gpu-admission reclaim` would do (policy spec.reclaim, the last 24 h):",
            _table(["namespace", "pod", "gpus", "idle since", "idle h", "action", "at",
                    "scale-down at (if opted in)"],
                   [[r["namespace"], r["pod"], r["gpus"], r["idleSince"],
                     r["idleHoursWorking"], r["action"], r["noticeAt"], r["scaleDownAt"]]
                    for r in doc["reclaim"]], {4}),
        ]
    return "\n".join(parts) + "\n"
