"""The pure half of ``gpu-admission reclaim``: which GPU pods are idle, and what to do about
each (docs/reclaim.md). No I/O: Prometheus answers (:class:`~gpu_admission.usage.data.
Fetched`), API objects (plain dicts), the policy and the current time in; a frozen
:class:`Plan` out.

**Idle** is the report's definition, by the report's code
(:func:`gpu_admission.usage.compute.idle_flags` and :func:`~gpu_admission.usage.compute.
idle_runs`): an instant is idle when the GPU's SM utilisation (``DCGM_FI_DEV_GPU_UTIL``,
%, the device-wide value: per-pod copies are merged by their maximum) is **under**
``spec.placement.idleBelowPercent`` inside ``spec.reclaim.workingHours`` (in
``timeZone``); a pod is idle when, on every GPU it holds now, the latest run of idle instants
it held lasts at least ``spec.reclaim.idleHours`` and no sample since that run began was at or
over the threshold (nights and weekends neither count nor break the run's "still idle").
A shared GPU's value is the whole GPU's, so an idle pod next to a busy one is never idle.
Missing samples count only inside the span being judged: the idle run and what followed it,
or, without an idle run, the time since the pod first held the GPU in the window. Before the
pod or its GPU existed (a fresh exporter, Prometheus or autoscaled node) there is nothing to
miss; a missing sample inside the span, or a pod without series, is never idle: no data is
not "idle". GPU pods that are not in the plan are listed as :class:`LeftOut` with the reason.

**Stages** (per pod): ``notice`` (Event, annotations, record) once idle; after
``graceMinutes`` from the notice, ``scale-down`` of the owner (Deployment, StatefulSet through
``scale``; a Kubeflow Notebook by ``kubeflow-resource-stopped``) only in namespaces labelled
``gpu-admission.io/reclaim: scale-down``, at most ``maxActionsPerInterval`` per interval,
oldest idle first; anything else stays ``notice-only``. A noticed pod busy again is
``clear``-ed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Final
from zoneinfo import ZoneInfo

from gpu_admission.admission.pod import analyse_gpu_pod
from gpu_admission.core.timeframe import Range, WorkingHours, iso
from gpu_admission.policy.model import Policy
from gpu_admission.reclaim.names import (
    ACTIONABLE_KINDS,
    IDLE_SINCE_ANNOTATION,
    NOTEBOOK,
    NOTEBOOK_GROUP,
    NOTEBOOK_STOP_ANNOTATION,
    NOTICE_AT_ANNOTATION,
    RECLAIM_LABEL,
    RECLAIM_SCALE_DOWN,
    RECLAIMED_AT_ANNOTATION,
    SCALABLE_KINDS,
)
from gpu_admission.usage.compute import idle_flags, idle_runs
from gpu_admission.usage.data import Fetched, GpuData

#: How far back the controller looks: a run of working hours never crosses midnight
#: (WorkingHours refuses such windows), so one day holds the longest run there is.
WINDOW_SECONDS: Final = 24 * 3600
MIB_PER_GIB: Final = 1024


class Action(StrEnum):
    NOTICE = "notice"  # stage 1: Event + annotations + record
    WAIT = "wait"  # noticed, grace not over yet
    SCALE_DOWN = "scale-down"  # stage 2
    DEFERRED = "deferred"  # would scale down, but the per-interval limit is reached
    HELD = "held"  # would act, but actions are paused (Prometheus/API failing)
    NOTICE_ONLY = "notice-only"  # grace over, but no stage 2 for this pod (reason says why)
    CLEAR = "clear"  # busy again: remove the notice
    SKIP = "skip"  # never touched (exempt, workload class, missing data)


class Cause(StrEnum):
    """Why a GPU pod is not idle (the ``reason`` label of the left-out metric)."""

    BUSY = "busy"  # a sample at/over the threshold since its idle run began
    SHORT = "not-idle-long-enough"  # no idle run of spec.reclaim.idleHours
    MISSING = "missing-samples"  # a sample missing inside the span judged
    NO_METRICS = "no-metrics"  # no series of this pod in the window
    NOT_HELD = "not-held"  # did not hold the GPU for the whole idle run


@dataclass(frozen=True, slots=True)
class GpuIdle:
    node: str
    gpu: str  # device index as the exporter prints it
    uuid: str
    memory_mib: float | None  # framebuffer used at the newest sample, MiB


@dataclass(frozen=True, slots=True)
class Idleness:
    """What the metrics say about one pod (all the GPUs it holds at the newest instant)."""

    idle: bool
    reason: str  # why not idle ("" when idle)
    since: float | None = None  # unix s: start of the idle run (latest over the pod's GPUs)
    idle_seconds: int = 0  # working-time seconds of the run (shortest over its GPUs)
    busy_at: float | None = None  # unix s: newest sample at/over the threshold the pod held
    complete: bool = True  # no missing sample on its GPUs in the span judged
    gpus: tuple[GpuIdle, ...] = ()
    cause: Cause | None = None  # why not idle (None when idle)


@dataclass(frozen=True, slots=True)
class Owner:
    """The object reclaim acts on for a pod: the top of its controller chain."""

    kind: str  # Deployment | StatefulSet | Notebook | Job | ReplicaSet | ... | Pod (bare)
    name: str
    api_version: str
    replicas: int | None = None  # spec.replicas (Deployment/StatefulSet)
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def actionable(self) -> bool:
        return self.kind in ACTIONABLE_KINDS and (
            self.kind != NOTEBOOK or self.api_version.startswith(f"{NOTEBOOK_GROUP}/"))

    @property
    def reclaimed(self) -> bool:
        """Already scaled down (or stopped) by us and not restored."""
        if RECLAIMED_AT_ANNOTATION not in self.annotations:
            return False
        if self.kind == NOTEBOOK:
            return NOTEBOOK_STOP_ANNOTATION in self.annotations
        return self.replicas == 0

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True, slots=True)
class PodPlan:
    namespace: str
    pod: str
    uid: str
    workload: str
    owner: Owner
    action: Action
    reason: str
    idleness: Idleness
    message: str = ""  # the Event text ("GPU 3 on gpu-node-7 under 10 % SM for ...")
    notice_at: float | None = None  # unix s: when the notice was (or is now) given
    scale_down_at: float | None = None  # unix s: earliest stage 2, None when never


@dataclass(frozen=True, slots=True)
class LeftOut:
    """A GPU pod that is not in the plan (not idle, nothing to undo), and why."""

    namespace: str
    pod: str
    workload: str
    cause: Cause
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    now: float
    window: Range
    threshold: float  # % SM
    items: tuple[PodPlan, ...]
    actions_allowed: bool
    limit: int
    left_out: tuple[LeftOut, ...] = ()

    def count(self, action: Action) -> int:
        return sum(1 for i in self.items if i.action is action)


# --- idleness -----------------------------------------------------------------------------

def measure(fetched: Fetched, working: Sequence[int], threshold: float,
            min_seconds: int) -> dict[tuple[str, str], Idleness]:
    """Idleness of every pod holding a GPU at the newest instant of ``fetched``'s range."""
    rng = fetched.range
    step = rng.step
    last = rng.points - 1
    per_pod: dict[tuple[str, str], list[Idleness]] = {}
    for data in fetched.gpus:
        util = data.util
        idle = idle_flags(util, working, threshold)
        fb = data.fb_used[last]
        gpu = GpuIdle(data.node, data.gpu, data.uuid, None if math.isnan(fb) else fb)
        for key, marks in data.holders.items():
            if not marks[last]:
                continue  # not holding it now (pod gone, or the newest sample is missing)
            busy = [i for i in range(rng.points) if marks[i] and util[i] >= threshold]
            busy_at = float(rng.start + busy[-1] * step) if busy else None
            per_pod.setdefault(key, []).append(
                _one(idle, util, marks, rng, min_seconds, busy, busy_at, gpu))
    return {key: _combine(found) for key, found in per_pod.items()}


