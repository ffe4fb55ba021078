"""``gpu-admission report`` end to end: a seeded week of dcgm-exporter history (tests/report/
fleet.py) backfilled with ``promtool tsdb create-blocks-from openmetrics``, served by the real
Prometheus, read by the real command (subprocess), every JSON figure compared with the same
figure computed independently from the generated samples (tests/report/expected.py).

One backfilled Prometheus for the module.
"""

from __future__ import annotations

import csv
import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpu_admission.core.timeframe import Range
from gpu_admission.report.html import AFTER_COLOR, FRACTIONAL_COLOR, IDLE_COLOR, SCALE
from gpu_admission.usage.prom import PrometheusClient
from gpu_admission.usage.query import fetch
from tests import chromium_support as png  # decode_png, count_color, Chromium flags
from tests.dcgm_history_support import Gpu, write_file
from tests.prometheus_support import PrometheusProcess, create_blocks, running_prometheus
from tests.report.expected import Settings, expected
from tests.report.fleet import (
    DAY,
    STEP,
    servicemonitor_bounds,
    servicemonitor_fleet,
    week_bounds,
    week_fleet,
)
from tests.server_support import free_port

POOL_POLICY = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUSharingPolicy
spec:
  nodePools:
  - name: a100-dedicated
    nodeSelector: {pool: dedicated}
    memoryMiB: 81920
  - name: a100-shared
    nodeSelector: {pool: shared}
    sharing: time-slicing
    replicasPerGPU: 4
    memoryMiB: 40960
  placement:
    targetUtilizationPercent: 60
