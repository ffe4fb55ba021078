"""Prometheus metrics, one :class:`prometheus_client.CollectorRegistry` per app.

Labels are low-cardinality by construction: webhook path (2 values), HTTP code (a handful),
stage, decision, rule id and mode (a fixed set from the policy), reload result. No pod,
namespace or user names: those go to the decision log.
Naming: https://prometheus.io/docs/practices/naming/ (base units: seconds, bytes).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Hashable, Iterator
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

CONTENT_TYPE = CONTENT_TYPE_LATEST

#: Seconds. An in-process decision is tens of microseconds; the API server's default
#: webhook timeout is 10 s, so the buckets span 0.5 ms .. 10 s.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0)


#: The ``le`` label of each bucket as prometheus-client writes it (``0.0005``, ``1.0``, ``+Inf``).
_BUCKET_LABELS = (*(str(float(b)) for b in LATENCY_BUCKETS), "+Inf")


class _Series:
    """One label set of a per-request counter or histogram: plain numbers, no lock (only
    the event loop writes them, and the scrape runs on the same loop)."""

    __slots__ = ("buckets", "count", "created", "sum")

    def __init__(self, buckets: int = 0) -> None:
        self.count = 0
        self.sum = 0.0  # seconds (histograms only)
        self.buckets = [0] * buckets  # per bucket, not cumulative; the last one is +Inf
        self.created = time.time()


_K = TypeVar("_K", bound=Hashable)


def _series(table: dict[_K, _Series], key: _K, buckets: int = 0) -> _Series:
    """The series of ``key`` in ``table``, created on first use."""
    series = table.get(key)
    if series is None:
        series = table[key] = _Series(buckets)
    return series


class RequestCollector(Collector):
    """The per-request series (requests, latency, decisions, rule violations) as plain
    counters, turned into Prometheus families only at scrape time.

    ``Counter.inc`` and ``Histogram.observe`` take a lock and walk their buckets on every
    call; with four updates per review that was ~5-8 µs of each request under load. The
    exposition (names, labels, HELP/TYPE, ``_created``) is the same as prometheus-client's
    own counters and histograms would give."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], _Series] = {}  # (path, HTTP code)
        self.latency: dict[str, _Series] = {}  # path
        self.decisions: dict[tuple[str, str, bool], _Series] = {}  # (stage, result, dry run)
        self.violations: dict[tuple[str, str, str], _Series] = {}  # (stage, rule, mode)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected on every scrape; names are fixed, nothing to check

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "gpu_admission_requests",
            "Admission review HTTP requests by webhook path and code.", labels=["path", "code"])
        for (path, code), series in self.requests.items():
            requests.add_metric([path, str(code)], series.count, created=series.created)
        yield requests
        latency = HistogramMetricFamily(
            "gpu_admission_request_duration_seconds",
            "Time from request start to response, by webhook path (seconds).",
            labels=["path"])
        for path, series in self.latency.items():
            cumulative = 0
            buckets: list[tuple[str, float]] = []
            for bound, count in zip(_BUCKET_LABELS, series.buckets, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            latency.add_metric([path], buckets, series.sum)
            latency.samples.append(Sample("gpu_admission_request_duration_seconds_created",
                                          {"path": path}, series.created))
        yield latency
        decisions = CounterMetricFamily(
            "gpu_admission_decisions", "Policy decisions by stage and result "
            "(allowed, mutated, denied, error).", labels=["stage", "result", "dry_run"])
        for (stage, result, dry_run), series in self.decisions.items():
            decisions.add_metric([stage, result, "true" if dry_run else "false"],
                                 series.count, created=series.created)
        yield decisions
        violations = CounterMetricFamily(
            "gpu_admission_rule_violations", "Rule violations by rule id and mode "
            "(enforce, warn, audit).", labels=["stage", "rule", "mode"])
        for (stage, rule, mode), series in self.violations.items():
            violations.add_metric([stage, rule, mode], series.count, created=series.created)
        yield violations


class Metrics:
    """All server metrics, registered on a fresh registry (never the global one)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._hot = RequestCollector()
        r.register(self._hot)
        # Read at scrape time from the server's counter (``set_function``): no per-request cost.
        self.in_flight = Gauge(
            "gpu_admission_in_flight_requests", "Admission reviews being read or decided now.",
            registry=r)
        self.receiving = Gauge(
            "gpu_admission_receiving_requests",
            "Admission reviews whose body is still arriving now (bounded by --max-in-flight).",
            registry=r)
        self.overload = Counter(
            "gpu_admission_overload_rejections",
            "Reviews refused without a decision: too many still receiving their body (429) "
            "or the request body not read before the deadline (408).", ["reason"], registry=r)
        self.policy_reloads = Counter(
            "gpu_admission_policy_reloads", "Policy file reloads by result (success, failure).",
            ["result"], registry=r)
        self.policy_loaded = Gauge(
            "gpu_admission_policy_loaded_timestamp_seconds",
            "Unix time the serving policy was loaded.", registry=r)
        self.cert_reloads = Counter(
            "gpu_admission_certificate_reloads",
            "Serving certificate reloads by result (success, failure).", ["result"], registry=r)
        self.cert_expiry = Gauge(
            "gpu_admission_certificate_expiry_timestamp_seconds",
            "Unix time the serving certificate expires (notAfter).", registry=r)
        self.ready = Gauge(
            "gpu_admission_ready", "1 when /readyz answers 200.", registry=r)
        for result in ("success", "failure"):  # export zeros so rate() works from start
            self.policy_reloads.labels(result)
            self.cert_reloads.labels(result)
        for reason in ("in_flight", "deadline"):
            self.overload.labels(reason)

    def count_decision(self, stage: str, result: str, dry_run: bool) -> None:
        _series(self._hot.decisions, (stage, result, dry_run)).count += 1

    def count_violation(self, stage: str, rule: str, mode: str) -> None:
        _series(self._hot.violations, (stage, rule, mode)).count += 1

    def observe_request(self, path: str, code: int, seconds: float) -> None:
        """Count one answered request and its duration (seconds)."""
        hot = self._hot
        _series(hot.requests, (path, code)).count += 1
        hist = _series(hot.latency, path, len(LATENCY_BUCKETS) + 1)
        hist.count += 1
        hist.sum += seconds
        # first bucket whose upper bound is >= seconds ("le"); past the last: +Inf
        hist.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1

    def render(self) -> bytes:
        return generate_latest(self.registry)
