"""The self-contained HTML report: summary tables and inline SVG charts.

People would rather look at a chart than read a table, and an audit report is often mailed
or attached to a ticket, so the page carries everything inline: CSS in a ``<style>``
element, charts as SVG generated here in Python. No JavaScript, fonts or images are loaded
from anywhere (the page renders offline and passes a strict CSP).
"""

from __future__ import annotations

import html
import zlib
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from importlib import resources
from string import Template
from typing import Final

from gpu_admission import __version__
from gpu_admission.auditlog.entry import ReadStats
from gpu_admission.auditlog.query import Summary, Tally

# Colour-blind-safe-ish palette (Okabe-Ito); the first two are fixed meanings.
DENIED_COLOR: Final = "#c62828"
ALLOWED_COLOR: Final = "#2e7d32"
MUTATED_COLOR: Final = "#1565c0"
PALETTE: Final = ("#e69f00", "#56b4e9", "#009e73", "#cc79a7", "#0072b2", "#d55e00",
                  "#999999")
TOP_NAMESPACES: Final = 6  # stacked series per chart; the rest is "other"
MAX_DAYS: Final = 370  # bars per chart; older days are left out (and said so)
TABLE_ROWS: Final = 15

W: Final = 520  # chart size in SVG user units (scaled to the container by CSS)
H: Final = 240
PAD_L, PAD_R, PAD_T, PAD_B = 44, 10, 14, 58


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _days(summary: Summary) -> list[date]:
    if summary.first is None or summary.last is None:
        return []
    first, last = summary.first.date(), summary.last.date()
    span = (last - first).days + 1
    start = last - timedelta(days=MAX_DAYS - 1) if span > MAX_DAYS else first
    return [start + timedelta(days=i) for i in range((last - start).days + 1)]


