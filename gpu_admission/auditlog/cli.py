"""``gpu-admission audit``: review what the webhook decided.

Reads decision logs written by ``gpu-admission serve --audit-log`` (plain, rotated,
gzipped) and Kubernetes API server audit logs (``audit.k8s.io/v1`` Event lines, see
https://kubernetes.io/docs/tasks/debug/debug-cluster/audit/). Inputs are files, globs or
``-`` for stdin, mixed freely. Bad lines are reported on stderr with file and line number
and counted in the summary; they never stop the command. Exit codes: 0 success, 1 nothing
found (``show``), 2 usage or unreadable input.
"""

from __future__ import annotations

import csv
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import click
import orjson

from gpu_admission.auditlog.entry import BadLine, Entry, ReadStats
from gpu_admission.auditlog.query import (
    DECISIONS,
    DIMENSIONS,
    MODES,
    Filter,
    Summary,
    find_uid,
    newest,
    parse_when,
)
from gpu_admission.auditlog.reader import DEFAULT_WEBHOOK_DOMAIN, InputError, read_entries
from gpu_admission.auditlog.report import render_html
from gpu_admission.cli.options import aliases

MIN_WIDTH: Final = 80  # tables are laid out for an 80-column terminal at least
BAD_SHOWN: Final = 20  # bad lines echoed on stderr; the rest are counted
DEFAULT_LIMIT: Final = 50


class Context:
    """Options shared by every sub-command (click passes it as ``ctx.obj``)."""

    def __init__(self, domains: Sequence[str], progress: bool | None) -> None:
        self.domains = tuple(domains) or (DEFAULT_WEBHOOK_DOMAIN,)
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.stats = ReadStats()
        self._shown = 0
        self._progress_drawn = False

    def entries(self, inputs: Sequence[str], filt: Filter) -> Iterator[Entry]:
        try:
            for entry in read_entries(inputs, stats=self.stats, domains=self.domains,
                                      on_bad=self._bad,
                                      progress=self._progress if self.progress else None):
                if filt.match(entry):
                    yield entry
        except InputError as exc:
            self._clear_progress()
            raise click.UsageError(str(exc)) from None
        self._clear_progress()

    def _bad(self, bad: BadLine) -> None:
        self._shown += 1
        if self._shown <= BAD_SHOWN:
            self._clear_progress()
            click.echo(f"warning: skipped bad line {bad}", err=True)

    def _progress(self, source: str, stats: ReadStats) -> None:
        text = f"{stats.lines:,} lines, {stats.records:,} decisions, {stats.bad} bad: {source}"
        click.echo("\r" + text[: MIN_WIDTH - 1].ljust(MIN_WIDTH - 1), err=True, nl=False)
        self._progress_drawn = True

    def _clear_progress(self) -> None:
        if self._progress_drawn:
            click.echo("\r" + " " * (MIN_WIDTH - 1) + "\r", err=True, nl=False)
            self._progress_drawn = False

    def finish(self) -> None:
        """Say on stderr how many bad lines were skipped beyond those already shown."""
        if self.stats.bad > BAD_SHOWN:
            click.echo(f"warning: {self.stats.bad - BAD_SHOWN} more bad lines not shown "
                       f"({self.stats.bad} in total)", err=True)
        elif self.stats.bad:
            click.echo(f"warning: {self.stats.bad} bad line(s) skipped", err=True)


# ---- options ---------------------------------------------------------------------------

