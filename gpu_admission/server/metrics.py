"""Prometheus metrics, one :class:`prometheus_client.CollectorRegistry` per app.

Labels are low-cardinality by construction: webhook path (2 values), HTTP code (a handful),
stage, decision, rule id and mode (a fixed set from the policy), reload result. No pod,
namespace or user names: those go to the decision log.
Naming: https://prometheus.io/docs/practices/naming/ (base units: seconds, bytes).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

CONTENT_TYPE = CONTENT_TYPE_LATEST

#: Seconds. An in-process decision is tens of microseconds; the API server's default
#: webhook timeout is 10 s, so the buckets span 0.5 ms .. 10 s.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0)


class Metrics:
    """All server metrics, registered on a fresh registry (never the global one)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "gpu_admission_requests", "Admission review HTTP requests by webhook path and code.",
            ["path", "code"], registry=r)
        self.latency = Histogram(
            "gpu_admission_request_duration_seconds",
            "Time from request start to response, by webhook path (seconds).",
            ["path"], buckets=LATENCY_BUCKETS, registry=r)
        # Read at scrape time from the server's counter (``set_function``): no per-request cost.
        self.in_flight = Gauge(
            "gpu_admission_in_flight_requests", "Admission reviews being read or decided now.",
            registry=r)
        self.decisions = Counter(
            "gpu_admission_decisions", "Policy decisions by stage and result "
            "(allowed, mutated, denied, error).", ["stage", "result", "dry_run"], registry=r)
        self.violations = Counter(
            "gpu_admission_rule_violations", "Rule violations by rule id and mode "
            "(enforce, warn, audit).", ["stage", "rule", "mode"], registry=r)
        self.overload = Counter(
            "gpu_admission_overload_rejections",
            "Reviews refused without a decision: too many in flight (429) or the request "
            "body not read before the deadline (408).", ["reason"], registry=r)
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
        # Label children are cached: .labels() takes a lock and hashes every time.
        self._req_children: dict[tuple[str, int], Counter] = {}
        self._lat_children: dict[str, Histogram] = {}
        self._decision_children: dict[tuple[str, str, bool], Counter] = {}

    def count_decision(self, stage: str, result: str, dry_run: bool) -> None:
        key = (stage, result, dry_run)
        child = self._decision_children.get(key)
        if child is None:
            child = self._decision_children[key] = self.decisions.labels(
                stage, result, "true" if dry_run else "false")
        child.inc()

    def observe_request(self, path: str, code: int, seconds: float) -> None:
        key = (path, code)
        child = self._req_children.get(key)
        if child is None:
            child = self._req_children[key] = self.requests.labels(path, str(code))
        child.inc()
        hist = self._lat_children.get(path)
        if hist is None:
            hist = self._lat_children[path] = self.latency.labels(path)
        hist.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