def stacked_bars(title: str, days: Sequence[date],
                 series: Sequence[tuple[str, str, Sequence[int]]], chart_id: str) -> str:
    """An SVG stacked bar chart: one bar per day, one coloured segment per series."""
    if not days or not any(any(v) for _, _, v in series):
        return (f'<figure id="{_e(chart_id)}"><figcaption><b>{_e(title)}</b></figcaption>'
                '<p class="empty">nothing in this period</p></figure>')
    totals = [sum(s[2][i] for s in series) for i in range(len(days))]
    peak = max(*totals, 1)
    peak += peak % 2 if peak > 1 else 0  # even, so the middle grid line is a whole number
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    step = plot_w / len(days)
    bar_w = max(step * 0.8, 0.5)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" '
             f'height="{H}" role="img" aria-label="{_e(title)}" class="chart">',
             f'<title>{_e(title)}</title>']
    for frac in (0, 0.5, 1):  # horizontal grid lines with counts
        y = PAD_T + plot_h * (1 - frac)
        parts.append(f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" '
                     'stroke="#dde1e8"/>')
        parts.append(f'<text x="{PAD_L - 4}" y="{y + 4:.1f}" text-anchor="end">'
                     f'{round(peak * frac)}</text>')
    for i, day in enumerate(days):
        x = PAD_L + i * step + (step - bar_w) / 2
        y = PAD_T + plot_h
        for name, color, values in series:
            if not values[i]:
                continue
            h = plot_h * values[i] / peak
            y -= h
            parts.append(f'<rect x="{x:.2f}" y="{y:.2f}" width="{bar_w:.2f}" '
                         f'height="{h:.2f}" fill="{color}" data-series="{_e(name)}">'
                         f'<title>{day.isoformat()} {_e(name)}: {values[i]}</title></rect>')
    labels = max(1, len(days) // 8)  # at most ~8 date labels
    for i in range(0, len(days), labels):
        x = PAD_L + i * step + step / 2
        parts.append(f'<text x="{x:.1f}" y="{PAD_T + plot_h + 14}" text-anchor="middle">'
                     f'{days[i]:%m-%d}</text>')
    lx = PAD_L
    for name, color, _ in series:  # legend
        parts.append(f'<rect x="{lx}" y="{H - 22}" width="10" height="10" fill="{color}"/>'
                     f'<text x="{lx + 14}" y="{H - 13}">{_e(name[:18])}</text>')
        lx += 20 + 7 * min(len(name), 18)
    parts.append("</svg>")
    return (f'<figure id="{_e(chart_id)}"><figcaption><b>{_e(title)}</b></figcaption>'
            f'{"".join(parts)}</figure>')


def _by_namespace(days: Sequence[date], counts: Counter[tuple[date, str]],
                  colors: dict[str, str]) -> list[tuple[str, str, list[int]]]:
    per_ns: Counter[str] = Counter()
    for (_, ns), n in counts.items():
        per_ns[ns] += n
    top = [ns for ns, _ in sorted(per_ns.items(), key=lambda kv: (-kv[1], kv[0]))
           [:TOP_NAMESPACES]]
    series = [(ns, colors.get(ns) or PALETTE[zlib.crc32(ns.encode()) % (len(PALETTE) - 1)],
               [counts[(d, ns)] for d in days]) for ns in top]
    rest = [sum(n for (d2, ns), n in counts.items() if d2 == d and ns not in top) for d in days]
    if any(rest):
        series.append(("other", PALETTE[-1], rest))
    return series


def _table(title: str, key_name: str, rows: Sequence[tuple[str, Tally]], total: int) -> str:
    if not rows:
        return f'<div><h3>{_e(title)}</h3><p class="empty">none</p></div>'
    body = "".join(
        f"<tr><td>{_e(key)}</td><td class=n>{t.total}</td><td class=n>{t.denied}</td>"
        f"<td class=n>{t.mutated}</td><td class=n>{t.warned}</td>"
        f"<td class=n>{t.audited}</td></tr>" for key, t in rows[:TABLE_ROWS])
    more = (f'<p class="empty">{len(rows) - TABLE_ROWS} more not shown '
            f'(use <code>gpu-admission audit summary</code>)</p>'
            if len(rows) > TABLE_ROWS else "")
    return (f'<div><h3>{_e(title)}</h3><table><thead><tr><th>{_e(key_name)}</th>'
            "<th class=n>total</th><th class=n>denied</th><th class=n>mutated</th>"
            f"<th class=n>warn</th><th class=n>audit</th></tr></thead><tbody>{body}"
            f"</tbody></table>{more}</div>") if total else ""


def render_html(summary: Summary, stats: ReadStats, filters: str,
                generated: datetime | None = None) -> str:
    """The report page as one HTML string."""
    days = _days(summary)
    per_day = [summary.per_day.get(d, Tally()) for d in days]
    # One colour per namespace across all charts, busiest namespaces first; grey is "other".
    colors = {ns: PALETTE[i] for i, (ns, _) in
              enumerate(summary.rows("namespace")[: len(PALETTE) - 1])}
    charts = [
        stacked_bars("Decisions per day", days, [
            ("allowed", ALLOWED_COLOR, [t.total - t.denied for t in per_day]),
            ("denied", DENIED_COLOR, [t.denied for t in per_day])], "chart-decisions"),
        stacked_bars("Denials per day, by namespace", days,
                     _by_namespace(days, summary.denied_day_ns, colors), "chart-denials"),
        stacked_bars("Mutations per day, by namespace", days,
                     _by_namespace(days, summary.mutated_day_ns, colors), "chart-mutations"),
    ]
    if summary.first and summary.last and (summary.last.date() - summary.first.date()).days \
            + 1 > MAX_DAYS:
        charts.append(f'<p class="empty">charts show the last {MAX_DAYS} days only</p>')
    tables = [
        _table("By namespace", "namespace", summary.rows("namespace"), summary.total),
        _table("By rule", "rule", summary.rows("rule"), summary.total),
        _table("By workload class", "workload", summary.rows("workload"), summary.total),
        _table("By user", "user", summary.rows("user"), summary.total),
    ]
    bad_section = ""
    if stats.bad:
        items = "".join(f"<li><code>{_e(b)}</code></li>" for b in stats.bad_samples)
        more = stats.bad - len(stats.bad_samples)
        bad_section = (f"<h2>Unreadable lines ({stats.bad})</h2><ul>{items}</ul>"
                       + (f'<p class="empty">{more} more not listed</p>' if more else ""))
    period = ("no decisions" if summary.first is None or summary.last is None else
              f"{summary.first:%Y-%m-%d %H:%M} – {summary.last:%Y-%m-%d %H:%M} UTC")
    template = Template(resources.files("gpu_admission").joinpath("data/report.html")
                        .read_text(encoding="utf-8"))
    warned = sum(t.warned for t in summary.per_day.values())
    return template.substitute(
        version=_e(__version__), period=_e(period), filters=_e(filters),
        generated=_e(f"{(generated or datetime.now(UTC)):%Y-%m-%d %H:%M} UTC"),
        files=stats.files, total=summary.total,
        denied=summary.by["decision"].get("denied", Tally()).total,
        mutated=sum(t.mutated for t in summary.per_day.values()), warned=warned,
        dry_run=summary.dry_run, bad=stats.bad, charts="\n".join(charts),
        tables="\n".join(tables), bad_section=bad_section)
