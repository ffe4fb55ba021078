"""``gpu-admission audit`` as a user runs it: a subprocess over real files on disk."""

from __future__ import annotations

import csv
import gzip
import io
import os
import pty
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

DATA = Path(__file__).parent.parent / "data" / "audit"
ROTATED = str(DATA / "decisions.log*")  # decisions.log, .1 and .2.gz
APISERVER = str(DATA / "apiserver-audit.log")
CORRUPT = str(DATA / "corrupt.log")


def run(*args: str, stdin: bytes | None = None, check: bool = True,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    environ.update(env or {})
    done = subprocess.run([sys.executable, "-m", "gpu_admission", "audit", *args],
                          input=stdin, capture_output=True, timeout=120, env=environ,
                          check=False)
    result = subprocess.CompletedProcess(done.args, done.returncode,
                                         done.stdout.decode(), done.stderr.decode())
    assert "Traceback" not in result.stderr, result.stderr
    if check:
        assert result.returncode == 0, result.stderr
    return result


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    return orjson.loads(result.stdout)


def fits_80(text: str) -> bool:
    return all(len(line) <= 80 for line in text.splitlines())


# ---- summary -------------------------------------------------------------------------

def test_summary_json_exact_for_one_namespace_over_rotated_and_gzipped_files() -> None:
    tally = {"denied": 0, "mutated": 0, "warned": 0, "audited": 0}
    got = as_json(run("summary", "-o", "json", "-n", "team-b", ROTATED))
    assert got == {
        "filter": "namespace in {team-b}",
        "input": {"files": 3, "lines": 11, "records": 11, "eventsSkipped": 0, "logLines": 0,
                  "badLines": 0, "badSamples": []},
        "total": 4, "dryRun": 1, "first": "2026-11-28T10:00:00Z",
        "last": "2026-11-30T13:00:00Z",
        "byDecision": {"denied": {**tally, "total": 3, "denied": 3},
                       "allowed": {**tally, "total": 1}},
        "byNamespace": {"team-b": {**tally, "total": 4, "denied": 3}},
        "byWorkload": {"training": {**tally, "total": 3, "denied": 3},
                       "(none)": {**tally, "total": 1}},
        "byUser": {"bob@example.com": {**tally, "total": 3, "denied": 3},
                   "alice@example.com": {**tally, "total": 1}},
        "byRule": {"no-training-on-shared-gpu": {**tally, "total": 3, "denied": 3}},
        "byRuleMode": [{"rule": "no-training-on-shared-gpu", "mode": "enforce", "count": 3}],
        "perDay": {"2026-11-28": {**tally, "total": 1, "denied": 1},
                   "2026-11-29": {**tally, "total": 1, "denied": 1},
                   "2026-11-30": {**tally, "total": 2, "denied": 1}},
    }


def test_summary_table_fits_80_columns_and_counts_both_formats() -> None:
    result = run("summary", ROTATED, APISERVER)
    out = result.stdout
    assert fits_80(out), out
    lines = out.splitlines()
    assert lines[0] == "18 decisions (2 dry-run), 2026-11-28 09:00 .. 2026-12-01 17:00 UTC"
    assert lines[2] == ("read 4 file(s), 18 lines, 2 audit events without our annotations, "
                        "0 bad lines")
    rows = {line.split()[0]: line.split()[1:] for line in lines[3:] if line.strip()}
    assert rows["DECISION"] == ["TOTAL", "DENIED", "MUTATED", "WARN", "AUDIT"]
    assert rows["allowed"] == ["13", "0", "5", "5", "3"]
    assert rows["denied"] == ["4", "4", "0", "0", "0"]
    assert rows["failed-open"] == ["1", "0", "0", "0", "0"]
    assert rows["no-training-on-shared-gpu"] == ["7", "4", "0", "0", "3"]
    assert rows["team-a"] == ["7", "0", "5", "5", "0"]
    assert result.stderr == ""


def test_summary_csv() -> None:
    out = run("summary", "-o", "csv", "--rule", "no-training-on-shared-gpu", ROTATED).stdout
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == ["dimension", "key", "total", "denied", "mutated", "warned", "audited"]
    assert ["decision", "denied", "3", "3", "0", "0", "0"] in rows
    assert ["decision", "allowed", "2", "0", "0", "0", "2"] in rows
    assert ["namespace", "ml-research", "2", "0", "0", "0", "2"] in rows
    assert ["rule", "no-training-on-shared-gpu", "5", "3", "0", "0", "2"] in rows


def test_summary_top_limits_rows() -> None:
    out = run("summary", "--top", "1", ROTATED).stdout
    assert "(3 more; --top 0 shows all)" in out  # 4 namespaces, 1 shown


@pytest.mark.parametrize(("args", "total"), [
    (["--since", "2026-11-29T00:00:00Z"], 8),
    (["--until", "2026-11-29"], 3),
    (["--since", "2026-11-29", "--until", "2026-11-30T00:00:00+00:00"], 3),
    (["--decision", "denied"], 3),
    (["--decision", "mutated"], 3),
    (["--decision", "denied", "--decision", "mutated"], 6),
    (["--namespace", "team-a", "-n", "kube-system"], 5),
    (["--rule", "gpu-memory-limit"], 3),
    (["--rule", "no-training-on-shared-gpu", "--mode", "audit"], 2),
    (["--mode", "warn"], 3),
    (["--rule", "no-such-rule"], 0),
], ids=["since", "until-date", "window", "denied", "mutated", "denied-or-mutated",
        "two-namespaces", "rule", "rule-in-audit-mode", "mode", "unknown-rule"])
def test_filters(args: list[str], total: int) -> None:
    assert as_json(run("summary", "-o", "json", *args, ROTATED))["total"] == total


def test_relative_since_and_until(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    log = tmp_path / "recent.log"
    log.write_bytes(b"".join(orjson.dumps({
        "schemaVersion": 1, "uid": f"u{age}", "decision": "allowed", "namespace": "a",
        "time": (now - timedelta(hours=age)).isoformat()}) + b"\n" for age in (1, 30, 200)))
    assert as_json(run("summary", "-o", "json", "--since", "24h", str(log)))["total"] == 1
    assert as_json(run("summary", "-o", "json", "--since", "2d", str(log)))["total"] == 2
    assert as_json(run("summary", "-o", "json", "--until", "1w", str(log)))["total"] == 1
    assert as_json(run("summary", "-o", "json", "--since", "90m", "--until", "30m",
                       str(log)))["total"] == 1


# ---- list ----------------------------------------------------------------------------

def test_list_table_newest_first_across_formats() -> None:
    out = run("list", ROTATED, APISERVER).stdout
    assert fits_80(out), out
    lines = out.splitlines()
    assert lines[0].split() == ["TIME", "(UTC)", "UID", "OUTCOME", "NAMESPACE", "POD", "RULES"]
    times = [line[:16] for line in lines[1:]]
    assert times == sorted(times, reverse=True) and len(times) == 18
    assert lines[1].startswith("2026-12-01 17:00 c3e9b4d5 mutated     team-a       infer-8")
    assert lines[-1].startswith("2026-11-28 09:00 00000001 mutated     team-a       infer-0")
    assert any("train-*" in line for line in lines)  # generateName shown with a star
    assert any("pytorchjob-wor…" in line for line in lines)  # clipped to the column


def test_list_limit_json_and_csv() -> None:
    records = as_json(run("list", "-o", "json", "--limit", "2", ROTATED))
    assert [r["uid"][:8] for r in records] == ["0000000b", "0000000a"]
    assert records[1]["origin"].endswith("decisions.log:4")
    assert records[1]["violations"][0]["rule"] == "no-training-on-shared-gpu"
    out = run("list", "-o", "csv", "--decision", "denied", ROTATED).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["uid"][:8] for r in rows] == ["0000000a", "00000005", "00000002"]
    assert rows[1] == {
        "time": "2026-11-29T10:00:00.000Z", "uid": "00000005-1111-4222-8333-000000000005",
        "decision": "denied", "mutated": "false", "namespace": "team-b", "pod": "train-1",
        "workload": "training", "rules": "no-training-on-shared-gpu",
        "user": "bob@example.com", "operation": "CREATE", "dryRun": "true",
        "stage": "mutate", "cudaVersion": "12.1",
        "origin": str(DATA / "decisions.log.1") + ":2"}


def test_list_limit_zero_is_everything_and_wide_terminal_uses_the_width() -> None:
    assert len(as_json(run("list", "-o", "json", "--limit", "0", ROTATED))) == 11
    wide = run("list", ROTATED, env={"COLUMNS": "140"}).stdout
    assert "no-training-on-shared-gpu" in wide  # not clipped when there is room
    assert max(len(line) for line in wide.splitlines()) <= 140


def test_list_nothing_matches() -> None:
    assert run("list", "-n", "nowhere", ROTATED).stdout.endswith("(no matching decisions)\n")


# ---- show ----------------------------------------------------------------------------

def test_show_by_full_uid_and_prefix() -> None:
    full = run("show", "0000000a-1111-4222-8333-00000000000a", ROTATED).stdout
    assert full == run("show", "0000000a", ROTATED).stdout
    assert fits_80(full)
    lines = full.splitlines()
    assert lines[0] == "uid:       0000000a-1111-4222-8333-00000000000a"
    assert "decision:  denied" in lines
    assert "workload:  training (owner PyTorchJob)" in lines
    assert "  - [enforce] no-training-on-shared-gpu at spec.containers[0].resources.limits" \
        in lines
    assert "instance:  gpu-admission-7d9f-abcde" in lines


def test_show_json_exact_for_an_apiserver_event() -> None:
    got = as_json(run("show", "-o", "json", "9c4f2a77", APISERVER))
    assert got == {
        "schemaVersion": 1, "source": "apiserver", "time": "2026-11-30T14:05:00.264000Z",
        "uid": "9c4f2a77-1e5d-4b8a-8f0c-3d2e1a9b7c55", "stage": "mutate.gpu-admission.io",
        "operation": "CREATE", "dryRun": True, "namespace": "team-b", "pod": "",
        "generateName": "pytorchjob-worker-", "owner": None, "user": "bob@example.com",
        "groups": ["system:authenticated", "team:team-b"], "gpu": True,
        "workload": "training", "workloadReason": "owner PyTorchJob", "cudaVersion": "12.1",
        "cudaSource": "image pytorch/pytorch:2.1.0-cuda12.1-cudnn8-runtime",
        "decision": "denied", "mutated": False,
        "modes": {"no-training-on-shared-gpu": "enforce"},
        "violations": [{"rule": "no-training-on-shared-gpu", "path": "", "message": "",
                        "mode": "enforce"}],
        "warnings": [], "warningCount": 0, "exempt": "",
        "patch": {"ops": 0, "paths": [], "changes": []}, "policyDigest": "", "instance": "",
        "responseCode": 403, "origin": APISERVER + ":2"}


def test_show_event_with_both_webhooks_and_patch_paths_without_values() -> None:
    got = as_json(run("show", "-o", "json", "5d0e6c1a", APISERVER))
    assert [r["stage"] for r in got] == ["mutate.gpu-admission.io", "validate.gpu-admission.io"]
    assert got[0]["mutated"] is True and got[1]["mutated"] is False
    assert got[0]["patch"]["paths"] == ["add /spec/schedulerName", "add /spec/containers/0/env"]
    text = run("show", "5d0e6c1a", APISERVER).stdout
    assert "hf_secret_do_not_log" not in text + orjson.dumps(got).decode()


@pytest.mark.parametrize(("uid", "code", "message"), [
    ("ffffffff", 1, "error: no decision with uid 'ffffffff' in the input"),
    ("0000000", 2, "Error: uid prefix '0000000' is ambiguous: 00000001-"),
], ids=["missing", "ambiguous"])
def test_show_errors(uid: str, code: int, message: str) -> None:
    result = run("show", uid, ROTATED, check=False)
    assert result.returncode == code
    assert message in result.stderr


# ---- inputs --------------------------------------------------------------------------

def test_stdin_plain_and_gzipped() -> None:
    plain = (DATA / "decisions.log").read_bytes()
    got = as_json(run("summary", "-o", "json", "-", stdin=plain))
    assert got["total"] == 5 and got["input"]["files"] == 1
    zipped = gzip.compress(plain + (DATA / "decisions.log.1").read_bytes())
    assert as_json(run("summary", "-o", "json", stdin=zipped))["total"] == 8  # default: stdin


def test_failed_open_and_eventlist_and_webhook_option() -> None:
    got = as_json(run("list", "-o", "json", "--decision", "failed-open", APISERVER))
    assert [(r["namespace"], r["pod"], r["stage"]) for r in got] == [
        ("ml-research", "notebook-0", "mutate.gpu-admission.io")]
    batch = as_json(run("show", "-o", "json", "c3e9b4d5", APISERVER))
    assert (batch["pod"], batch["mutated"]) == ("infer-8", True)
    other = as_json(run("--webhook", "example.com", "summary", "-o", "json", APISERVER))
    assert (other["total"], other["input"]["eventsSkipped"]) == (0, 7)
    exact = as_json(run("--webhook", "validate.gpu-admission.io", "summary", "-o", "json",
                        APISERVER))
    assert exact["total"] == 2


def test_corrupt_lines_are_reported_with_file_and_line_and_counted() -> None:
    result = run("summary", "-o", "json", CORRUPT, ROTATED)
    got = orjson.loads(result.stdout)
    assert got["total"] == 13
    assert got["input"]["badLines"] == 5
    expected = [f"{CORRUPT}:2: invalid JSON", f"{CORRUPT}:3: expected a JSON object, got list",
                f"{CORRUPT}:4: field 'time': not RFC 3339: 'yesterday'",
                f"{CORRUPT}:5: missing field 'uid'", f"{CORRUPT}:8: truncated JSON"]
    for sample, start in zip(got["input"]["badSamples"], expected, strict=True):
        assert sample.startswith(start)
    stderr = result.stderr.splitlines()
    for line, start in zip(stderr[:5], expected, strict=True):
        assert line.startswith("warning: skipped bad line " + start)
    assert stderr[5] == "warning: 5 bad line(s) skipped"
    table = run("summary", CORRUPT).stdout
    assert "BAD LINES: 5" in table and f"{CORRUPT}:8: truncated JSON" in table


def test_many_bad_lines_are_counted_but_stderr_stays_short(tmp_path: Path) -> None:
    noisy = tmp_path / "noisy.log"
    noisy.write_bytes(b"not json\n" * 500)
    result = run("list", str(noisy))
    assert len(result.stderr.splitlines()) == 21
    assert result.stderr.splitlines()[-1] == ("warning: 480 more bad lines not shown "
                                              "(500 in total)")


def test_truncated_gzip_is_a_bad_line_not_a_crash(tmp_path: Path) -> None:
    whole = gzip.compress((DATA / "decisions.log").read_bytes() * 50)
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    got = as_json(run("summary", "-o", "json", str(cut)))
    assert got["input"]["badLines"] >= 1
    assert "unreadable compressed data" in got["input"]["badSamples"][-1]
    assert got["total"] > 0


@pytest.mark.parametrize(("args", "message"), [
    (["summary", "/nonexistent/audit.log"], "no such file: '/nonexistent/audit.log'"),
    (["summary", "/nonexistent/*.log"], "no files match '/nonexistent/*.log'"),
    (["summary", str(DATA)], "is a directory"),
    (["summary", "--since", "last tuesday", ROTATED], "neither RFC 3339"),
    (["summary", "--since", "2026-12-01", "--until", "2026-11-01", ROTATED],
     "--since must be earlier than --until"),
    (["list", "--decision", "maybe", ROTATED], "'maybe' is not one of"),
    (["list", "-o", "yaml", ROTATED], "'yaml' is not one of"),
    (["report", ROTATED], "Missing option '--out'"),
], ids=["missing-file", "empty-glob", "directory", "bad-since", "inverted-window",
        "bad-decision", "bad-format", "report-needs-html"])
def test_usage_errors_are_clear(args: list[str], message: str) -> None:
    result = run(*args, check=False)
    assert result.returncode == 2
    assert message in result.stderr


# ---- progress ------------------------------------------------------------------------

def test_progress_only_on_a_terminal(tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    big.write_bytes((DATA / "decisions.log").read_bytes() * 30_000)  # 150k lines
    assert run("summary", str(big)).stderr == ""  # stderr is a pipe: no progress
    leader, follower = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-m", "gpu_admission", "audit", "summary",
                               str(big)], stdout=subprocess.PIPE, stderr=follower,
                              timeout=120, check=True)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
    shown = b"".join(chunks).decode()
    assert "\r50,000 lines, 50,000 decisions, 0 bad:" in shown
    assert "150,000 lines" in shown
    assert done.stdout.startswith(b"150000 decisions")


