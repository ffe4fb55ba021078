"""The report's pure parts, table-driven: time inputs, idle runs, p95, chunk planning, the
first-fit-decreasing packing and the Prometheus envelope decoding."""

from __future__ import annotations

import itertools
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from gpu_admission.core.timeframe import (
    Range,
    WorkingHours,
    parse_duration,
    parse_instant,
    resolve_range,
)
from gpu_admission.usage.compute import idle_run_seconds, p95
from gpu_admission.usage.data import GpuData
from gpu_admission.usage.prom import MAX_POINTS_PER_SERIES, PromError, decode
from gpu_admission.usage.query import merge_util, plan_chunks
from gpu_admission.usage.sharing import Item, pack

UTC = ZoneInfo("UTC")


@pytest.mark.parametrize(("text", "seconds"), [
    ("5m", 300), ("7d", 604800), ("1h30m", 5400), ("2w", 1209600), ("90s", 90),
], ids=str)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text, "--step") == seconds


@pytest.mark.parametrize("text", ["", "5", "5 m", "-5m", "0s", "1.5h", "500ms", "m5"])
def test_bad_durations_name_the_option(text: str) -> None:
    with pytest.raises(ValueError, match=r"^--since: expected a duration"):
        parse_duration(text, "--since")


@pytest.mark.parametrize(("text", "days", "start", "end"), [
    ("Mon-Fri 08:00-18:00", {0, 1, 2, 3, 4}, 480, 1080),
    ("mon,wed,FRI 09:00-17:30", {0, 2, 4}, 540, 1050),
    ("Fri-Mon 00:00-24:00", {4, 5, 6, 0}, 0, 1440),
    ("Sunday-Thursday  7:00 - 15:00", {6, 0, 1, 2, 3}, 420, 900),
], ids=["weekdays", "list", "wraps", "long-names"])
def test_working_hours(text: str, days: set[int], start: int, end: int) -> None:
    hours = WorkingHours.parse(text)
    assert (set(hours.days), hours.start_minute, hours.end_minute) == (days, start, end)


@pytest.mark.parametrize(("text", "message"), [
    ("Mon-Fri", "expected \"<days> <HH:MM>-<HH:MM>\""),
    ("Mon-Fri 08:00", "expected \"<days> <HH:MM>-<HH:MM>\""),
    ("Mon-Fri 8-18", "expected \"<days> <HH:MM>-<HH:MM>\""),
    ("Mon-Tue-Wed 08:00-18:00", "bad day range 'Mon-Tue-Wed'"),
    ("Mo-Fr 08:00-18:00", "unknown day 'Mo'"),
    ("Mon-Fri 08:60-18:00", "08:60 is not a time of day"),
    ("Mon-Fri 24:30-25:00", "24:30 is not a time of day"),
    ("Mon-Fri 18:00-18:00", "the end 18:00 must be after the start 18:00"),
    ("Mon-Fri 22:00-06:00", "the end 06:00 must be after the start 22:00"),
], ids=["no-hours", "no-end", "no-minutes", "three-days", "unknown-day", "minute",
        "hour", "empty", "overnight"])
def test_bad_working_hours(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"^--working-hours: ") as info:
        WorkingHours.parse(text)
    assert message in str(info.value)


def test_working_hours_are_local_to_the_zone() -> None:
    hours = WorkingHours.parse("Mon-Fri 08:00-18:00")
    berlin = ZoneInfo("Europe/Berlin")
    # Monday 07:30 UTC is 08:30 in Berlin (CET, UTC+1): inside there, outside in UTC
    ts = datetime(2026, 11, 30, 7, 30, tzinfo=UTC).timestamp()
    assert hours.contains(datetime.fromtimestamp(ts, berlin))
    assert not hours.contains(datetime.fromtimestamp(ts, UTC))
    # the end is exclusive, the start inclusive
    assert hours.contains(datetime(2026, 11, 30, 8, 0, tzinfo=UTC))
    assert not hours.contains(datetime(2026, 11, 30, 18, 0, tzinfo=UTC))
    assert not hours.contains(datetime(2026, 11, 29, 12, 0, tzinfo=UTC))  # Sunday


def test_instants() -> None:
    assert parse_instant("1764489600", "--start", UTC) == 1764489600
    assert parse_instant("2025-11-30T08:00:00Z", "--start", UTC) == 1764489600
    # without an offset: read in --tz
    assert parse_instant("2025-11-30T09:00:00", "--start", ZoneInfo("Europe/Berlin")) == \
        1764489600


@pytest.mark.parametrize(("kw", "want"), [
    ({"since": 3600, "start": None, "end": None}, Range(1000500, 1003800, 300)),  # 12 x 5m
    ({"since": None, "start": 1000001.0, "end": 1000900.0}, Range(1000200, 1000800, 300)),
    ({"since": None, "start": 1000200.0, "end": None}, Range(1000200, 1003800, 300)),
], ids=["since", "start-end-aligned-inwards", "start-to-now"])
def test_range_is_step_aligned(kw: dict[str, float | None], want: Range) -> None:
    assert resolve_range(now=1003999.0, step=300, **kw) == want  # type: ignore[arg-type]


def test_range_needs_one_step() -> None:
    with pytest.raises(ValueError, match="at least one --step"):
        resolve_range(now=0, step=300, since=None, start=1000001.0, end=1000100.0)


@pytest.mark.parametrize(("flags", "seconds"), [
    ([True] * 24, 7200),  # exactly 2 h at 5 m: counts
    ([True] * 23, 0),  # 1 h 55 m: does not
    ([True] * 23 + [False] + [True] * 24, 7200),  # broken run: only the long part
    ([True] * 30 + [False] + [True] * 25, 30 * 300 + 25 * 300),
    ([], 0),
], ids=["2h", "under-2h", "broken", "two-runs", "empty"])
def test_idle_runs(flags: list[bool], seconds: int) -> None:
    assert idle_run_seconds(flags, 300) == seconds