"""


@dataclass
class Env:
    prom: PrometheusProcess
    start: int
    end: int
    week: list[Gpu]
    sm_start: int
    sm_end: int
    servicemonitor: list[Gpu]
    work: Path


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    work = tmp_path_factory.mktemp("report")
    start, end = week_bounds()
    sm_start, sm_end = servicemonitor_bounds(start)
    week = week_fleet(start, end)
    sm = servicemonitor_fleet(sm_start, sm_end)
    write_file(week + sm, work / "history.om")
    create_blocks(work / "history.om", work / "tsdb", max_block_duration="720h")
    with running_prometheus(work / "prom", None, work / "tsdb") as prom:
        yield Env(prom, start, end, week, sm_start, sm_end, sm, work)


def run(env: Env, *args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_admission", "report", "--prometheus", url or env.prom.url,
         *args], capture_output=True, text=True, timeout=120, check=False)


def report_json(env: Env, start: int, end: int, *args: str) -> tuple[int, dict[str, Any]]:
    result = run(env, "--start", str(start), "--end", str(end), "-o", "json", *args)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, orjson.loads(result.stdout)


def _digits(key: str) -> int:
    if key.endswith("MiB"):
        return 1
    if "Percent" in key:
        return 2
    return 3  # hours


def assert_same(got: Any, want: Any, path: str = "") -> None:
    """Every figure of ``want`` equals ``got`` after the JSON's documented rounding."""
    if isinstance(want, dict):
        for key, value in want.items():
            assert key in got, f"{path}.{key} missing"
            assert_same(got[key], value, f"{path}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), f"{path}: {len(got)} != {len(want)} entries"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        digits = _digits(path.rsplit(".", 1)[-1])
        assert got == pytest.approx(want, abs=0.5 * 10 ** -digits + 1e-9), path
    else:
        assert got == want, path


CASES = [
    pytest.param([], {}, id="defaults-utc"),
    pytest.param(["--tz", "Europe/Berlin", "--working-hours", "Mon-Thu 09:00-17:30",
                  "--idle-below", "5"],
                 {"tz": "Europe/Berlin", "days": (0, 1, 2, 3), "begin": (9, 0),
                  "finish": (17, 30), "idle_below": 5.0}, id="berlin-mon-thu-idle-5"),
    pytest.param(["--policy", "POLICY"], {"replicas": 4, "share_mib": 10240, "target": 60.0,
                                          "card_mib": 40960},
                 id="time-slicing-pool"),
    pytest.param(["--policy", "FRACTIONAL"],
                 {"replicas": 4, "share_mib": 10240, "target": 50.0, "card_mib": 81920,
                  "headroom_mib": 4096, "fractional_pool": "a100-frac"},
                 id="fractional-pool"),
]

FRACTIONAL_POLICY = POOL_POLICY.replace("""\
  placement:
    targetUtilizationPercent: 60
""", """\
  - name: a100-frac
    nodeSelector: {pool: frac}
    sharing: fractional
    memoryMiB: 81920
  placement:
    targetUtilizationPercent: 50
    memoryHeadroomMiB: 4096
""")


@pytest.mark.parametrize(("args", "settings"), CASES)
def test_week_figures_match_the_generated_data(env: Env, args: list[str],
                                               settings: dict[str, Any]) -> None:
    for marker, text in (("POLICY", POOL_POLICY), ("FRACTIONAL", FRACTIONAL_POLICY)):
        if marker in args:
            policy = env.work / f"{marker.lower()}-policy.yaml"
            policy.write_text(text)
            args = [str(policy) if a == marker else a for a in args]
    code, doc = report_json(env, env.start, env.end, *args)
    want = expected(env.week, Settings(env.start, env.end, STEP, **settings))
    assert_same(doc, want)
    # the week has a gap and a vanished GPU: partial, exit 1, both named
    assert code == 1 and doc["partial"] is True
    assert [w.split(" (")[0] for w in doc["warnings"]] == ["GPU node-a/2", "GPU node-b/1"]
    assert doc["range"] == {"start": iso(env.start), "end": iso(env.end), "step": "300s"}
    assert doc["sharingEstimate"]["estimate"] is True
    assert doc["sharingEstimate"]["method"].startswith("Estimate, not a measurement. "
                                                       "First-fit decreasing")
    if "--policy" in args:
        assert doc["sharingEstimate"]["pool"] == "a100-shared"
    assert doc["sharingEstimate"]["fractional"]["method"].startswith(
        "Estimate, not a measurement. Fractional GPUs: the same items, each sized by its peak "
        "framebuffer use (DCGM_FI_DEV_FB_USED) and its p95 SM utilisation")


def iso(ts: int) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_complete_range_exits_0_and_matches(env: Env) -> None:
    end = env.start + 2 * DAY  # before the gap (day 3) and the vanishing (day 4.5)
    code, doc = report_json(env, env.start, end)
    assert code == 0 and doc["partial"] is False and doc["warnings"] == []
    assert_same(doc, expected(env.week, Settings(env.start, end, STEP)))


def test_servicemonitor_labels_exported_pod_holds_the_gpu(env: Env) -> None:
    code, doc = report_json(env, env.sm_start, env.sm_end)
    assert code == 0
    assert_same(doc, expected(env.servicemonitor, Settings(env.sm_start, env.sm_end, STEP)))
    assert doc["settings"]["holderLabel"] == "exported_pod"
    # the exporter's own pod label never counts as a holder
    assert [g["pods"] for g in doc["gpus"]] == [["team-x/infer-0"], []]


def test_table_and_csv_show_the_json_figures(env: Env) -> None:
    args = ["--start", str(env.start), "--end", str(env.end)]
    doc = orjson.loads(run(env, *args, "-o", "json").stdout)
    table = run(env, *args, "-o", "table")
    rows = list(csv.DictReader(io.StringIO(run(env, *args, "-o", "csv").stdout)))
    assert table.returncode == 1 and "PARTIAL" in table.stdout

    def cell(value: Any) -> str:
        return "" if value is None else " ".join(value) if isinstance(value, list) else str(value)

    by_scope: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_scope.setdefault(row["scope"], []).append(row)
    fleet = by_scope["fleet"][0]
    assert fleet["gpus"] == str(doc["fleet"]["gpus"])
    assert fleet["allocatedGpuUtilizationPercent"] == \
        str(doc["fleet"]["allocatedGpuUtilizationPercent"])
    assert fleet["idleHoursWorking"] == str(doc["fleet"]["idleGpuHoursWorking"])
    assert fleet["partial"] == "true"
    assert len(by_scope["gpu"]) == len(doc["gpus"])
    for row, gpu in zip(by_scope["gpu"], doc["gpus"], strict=True):
        for key, value in gpu.items():
            if key in row:
                assert row[key] == cell(value), key
        # the table's GPU line carries the same figures, in the same order
        line = next(li for li in table.stdout.splitlines()
                    if li.startswith(gpu["node"]) and gpu["uuid"] in li)
        numbers = [str(gpu[k]) for k in ("meanUtilizationPercent", "p95UtilizationPercent",
                                         "meanFramebufferUsedMiB", "idleHoursWorking")]
        assert " ".join(numbers) in " ".join(line.split()), line
    for scope, key in (("namespace", "namespaces"), ("node", "nodes")):
        assert len(by_scope[scope]) == len(doc[key])
        for row, item in zip(by_scope[scope], doc[key], strict=True):
            for k, value in item.items():
                assert row[k] == cell(value), (scope, k)
            line = next(li for li in table.stdout.splitlines()
                        if li.split() and li.split()[0] == item[scope] and
                        li.split()[1] == str(item["gpus"]))
            assert line.split()[2:] == [str(item["gpuHoursHeld"]), str(item["gpuHoursUsed"]),
                                        str(item["idleGpuHours"])]
    s = doc["sharingEstimate"]
    assert by_scope["sharingEstimate"][0]["gpusNeeded"] == str(s["gpusNeeded"])
    assert by_scope["sharingEstimate"][0]["utilizationPercent"] == str(s["utilizationPercent"])
    assert by_scope["sharingBefore"][0]["gpus"] == str(s["gpusBefore"])
    lines = [" ".join(li.split()) for li in table.stdout.splitlines()]
    assert f"after (estimate) {s['gpusNeeded']} {s['utilizationPercent']}" in lines
    assert s["method"] in table.stdout
    # the fractional estimate, next to the time-sliced one, in every format
    f = s["fractional"]
    assert by_scope["fractionalEstimate"] == [{
        **dict.fromkeys(rows[0], ""), "scope": "fractionalEstimate",
        "gpusNeeded": str(f["gpusNeeded"]), "utilizationPercent": str(f["utilizationPercent"])}]
    assert f"after, fractional (estimate) {f['gpusNeeded']} {f['utilizationPercent']}" in lines
    assert "fractional method: " + f["method"] in table.stdout.splitlines()


def test_out_file_gets_the_report(env: Env, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = run(env, "--start", str(env.start), "--end", str(env.start + DAY), "-o", "json",
                 "--out", str(out))
    assert result.returncode == 0 and result.stdout == ""
    assert orjson.loads(out.read_text())["fleet"]["gpus"] == 6


# --------------------------------------------------------------------------- failures
def test_prometheus_unreachable_is_exit_2_with_a_clear_message(env: Env) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = run(env, "--since", "1d", url=url)
    assert result.returncode == 2
    assert result.stderr.strip() == (f"Error: cannot reach Prometheus at {url}: "
                                      "connection refused")
    assert result.stdout == ""


def test_not_a_prometheus_api_is_exit_2(env: Env) -> None:
    result = run(env, "--since", "1d", url=env.prom.url + "/nowhere")
    assert result.returncode == 2
    assert "not a Prometheus API response (HTTP 404" in result.stderr
    assert "Traceback" not in result.stderr


def test_no_dcgm_series_is_exit_2_with_a_clear_message(env: Env) -> None:
    start = env.start - 6 * DAY  # within retention, before any generated history
    result = run(env, "--start", str(start), "--end", str(start + DAY))
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"Error: no dcgm-exporter series (DCGM_FI_DEV_GPU_UTIL) in Prometheus at "
        f"{env.prom.url} between {iso(start)} and {iso(start + DAY)}: is dcgm-exporter "
        "scraped")


@pytest.mark.parametrize(("args", "message"), [
    (["--working-hours", "Mon-Fri 8-18"],
     'Error: --working-hours: expected "<days> <HH:MM>-<HH:MM>" like "Mon-Fri 08:00-18:00", '
     "got 'Mon-Fri 8-18'"),
    (["--working-hours", "Mon-Fry 08:00-18:00"],
     "Error: --working-hours: unknown day 'Fry'; expected one of Mon, Tue, Wed, Thu, Fri, "
     "Sat, Sun"),
    (["--working-hours", "Mon-Fri 18:00-08:00"],
     "Error: --working-hours: the end 08:00 must be after the start 18:00 on the same day, "
     "in 'Mon-Fri 18:00-08:00'"),
    (["--tz", "Mars/Olympus"],
     "Error: --tz: unknown time zone 'Mars/Olympus'; expected an IANA name like UTC or "
     "Europe/Berlin"),
    (["--step", "5 minutes"], "Error: --step: expected a duration like 5m, 12h or 7d, "
                              "got '5 minutes'"),
    (["--since", "7d", "--start", "2026-01-01T00:00:00Z"],
     "Error: --since and --start are mutually exclusive; give one of them"),
    (["--start", "yesterday"], "Error: --start: expected an RFC 3339 time like "
                               "2026-11-30T08:00:00Z or unix seconds, got 'yesterday'"),
    (["--idle-below", "0"], "Error: --idle-below: expected a percentage in (0, 100], got 0"),
    (["--policy", "/nonexistent/policy.yaml"],
     "Error: /nonexistent/policy.yaml: cannot read policy file: No such file or directory"),
], ids=["hours-syntax", "unknown-day", "end-before-start", "tz", "step", "since-and-start",
        "start", "idle-below", "policy"])
def test_bad_options_are_exit_2_naming_the_option(env: Env, args: list[str],
                                                  message: str) -> None:
    result = run(env, *args)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == message
    assert "Traceback" not in result.stderr


# --------------------------------------------------------------------------- query layer
def test_chunked_queries_return_the_same_samples(env: Env) -> None:
    """A tiny point budget splits the week into many queries; nothing is lost or doubled."""
    rng = Range(env.start, env.end, STEP)
    whole_client, small_client = PrometheusClient(env.prom.url), PrometheusClient(env.prom.url)
    whole = fetch(whole_client, rng)
    # 7 GPU_UTIL series in the week (6 GPUs, one changes pods): 400 instants per query
    small = fetch(small_client, rng, budget=7 * 400, max_steps=700)
    chunks = -(-rng.points // 400)
    assert whole_client.queries == 1 + 2  # /series + one query per metric
    assert small_client.queries == 1 + 2 * chunks
    assert [(g.node, g.uuid) for g in small.gpus] == [(g.node, g.uuid) for g in whole.gpus]
    for a, b in zip(whole.gpus, small.gpus, strict=True):
        assert a.util.tobytes() == b.util.tobytes() and a.fb_used.tobytes() == \
            b.fb_used.tobytes() and a.holders == b.holders


def test_progress_is_drawn_on_a_terminal_only(env: Env) -> None:
    """stderr a TTY (a pty here): a click progress bar; not a TTY: no progress output."""
    primary, secondary = os.openpty()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "gpu_admission", "report", "--prometheus", env.prom.url,
             "--start", str(env.start), "--end", str(env.start + DAY), "-o", "json"],
            stdout=subprocess.PIPE, stderr=secondary, timeout=120, check=False)
        os.close(secondary)
        drawn = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(primary)
    assert result.returncode == 0
    assert b"querying Prometheus" in drawn and b"100%" in drawn
    quiet = run(env, "--start", str(env.start), "--end", str(env.start + DAY), "-o", "json")
    assert quiet.returncode == 0 and quiet.stderr == ""


