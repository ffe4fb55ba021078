"""``-o html``: one self-contained page (inline CSS and SVG, no script, nothing loaded from the
network), built like the audit report (``gpu_admission.auditlog.report``).

Charts a person reads at a glance: the utilisation heatmap per GPU by local hour of the week,
idle GPU-hours by namespace, and GPUs/utilisation before and after sharing (the estimate).
Figures come from the JSON document, so the page shows what ``-o json`` says; only the
heatmap uses the per-hour means, which JSON leaves out.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import resources
from string import Template
from typing import Any, Final

from gpu_admission import __version__
from gpu_admission.report.render import fmt
from gpu_admission.usage.compute import Report

NO_DATA_COLOR: Final = "#e6e8ec"
IDLE_COLOR: Final = "#d55e00"  # idle GPU-hours bars
BEFORE_COLOR: Final = "#999999"
AFTER_COLOR: Final = "#0072b2"
FRACTIONAL_COLOR: Final = "#009e73"  # the fractional estimate's bars (Okabe-Ito green)
# Sequential scale for 0..100 % (light yellow -> dark blue), 10 steps of 10 %.
SCALE: Final = ("#ffffd9", "#edf8b1", "#c7e9b4", "#7fcdbb", "#41b6c4", "#1d91c0", "#225ea8",
                "#253494", "#182b7a", "#081d58")
DAY_NAMES: Final = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def heat_color(percent: float | None) -> str:
    if percent is None:
        return NO_DATA_COLOR
    return SCALE[min(len(SCALE) - 1, max(0, int(percent // 10)))]


def heatmap(report: Report) -> str:
    cell, label_w, top = 5, 170, 22
    rows = report.gpus
    if not rows:
        return '<p class="empty">no GPUs</p>'
    width = label_w + 168 * cell + 10
    height = top + len(rows) * (cell * 3) + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" id="chart-heatmap" class="chart" '
             f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'aria-label="utilisation heatmap">']
    for d, name in enumerate(DAY_NAMES):
        x = label_w + d * 24 * cell
        parts.append(f'<text x="{x + 2}" y="{top - 8}">{name}</text>'
                     f'<line x1="{x}" x2="{x}" y1="{top - 4}" y2="{top + len(rows) * cell * 3}" '
                     'stroke="#ffffff"/>')
    for r, g in enumerate(rows):
        y = top + r * cell * 3
        parts.append(f'<text x="{label_w - 6}" y="{y + cell * 2}" text-anchor="end">'
                     f'{_e(g.node)}/{_e(g.gpu)}</text>')
        for h, value in enumerate(g.hour_of_week):
            shown = "no data" if value is None else f"{value:.1f} %"
            parts.append(f'<rect x="{label_w + h * cell}" y="{y}" width="{cell}" '
                         f'height="{cell * 3 - 1}" fill="{heat_color(value)}" class="heat" '
                         f'data-gpu="{_e(g.node)}/{_e(g.gpu)}"><title>{_e(g.node)}/{_e(g.gpu)} '
                         f'{DAY_NAMES[h // 24]} {h % 24:02d}:00 {shown}</title></rect>')
    ly = top + len(rows) * cell * 3 + 14
    for i, color in enumerate(SCALE):
        parts.append(f'<rect x="{label_w + i * 40}" y="{ly}" width="40" height="10" '
                     f'fill="{color}"/><text x="{label_w + i * 40}" y="{ly + 22}">{i * 10}%</text>')
    parts.append(f'<rect x="{label_w + 420}" y="{ly}" width="14" height="10" '
                 f'fill="{NO_DATA_COLOR}"/><text x="{label_w + 438}" y="{ly + 9}">no data</text>')
    parts.append("</svg>")
    return "".join(parts)


def hbars(chart_id: str, title: str, rows: Sequence[tuple[str, float, str]],
          unit: str) -> str:
    """Horizontal bars: (label, value, colour) each, scaled to the largest value."""
    if not rows or not any(v for _, v, _ in rows):
        return (f'<figure id="{chart_id}"><figcaption><b>{_e(title)}</b></figcaption>'
                '<p class="empty">none</p></figure>')
    bar_h, label_w, width = 20, 150, 520
    height = len(rows) * (bar_h + 6) + 10
    peak = max(v for _, v, _ in rows) or 1
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} '
             f'{height}" width="{width}" height="{height}" role="img" aria-label="{_e(title)}">']
    for i, (label, value, color) in enumerate(rows):
        y = 5 + i * (bar_h + 6)
        w = (width - label_w - 80) * value / peak
        parts.append(f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end">'
                     f'{_e(label[:24])}</text>'
                     f'<rect x="{label_w}" y="{y}" width="{w:.2f}" height="{bar_h}" '
                     f'fill="{color}" data-label="{_e(label)}" data-value="{fmt(value)}">'
                     f'<title>{_e(label)}: {fmt(value)} {unit}</title></rect>'
                     f'<text x="{label_w + w + 4:.2f}" y="{y + 14}" class="value">{fmt(value)} '
                     f'{unit}</text>')
    parts.append("</svg>")
    return (f'<figure id="{chart_id}"><figcaption><b>{_e(title)}</b></figcaption>'
            f'{"".join(parts)}</figure>')


def _table(table_id: str, headers: Sequence[str], rows: Sequence[Sequence[Any]],
           numeric: set[int]) -> str:
    if not rows:
        return f'<p class="empty" id="{table_id}">none</p>'
    head = "".join(f'<th{" class=n" if i in numeric else ""}>{_e(h)}</th>'
                   for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td{" class=n" if i in numeric else ""}>{_e(fmt(v))}</td>'
                                    for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def render_html(report: Report, doc: dict[str, Any], generated: datetime | None = None) -> str:
    fleet, s, rng = doc["fleet"], doc["sharingEstimate"], doc["range"]
    partial = ""
    if doc["partial"]:
        items = "".join(f"<li>{_e(w)}</li>" for w in doc["warnings"])
        partial = (f'<div class="partial" id="partial"><b>Partial data:</b> some GPUs have no '
                   f'samples for part of the range.<ul>{items}</ul></div>')
    idle_rows = sorted(((n["namespace"], n["idleGpuHours"], IDLE_COLOR)
                        for n in doc["namespaces"]), key=lambda r: (-r[1], r[0]))
    f = s.get("fractional")
    frac_gpus = [("after, fractional (estimate)", f["gpusNeeded"], FRACTIONAL_COLOR)] if f else []
    frac_util = ([("after, fractional (estimate)", f["utilizationPercent"] or 0,
                   FRACTIONAL_COLOR)] if f else [])
    sharing_chart = (
        hbars("chart-sharing-gpus", "GPUs: held before / needed with sharing (estimate)",
              [("before", s["gpusBefore"], BEFORE_COLOR),
               ("after (estimate)", s["gpusNeeded"], AFTER_COLOR), *frac_gpus], "GPUs")
        + hbars("chart-sharing-util", "Utilisation before / after sharing (estimate)",
                [("before", s["utilizationPercentBefore"] or 0, BEFORE_COLOR),
                 ("after (estimate)", s["utilizationPercent"] or 0, AFTER_COLOR),
                 *frac_util], "%"))
    template = Template(resources.files("gpu_admission").joinpath("data/usage-report.html")
                        .read_text(encoding="utf-8"))
    return template.substitute(
        version=_e(__version__), period=_e(f"{rng['start']} – {rng['end']}"),
        step=_e(rng["step"]), working=_e(doc["settings"]["workingHours"]),
        tz=_e(doc["settings"]["tz"]), idle_below=_e(fmt(doc["settings"]["idleBelowPercent"])),
        generated=_e(f"{(generated or datetime.now(UTC)):%Y-%m-%d %H:%M} UTC"),
        partial=partial, gpus=fleet["gpus"],
        allocated_util=_e(fmt(fleet["allocatedGpuUtilizationPercent"])),
        idle_hours=_e(fmt(fleet["idleGpuHoursWorking"])),
        hours_held=_e(fmt(fleet["gpuHoursHeld"])), hours_used=_e(fmt(fleet["gpuHoursUsed"])),
        heatmap=heatmap(report),
        idle_chart=hbars("chart-idle", "Idle GPU-hours in working hours, by namespace",
                         idle_rows, "h"),
        sharing_chart=sharing_chart, method=_e(s["method"]),
        fractional_method=_e(f["method"] if f else "no fractional estimate"),
        gpu_table=_table("table-gpus", [
            "node", "gpu", "uuid", "model", "mean %", "p95 %", "fb MiB", "idle h",
            "namespaces", "pods"], [
            [g["node"], g["gpu"], g["uuid"], g["model"], g["meanUtilizationPercent"],
             g["p95UtilizationPercent"], g["meanFramebufferUsedMiB"], g["idleHoursWorking"],
             g["namespaces"], g["pods"]] for g in doc["gpus"]], {1, 4, 5, 6, 7}),
        namespace_table=_table("table-namespaces", [
            "namespace", "gpus", "GPU-h held", "GPU-h used", "idle GPU-h"], [
            [n["namespace"], n["gpus"], n["gpuHoursHeld"], n["gpuHoursUsed"],
             n["idleGpuHours"]] for n in doc["namespaces"]], {1, 2, 3, 4}),
        node_table=_table("table-nodes", [
            "node", "gpus", "GPU-h held", "GPU-h used", "idle GPU-h"], [
            [n["node"], n["gpus"], n["gpuHoursHeld"], n["gpuHoursUsed"], n["idleGpuHours"]]
            for n in doc["nodes"]], {1, 2, 3, 4}))
