"""Reader and query building blocks: webhook matching, times, the bounded newest-first heap,
audit Event decoding."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_admission.auditlog.entry import Entry, ReadStats
from gpu_admission.auditlog.query import Filter, Summary, newest, parse_when
from gpu_admission.auditlog.reader import event_records, read_entries, webhook_matches

DATA = Path(__file__).parent.parent / "data" / "audit"
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("name", "ok"), [
    ("gpu-admission.io", True), ("mutate.gpu-admission.io", True),
    ("pods.validate.gpu-admission.io", True), ("gpu-admission.io.evil.com", True),
    ("notgpu-admission.io", False), ("gpu-admission.iox", False), ("other.io", False),
], ids=str)
def test_webhook_matches_default_domain(name: str, ok: bool) -> None:
    assert webhook_matches(name, ["gpu-admission.io"]) is ok


@pytest.mark.parametrize(("text", "expected"), [
    ("30m", NOW - timedelta(minutes=30)), ("24h", NOW - timedelta(hours=24)),
    ("7d", NOW - timedelta(days=7)), ("2w", NOW - timedelta(weeks=2)),
    ("2026-11-30T10:00:00Z", datetime(2026, 11, 30, 10, tzinfo=UTC)),
    ("2026-11-30T12:00:00+02:00", datetime(2026, 11, 30, 10, tzinfo=UTC)),
    ("2026-11-30", datetime(2026, 11, 30, tzinfo=UTC)),
], ids=["minutes", "hours", "days", "weeks", "rfc3339-z", "rfc3339-offset", "date"])
def test_parse_when(text: str, expected: datetime) -> None:
    assert parse_when(text, NOW) == expected


@pytest.mark.parametrize("text", ["", "7", "7y", "yesterday", "2026-13-01"],
                         ids=["empty", "no-unit", "bad-unit", "word", "bad-month"])
def test_parse_when_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="neither RFC 3339"):
        parse_when(text, NOW)


def entry(minutes: int, n: int) -> Entry:
    return Entry(NOW + timedelta(minutes=minutes), {"n": n}, "mem", n)


@given(st.lists(st.integers(-1000, 1000), max_size=60), st.integers(0, 70))
def test_newest_equals_a_full_sort(minutes: list[int], limit: int) -> None:
    entries = [entry(m, i) for i, m in enumerate(minutes)]
    expected = sorted(entries, key=lambda e: (e.time, e.line), reverse=True)
    expected = expected[:limit] if limit else expected
    assert [e.line for e in newest(iter(entries), limit)] == [e.line for e in expected]


def test_event_records_from_a_real_shaped_event() -> None:
    first = orjson.loads((DATA / "apiserver-audit.log").read_bytes().splitlines()[0])
    records = event_records(first, ["gpu-admission.io"])
    assert [r["stage"] for r in records] == ["mutate.gpu-admission.io",
                                            "validate.gpu-admission.io"]
    mutate = records[0]
    assert (mutate["decision"], mutate["mutated"], mutate["workload"]) == (
        "allowed", True, "inference")
    assert mutate["violations"] == [{"rule": "gpu-memory-limit", "path": "", "message": "",
                                     "mode": "warn"}]
    assert mutate["patch"]["paths"] == ["add /spec/schedulerName", "add /spec/containers/0/env"]
    assert mutate["warningCount"] == 1
    # the other webhook's mutation annotation (index 0) is not ours
    assert all(r["stage"] != "sidecar.istio.io" for r in records)
    assert event_records(first, ["example.com"]) == []


def test_event_with_bad_annotation_json_still_reads(tmp_path: Path) -> None:
    event = {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "auditID": "a",
             "stageTimestamp": "2026-11-30T10:00:00.000001Z", "verb": "create",
             "annotations": {"mutation.webhook.admission.k8s.io/round_0_index_0": "{not json",
                             "mutate.gpu-admission.io/decision": "allowed"}}
    records = event_records(event, ["gpu-admission.io"])
    assert [(r["decision"], r["mutated"]) for r in records] == [("allowed", False)]


@pytest.mark.parametrize(("line", "reason"), [
    (b'{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":{}}',
     "EventList: field 'items' must be a list"),
    (b'{"kind":"Event","apiVersion":"audit.k8s.io/v1","auditID":"a",'
     b'"annotations":{"mutate.gpu-admission.io/decision":"denied"}}',
     "field 'time': expected an RFC 3339 string, got None"),
    (b'{"hello":"world"}', "neither a decision record"),
    (b'{"schemaVersion":1,"time":"2026-11-30T10:00:00Z","uid":"u","decision":"allowed",'
     b'"violations":"oops"}', "field 'violations': expected a list"),
    (b'{"schemaVersion":1,"time":"2026-11-30T10:00:00Z","uid":"u","decision":"allowed",'
     b'"violations":[{"path":"x"}]}', "each item needs a string 'rule'"),
], ids=["eventlist-items", "event-without-time", "unknown-object", "violations-type",
        "violation-without-rule"])
def test_bad_lines_name_the_field(tmp_path: Path, line: bytes, reason: str) -> None:
    path = tmp_path / "x.log"
    path.write_bytes(line + b"\n")
    stats = ReadStats()
    assert list(read_entries([str(path)], stats=stats)) == []
    assert stats.bad == 1
    assert stats.bad_samples[0].line == 1
    assert reason in stats.bad_samples[0].reason


def test_summary_and_filter_over_fixtures() -> None:
    stats = ReadStats()
    summary = Summary()
    filt = Filter(namespaces=frozenset({"team-a"}))
    for e in read_entries([str(p) for p in sorted(DATA.glob("decisions.log*"))], stats=stats):
        if filt.match(e):
            summary.add(e)
    assert (summary.total, stats.records, stats.files) == (4, 11, 3)
    assert summary.by["decision"]["allowed"].mutated == 3
    assert sum(summary.mutated_day_ns.values()) == 3
    assert summary.denied_day_ns == {}