# --------------------------------------------------------------------------- HTML
@pytest.fixture(name="chromium")
def chromium_binary() -> str:
    return png.chromium_or_skip()


def test_html_in_headless_chromium_shows_the_json_figures(env: Env, chromium: str,
                                                          tmp_path: Path) -> None:
    args = ["--start", str(env.start), "--end", str(env.end)]
    doc = orjson.loads(run(env, *args, "-o", "json").stdout)
    page = tmp_path / "usage.html"
    assert run(env, *args, "-o", "html", "--out", str(page)).returncode == 1
    text = page.read_text()
    # self-contained: nothing to fetch at view time (the SVG namespace is not a request)
    assert not re.search(r"""(src|href)\s*=|url\(|@import|<script""", text)
    shot, profile = tmp_path / "shot.png", tmp_path / "profile"
    subprocess.run([chromium, *png.FLAGS, "--window-size=1200,1400",
                    f"--user-data-dir={profile}", f"--screenshot={shot}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    dom = subprocess.run([chromium, *png.FLAGS, f"--user-data-dir={profile}", "--dump-dom",
                          page.as_uri()], check=True, capture_output=True, timeout=120
                         ).stdout.decode()

    def card(name: str) -> str:
        match = re.search(rf'id="card-{name}"><b>([^<]*)</b>', dom)
        assert match, name
        return match.group(1)

    fleet = doc["fleet"]
    assert card("gpus") == str(fleet["gpus"])
    assert card("util") == str(fleet["allocatedGpuUtilizationPercent"])
    assert card("idle") == str(fleet["idleGpuHoursWorking"])
    assert card("held") == str(fleet["gpuHoursHeld"])
    assert card("used") == str(fleet["gpuHoursUsed"])
    assert 'id="partial"' in dom and "node-b/1" in dom
    # heatmap: one cell per GPU and hour of the week
    assert dom.count('class="heat"') == fleet["gpus"] * 168
    # idle GPU-hours by namespace: one bar each, the JSON value
    bars = dict(re.findall(r'data-label="([^"]+)" data-value="([^"]+)"', dom))
    for ns in doc["namespaces"]:
        assert bars[ns["namespace"]] == str(ns["idleGpuHours"])
    s = doc["sharingEstimate"]
    assert bars["before"] in (str(s["gpusBefore"]), str(s["utilizationPercentBefore"]))
    assert re.findall(r'data-label="after \(estimate\)" data-value="([^"]+)"', dom) == [
        str(s["gpusNeeded"]), str(s["utilizationPercent"])]
    assert "How the sharing estimate is made:" in dom and "First-fit decreasing" in dom
    f = s["fractional"]
    assert re.findall(r'data-label="after, fractional \(estimate\)" data-value="([^"]+)"',
                      dom) == [str(f["gpusNeeded"]), str(f["utilizationPercent"])]
    assert "How the fractional estimate is made:" in dom and "peak framebuffer" in dom
    assert dom.count("<tr>") == 1 + len(doc["gpus"]) + 1 + len(doc["namespaces"]) + 1 + \
        len(doc["nodes"])

    width, height, rows = png.decode_png(shot.read_bytes())
    assert (width, height) == (1200, 1400)
    # painted, in the chart colours: idle bars, the "after" bars, the 90-100 % heat cells of
    # the training GPU
    assert png.count_color(rows, IDLE_COLOR) > 2000
    assert png.count_color(rows, AFTER_COLOR) > 2000
    assert png.count_color(rows, FRACTIONAL_COLOR) > 2000
    assert png.count_color(rows, SCALE[-1]) > 2000
