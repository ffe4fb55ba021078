"""Streaming reader for decision logs and Kubernetes API server audit logs.

Both inputs become the same thing: a stream of :class:`~gpu_admission.auditlog.entry.Entry`
objects whose ``record`` has the decision-record shape of
:func:`gpu_admission.auditlog.record.decision_record`, so summaries, filters and reports do
not care where a decision came from.

* Decision log lines (``schemaVersion`` present) are taken as they are.
* The server's own log lines (structlog JSON objects with ``event``, ``level`` and
  ``timestamp``, :mod:`gpu_admission.server.logs`) are counted and skipped, never bad: with
  ``serve --audit-log -`` decisions and log lines share one stream (``kubectl logs``).
* ``audit.k8s.io/v1`` ``Event`` lines (the API server's ``--audit-log-path`` log backend
  writes one JSON Event per line; the webhook backend sends ``EventList`` batches) carry our
  ``auditAnnotations`` under ``<webhook name>/<key>``
  (https://kubernetes.io/docs/tasks/debug/debug-cluster/audit/). One record is produced per
  matching webhook (mutating and validating both annotate the same event). The API server's
  own ``mutation.webhook.admission.k8s.io/round_<r>_index_<i>`` (JSON
  ``{"configuration", "webhook", "mutated"}``), ``patch.webhook.admission.k8s.io/…`` (JSON with
  the ``patch``; only op/path are kept, never values) and
  ``failed-open.{mutation,validating}.webhook.admission.k8s.io/…`` (value: webhook name)
  annotations fill in "did it mutate" and "did the call fail open". Events of requests our
  webhooks never saw are skipped and counted, not reported as corrupt.

Everything streams: one line in memory at a time, gzip decompressed on the fly. Bad lines
(invalid JSON, truncated gzip, missing or wrong-typed fields) are counted and kept as
:class:`BadLine` samples with file and line number; they never stop the read.
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import io
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Final

import orjson

from gpu_admission.auditlog.entry import BadLine, Entry, ReadStats
from gpu_admission.auditlog.record import patch_paths

DEFAULT_WEBHOOK_DOMAIN: Final = "gpu-admission.io"
STDIN: Final = "-"
GZIP_MAGIC: Final = b"\x1f\x8b"
#: the keys every line of the server's structlog logger has (gpu_admission.server.logs)
LOG_LINE_KEYS: Final = ("event", "level", "timestamp")

AUDIT_API_VERSION: Final = "audit.k8s.io/v1"
MUTATION_KEY: Final = "mutation.webhook.admission.k8s.io/"
PATCH_KEY: Final = "patch.webhook.admission.k8s.io/"
FAILED_OPEN_KEYS: Final = ("failed-open.mutation.webhook.admission.k8s.io/",
                           "failed-open.validating.webhook.admission.k8s.io/")

# audit Event verb → admission operation (PATCH and UPDATE are both UPDATE to a webhook).
VERB_OPERATION: Final = {"create": "CREATE", "update": "UPDATE", "patch": "UPDATE",
                         "delete": "DELETE", "deletecollection": "DELETE"}


class InputError(Exception):
    """An input that cannot be read at all (missing file, glob without matches)."""


class RecordError(ValueError):
    """A parsed JSON object that is not a usable record (message says which field)."""


def parse_time(value: object, what: str = "time") -> datetime:
    """An RFC 3339 timestamp as an aware UTC datetime (``Z`` or offsets accepted)."""
    if not isinstance(value, str) or not value:
        raise RecordError(f"field {what!r}: expected an RFC 3339 string, got {value!r}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise RecordError(f"field {what!r}: not RFC 3339: {value!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def webhook_matches(name: str, domains: Sequence[str]) -> bool:
    """Is ``name`` one of our webhooks? Webhook names are fully qualified
    (``admissionregistration.k8s.io/v1`` ``webhooks[].name``, e.g. ``mutate.gpu-admission.io``),
    so a configured domain matches itself and every name under it; a name configured exactly
    (``pods.example.com``) matches that name."""
    return any(name == d or name.endswith("." + d) or name.startswith(d + ".") for d in domains)


# ---- inputs ----------------------------------------------------------------------------

def expand_inputs(specs: Sequence[str]) -> list[str]:
    """Files, globs (``audit.log*`` picks up rotated and ``.gz`` files), any other readable
    path (a named pipe, ``/dev/fd/N`` of a shell's ``<(…)``) or ``-`` (stdin).

    Glob matches are sorted; order does not matter for results (``list`` sorts by time).
    """
    out: list[str] = []
    for spec in specs or [STDIN]:
        if spec == STDIN:
            out.append(spec)
        elif glob.has_magic(spec):
            # glob.glob, not Path.glob: users pass absolute patterns like /var/log/x/audit.log*
            matches = sorted(m for m in glob.glob(spec) if Path(m).is_file())  # noqa: PTH207
            if not matches:
                raise InputError(f"no files match {spec!r}")
            out.extend(matches)
        elif Path(spec).is_dir():
            raise InputError(f"{spec!r} is a directory; pass files or a glob like '{spec}/*'")
        elif not Path(spec).exists():  # pipes and /dev/fd/N (process substitution) exist
            raise InputError(f"no such file: {spec!r}")
        else:
            out.append(spec)
    return out


@contextlib.contextmanager
def open_input(spec: str) -> Iterator[IO[bytes]]:
    """A binary stream for a path or stdin, gunzipped when it starts with the gzip magic
    (so rotated logs compressed by logrotate work whatever their name)."""
    with contextlib.ExitStack() as stack:
        raw: io.BufferedReader
        if spec == STDIN:
            raw = sys.stdin.buffer if isinstance(sys.stdin.buffer, io.BufferedReader) else \
                io.BufferedReader(sys.stdin.buffer)  # type: ignore[arg-type]
        else:
            try:
                raw = stack.enter_context(Path(spec).open("rb"))
            except OSError as exc:
                raise InputError(f"cannot read {spec!r}: {exc.strerror}") from None
        if raw.peek(2)[:2] == GZIP_MAGIC:
            unzipped = stack.enter_context(gzip.GzipFile(fileobj=raw, mode="rb"))
            yield unzipped  # type: ignore[misc]  # GzipFile is a binary IO; typeshed differs
        else:
            yield raw


def _lines(stream: IO[bytes], source: str, stats: ReadStats) -> Iterator[tuple[int, bytes]]:
    number = 0
    try:
        for number, raw in enumerate(stream, 1):  # number is also used after the loop
            yield number, raw
    except (EOFError, OSError, zlib.error) as exc:  # truncated or damaged gzip member
        stats.add_bad(source, number + 1, f"unreadable compressed data: {exc}")


# ---- decoding --------------------------------------------------------------------------

def _check_record(obj: dict[str, Any]) -> datetime:
    """Minimal shape check of a decision-log record; returns its time."""
    when = parse_time(obj.get("time"))
    for name in ("uid", "decision"):
        if name not in obj:
            raise RecordError(f"missing field {name!r}")
        if not isinstance(obj.get(name), str):
            raise RecordError(f"field {name!r}: expected a string, got {obj.get(name)!r}")
    for name in ("violations", "warnings", "groups"):
        if name in obj and not isinstance(obj[name], list):
            raise RecordError(f"field {name!r}: expected a list")
    for violation in obj.get("violations", ()):
        if not isinstance(violation, Mapping) or not isinstance(violation.get("rule"), str):
            raise RecordError("field 'violations': each item needs a string 'rule'")
    return when


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _json_annotation(value: str) -> dict[str, Any]:
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def event_records(event: Mapping[str, Any], domains: Sequence[str]) -> list[dict[str, Any]]:
    """Decision records for our webhooks found in one audit Event (may be empty)."""
    notes = event.get("annotations")
    if not isinstance(notes, Mapping):
        return []
    ours: dict[str, dict[str, str]] = {}
    mutated: dict[str, bool] = {}
    paths: dict[str, list[str]] = {}
    failed_open: set[str] = set()
    for key, value in notes.items():
        if not isinstance(value, str) or "/" not in key:
            continue
        if key.startswith(MUTATION_KEY):
            info = _json_annotation(value)
            hook = str(info.get("webhook", ""))
            if webhook_matches(hook, domains):
                mutated[hook] = mutated.get(hook, False) or info.get("mutated") is True
        elif key.startswith(PATCH_KEY):
            info = _json_annotation(value)
            hook = str(info.get("webhook", ""))
            patch = info.get("patch")
            if webhook_matches(hook, domains) and isinstance(patch, list):
                paths.setdefault(hook, []).extend(
                    patch_paths(op for op in patch if isinstance(op, Mapping)))
        elif key.startswith(FAILED_OPEN_KEYS):
            if webhook_matches(value, domains):
                failed_open.add(value)
        else:
            hook, _, sub = key.partition("/")
            if webhook_matches(hook, domains):
                ours.setdefault(hook, {})[sub] = value
    hooks = sorted(set(ours) | set(mutated) | failed_open)
    if not hooks:
        return []

    ref = _mapping(event.get("objectRef"))
    user = _mapping(event.get("user"))
    request_meta: Mapping[str, Any] = {}
    request_object = event.get("requestObject")
    if isinstance(request_object, Mapping) and isinstance(request_object.get("metadata"),
                                                          Mapping):
        request_meta = request_object["metadata"]
    when = event.get("stageTimestamp") or event.get("requestReceivedTimestamp")
    uri = str(event.get("requestURI", ""))
    status = _mapping(event.get("responseStatus"))
    out = []
    for hook in hooks:
        got = ours.get(hook, {})
        decision = got.get("decision") or ("failed-open" if hook in failed_open else "allowed")
        violations = []
        for item in filter(None, got.get("violations", "").split(",")):
            rule, _, mode = item.partition("=")
            violations.append({"rule": rule, "path": "", "message": "",
                               "mode": mode or "enforce"})
        changes = [c for c in got.get("patch", "").split("; ") if c]
        hook_paths = paths.get(hook, [])
        out.append({
            "schemaVersion": 1,
            "source": "apiserver",
            "time": when,
            "uid": str(event.get("auditID", "")),
            "stage": hook,
            "operation": VERB_OPERATION.get(str(event.get("verb", "")),
                                            str(event.get("verb", "")).upper()),
            "dryRun": "dryRun=All" in uri,
            "namespace": str(ref.get("namespace", "")),
            "pod": str(ref.get("name", "") or request_meta.get("name", "")),
            "generateName": str(request_meta.get("generateName", "")),
            "owner": None,
            "user": str(user.get("username", "")),
            "groups": [str(g) for g in user.get("groups", []) or []],
            "gpu": "workload" in got or "cuda-version" in got,
            "workload": got.get("workload"),
            "workloadReason": got.get("workload-reason", ""),
            "cudaVersion": got.get("cuda-version"),
            "cudaSource": got.get("cuda-source", ""),
            "decision": decision,
            "mutated": mutated.get(hook, bool(changes)) and decision == "allowed",
            "modes": {v["rule"]: v["mode"] for v in violations},
            "violations": violations,
            "warnings": [],
            "warningCount": int(got["warnings"]) if got.get("warnings", "").isdigit() else 0,
            "exempt": got.get("exempt", ""),
            "patch": {"ops": len(hook_paths), "paths": hook_paths, "changes": changes},
            "policyDigest": "",
            "instance": "",
            "responseCode": status.get("code"),
        })
    return out


# ---- the stream ------------------------------------------------------------------------

Progress = Callable[[str, ReadStats], None]


def read_entries(specs: Sequence[str], *, stats: ReadStats,
                 domains: Sequence[str] = (DEFAULT_WEBHOOK_DOMAIN,),
                 on_bad: Callable[[BadLine], None] | None = None,
                 progress: Progress | None = None,
                 progress_every: int = 50_000) -> Iterator[Entry]:
    """Every decision in ``specs`` (see :func:`expand_inputs`), one at a time."""
    for source in expand_inputs(specs):
        stats.files += 1
        label = "<stdin>" if source == STDIN else source
        with open_input(source) as stream:
            for number, raw in _lines(stream, label, stats):
                stats.lines += 1
                yield from _decode(raw, label, number, stats, domains=domains, on_bad=on_bad)
                if progress is not None and stats.lines % progress_every == 0:
                    progress(label, stats)
        if progress is not None:
            progress(label, stats)


def is_log_line(obj: Mapping[str, Any]) -> bool:
    """A structlog line of the server (``event``, ``level`` and ``timestamp`` strings, no
    ``schemaVersion``, no ``apiVersion``): what ``serve`` writes beside its decisions."""
    return ("apiVersion" not in obj
            and all(isinstance(obj.get(key), str) for key in LOG_LINE_KEYS))


def _parse(raw: bytes, stats: ReadStats, domains: Sequence[str]
           ) -> list[tuple[datetime, dict[str, Any]]]:
    """The decisions in one line; raises RecordError/JSONDecodeError for a bad line."""
    obj = orjson.loads(raw)
    if not isinstance(obj, dict):
        raise RecordError(f"expected a JSON object, got {type(obj).__name__}")
    if "schemaVersion" in obj:
        return [(_check_record(obj), obj)]
    if is_log_line(obj):
        stats.log_lines += 1
        return []
    if obj.get("apiVersion") != AUDIT_API_VERSION or obj.get("kind") not in ("Event",
                                                                             "EventList"):
        raise RecordError("neither a decision record (no 'schemaVersion') nor an "
                          f"{AUDIT_API_VERSION} Event")
    events = obj.get("items") if obj.get("kind") == "EventList" else [obj]
    if not isinstance(events, list):
        raise RecordError("EventList: field 'items' must be a list")
    found = []
    for event in events:
        records = event_records(event, domains) if isinstance(event, Mapping) else []
        if not records:
            stats.events_skipped += 1
        found += [(_check_record(rec), rec) for rec in records]
    return found


def _decode(raw: bytes, source: str, number: int, stats: ReadStats, *,
            domains: Sequence[str], on_bad: Callable[[BadLine], None] | None
            ) -> Iterable[Entry]:
    if not raw.strip():
        return ()
    try:
        found = _parse(raw, stats, domains)
    except orjson.JSONDecodeError as exc:
        reason = "truncated JSON" if not raw.endswith(b"\n") else f"invalid JSON: {exc}"
        bad = stats.add_bad(source, number, reason)
    except RecordError as exc:
        bad = stats.add_bad(source, number, str(exc))
    else:
        stats.records += len(found)
        return [Entry(when, rec, source, number) for when, rec in found]
    if on_bad is not None:
        on_bad(bad)
    return ()
