"""The loop of ``gpu-admission reclaim``: every interval, measure (Prometheus), read the
cluster (API server), plan (:mod:`gpu_admission.reclaim.plan`, pure) and act, with a record
for each act in the decision log (``gpu-admission audit list`` shows them).

Safety (docs/reclaim.md):

* a failing Prometheus or API server pauses every action: the gauge
  ``gpu_admission_reclaim_paused`` turns 1 and one log line says why (one per outage, not
  one per interval); the first interval after an outage acts on notices only, so an outage
  never turns into a burst;
* each scale-down is three requests (read the Scale, annotate the owner with the count and
  the time, write the Scale); its record is written before the first and after the last
  (``phase`` ``started``/``done``), and a failure in between is recorded with the steps that
  did complete (``phase: failed``), so no half-done action goes unrecorded; the first
  failing write stops the interval's remaining writes;
* with a Lease (``--lease NAMESPACE/NAME``), only the leader acts; the others stand by.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Final

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge
from structlog.typing import FilteringBoundLogger

from gpu_admission.auditlog.record import SCHEMA_VERSION
from gpu_admission.core.timeframe import iso, resolve_range
from gpu_admission.policy.model import Policy
from gpu_admission.reclaim.kube import Kube, KubeError, event_name, involved, object_path
from gpu_admission.reclaim.names import (
    IDLE_SINCE_ANNOTATION,
    NOTEBOOK,
    NOTEBOOK_STOP_ANNOTATION,
    NOTICE_AT_ANNOTATION,
    REASON_IDLE,
    REASON_RECLAIMED,
    REASON_RESTORED,
    RECLAIMED_AT_ANNOTATION,
    RECLAIMED_REPLICAS_ANNOTATION,
    SCALABLE_KINDS,
)
from gpu_admission.reclaim.plan import (
    WINDOW_SECONDS,
    Action,
    Owner,
    Plan,
    PodPlan,
    build_plan,
)
from gpu_admission.usage.prom import PromError, PrometheusClient
from gpu_admission.usage.query import POINT_BUDGET, NoDataError, fetch

STEP_SECONDS: Final = 300  # the report's default --step: dcgm-exporter samples every 30 s


class ReclaimMetrics:
    """On a registry of their own (never the global one)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.paused = Gauge("gpu_admission_reclaim_paused", "1 while actions are paused "
                            "because Prometheus or the API server failed.", registry=r)
        self.source_up = Gauge("gpu_admission_reclaim_source_up", "1 when the last "
                               "interval's requests to the source succeeded.", ["source"],
                               registry=r)
        self.idle = Gauge("gpu_admission_reclaim_idle_pods", "GPU pods idle by the report's "
                          "definition in the last interval.", registry=r)
        self.planned = Gauge("gpu_admission_reclaim_planned_pods", "Pods per planned action "
                             "in the last interval.", ["action"], registry=r)
        self.left_out = Gauge("gpu_admission_reclaim_left_out_pods", "GPU pods left out of "
                              "the last interval's plan (not idle), one series per pod with "
                              "the reason: busy, not-idle-long-enough, missing-samples, "
                              "no-metrics, not-held.", ["namespace", "pod", "reason"],
                              registry=r)
        self.actions = Counter("gpu_admission_reclaim_actions_total", "Actions carried out "
                               "(notice, clear, scale-down, restore) and failed ones.",
                               ["action", "result"], registry=r)
        self.last = Gauge("gpu_admission_reclaim_last_interval_timestamp_seconds",
                          "When the last interval ended (unix seconds).", registry=r)
        self.leader = Gauge("gpu_admission_reclaim_leader", "1 while this instance holds "
                            "the Lease (or runs without one).", registry=r)
        self.requests = Counter("gpu_admission_reclaim_prometheus_queries_total",
                                "Requests sent to Prometheus.", registry=r)