def _when(_ctx: click.Context, param: click.Parameter, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_when(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param=param) from None


def filter_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The filters every reading sub-command accepts."""
    options = [
        click.option("--since", callback=_when, metavar="WHEN",
                     help="Only decisions at or after WHEN: RFC 3339, a date, or an age "
                          "like 30m, 24h, 7d, 2w."),
        click.option("--until", callback=_when, metavar="WHEN",
                     help="Only decisions before WHEN (same formats as --since)."),
        click.option("--namespace", "-n", "namespaces", multiple=True,
                     help="Only this namespace (repeatable)."),
        click.option("--rule", "rules", multiple=True,
                     help="Only decisions that violated this rule id (repeatable)."),
        click.option("--decision", "decisions", multiple=True,
                     type=click.Choice(DECISIONS), help="Only this outcome (repeatable)."),
        click.option("--mode", "modes", multiple=True, type=click.Choice(MODES),
                     help="Only violations in this mode; with --rule, that rule in this mode."),
    ]
    for option in reversed(options):
        func = option(func)
    return click.argument("inputs", nargs=-1, metavar="[FILE|GLOB|-]...")(func)


def make_filter(kw: dict[str, Any]) -> Filter:
    since, until = kw.pop("since"), kw.pop("until")
    if since and until and since >= until:
        raise click.BadParameter("--since must be earlier than --until", param_hint="--since")
    return Filter(since=since, until=until, namespaces=frozenset(kw.pop("namespaces")),
                  rules=frozenset(kw.pop("rules")), decisions=frozenset(kw.pop("decisions")),
                  modes=frozenset(kw.pop("modes")))


output_option = click.option("-o", "--output", "fmt", default="table", show_default=True,
                             type=click.Choice(["table", "json", "csv"]))


@click.group(name="audit", short_help="Review the webhook's decisions.")
@click.option("--webhook", "domains", multiple=True, metavar="NAME",
              default=(DEFAULT_WEBHOOK_DOMAIN,), show_default=True,
              help="In API server audit logs, annotations of webhooks named NAME, "
                   "<anything>.NAME or NAME.<anything> are ours (repeatable).")
@click.option("--progress/--no-progress", default=None,
              help="Progress on stderr (default: only when stderr is a terminal).")
@click.pass_context
def audit(ctx: click.Context, domains: tuple[str, ...], progress: bool | None) -> None:
    """Review gpu-admission decisions from decision logs or API server audit logs.

    INPUTS are files, globs ('/var/log/gpu-admission/audit.log*' includes rotated and
    gzipped files), pipes such as <(kubectl logs ...), or '-' for stdin (the default).
    The server's own log lines in a mixed stream (serve --audit-log -) are skipped.
    """
    ctx.obj = Context(domains, progress)


# ---- table helpers ---------------------------------------------------------------------

def term_width() -> int:
    return max(MIN_WIDTH, shutil.get_terminal_size((MIN_WIDTH, 24)).columns)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def render_table(headers: Sequence[str], rows: Sequence[Sequence[object]],
                 widths: Sequence[int], right: Sequence[bool] = ()) -> str:
    """Fixed-width columns; a width of 0 marks the one column that takes the rest."""
    total = term_width()
    fixed = sum(widths) + len(widths) - 1
    widths = [w or max(total - fixed, 8) for w in widths]
    lines = []
    for row in [headers, *rows]:
        cells = []
        for i, (cell, width) in enumerate(zip(row, widths, strict=True)):
            text = _clip(str(cell), width)
            cells.append(text.rjust(width) if i < len(right) and right[i] else text.ljust(width))
        lines.append(" ".join(cells).rstrip())
    return "\n".join(lines)


def _csv_cell(value: object) -> object:
    """JSON spelling for booleans and null, so CSV and JSON outputs agree."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else value


def _emit_csv(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(headers)
    writer.writerows([_csv_cell(c) for c in row] for row in rows)


def _json(obj: Any) -> None:
    click.echo(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))


# ---- summary ---------------------------------------------------------------------------

@audit.command()
@filter_options
@output_option
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=0),
              help="Rows per breakdown table (0: all).")
@click.pass_obj
def summary(obj: Context, /, inputs: tuple[str, ...], fmt: str, top: int, **kw: Any) -> None:
    """Counts by decision, rule, namespace, workload class and user."""
    filt = make_filter(kw)
    result = Summary()
    for entry in obj.entries(inputs, filt):
        result.add(entry)
    stats = obj.stats
    if fmt == "json":
        _json({"filter": filt.describe(), "input": stats.as_dict(), **result.as_dict(top)})
    elif fmt == "csv":
        rows: list[list[object]] = []
        for dim in DIMENSIONS:
            rows += [[dim, key, *t.as_dict().values()] for key, t in result.rows(dim, top)]
        _emit_csv(["dimension", "key", "total", "denied", "mutated", "warned", "audited"],
                  rows)
    else:
        period = ("no decisions" if result.first is None or result.last is None else
                  f"{result.first:%Y-%m-%d %H:%M} .. {result.last:%Y-%m-%d %H:%M} UTC")
        click.echo(f"{result.total} decisions ({result.dry_run} dry-run), {period}")
        click.echo(f"filter: {filt.describe()}")
        click.echo(f"read {stats.files} file(s), {stats.lines} lines, "
                   f"{stats.events_skipped} audit events without our annotations, "
                   + (f"{stats.log_lines} server log lines, " if stats.log_lines else "")
                   + f"{stats.bad} bad lines")
        for dim in DIMENSIONS:
            rows_ = result.rows(dim, top)
            if not rows_:
                continue
            click.echo()
            click.echo(render_table(
                [dim.upper(), "TOTAL", "DENIED", "MUTATED", "WARN", "AUDIT"],
                [[k, t.total, t.denied, t.mutated, t.warned, t.audited] for k, t in rows_],
                [0, 7, 7, 7, 7, 7], right=[False, True, True, True, True, True]))
            hidden = len(result.by[dim]) - len(rows_)
            if hidden > 0:
                click.echo(f"({hidden} more; --top 0 shows all)")
        if stats.bad:
            click.echo()
            click.echo(f"BAD LINES: {stats.bad}")
            for bad in stats.bad_samples[:10]:
                click.echo(f"  {_clip(str(bad), term_width() - 2)}")
    obj.finish()