# ---- report --------------------------------------------------------------------------

def test_report_is_self_contained(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    result = run("report", "--out", str(page), ROTATED, APISERVER, CORRUPT)
    assert result.stderr.splitlines()[-1] == (f"wrote {page} (20 decisions, 5 bad lines)")
    text = page.read_text()
    assert text.count("<svg") == 3
    assert "<script" not in text and "src=" not in text
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in text and "@import" not in text and "url(" not in text
    assert "Unreadable lines (5)" in text and f"{CORRUPT}:8: truncated JSON" in text


def test_report_escapes_user_controlled_text(tmp_path: Path) -> None:
    log = tmp_path / "evil.log"
    log.write_bytes(orjson.dumps({
        "schemaVersion": 1, "uid": "x", "decision": "denied", "time": "2026-11-30T10:00:00Z",
        "namespace": "<script>alert(1)</script>", "user": "\"><img src=x>",
        "violations": [{"rule": "<b>r</b>", "mode": "enforce"}]}) + b"\n")
    page = tmp_path / "report.html"
    run("report", "--out", str(page), str(log))
    text = page.read_text()
    assert "<script>" not in text and "<img" not in text and "<b>r" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_report_unwritable_target(tmp_path: Path) -> None:
    result = run("report", "--out", str(tmp_path / "no" / "dir" / "r.html"), ROTATED,
                 check=False)
    assert result.returncode != 0 and "r.html" in result.stderr


def test_empty_input_everywhere(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert run("summary", str(empty)).stdout.startswith("0 decisions (0 dry-run), no decisions")
    assert as_json(run("list", "-o", "json", str(empty))) == []
    run("report", "--out", str(tmp_path / "r.html"), str(empty))
    assert "nothing in this period" in (tmp_path / "r.html").read_text()


def test_help_lists_every_subcommand() -> None:
    out = run("--help").stdout
    for name in ("summary", "list", "show", "report"):
        assert name in out
    assert shutil.which(sys.executable)