class RecordLog:
    """Decision-log records, one JSON line each, appended and flushed before the next
    request is sent (few records: notices and scale-downs, not admission traffic). ``-`` is
    stdout. ``gpu-admission audit`` reads them (``stage: reclaim``)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._lock = threading.Lock()
        self._stream: IO[bytes] | None = None

    def write(self, record: Mapping[str, Any]) -> None:
        line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
        with self._lock:
            if self._stream is None:
                self._stream = (os.fdopen(os.dup(1), "ab") if self.target == "-"
                                else Path(self.target).open("ab"))  # noqa: SIM115 - held
            self._stream.write(line)
            self._stream.flush()

    def close(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.close()
                self._stream = None


def record(*, decision: str, namespace: str, pod: str, owner: Owner | None, workload: str | None,
           policy_digest: str, instance: str, now: float, details: Mapping[str, Any],
           ) -> dict[str, Any]:
    """A decision-log record in the admission records' layout (docs/audit.md), so
    ``gpu-admission audit list/show/summary`` read it; ``reclaim`` holds the specifics."""
    return {
        "schemaVersion": SCHEMA_VERSION,
        "time": datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")
        .replace("+00:00", "Z"),
        "uid": str(uuid.uuid4()), "stage": "reclaim",
        "operation": decision.removeprefix("reclaim-").upper(), "dryRun": False,
        "namespace": namespace, "pod": pod, "generateName": "",
        "owner": {"kind": owner.kind, "name": owner.name} if owner is not None else None,
        "user": "", "groups": [], "gpu": True, "workload": workload, "workloadReason": "",
        "cudaVersion": None, "cudaSource": "", "decision": decision, "mutated": False,
        "modes": {}, "violations": [], "warnings": [], "exempt": "",
        "patch": {"ops": 0, "paths": [], "changes": []}, "policyDigest": policy_digest,
        "instance": instance, "reclaim": dict(details)}


@dataclass
class Controller:
    """One instance's state across intervals."""

    policy: Policy
    prom: PrometheusClient
    kube: Kube
    records: RecordLog
    log: FilteringBoundLogger
    metrics: ReclaimMetrics = field(default_factory=ReclaimMetrics)
    instance: str = field(default_factory=socket.gethostname)
    step: int = STEP_SECONDS
    # series x instants per Prometheus answer: half the report's, so a large fleet's answers
    # (decoded JSON, two in flight) stay small next to the cluster's object lists
    point_budget: int = POINT_BUDGET // 2
    window: int = WINDOW_SECONDS
    is_leader: Callable[[], bool] = lambda: True
    healthy: bool = True  # the previous interval succeeded (actions may run)
    failing: str = ""  # why the last interval failed ("" when it did not)
    prom_failed: bool = False

    def plan(self, now: float) -> Plan | None:
        """Measure, read and plan; None when the cluster could not be read."""
        rng = resolve_range(now=now, step=self.step, since=self.window, start=None, end=None)
        before = self.prom.queries
        fetched = None
        prom_error = ""
        try:
            fetched = fetch(self.prom, rng, budget=self.point_budget)
        except NoDataError:
            pass  # no GPU series at all: nothing is idle, nothing failed
        except PromError as exc:
            prom_error = f"Prometheus: {exc}"
        self.metrics.requests.inc(self.prom.queries - before)
        self.metrics.source_up.labels("prometheus").set(0 if prom_error else 1)
        try:
            cluster = self.kube.read_cluster()
        except KubeError as exc:
            self.metrics.source_up.labels("apiserver").set(0)
            self._fail(f"API server: {exc}")
            return None
        self.metrics.source_up.labels("apiserver").set(1)
        allowed = self.healthy and not prom_error
        plan = build_plan(fetched, cluster, self.policy, now=now, window=rng,
                          actions_allowed=allowed)
        self.prom_failed = bool(prom_error)
        if prom_error:
            self._fail(prom_error)
        self.metrics.idle.set(sum(1 for i in plan.items if i.idleness.idle))
        for action in Action:
            self.metrics.planned.labels(action.value).set(plan.count(action))
        self.metrics.left_out.clear()  # pods gone or idle since leave the metric
        for out in plan.left_out:
            self.metrics.left_out.labels(out.namespace, out.pod, out.cause.value).set(1)
        return plan

    def run_once(self, now: float | None = None) -> Plan | None:
        """One interval: plan, then act on it (only while leader). Actions resume after an
        outage only once a whole interval has succeeded (the plan says ``held`` till then)."""
        now = time.time() if now is None else now
        plan = self.plan(now)
        if plan is None:
            return None
        if self.act(plan) and not self.prom_failed:
            if self.failing:
                self.log.info("reclaim_recovered", was=self.failing)
            self.failing = ""
            self.metrics.paused.set(0)
            self.healthy = True
        self.metrics.last.set(now)
        return plan

    def pause(self, why: str) -> None:
        """Pause actions after an unexpected error (the loop keeps running)."""
        self._fail(why)

    def _fail(self, why: str) -> None:
        """Pause actions; one log line per outage (a new cause logs again)."""
        if self.failing != why:
            self.log.error("reclaim_paused", reason=why,
                           detail="no scale-downs until an interval succeeds")
        self.failing = why
        self.healthy = False
        self.metrics.paused.set(1)

    # --- acting --------------------------------------------------------------------------

    def act(self, plan: Plan) -> bool:
        """Carry out the plan's writes in order; stop at the first failure. True if all
        succeeded."""
        for item in plan.items:
            if not self.is_leader():
                self.log.info("reclaim_not_leader", detail="lost the Lease: stopping")
                return True
            try:
                if item.action is Action.NOTICE:
                    self.notice(item, plan)
                elif item.action is Action.CLEAR:
                    self.clear(item, plan)
                elif item.action is Action.SCALE_DOWN:
                    self.scale_down(item, plan)
            except KubeError as exc:
                self._fail(f"API server: {exc}")
                return False
        return True

    def _record(self, decision: str, item: PodPlan, now: float, **details: Any) -> None:
        self.records.write(record(
            decision=decision, namespace=item.namespace, pod=item.pod, owner=item.owner,
            workload=item.workload, policy_digest=self.policy.digest,
            instance=self.instance, now=now, details={
                "reason": item.reason, "message": item.message,
                "idleSince": iso(item.idleness.since) if item.idleness.since else None,
                "idleHoursWorking": round(item.idleness.idle_seconds / 3600, 3),
                "gpus": [f"{g.node}/{g.gpu}" for g in item.idleness.gpus], **details}))

    def notice(self, item: PodPlan, plan: Plan) -> None:
        """Stage 1: Events on the pod and its owner, then the pod's annotations (the
        state: a failure before them repeats the notice next interval; the Events' names
        make a repeat a no-op)."""
        now = plan.now
        ns = item.namespace
        pod_ref = {"kind": "Pod", "name": item.pod, "apiVersion": "v1", "uid": item.uid}
        self.kube.event(ns, pod_ref, REASON_IDLE, item.message,
                        name=event_name(item.pod, REASON_IDLE, item.pod), now=now,
                        warning=True, instance=self.instance)
        if item.owner.kind != "Pod":
            self.kube.event(ns, involved(item.owner), REASON_IDLE,
                            f"pod {item.pod}: {item.message}",
                            name=event_name(item.owner.name, REASON_IDLE, item.pod), now=now,
                            warning=True, instance=self.instance)
        since = item.idleness.since
        self.kube.patch_annotations(object_path(ns, "Pod", item.pod), {
            IDLE_SINCE_ANNOTATION: iso(since) if since is not None else iso(now),
            NOTICE_AT_ANNOTATION: iso(int(now))})
        self.metrics.actions.labels("notice", "done").inc()
        self._record("reclaim-notice", item, now,
                     scaleDownAt=iso(item.scale_down_at) if item.scale_down_at else None)

    def clear(self, item: PodPlan, plan: Plan) -> None:
        ns = item.namespace
        self.kube.delete_event(ns, event_name(item.pod, REASON_IDLE, item.pod))
        if item.owner.kind != "Pod":
            self.kube.delete_event(ns, event_name(item.owner.name, REASON_IDLE, item.pod))
        self.kube.patch_annotations(object_path(ns, "Pod", item.pod), {
            IDLE_SINCE_ANNOTATION: None, NOTICE_AT_ANNOTATION: None})
        self.metrics.actions.labels("clear", "done").inc()
        self._record("reclaim-clear", item, plan.now)

    def scale_down(self, item: PodPlan, plan: Plan) -> None:
        """Stage 2. Deployment/StatefulSet: read the Scale, annotate the owner with the
        count and time, write replicas 0. Notebook: one patch (stop annotation + time)."""
        now = plan.now
        owner = item.owner
        ns = item.namespace
        stamp = iso(int(now))
        done: list[str] = []
        self._record("reclaim-scale-down", item, now, phase="started")
        try:
            if owner.kind == NOTEBOOK:
                self.kube.patch_annotations(object_path(ns, NOTEBOOK, owner.name), {
                    NOTEBOOK_STOP_ANNOTATION: stamp, RECLAIMED_AT_ANNOTATION: stamp})
                done.append("annotated")
                replicas = None
            else:
                scale = self.kube.get_scale(ns, owner.kind, owner.name)
                done.append("read-scale")
                replicas = int((scale.get("spec") or {}).get("replicas") or 0)
                patched = self.kube.patch_annotations(
                    object_path(ns, owner.kind, owner.name), {
                        RECLAIMED_REPLICAS_ANNOTATION: str(replicas),
                        RECLAIMED_AT_ANNOTATION: stamp})
                done.append("annotated")
                # the patch changed the object's resourceVersion (the Scale's too): write
                # the Scale against the patched object, so a replica change by someone else
                # in between is still a 409
                if (patched.get("spec") or {}).get("replicas", replicas) != replicas:
                    raise KubeError(  # noqa: TRY301 - recorded below like any API failure
                        f"PATCH {object_path(ns, owner.kind, owner.name)}", None,
                        "replicas changed while scaling down; next interval")
                scale = {**scale, "metadata": {
                    **(scale.get("metadata") or {}),
                    "resourceVersion": (patched.get("metadata") or {}).get("resourceVersion")}}
                self.kube.put_scale(ns, owner.kind, owner.name, scale, 0)
                done.append("scaled")
            message = (f"scaled {owner.ref} from {replicas} to 0 replicas"
                       if replicas is not None else f"stopped {owner.ref}") + \
                f": {item.message or 'idle since the notice'}; restore: gpu-admission " \
                f"reclaim restore {owner.ref} -n {ns}"
            self.kube.event(ns, involved(owner), REASON_RECLAIMED, message,
                            name=event_name(owner.name, REASON_RECLAIMED, item.pod), now=now,
                            warning=True, instance=self.instance)
            done.append("event")
        except KubeError as exc:
            self.metrics.actions.labels("scale-down", "failed").inc()
            self._record("reclaim-scale-down", item, now, phase="failed", done=done,
                         error=str(exc))
            raise
        self.metrics.actions.labels("scale-down", "done").inc()
        self._record("reclaim-scale-down", item, now, phase="done", replicas=replicas,
                     done=done)