def _one(idle: list[bool], util: Sequence[float], marks: bytearray,  # noqa: PLR0917
         rng: Range, min_seconds: int, busy: list[int], busy_at: float | None,
         gpu: GpuIdle) -> Idleness:
    step = rng.step
    where = f"GPU {gpu.node}/{gpu.gpu}"
    held = [f and m == 1 for f, m in zip(idle, marks, strict=True)]
    runs = idle_runs(held, step, min_seconds)
    # the span judged: the latest idle run and everything after it; without one, since the
    # pod first held the GPU in the window (never before the pod or its GPU existed)
    start = runs[-1][0] if runs else marks.index(1)
    missing = sum(1 for v in util[start:] if math.isnan(v))
    if missing:
        began = "its idle run began" if runs else "the pod first held it"
        return Idleness(False, f"{missing} of {rng.points - start} samples missing on {where} "
                        f"since {began} at {iso(rng.start + start * step - step)}: no data is "
                        "never idle", busy_at=busy_at, complete=False, gpus=(gpu,),
                        cause=Cause.MISSING)
    if not runs:
        return Idleness(False, f"no idle run of {min_seconds / 3600:g} h of working hours on "
                        f"{where} in the window", busy_at=busy_at, gpus=(gpu,),
                        cause=Cause.SHORT)
    first, last = runs[-1]
    if busy and busy[-1] > first:
        return Idleness(False, f"busy at {iso(rng.start + busy[-1] * step)}", busy_at=busy_at,
                        gpus=(gpu,), cause=Cause.BUSY)
    if any(not marks[i] for i in range(first, rng.points)):
        return Idleness(False, "did not hold the GPU for the whole idle run", busy_at=busy_at,
                        gpus=(gpu,), cause=Cause.NOT_HELD)
    # one sample stands for the step ending at it: the run began one step before its first
    since = float(rng.start + first * step - step)
    return Idleness(True, "", since=since, idle_seconds=(last - first + 1) * step,
                    busy_at=busy_at, gpus=(gpu,))