# ---- list ------------------------------------------------------------------------------

LIST_FIELDS: Final = ("time", "uid", "decision", "mutated", "namespace", "pod", "workload",
                      "rules", "user", "operation", "dryRun", "stage", "cudaVersion", "origin")


def _rules(record: dict[str, Any]) -> str:
    return ",".join(f"{v.get('rule')}" + ("" if v.get("mode") == "enforce"
                                          else f"({v.get('mode')})")
                    for v in record.get("violations") or ())


def _pod(record: dict[str, Any]) -> str:
    return str(record.get("pod") or (f"{record.get('generateName')}*"
                                     if record.get("generateName") else ""))


def _outcome(record: dict[str, Any]) -> str:
    return "mutated" if record.get("mutated") is True else str(record.get("decision", ""))


def _flat(entry: Entry) -> dict[str, Any]:
    r = entry.record
    return {"time": r.get("time"), "uid": r.get("uid"), "decision": r.get("decision"),
            "mutated": r.get("mutated"), "namespace": r.get("namespace"), "pod": _pod(r),
            "workload": r.get("workload"), "rules": _rules(r), "user": r.get("user"),
            "operation": r.get("operation"), "dryRun": r.get("dryRun"),
            "stage": r.get("stage"), "cudaVersion": r.get("cudaVersion"),
            "origin": f"{entry.source}:{entry.line}"}


@audit.command(name="list")
@filter_options
@output_option
@click.option("--limit", default=DEFAULT_LIMIT, show_default=True,
              type=click.IntRange(min=0),
              help="Newest N decisions (0: all; then every match is held in memory).")
@click.pass_obj
def list_(obj: Context, /, inputs: tuple[str, ...], fmt: str, limit: int, **kw: Any) -> None:
    """The matching decisions, one row each, newest first."""
    chosen = newest(obj.entries(inputs, make_filter(kw)), limit)
    if fmt == "json":
        _json([{**e.record, "origin": f"{e.source}:{e.line}"} for e in chosen])
    elif fmt == "csv":
        _emit_csv(LIST_FIELDS, [list(_flat(e).values()) for e in chosen])
    else:
        click.echo(render_table(
            ["TIME (UTC)", "UID", "OUTCOME", "NAMESPACE", "POD", "RULES"],
            [[e.time.strftime("%Y-%m-%d %H:%M"), str(e.record.get("uid", ""))[:8],
              _outcome(e.record), e.record.get("namespace", ""), _pod(e.record),
              _rules(e.record) or "-"] for e in chosen],
            [16, 8, 11, 12, 15, 0]))
        if not chosen:
            click.echo("(no matching decisions)")
        elif limit and len(chosen) == limit:
            click.echo(f"(newest {limit}; --limit 0 for all)", err=True)
    obj.finish()


# ---- show ------------------------------------------------------------------------------