class RestoreError(Exception):
    """Nothing to restore, or the API refused; ``str()`` is the message (exit 2)."""


def restore(kube: Kube, records: RecordLog, *, kind: str, name: str, namespace: str,
            policy: Policy, instance: str, now: float) -> str:
    """Scale ``kind/name`` back to the recorded count (or un-stop a Notebook), remove our
    annotations, post an Event and record it. Returns what was done."""
    if kind not in (*SCALABLE_KINDS, NOTEBOOK):
        raise RestoreError(f"KIND/NAME: expected Deployment, StatefulSet or Notebook, got "
                           f"{kind!r}")
    path = object_path(namespace, kind, name)
    obj = kube.request("GET", path, missing_ok=True)
    if obj is None:
        raise RestoreError(f"{kind}/{name} not found in namespace {namespace}")
    notes = (obj.get("metadata") or {}).get("annotations") or {}
    owner = Owner(kind, name, str(obj.get("apiVersion", "")))
    if RECLAIMED_AT_ANNOTATION not in notes:
        raise RestoreError(f"{kind}/{name} in {namespace} was not reclaimed (no annotation "
                           f"{RECLAIMED_AT_ANNOTATION})")
    replicas: int | None = None
    if kind == NOTEBOOK:
        kube.patch_annotations(path, {NOTEBOOK_STOP_ANNOTATION: None,
                                      RECLAIMED_AT_ANNOTATION: None})
        what = f"restarted {kind}/{name}"
    else:
        text = str(notes.get(RECLAIMED_REPLICAS_ANNOTATION, ""))
        if not text.isdigit():
            raise RestoreError(f"{kind}/{name}: annotation {RECLAIMED_REPLICAS_ANNOTATION} "
                               f"is {text!r}, expected a replica count")
        replicas = int(text)
        scale = kube.get_scale(namespace, kind, name)
        kube.put_scale(namespace, kind, name, scale, replicas)
        kube.patch_annotations(path, {RECLAIMED_REPLICAS_ANNOTATION: None,
                                      RECLAIMED_AT_ANNOTATION: None})
        what = f"scaled {kind}/{name} back to {replicas} replicas"
    kube.event(namespace, involved(owner), REASON_RESTORED, what,
               name=event_name(name, REASON_RESTORED, str(int(now))), now=now, warning=False,
               instance=instance)
    records.write(record(decision="reclaim-restore", namespace=namespace, pod="",
                         owner=owner, workload=None, policy_digest=policy.digest,
                         instance=instance, now=now,
                         details={"replicas": replicas, "message": what}))
    return what