def _combine(found: list[Idleness]) -> Idleness:
    gpus = tuple(g for f in found for g in f.gpus)
    busy = [f.busy_at for f in found if f.busy_at is not None]
    busy_at = max(busy) if busy else None
    complete = all(f.complete for f in found)
    not_idle = [f for f in found if not f.idle]
    if not_idle:
        return Idleness(False, "; ".join(f.reason for f in not_idle), busy_at=busy_at,
                        complete=complete, gpus=gpus, cause=not_idle[0].cause)
    return Idleness(True, "", since=max(f.since or 0.0 for f in found),
                    idle_seconds=min(f.idle_seconds for f in found), busy_at=busy_at,
                    complete=complete, gpus=gpus)


# --- owners -------------------------------------------------------------------------------

Objects = Mapping[tuple[str, str], Mapping[str, Any]]  # (namespace, name) -> object


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference with ``controller: true`` (at most one has it)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if isinstance(r, Mapping) and r.get("controller") is True),
                None)


def _owner_of(obj: Mapping[str, Any], kind: str, api_version: str) -> Owner:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    replicas = spec.get("replicas", 1) if kind in SCALABLE_KINDS else None
    return Owner(kind, str(meta.get("name", "")), api_version,
                 replicas if isinstance(replicas, int) else None,
                 dict(meta.get("annotations") or {}))