@pytest.mark.parametrize(("values", "want"), [
    ([float(v) for v in range(1, 101)], 95.0),
    ([float(v) for v in range(1, 21)], 19.0),  # ceil(0.95*20) = 19th value
    ([5.0], 5.0), ([], None),
], ids=["100", "20", "one", "none"])
def test_p95_nearest_rank(values: list[float], want: float | None) -> None:
    assert p95(values) == want


@pytest.mark.parametrize(("points", "series", "budget", "sizes"), [
    (8640, 64, 200_000, [3125, 3125, 2390]),  # 30 d x 64 GPUs at 5 m
    (8640, 1, 200_000, [8640]),  # one query
    (20_000, 1, 10**9, [10_000, 10_000]),
    (5, 1000, 10, [1, 1, 1, 1, 1]),  # never less than one instant per query
], ids=["30d-64gpu", "one-series", "per-series-limit", "tiny-budget"])
def test_chunks_cover_the_range_within_limits(points: int, series: int, budget: int,
                                              sizes: list[int]) -> None:
    rng = Range(0, (points - 1) * 300, 300)
    chunks = plan_chunks(rng, series, budget=budget)
    got = [(b - a) // 300 + 1 for a, b in chunks]
    assert got[:2] == sizes[:2] and sum(got) == points
    assert chunks[0][0] == 0 and chunks[-1][1] == rng.end
    assert all(b2 == a1 + 300 for (_, a1), (b2, _) in itertools.pairwise(chunks))
    assert max(got) <= MAX_POINTS_PER_SERIES


def item(load: float, mem: float = 1000) -> Item:
    return Item(f"ns/p{load}-{mem}", load, mem)


@pytest.mark.parametrize(("loads", "replicas", "want"), [
    ([item(30), item(30), item(30)], 4, (2, 0)),  # 60 fits, 90 would not
    ([item(10)] * 6, 4, (2, 0)),  # replica count binds before the target
    ([item(95), item(20)], 4, (1, 1)),  # over the target: a whole GPU
    ([item(20, 20000), item(20)], 4, (1, 1)),  # over the memory share: a whole GPU
    ([item(40), item(35), item(25), item(30)], 4, (2, 0)),  # FFD: 40+30, 35+25
    ([], 4, (0, 0)),
], ids=["target", "replicas", "load-too-big", "memory-too-big", "decreasing", "none"])
def test_first_fit_decreasing(loads: list[Item], replicas: int, want: tuple[int, int]) -> None:
    assert pack(loads, replicas=replicas, target=70, memory_share_mib=10240) == want


@pytest.mark.parametrize(("status", "ctype", "body", "message"), [
    (400, "application/json",
     b'{"status":"error","errorType":"bad_data","error":"exceeded maximum resolution"}',
     "u: Prometheus answered HTTP 400 bad_data: exceeded maximum resolution"),
    (502, "text/html", b"<html>Bad gateway</html>",
     "u: not a Prometheus API response (HTTP 502, text/html): '<html>Bad gateway</html>'"),
    (200, "application/json", b'{"hello": 1}',
     "u: not a Prometheus API response (HTTP 200, application/json): '{\"hello\": 1}'"),
    (200, "", b"", "u: not a Prometheus API response (HTTP 200, no content type)"),
], ids=["error-envelope", "html", "other-json", "empty"])
def test_prometheus_answers_are_mapped_to_clear_errors(status: int, ctype: str, body: bytes,
                                                       message: str) -> None:
    with pytest.raises(PromError) as info:
        decode("u", status, ctype, body)
    assert str(info.value) == message


def test_prometheus_success_returns_data() -> None:
    assert decode("u", 200, "application/json", b'{"status":"success","data":[1]}') == [1]


def test_series_of_one_gpu_merge_and_garbage_is_dropped() -> None:
    """Per-pod copies (KUBERNETES_VIRTUAL_GPUS) of one GPU: the largest value per instant,
    every copy's pod a holder; NaN, negative and over-100 % readings count as missing."""
    rng = Range(600, 1500, 300)  # 4 instants
    gpu = {"Hostname": "n1", "UUID": "GPU-1", "gpu": "0", "modelName": "A100"}
    result = [
        {"metric": gpu, "values": [[600, "40"], [900, "NaN"], [1200, "-1"], [1500, "101"]]},
        {"metric": {**gpu, "pod": "a", "namespace": "ns", "pod_uid": "u1"},
         "values": [[600, "10"], [900, "20"]]},
        {"metric": {**gpu, "pod": "b", "namespace": "ns", "pod_uid": "u2", "vgpu": "1"},
         "values": [[900, "30"], [1200, "5"]]},
    ]
    gpus: dict[tuple[str, str], GpuData] = {}
    merge_util(result, rng, gpus, exported=False)
    data = gpus[("n1", "GPU-1")]
    assert [v if v == v else None for v in data.util] == [40.0, 30.0, 5.0, None]
    assert {k: list(v) for k, v in data.holders.items()} == {
        ("ns", "a"): [1, 1, 0, 0], ("ns", "b"): [0, 1, 1, 0]}
    # through a ServiceMonitor, ``pod`` is the exporter's: only exported_pod holds
    exported: dict[tuple[str, str], GpuData] = {}
    merge_util([{"metric": {**gpu, "pod": "dcgm-exporter-x", "namespace": "gpu-operator"},
                 "values": [[600, "0"]]}], rng, exported, exported=True)
    assert exported[("n1", "GPU-1")].holders == {}