def _describe(entry: Entry, width: int) -> str:
    r = entry.record
    owner = r.get("owner") or {}
    lines = [
        ("uid", r.get("uid")), ("time", r.get("time")), ("source", f"{entry.source}:{entry.line}"),
        ("stage", r.get("stage")), ("operation", r.get("operation")),
        ("dry run", r.get("dryRun")), ("namespace", r.get("namespace")), ("pod", _pod(r)),
        ("owner", f"{owner.get('kind')}/{owner.get('name')}" if owner else "-"),
        ("user", r.get("user")), ("groups", ", ".join(r.get("groups") or []) or "-"),
        ("decision", r.get("decision")), ("mutated", r.get("mutated")),
        ("workload", f"{r.get('workload') or '-'}"
                     + (f" ({r['workloadReason']})" if r.get("workloadReason") else "")),
        ("cuda", f"{r.get('cudaVersion') or '-'}"
                 + (f" ({r['cudaSource']})" if r.get("cudaSource") else "")),
        ("exempt", r.get("exempt") or "-"), ("policy", r.get("policyDigest") or "-"),
        ("instance", r.get("instance") or "-"),
    ]
    out = [_wrap(f"{k + ':':<11}{v}", width) for k, v in lines]
    violations = r.get("violations") or []
    out.append(f"violations: {len(violations)}")
    for v in violations:
        out.append(_wrap(f"  - [{v.get('mode')}] {v.get('rule')} at {v.get('path') or '-'}",
                         width, "      "))
        if v.get("message"):
            out.append(_wrap(f"      {v.get('message')}", width, "      "))
    warnings = r.get("warnings") or []
    out.append(f"warnings:   {len(warnings) or r.get('warningCount', 0)}")
    out += [_wrap(f"  - {w}", width, "    ") for w in warnings]
    patch = r.get("patch") or {}
    out.append(f"patch:      {patch.get('ops', 0)} operation(s)")
    out += [_wrap(f"  - {p}", width, "    ") for p in patch.get("paths") or []]
    if patch.get("changes"):
        out.append(_wrap("changes:    " + "; ".join(patch["changes"]), width, " " * 12))
    return "\n".join(out)


def _wrap(text: str, width: int, indent: str = " " * 11) -> str:
    return "\n".join(textwrap.wrap(text, width, subsequent_indent=indent,
                                   break_long_words=True, break_on_hyphens=False)) or text


@audit.command()
@click.argument("uid")
@filter_options
@click.option("-o", "--output", "fmt", default="table", show_default=True,
              type=click.Choice(["table", "json"]))
@click.pass_obj
def show(obj: Context, /, uid: str, inputs: tuple[str, ...], fmt: str, **kw: Any) -> None:
    """One decision in full, by request uid (a unique prefix is enough)."""
    if not uid.strip():
        raise click.BadParameter("must not be empty", param_hint="UID")
    found = find_uid(obj.entries(inputs, make_filter(kw)), uid)
    obj.finish()
    exact = [e for e in found if e.record.get("uid") == uid]
    found = exact or found
    uids = sorted({str(e.record.get("uid")) for e in found})
    if not found:
        click.echo(f"error: no decision with uid {uid!r} in the input", err=True)
        sys.exit(1)
    if len(uids) > 1:
        shown = ", ".join(uids[:10]) + (" …" if len(uids) > 10 else "")
        raise click.UsageError(f"uid prefix {uid!r} is ambiguous: {shown}")
    if fmt == "json":
        _json([{**e.record, "origin": f"{e.source}:{e.line}"} for e in found]
              if len(found) > 1 else {**found[0].record,
                                      "origin": f"{found[0].source}:{found[0].line}"})
        return
    click.echo("\n\n".join(_describe(e, term_width()) for e in found))


# ---- report ----------------------------------------------------------------------------

_HTML_FILE: Final = click.Path(dir_okay=False, writable=True, path_type=Path)


@audit.command(short_help="A self-contained HTML page of the decisions.")
@filter_options
@aliases("html_file", "--out", "--html", type=_HTML_FILE)
@click.option("--out", "html_file", default=None, metavar="FILE", type=_HTML_FILE,
              help="Where to write the self-contained HTML page (required).")
@click.pass_obj
def report(obj: Context, /, inputs: tuple[str, ...], html_file: Path | None,
           **kw: Any) -> None:
    """A self-contained HTML page with summary tables and charts over time."""
    if html_file is None:
        raise click.UsageError("Missing option '--out' (the HTML page to write).")
    filt = make_filter(kw)
    result = Summary()
    for entry in obj.entries(inputs, filt):
        result.add(entry)
    page = render_html(result, obj.stats, filt.describe())
    try:
        html_file.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise click.FileError(str(html_file), hint=exc.strerror) from None
    obj.finish()
    click.echo(f"wrote {html_file} ({result.total} decisions, {obj.stats.bad} bad lines)",
               err=True)