def resolve_owner(pod: Mapping[str, Any], *, replicasets: Objects, deployments: Objects,
                  statefulsets: Objects, notebooks: Objects) -> Owner:
    """The top of ``pod``'s controller chain that reclaim would act on: a ReplicaSet's
    Deployment, a StatefulSet (or the Kubeflow Notebook that controls it), else the pod's
    own controller (Job, DaemonSet, ... never acted on), else the bare pod."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    ref = controller_ref(pod)
    if ref is None:
        return Owner("Pod", str(meta.get("name", "")), "v1")
    kind, name = str(ref.get("kind", "")), str(ref.get("name", ""))
    api_version = str(ref.get("apiVersion", ""))
    if kind == "ReplicaSet":
        rs = replicasets.get((namespace, name))
        up = controller_ref(rs) if rs is not None else None
        if up is not None and up.get("kind") == "Deployment":
            dep = deployments.get((namespace, str(up.get("name", ""))))
            if dep is not None:
                return _owner_of(dep, "Deployment", "apps/v1")
        return Owner(kind, name, api_version)  # a bare ReplicaSet: not acted on
    if kind == "StatefulSet":
        sts = statefulsets.get((namespace, name))
        if sts is None:
            return Owner(kind, name, api_version)
        up = controller_ref(sts)
        if up is not None and up.get("kind") == NOTEBOOK:
            nb = notebooks.get((namespace, str(up.get("name", ""))))
            if nb is not None:
                return _owner_of(nb, NOTEBOOK, str(up.get("apiVersion", "")))
        return _owner_of(sts, "StatefulSet", "apps/v1")
    return Owner(kind, name, api_version)


# --- the plan -----------------------------------------------------------------------------

def duration_text(seconds: float) -> str:
    """``2 h 40 min``, ``45 min``, ``3 h``."""
    minutes = round(seconds / 60)
    hours, rest = divmod(minutes, 60)
    if hours and rest:
        return f"{hours} h {rest} min"
    return f"{hours} h" if hours else f"{rest} min"


def memory_text(mib: float) -> str:
    gib = mib / MIB_PER_GIB
    return f"{gib:.0f} GiB" if gib >= 10 else f"{gib:.1f} GiB"


def notice_message(idleness: Idleness, threshold: float) -> str:
    """The Event text: "GPU 3 on gpu-node-7 under 10 % SM for 2 h 40 min of working hours,
    holding 16 GiB"."""
    by_node: dict[str, list[str]] = {}
    for g in idleness.gpus:
        by_node.setdefault(g.node, []).append(g.gpu)
    where = "; ".join(f"GPU{'s' if len(ids) > 1 else ''} {', '.join(ids)} on {node}"
                      for node, ids in by_node.items())
    mems = [g.memory_mib for g in idleness.gpus if g.memory_mib is not None]
    holding = f", holding {memory_text(sum(mems))}" if mems else ""
    return (f"{where} under {threshold:g} % SM for {duration_text(idleness.idle_seconds)} of "
            f"working hours{holding}")


