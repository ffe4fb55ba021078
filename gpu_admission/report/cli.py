"""``gpu-admission report``: how much GPU is wasted, and what sharing would give back.

Reads dcgm-exporter series from Prometheus (``gpu_admission.usage.query``), computes the
figures (``compute``, ``sharing``) and renders them (``render``, ``html``). See docs/report.md.

Exit codes: 0 complete, 1 partial (some GPU lacks samples for part of the range: a GPU that
vanished or appeared, gaps), 2 error (bad option, Prometheus unreachable or rejecting the
query, no dcgm-exporter series, unwritable ``--out``).
"""

from __future__ import annotations

import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import click

from gpu_admission.core.timeframe import (
    WorkingHours,
    parse_duration,
    parse_instant,
    parse_zone,
    resolve_range,
)
from gpu_admission.policy.model import PolicyError, default_policy, load_policy
from gpu_admission.reclaim.plan import preview
from gpu_admission.report.render import render_csv, render_json, render_table
from gpu_admission.usage.compute import Options, build_report, to_json
from gpu_admission.usage.prom import PromError, PrometheusClient
from gpu_admission.usage.query import NoDataError, Progress, fetch

if TYPE_CHECKING:
    from click._termui_impl import ProgressBar


class ReportError(click.ClickException):
    """Unusable input or an unreachable source: one clear message, exit 2."""

    exit_code = 2


def _terminal_progress(stack: ExitStack) -> Progress | None:
    """A progress bar on stderr, only when stderr is a terminal (closed with ``stack``)."""
    if not sys.stderr.isatty():
        return None
    bars: list[ProgressBar[int]] = []

    def progress(done: int, total: int) -> None:
        if not bars:
            bars.append(stack.enter_context(click.progressbar(
                length=total, label="querying Prometheus", file=sys.stderr)))
        bars[0].update(done - bars[0].pos)

    return progress


@click.command("report", short_help="GPU utilisation and waste from dcgm-exporter.")
@click.option("--prometheus", "prometheus_url", required=True, metavar="URL",
              help="Prometheus base URL, e.g. http://prometheus:9090.")
@click.option("--since", metavar="DURATION",
              help="Range back from now (or --end), e.g. 7d, 12h. Default 7d.")
@click.option("--start", metavar="TIME", help="Range start: RFC 3339 or unix seconds.")
@click.option("--end", metavar="TIME", help="Range end: RFC 3339 or unix seconds (default now).")
@click.option("--step", default="5m", show_default=True, metavar="DURATION",
              help="Sample spacing; each sample stands for the step before it.")
@click.option("--working-hours", default="Mon-Fri 08:00-18:00", show_default=True,
              help='Days and hours idle time counts, e.g. "Mon-Fri 08:00-18:00".')
@click.option("--tz", default="UTC", show_default=True,
              help="IANA time zone of --working-hours and naive times (alert rules use UTC).")
@click.option("--idle-below", type=float, default=None, metavar="PERCENT",
              help="SM utilisation under which a sample is idle, in % "
                   "[default: the policy's spec.placement.idleBelowPercent, 10].")
@click.option("--policy", "policy_file", type=click.Path(path_type=Path, dir_okay=False),
              help="GPUSharingPolicy file (pools and placement target of the sharing "
                   "estimate); default the built-in policy.")
@click.option("-o", "--output", type=click.Choice(["table", "json", "csv", "html"]),
              default="table", show_default=True)
@click.option("--out", "out_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Write to FILE instead of stdout.")
def report(  # noqa: PLR0917 (click passes every option)
        prometheus_url: str, since: str | None, start: str | None, end: str | None,
           step: str, working_hours: str, tz: str, idle_below: float | None,
           policy_file: Path | None, output: str, out_file: Path | None) -> None:
    """GPU utilisation and waste from dcgm-exporter metrics, and what sharing would give.

    Exit codes: 0 complete, 1 partial data (marked in the output), 2 error.
    """
    try:
        zone = parse_zone(tz)
        step_s = parse_duration(step, "--step")
        rng = resolve_range(
            now=time.time(), step=step_s,
            since=parse_duration(since, "--since") if since is not None else None,
            start=parse_instant(start, "--start", zone) if start is not None else None,
            end=parse_instant(end, "--end", zone) if end is not None else None)
        hours = WorkingHours.parse(working_hours)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        policy = load_policy(policy_file) if policy_file is not None else default_policy()
    except PolicyError as exc:
        raise ReportError(str(exc)) from None
    threshold = (idle_below if idle_below is not None
                 else float(policy.spec.placement.idle_below_percent))
    if not 0 < threshold <= 100:
        raise click.UsageError(f"--idle-below: expected a percentage in (0, 100], got "
                               f"{threshold:g}")
    try:
        client = PrometheusClient(prometheus_url)
    except PromError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        with ExitStack() as stack:
            fetched = fetch(client, rng, progress=_terminal_progress(stack))
    except (PromError, NoDataError) as exc:
        raise ReportError(str(exc)) from None
    finally:
        client.close()
    result = build_report(fetched, Options(threshold, hours, zone, policy))
    doc = to_json(result)
    # what `gpu-admission reclaim` would do with the pods idle at the end of the range
    doc["reclaim"] = preview(fetched, policy)
    if output == "json":
        text = render_json(doc)
    elif output == "csv":
        text = render_csv(doc)
    elif output == "html":
        from gpu_admission.report.html import render_html  # noqa: PLC0415 - only for -o html

        text = render_html(result, doc)
    else:
        text = render_table(doc)
    if out_file is not None:
        try:
            out_file.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise ReportError(f"--out {out_file}: cannot write: {exc.strerror or exc}") from None
    else:
        click.echo(text, nl=False)
    if doc["partial"]:
        for warning in doc["warnings"]:
            click.echo(f"warning: partial data: {warning}", err=True)
        sys.exit(1)