def parse_time(value: object) -> float | None:
    """Unix seconds of an RFC 3339 annotation value; None when absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Cluster:
    """What the API server holds, as plain dicts (one list of each per interval)."""

    pods: Sequence[Mapping[str, Any]]
    namespaces: Mapping[str, Mapping[str, str]]  # name -> labels
    replicasets: Objects = field(default_factory=dict)
    deployments: Objects = field(default_factory=dict)
    statefulsets: Objects = field(default_factory=dict)
    notebooks: Objects = field(default_factory=dict)


def working_mask(policy: Policy, rng: Range) -> bytearray:
    spec = policy.spec.reclaim
    return WorkingHours.parse(spec.working_hours).mask(rng, ZoneInfo(spec.time_zone))


def build_plan(fetched: Fetched | None, cluster: Cluster, policy: Policy, *, now: float,
               window: Range, actions_allowed: bool = True) -> Plan:
    """The plan for one interval. ``fetched`` None: Prometheus gave nothing usable, so no pod
    is idle (and none is cleared: no data says nothing)."""
    spec = policy.spec
    rc = spec.reclaim
    threshold = float(spec.placement.idle_below_percent)
    grace = rc.grace_minutes * 60
    min_seconds = max(1, round(rc.idle_hours * 3600))
    measured = (measure(fetched, working_mask(policy, fetched.range), threshold, min_seconds)
                if fetched is not None else {})
    exempt = policy.compiled.exempt_namespaces
    items: list[PodPlan] = []
    left_out: list[LeftOut] = []
    for pod in cluster.pods:
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        annotations = meta.get("annotations") or {}
        analysed = analyse_gpu_pod(pod, policy)
        if analysed is None:
            continue
        idleness = measured.get((namespace, name))
        noticed = parse_time(annotations.get(NOTICE_AT_ANNOTATION))
        if idleness is None:
            idleness = Idleness(False, "no GPU metrics for this pod in the window: no data is "
                                "never idle", complete=False, cause=Cause.NO_METRICS)
        if not idleness.idle and noticed is None:  # busy or unknown, nothing to undo
            left_out.append(LeftOut(namespace, name, analysed.workload,
                                    idleness.cause or Cause.NO_METRICS, idleness.reason))
            continue
        owner = resolve_owner(pod, replicasets=cluster.replicasets,
                              deployments=cluster.deployments,
                              statefulsets=cluster.statefulsets, notebooks=cluster.notebooks)
        base = PodPlan(namespace, name, str(meta.get("uid", "")), analysed.workload, owner,
                       Action.SKIP, "", idleness, notice_at=noticed)
        items.append(_decide(base, annotations, cluster, threshold, grace, now,
                             exempt, tuple(rc.workloads)))
    return Plan(now, window, threshold, tuple(_limit(items, actions_allowed,
                                                     rc.max_actions_per_interval)),
                actions_allowed, rc.max_actions_per_interval,
                tuple(sorted(left_out, key=lambda o: (o.namespace, o.pod))))


def _decide(p: PodPlan, annotations: Mapping[str, Any], cluster: Cluster,  # noqa: PLR0917
            threshold: float, grace: int, now: float, exempt: frozenset[str],
            workloads: tuple[str, ...]) -> PodPlan:
    def with_(action: Action, reason: str, **kw: Any) -> PodPlan:
        return replace(p, action=action, reason=reason, **kw)

    idl = p.idleness
    noticed = p.notice_at
    # undoing a notice is always allowed (even where a changed policy now exempts the pod)
    if noticed is not None and idl.busy_at is not None and idl.busy_at > _since(annotations,
                                                                               noticed):
        return with_(Action.CLEAR, f"busy again at {iso(idl.busy_at)}")
    if p.namespace in exempt:
        return with_(Action.SKIP, f"namespace {p.namespace} is exempt (spec.exemptions)")
    if p.workload not in workloads:
        return with_(Action.SKIP, f"workload {p.workload} is not in spec.reclaim.workloads")
    if not idl.complete:
        return with_(Action.SKIP, idl.reason)
    if not idl.idle and noticed is None:
        return with_(Action.SKIP, idl.reason)  # pragma: no cover - filtered by the caller
    message = notice_message(idl, threshold) if idl.idle else ""
    labelled = cluster.namespaces.get(p.namespace, {}).get(RECLAIM_LABEL) == RECLAIM_SCALE_DOWN
    stage2 = labelled and p.owner.actionable
    if noticed is None:
        at = now + grace if stage2 else None
        return with_(Action.NOTICE, f"idle {duration_text(idl.idle_seconds)} of working hours",
                     message=message, notice_at=now, scale_down_at=at)
    # noticed, not busy since: still idle (the run may have left the window over a weekend)
    at = noticed + grace if stage2 else None
    if not stage2:
        why = (f"namespace {p.namespace} is not labelled {RECLAIM_LABEL}={RECLAIM_SCALE_DOWN}"
               if not labelled else f"owner {p.owner.ref} is never scaled down (only "
               f"Deployments, StatefulSets and Kubeflow Notebooks are)")
        return with_(Action.NOTICE_ONLY, why, message=message)
    if p.owner.reclaimed:
        return with_(Action.SKIP, f"{p.owner.ref} already scaled down", message=message)
    if now < noticed + grace:
        return with_(Action.WAIT, f"grace until {iso(noticed + grace)}", message=message,
                     scale_down_at=at)
    return with_(Action.SCALE_DOWN, f"idle since the notice at {iso(noticed)}, grace over",
                 message=message, scale_down_at=at)


def _since(annotations: Mapping[str, Any], noticed: float) -> float:
    """Busy after this clears a notice: the idle run's start when recorded, else the notice."""
    since = parse_time(annotations.get(IDLE_SINCE_ANNOTATION))
    return since if since is not None else noticed


def _limit(items: list[PodPlan], allowed: bool, limit: int) -> list[PodPlan]:
    """At most ``limit`` scale-downs (oldest idle first, one per owner); none when actions
    are paused. The others are ``deferred`` / ``held`` and come back next interval."""
    order = sorted((i for i in items if i.action is Action.SCALE_DOWN),
                   key=lambda i: (i.notice_at or 0.0, i.namespace, i.pod))
    chosen: dict[tuple[str, str], PodPlan] = {}
    owners: set[tuple[str, str]] = set()
    for item in order:
        key = (item.namespace, item.owner.ref)
        if key in owners:
            chosen[(item.namespace, item.pod)] = _replace(item, Action.WAIT,
                                                          f"{item.owner.ref} is scaled down "
                                                          "for another of its pods")
            continue
        if not allowed:
            chosen[(item.namespace, item.pod)] = _replace(
                item, Action.HELD, "actions paused: Prometheus or the API server failed "
                "(notice-only until an interval succeeds)")
        elif len(owners) >= limit:
            chosen[(item.namespace, item.pod)] = _replace(
                item, Action.DEFERRED, f"spec.reclaim.maxActionsPerInterval ({limit}) "
                "reached: next interval")
        owners.add(key)
    out = [chosen.get((i.namespace, i.pod), i) for i in items]
    return sorted(out, key=lambda i: (i.namespace, i.pod))


def _replace(item: PodPlan, action: Action, reason: str) -> PodPlan:
    return replace(item, action=action, reason=reason)


def plan_json(plan: Plan) -> dict[str, Any]:
    """``-o json`` of ``--dry-run`` (and of each interval in the log)."""
    return {
        "time": iso(plan.now),
        "window": {"start": iso(plan.window.start), "end": iso(plan.window.end),
                   "step": f"{plan.window.step}s"},
        "idleBelowPercent": plan.threshold,
        "actionsAllowed": plan.actions_allowed,
        "maxActionsPerInterval": plan.limit,
        "counts": {a.value: plan.count(a) for a in Action},
        "pods": [{
            "namespace": i.namespace, "pod": i.pod, "workload": i.workload,
            "owner": {"kind": i.owner.kind, "name": i.owner.name},
            "action": i.action.value, "reason": i.reason, "message": i.message,
            "idle": i.idleness.idle,
            "idleSince": iso(i.idleness.since) if i.idleness.since is not None else None,
            "idleHoursWorking": round(i.idleness.idle_seconds / 3600, 3),
            "gpus": [{"node": g.node, "gpu": g.gpu, "uuid": g.uuid,
                      "memoryUsedMiB": None if g.memory_mib is None else round(g.memory_mib, 1)}
                     for g in i.idleness.gpus],
            "noticeAt": iso(i.notice_at) if i.notice_at is not None else None,
            "scaleDownAt": iso(i.scale_down_at) if i.scale_down_at is not None else None,
        } for i in plan.items],
        "leftOut": [{"namespace": o.namespace, "pod": o.pod, "workload": o.workload,
                     "cause": o.cause.value, "reason": o.reason} for o in plan.left_out],
    }


def plan_table(plan: Plan) -> str:
    headers = ("NAMESPACE", "POD", "WORKLOAD", "OWNER", "IDLE", "ACTION", "SCALE-DOWN AT",
               "REASON")
    rows = [(i.namespace, i.pod, i.workload, i.owner.ref,
             duration_text(i.idleness.idle_seconds) if i.idleness.idle else "-",
             i.action.value, iso(i.scale_down_at) if i.scale_down_at is not None else "-",
             i.reason) for i in plan.items]
    widths = [max(len(h), *(len(r[c]) for r in rows)) if rows else len(h)
              for c, h in enumerate(headers)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
             for row in (headers, *rows)]
    counts = ", ".join(f"{plan.count(a)} {a.value}" for a in Action if plan.count(a))
    lines.append("")
    lines.append(f"{iso(plan.now)}: {len(plan.items)} pods ({counts or 'none idle'}); "
                 f"idle = SM under {plan.threshold:g} %; at most {plan.limit} scale-downs "
                 f"per interval{'' if plan.actions_allowed else '; ACTIONS PAUSED'}")
    if plan.left_out:
        lines.append(f"left out: {len(plan.left_out)} GPU pods not idle")
        lines += [f"  {o.namespace}/{o.pod} ({o.workload}) {o.cause.value}: {o.reason}"
                  for o in plan.left_out]
    return "\n".join(lines) + "\n"


# --- the report's preview -----------------------------------------------------------------

def tail(fetched: Fetched, seconds: int = WINDOW_SECONDS) -> Fetched:
    """The last ``seconds`` of ``fetched`` (the controller's window), as its own Fetched."""
    rng = fetched.range
    n = min(rng.points, seconds // rng.step + 1)
    cut = rng.points - n
    sliced = Range(rng.end - (n - 1) * rng.step, rng.end, rng.step)
    gpus = []
    for g in fetched.gpus:
        holders = {k: m[cut:] for k, m in g.holders.items() if any(m[cut:])}
        gpus.append(GpuData(g.node, g.gpu, g.uuid, g.model, g.util[cut:], g.fb_used[cut:],
                            holders))
    return Fetched(sliced, gpus, fetched.holder_labels, fetched.queries,
                   fetched.metrics_missing)


def preview(fetched: Fetched, policy: Policy) -> list[dict[str, Any]]:
    """What ``gpu-admission reclaim`` would do at the end of a report's range, per idle pod,
    from the metrics alone (the report reads no Kubernetes objects, so the workload class,
    the owner and the namespace's ``gpu-admission.io/reclaim`` label are stated as the
    conditions they are). Same window, settings and code as the controller."""
    window = tail(fetched)
    rc = policy.spec.reclaim
    threshold = float(policy.spec.placement.idle_below_percent)
    found = measure(window, working_mask(policy, window.range), threshold,
                    max(1, round(rc.idle_hours * 3600)))
    exempt = policy.compiled.exempt_namespaces
    end = float(window.range.end)
    out = []
    for (namespace, pod), idl in sorted(found.items()):
        if not idl.idle:
            continue
        never = namespace in exempt
        out.append({
            "namespace": namespace, "pod": pod,
            "gpus": [f"{g.node}/{g.gpu}" for g in idl.gpus],
            "idleSince": iso(idl.since) if idl.since is not None else None,
            "idleHoursWorking": round(idl.idle_seconds / 3600, 3),
            "message": notice_message(idl, threshold),
            "action": "none (namespace exempt)" if never else "notice",
            "noticeAt": None if never else iso(end),
            "scaleDownAt": None if never else iso(end + rc.grace_minutes * 60),
            "condition": "" if never else (
                f"notice if its workload class is one of {', '.join(rc.workloads)}; "
                f"scale-down only if namespace {namespace} is labelled "
                f"{RECLAIM_LABEL}={RECLAIM_SCALE_DOWN} and its owner is a Deployment, "
                "StatefulSet or Kubeflow Notebook")})
    return out
