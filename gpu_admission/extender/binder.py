"""The extender's ``bind`` verb and the Kubernetes state behind fractional GPUs (I/O).

* :class:`KubeState` keeps the :class:`~gpu_admission.placement.ledger.Ledger` current from
  one list/watch (:mod:`gpu_admission.kube.watch`) of pods, our ConfigMaps and nodes. The
  ledger is rebuilt from those lists at every start, so a restarted or newly elected replica
  never hands out memory twice.
* :meth:`Binder.bind` answers kube-scheduler's ``ExtenderBindingArgs`` (``PodName``,
  ``PodNamespace``, ``PodUID``, ``Node``; ``k8s.io/kube-scheduler/extender/v1/types.go``).
  For a fractional pod, before any API call (no ``await`` in between, so atomic on the event
  loop): re-check fit on the ledger, choose the GPU
  (:func:`gpu_admission.placement.fractional.choose`) and record the share as assumed, so the
  next pod's filter and prioritize count it at once (kube-scheduler sends them while this
  bind is in flight); the pod's share comes from the pod filter/prioritize saw or the watch
  (:class:`PodFacts`). Then: open the GPU if new (a reservation pod holding one whole
  ``nvidia.com/gpu``, waiting a bounded time for ``gpu-admission reserve`` to publish the
  UUID), write the pod's own ConfigMap with the UUID, and at once ``POST
  pods/{name}/binding``. Any failure undoes what this bind made (the ConfigMap, a
  reservation it opened) and returns ``Error``, so kube-scheduler forgets the assumed
  placement and retries (KAI-Scheduler's binder does the same:
  ``pkg/binder/binding/resourcereservation/resource_reservation.go``). Other pods are bound
  as kube-scheduler's DefaultBinder does.
* Housekeeping on every replica (all idempotent): reservation pods whose last fractional pod
  is gone are deleted (after a grace period longer than any bind in flight), and each node
  of a fractional pool advertises ``gpu-admission.io/gpu-memory`` = GPUs x ``memoryMiB`` in
  its status capacity (``PATCH nodes/{name}/status``, the documented way:
  https://kubernetes.io/docs/tasks/administer-cluster/extended-resource-node/).

Only the leader binds: the extender listens on loopback, and kube-scheduler calls it only
while it holds the ``gpu-aware-scheduler`` lease (``leaderElection`` in the scheduler
config). The bind's API calls run on an asynchronous client
(:mod:`gpu_admission.kube.aio`), the watch in its own threads: the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Final

from kubernetes import client as k8s
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from structlog.typing import FilteringBoundLogger

from gpu_admission.core.vocab import (
    CONFIGMAP_LABEL,
    GPU_CONFIGMAP_ANNOTATION,
    GPU_CONFIGMAP_KEY,
    GPU_MEMORY_ANNOTATION,
    GPU_MEMORY_RESOURCE,
    GPU_RESOURCE,
    GPU_UUID_ANNOTATION,
    RESERVATION_LABEL,
)
from gpu_admission.facts.fractional import visible_devices_value
from gpu_admission.kube import client as kube
from gpu_admission.kube.aio import AsyncKube
from gpu_admission.kube.watch import Resource, Watcher, WatchMetrics
from gpu_admission.placement.fractional import (
    NEW_GPU,
    Placer,
    choose,
    fractional_error,
    fractional_share,
    no_fit_reason,
    node_pool,
)
from gpu_admission.placement.ledger import (
    OPENING_PREFIX,
    Assignment,
    Ledger,
    NodeView,
    configmap_entry,
    parse_mib,
)
from gpu_admission.placement.requests import NodeRequests
from gpu_admission.policy.model import Policy

RESERVED_FOR_ANNOTATION: Final = "gpu-admission.io/reserved-for"  # ns/name of the first pod
RESOURCES: Final = (
    Resource("pods", "pods"),
    Resource("configmaps", "configmaps", label_selector=f"{CONFIGMAP_LABEL}=true"),
    Resource("nodes", "nodes"),
)
BIND_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class BindError(Exception):
    """A bind that cannot complete; the message is ExtenderBindingResult.Error."""


@dataclass(frozen=True, slots=True)
class BindConfig:
    namespace: str  # the install namespace: reservation pods live here
    #: the project's image (runs `gpu-admission reserve`); "": this extender container's own
    #: image, read once from its pod (env POD_NAME / POD_NAMESPACE, the downward API)
    image: str
    reservation_timeout_seconds: float = 60.0  # wait for the reservation's UUID
    service_account: str = "gpu-admission-reservation"
    housekeeping_seconds: float = 30.0  # period of cleanup and node advertising
    #: a reservation without pods is deleted only when older than this (s): longer than any
    #: bind in flight
    empty_grace_seconds: float = 120.0
    #: "namespace/name" of kube-scheduler's leader-election Lease: housekeeping runs only on
    #: the replica whose pod (env POD_NAME) holds it, so the replica that binds is the one
    #: that deletes (kube-scheduler's identity is "<hostname>_<uuid>", hostname = pod name).
    #: "": every replica (a single one)
    leader_lease: str = ""
    #: connections of the bind's own asynchronous client (:mod:`gpu_admission.kube.aio`):
    #: a burst's calls never queue behind each other (issue 36: on asyncio's default thread
    #: pool, min(32, CPUs + 4) = 6 threads on 2 cores, a bind waited 0.6 s between writing
    #: the ConfigMap and posting the binding)
    api_connections: int = 64


#: Seconds a bind waits for an opened card's UUID (the reservation pod's start).
WAIT_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class BindMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.races = Counter("gpu_admission_extender_bind_races",
                             "Fractional binds refused because the node's cards no longer had "
                             "the share free when the bind came (another pod took the memory "
                             "after filter; kube-scheduler retries).", registry=registry)
        self.gpus_opened = Counter("gpu_admission_extender_gpus_opened",
                                   "Cards opened for fractional pods (a reservation pod "
                                   "created by a bind).", registry=registry)
        self.gpus_released = Counter("gpu_admission_extender_gpus_released",
                                     "Cards given back by reason: empty (last fractional pod "
                                     "gone) or failed (the opening bind failed).", ["reason"],
                                     registry=registry)
        for reason in ("empty", "failed"):
            self.gpus_released.labels(reason)
        self.gpu_wait = Histogram("gpu_admission_extender_bind_gpu_wait_seconds",
                                  "Time a bind waited for the UUID of a card being opened "
                                  "(seconds; only binds onto an opening card).",
                                  buckets=WAIT_BUCKETS, registry=registry)
        self.binds = Counter("gpu_admission_extender_binds",
                             "Binds by kind (fractional, whole) and result (bound, error).",
                             ["kind", "result"], registry=registry)
        self.bind_seconds = Histogram("gpu_admission_extender_bind_duration_seconds",
                                      "Wall time of a bind including its API calls "
                                      "(seconds).", buckets=BIND_BUCKETS, registry=registry)
        self.reservations = Counter("gpu_admission_extender_reservations",
                                    "Reservation pods by action (created, deleted, "
                                    "timed_out).", ["action"], registry=registry)
        self.synced = Gauge("gpu_admission_extender_ledger_synced",
                            "1 once pods, ConfigMaps and nodes have been listed.",
                            registry=registry)
        self.events = Counter("gpu_admission_extender_watch_events",
                              "Watch events by resource and type.", ["resource", "type"],
                              registry=registry)
        self.lists = Counter("gpu_admission_extender_watch_lists",
                             "Lists by resource and reason.", ["resource", "reason"],
                             registry=registry)
        self.errors = Counter("gpu_admission_extender_watch_errors",
                              "Failed lists/watches by resource.", ["resource"],
                              registry=registry)


class LedgerCollector(Collector):
    """``gpu_admission_extender_gpu_free_mib{node, gpu}``: each open card's free memory as
    the ledger offers it (the pool's ``memoryMiB`` minus every share given out or assumed),
    read at scrape time on the event loop (the only place the ledger changes), so it is
    never a stale copy. Opening cards are labelled ``opening:<reservation>``."""

    def __init__(self, state: KubeState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("gpu_admission_extender_gpu_free_mib",
                                   "Free GPU memory of each open card of a fractional pool "
                                   "(MiB): memoryMiB minus the shares bound or being bound.",
                                   labels=["node", "gpu"])
        state = self.state
        if state.synced:
            policy = state.policy()
            for node in sorted(state.nodes):
                labels = (state.nodes[node].get("metadata") or {}).get("labels") or {}
                pool = node_pool(labels, policy)
                if pool is None:
                    continue
                for gpu in state.ledger.view(node).open:
                    family.add_metric([node, gpu.gpu_id], pool.memory_mib - gpu.used_mib)
        yield family


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What bind needs of a fractional pod, known before the bind comes (from the pod
    kube-scheduler sent to filter/prioritize, or the watch), so the share is assumed the
    instant bind starts, with no API call first."""

    namespace: str
    name: str
    uid: str
    share_mib: int
    configmap: str


def pod_facts(pod: dict[str, Any]) -> PodFacts | None:
    """The facts of a valid, unbound fractional pod; None otherwise."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    share = parse_mib(annotations.get(GPU_MEMORY_ANNOTATION))
    cm = annotations.get(GPU_CONFIGMAP_ANNOTATION)
    uid = meta.get("uid")
    if (share is None or not isinstance(cm, str) or not cm or not isinstance(uid, str)
            or not uid or (pod.get("spec") or {}).get("nodeName")):
        return None
    return PodFacts(str(meta.get("namespace") or ""), str(meta.get("name") or ""), uid,
                    share, cm)


def reservation_pod(name: str, node: str, config: BindConfig, reserved_for: str) -> dict[str, Any]:
    """The reservation pod that opens a GPU on ``node``: one whole ``nvidia.com/gpu`` (so the
    device plugin gives the card to nobody else), pinned with ``nodeName`` (the kubelet admits
    it directly, no scheduler), tiny requests, running ``gpu-admission reserve`` which
    publishes the GPU's UUID on :data:`GPU_UUID_ANNOTATION` and then sleeps."""
    labels = {RESERVATION_LABEL: "true", "app.kubernetes.io/name": "gpu-admission",
              "app.kubernetes.io/component": "gpu-reservation"}
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "POD_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": config.namespace, "labels": labels,
                     "annotations": {RESERVED_FOR_ANNOTATION: reserved_for}},
        "spec": {
            "nodeName": node,
            "serviceAccountName": config.service_account,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 5,
            "priorityClassName": "system-node-critical",
            "tolerations": [{"operator": "Exists"}],
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "reserve", "image": config.image, "imagePullPolicy": "IfNotPresent",
                "args": ["reserve"], "env": env,
                "resources": {"requests": {"cpu": "1m", "memory": "32Mi", GPU_RESOURCE: "1"},
                              "limits": {"memory": "64Mi", GPU_RESOURCE: "1"}},
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}}}]}}


def reservation_name(node: str) -> str:
    """``gpu-admission-reserve-<node hash>-<random>``: a valid pod name for any node name."""
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"gpu-admission-reserve-{digest}-{secrets.token_hex(3)}"


def configmap(namespace: str, name: str, pod_name: str, pod_uid: str, value: str) -> dict[str, Any]:
    """The pod's own ConfigMap: owned by the pod (it goes with the pod; the garbage
    collector deletes it), labelled ours, the GPU in the device plugin's form."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {CONFIGMAP_LABEL: "true",
                                    "app.kubernetes.io/name": "gpu-admission"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                                              "name": pod_name, "uid": pod_uid,
                                              "controller": False,
                                              "blockOwnerDeletion": False}]},
            "data": {GPU_CONFIGMAP_KEY: value}}


@dataclass(eq=False)
class KubeState:
    """The ledger, fed by the watch; callbacks on the event loop."""

    client: k8s.ApiClient
    config: BindConfig
    metrics: BindMetrics
    log: FilteringBoundLogger
    policy: Callable[[], Policy]
    watch_timeout_seconds: int = 300
    ledger: Ledger = field(init=False)
    listed: set[str] = field(default_factory=set)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> Node
    #: reservation name -> future of its UUID (binds waiting on an opening GPU)
    waiting: dict[str, asyncio.Future[str]] = field(default_factory=dict)
    created: dict[str, float] = field(default_factory=dict)  # reservation -> creation time
    image: str = ""  # reservation pods' image, once known
    #: pod UID -> facts of fractional pods not bound yet (filter/prioritize and the watch
    #: add; binding, deletion or a terminal phase drop)
    pending: dict[str, PodFacts] = field(default_factory=dict)
    #: CPU and memory requested per node, for the fragmentation ranking: fed from the same
    #: pod list/watch as the ledger (one watch of pods, not two)
    requests: NodeRequests = field(default_factory=NodeRequests)
    #: the extender's fractional ranking state (its learned workload): bind takes the card
    #: the ranking filter and prioritize used
    placer: Placer = field(default_factory=Placer)
    watcher: Watcher = field(init=False)

    def __post_init__(self) -> None:
        self.ledger = Ledger(self.config.namespace)
        self.image = self.config.image
        self.metrics.registry.register(LedgerCollector(self))
        m = self.metrics
        self.watcher = Watcher(self.client, RESOURCES, on_replace=self._replace,
                               on_event=self._event,
                               metrics=WatchMetrics(m.events, m.lists, m.errors), log=self.log,
                               event_prefix="ledger",
                               watch_timeout_seconds=self.watch_timeout_seconds)

    @property
    def synced(self) -> bool:
        return len(self.listed) == len(RESOURCES)

    def remember(self, pod: dict[str, Any]) -> None:
        """Keep a fractional pod's facts until it is bound (a pod kube-scheduler asks
        about): its bind then assumes its share before any API call."""
        facts = pod_facts(pod)
        if facts is not None:
            self.pending[facts.uid] = facts

    def _pending(self, pod: dict[str, Any], deleted: bool) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        phase = (pod.get("status") or {}).get("phase")
        if deleted or phase in ("Succeeded", "Failed"):
            self.pending.pop(uid, None)
            return
        facts = pod_facts(pod)
        if facts is None:
            self.pending.pop(uid, None)
        else:
            self.pending[uid] = facts

    def _replace(self, resource: str, items: list[dict[str, Any]]) -> None:
        if resource == "pods":
            self.ledger.replace_pods(items)
            self.pending.clear()
            self.requests.replace(items)
            for item in items:
                self._reservation_seen(item)
                self._pending(item, False)
        elif resource == "configmaps":
            self.ledger.replace_configmaps(items)
        else:
            self.nodes = {str((n.get("metadata") or {}).get("name")): n for n in items}
            self.ledger.replace_nodes(items)
        self.listed.add(resource)
        if self.synced:
            self.metrics.synced.set(1)

    def _event(self, resource: str, kind: str, obj: dict[str, Any]) -> None:
        deleted = kind == "DELETED"
        if resource == "pods":
            if deleted:
                self.ledger.remove_pod(obj)
                self.requests.remove_pod(obj)
            else:
                self.ledger.set_pod(obj)
                self.requests.set_pod(obj)
                self._reservation_seen(obj)
            self._pending(obj, deleted)
        elif resource == "configmaps":
            (self.ledger.remove_configmap if deleted else self.ledger.set_configmap)(obj)
        else:
            name = str((obj.get("metadata") or {}).get("name"))
            if deleted:
                self.nodes.pop(name, None)
                self.ledger.remove_node(name)
            else:
                self.nodes[name] = obj
                self.ledger.set_node(obj)

    def _reservation_seen(self, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uuid = (meta.get("annotations") or {}).get(GPU_UUID_ANNOTATION)
        future = self.waiting.get(str(meta.get("name")))
        if uuid and future is not None and not future.done():
            future.set_result(str(uuid))


class Binder:
    """The GPU choice of each bind, made the instant it starts, then its API calls."""

    def __init__(self, state: KubeState) -> None:
        self.state = state
        #: held by housekeeping while it closes empty cards (bind's choice needs no lock:
        #: it runs with no ``await`` between reading the ledger and recording the share)
        self.lock = asyncio.Lock()
        #: the bind's own client: coroutines on the loop, no thread (blocking at startup:
        #: reads the TLS files)
        self.api = AsyncKube(state.client.configuration, limit=state.config.api_connections)

    async def close(self) -> None:
        await self.api.close()

    async def call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        return await self.api.request(method, path, **kwargs)

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        """"" when bound, else the Error for ExtenderBindingResult.

        A fractional pod kube-scheduler asked about (filter/prioritize) or the watch has
        seen is placed on the ledger before the first ``await``: kube-scheduler sends the
        next pod's filter while this bind is in flight (its binding cycle runs beside the
        next scheduling cycle, ``pkg/scheduler/schedule_one.go``), and that filter must see
        this share, as kube-scheduler's own cache counts an assumed pod
        (``pkg/scheduler/backend/cache/cache.go`` ``AssumePod``) until it is bound."""
        start = time.perf_counter()
        kind = "whole"
        try:
            facts = self.state.pending.get(uid) if uid else None
            if facts is None or (facts.namespace, facts.name) != (namespace, name):
                facts = await self._read_facts(namespace, name, uid)  # not seen: read it
            if facts is not None:
                kind = "fractional"
                await self._bind_fractional(facts, node)
            else:
                await post_binding(self.api, namespace, name, uid, node)
        except BindError as exc:
            self.state.metrics.binds.labels(kind, "error").inc()
            self.state.log.warning("bind_failed", pod=f"{namespace}/{name}", node=node,
                                   error=str(exc))
            return str(exc)
        except kube.KubeError as exc:
            self.state.metrics.binds.labels(kind, "error").inc()
            self.state.log.warning("bind_failed", pod=f"{namespace}/{name}", node=node,
                                   error=str(exc))
            return f"binding {namespace}/{name} to {node}: {exc}"
        finally:
            self.state.metrics.bind_seconds.observe(time.perf_counter() - start)
        self.state.metrics.binds.labels(kind, "bound").inc()
        return ""

    async def _read_facts(self, namespace: str, name: str, uid: str) -> PodFacts | None:
        """A pod bind has not seen before (a restart between its filter and its bind): read
        it; its facts when fractional, None for other pods."""
        pod = await self._pod(namespace, name, uid)
        if fractional_share(pod) is None:
            return None
        facts = pod_facts(pod)
        if facts is None:
            raise BindError(f"pod {namespace}/{name} is already bound to "
                            f"{(pod.get('spec') or {}).get('nodeName')}; not bound")
        return facts

    async def _pod(self, namespace: str, name: str, uid: str) -> dict[str, Any]:
        """The pod as the API has it now; the same UID as kube-scheduler's (not replaced)."""
        pod = await self.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        found = (pod.get("metadata") or {}).get("uid")
        if uid and found != uid:
            raise BindError(f"pod {namespace}/{name} has UID {found}, not {uid}: it was "
                            f"replaced; not bound")
        bad = fractional_error(pod)
        if bad:
            raise BindError(f"pod {namespace}/{name}: {bad}; not bound")
        return pod

    def place(self, facts: PodFacts, node: str) -> tuple[str, str]:
        """Choose the card on the node's view and record the share, synchronously (atomic
        on the event loop: no other bind, watch event or filter runs in between). Returns
        (GPU id, the reservation opened for it or ""). :class:`BindError` when nothing fits
        any more: a real race (a bind that came between this pod's filter and its bind)."""
        state = self.state
        if not state.synced:
            raise BindError("the extender's GPU ledger is not synced yet (pods, ConfigMaps, "
                            "nodes still listing); retry")
        policy = state.policy()
        labels = ((state.nodes.get(node) or {}).get("metadata") or {}).get("labels") or {}
        pool = node_pool(labels, policy)
        if pool is None:
            raise BindError(f"node {node} is not in a fractional node pool; a fractional pod "
                            f"needs one")
        view = state.ledger.view(node)
        choice = choose(view, pool.memory_mib, facts.share_mib, policy.spec.placement,
                        placer=state.placer)
        if choice is None:
            state.metrics.races.inc()
            why = no_fit_reason(view, pool.memory_mib, facts.share_mib, policy.spec.placement)
            raise BindError(f"node {node}: {why} (another pod took the memory; "
                            f"kube-scheduler retries)")
        gpu_id, opened = choice.gpu_id, ""
        if gpu_id == NEW_GPU:
            opened = reservation_name(node)
            gpu_id = state.ledger.open_gpu(opened, node)
            state.waiting[opened] = asyncio.get_running_loop().create_future()
            state.created[opened] = time.time()
        state.ledger.assume(Assignment(facts.namespace, facts.name, facts.uid, node, gpu_id,
                                       facts.share_mib))
        state.pending.pop(facts.uid, None)
        return gpu_id, opened

    async def _bind_fractional(self, facts: PodFacts, node: str) -> None:
        state = self.state
        gpu_id, opened = self.place(facts, node)
        pool = node_pool(((state.nodes.get(node) or {}).get("metadata") or {}).get("labels")
                         or {}, state.policy())
        strategy = pool.device_list_strategy if pool is not None else "envvar"
        uuid = ""
        try:
            if opened:
                uuid = await self._open(opened, node, f"{facts.namespace}/{facts.name}")
            elif gpu_id.startswith(OPENING_PREFIX):
                uuid = await self._wait_opening(gpu_id[len(OPENING_PREFIX):], node)
            else:
                uuid = gpu_id
            # the ConfigMap, then at once the binding: nothing else between the two calls
            await commit(self.api, facts, node, visible_devices_value(uuid, strategy),
                         state.log)
        except BaseException:
            state.ledger.unassume(facts.uid)
            if opened and not (uuid and _in_use(state.ledger.view(node), uuid)):
                await self._close(opened)
            # else: pods that joined the GPU this bind opened use it; it stays open and is
            # released by housekeeping once empty
            raise

    async def image(self) -> str:
        """The reservation pods' image: configured, else this container's own."""
        state = self.state
        if state.image:
            return state.image
        pod_name, pod_ns = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
        if not pod_name or not pod_ns:
            raise BindError("no image for reservation pods: set --reservation-image, or "
                            "POD_NAME/POD_NAMESPACE (downward API) so the extender reads its "
                            "own image")
        try:
            pod = await self.call("GET", f"/api/v1/namespaces/{pod_ns}/pods/{pod_name}")
        except kube.KubeError as exc:
            raise BindError(f"cannot read this extender's pod {pod_ns}/{pod_name} for the "
                            f"reservation image: {exc}") from None
        for c in (pod.get("spec") or {}).get("containers") or []:
            if (c.get("args") or [""])[0] == "extender" and c.get("image"):
                state.image = str(c["image"])
                return state.image
        raise BindError(f"pod {pod_ns}/{pod_name} has no container running `gpu-admission "
                        f"extender`; set --reservation-image")

    async def _open(self, reservation: str, node: str, reserved_for: str) -> str:
        state = self.state
        config = state.config
        image = await self.image()
        if image != config.image:
            config = BindConfig(**{**asdict(config), "image": image})
        body = reservation_pod(reservation, node, config, reserved_for)
        try:
            await self.call("POST", f"/api/v1/namespaces/{state.config.namespace}/pods",
                            body=body)
        except kube.KubeError as exc:
            raise BindError(f"cannot create reservation pod {state.config.namespace}/"
                            f"{reservation} on {node}: {exc}") from None
        state.metrics.reservations.labels("created").inc()
        state.metrics.gpus_opened.inc()
        state.log.info("gpu_opening", reservation=reservation, node=node, pod=reserved_for)
        uuid = await self._wait_opening(reservation, node)
        state.ledger.resolve(reservation, uuid)
        state.waiting.pop(reservation, None)  # later joiners read the UUID from the ledger
        return uuid

    async def _wait_opening(self, reservation: str, node: str) -> str:
        state = self.state
        future = state.waiting.get(reservation)
        if future is None:  # resolved meanwhile: the ledger knows the pod and its UUID
            entry = state.ledger.pods.get((state.config.namespace, reservation))
            if entry is not None and entry.gpu_uuid:
                return entry.gpu_uuid
            raise BindError(f"reservation pod {reservation} on {node} is gone")
        timeout = state.config.reservation_timeout_seconds
        start = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(future)
        except TimeoutError:
            raise BindError(
                f"reservation pod {state.config.namespace}/{reservation} on node {node} did "
                f"not publish its GPU UUID (annotation {GPU_UUID_ANNOTATION}) within "
                f"{timeout:g} s: is the device plugin out of whole GPUs, the image "
                f"unpullable, or NVML failing? (kubectl -n {state.config.namespace} describe "
                f"pod {reservation}); reservation deleted, kube-scheduler retries") from None
        finally:
            state.metrics.gpu_wait.observe(time.perf_counter() - start)

    async def _close(self, reservation: str) -> None:
        """Undo an opening: delete the reservation pod, forget it and its assumed shares."""
        state = self.state
        state.ledger.close_opening(reservation)
        future = state.waiting.pop(reservation, None)
        if future is not None and not future.done():
            # binds that joined this opening GPU fail with a reason too
            future.set_exception(BindError(f"the GPU being opened on reservation pod "
                                           f"{reservation} failed; kube-scheduler retries"))
            future.exception()  # retrieved: no "never retrieved" warning when nobody joined
        state.created.pop(reservation, None)
        await self._quietly("DELETE", f"/api/v1/namespaces/{state.config.namespace}/pods/"
                                      f"{reservation}")
        state.metrics.reservations.labels("deleted").inc()
        state.metrics.gpus_released.labels("failed").inc()

    async def _quietly(self, method: str, path: str) -> None:
        try:
            await self.call(method, path)
        except Exception as exc:  # cleanup: logged; the ledger ignores what is left
            self.state.log.warning("cleanup_failed", method=method, path=path,
                                   error=f"{type(exc).__name__}: {str(exc)[:200]}")

    # --- housekeeping ---------------------------------------------------------------------

    async def release_empty(self, now: float | None = None) -> list[str]:
        """Delete reservation pods whose GPU no fractional pod uses (older than the grace
        period, no bind in flight on them): closed in the ledger under the bind lock (no GPU
        choice sees them open again), then deleted; a failed delete is retried on the next
        round. Returns the names closed or retried."""
        state = self.state
        if not state.synced:
            return []
        now = time.time() if now is None else now
        grace = state.config.empty_grace_seconds
        deleted = []
        async with self.lock:  # no GPU choice runs while we decide; closed ones stay closed
            empty = []
            for e in state.ledger.empty_reservations():
                if e.name in state.waiting or e.name in state.ledger.opening:
                    continue
                created = state.created.get(e.name)
                if now - (_epoch(e.created) if created is None else created) < grace:
                    continue
                state.ledger.close(e.name)
                empty.append(e)
            # deletes that failed before (or still terminating): sent again, counted once
            retry = [e for e in state.ledger.pods.values()
                     if e.reservation and e.name in state.ledger.closing and e not in empty]
        for entry in empty + retry:
            await self._quietly("DELETE", f"/api/v1/namespaces/{entry.namespace}/pods/"
                                          f"{entry.name}")
            state.created.pop(entry.name, None)
            if entry in empty:
                state.metrics.reservations.labels("deleted").inc()
                state.metrics.gpus_released.labels("empty").inc()
                state.log.info("gpu_released", reservation=entry.name, node=entry.node,
                               uuid=entry.gpu_uuid)
            deleted.append(entry.name)
        return deleted

    async def advertise(self) -> list[str]:
        """Each fractional pool node's capacity ``gpu-admission.io/gpu-memory`` = its
        ``nvidia.com/gpu`` capacity x the pool's memoryMiB (MiB). Returns nodes patched."""
        state = self.state
        policy = state.policy()
        patched = []
        for name, node in list(state.nodes.items()):
            labels = (node.get("metadata") or {}).get("labels") or {}
            pool = node_pool(labels, policy)
            if pool is None:
                continue
            capacity = (node.get("status") or {}).get("capacity") or {}
            try:
                gpus = int(str(capacity.get(GPU_RESOURCE, "0")))
            except ValueError:
                gpus = 0
            want = str(gpus * pool.memory_mib)
            if str(capacity.get(GPU_MEMORY_RESOURCE)) == want:
                continue
            try:
                updated = await self.call("PATCH", f"/api/v1/nodes/{name}/status",
                                          body={"status": {"capacity": {
                                              GPU_MEMORY_RESOURCE: want}}},
                                          content_type=kube.MERGE_PATCH)
            except kube.KubeError as exc:
                state.log.warning("advertise_failed", node=name, error=str(exc))
                continue
            state.nodes[name] = updated or node
            state.log.info("gpu_memory_advertised", node=name, mib=want, pool=pool.name)
            patched.append(name)
        return patched

    async def is_leader(self) -> bool:
        """Whether this replica's kube-scheduler holds the lease (True when none is set)."""
        lease = self.state.config.leader_lease
        if not lease:
            return True
        namespace, _, name = lease.partition("/")
        me = os.environ.get("POD_NAME", "")
        try:
            body = await self.call("GET", f"/apis/coordination.k8s.io/v1/namespaces/"
                                          f"{namespace}/leases/{name}")
        except kube.KubeError:
            return False
        holder = str((body.get("spec") or {}).get("holderIdentity") or "")
        return bool(me) and holder.startswith(f"{me}_")

    async def housekeeping(self) -> None:
        while True:
            try:
                if self.state.synced and await self.is_leader():
                    await self.advertise()
                    await self.release_empty()
            except Exception as exc:  # never let the loop die
                self.state.log.warning("housekeeping_failed",
                                       error=f"{type(exc).__name__}: {str(exc)[:200]}")
            await asyncio.sleep(self.state.config.housekeeping_seconds)


def binding_body(namespace: str, name: str, uid: str, node: str) -> dict[str, Any]:
    """The ``Binding`` kube-scheduler's DefaultBinder sends
    (``pkg/scheduler/framework/plugins/defaultbinder/default_binder.go``). With the pod's
    UID the API server binds only that pod (``BindingREST.assignPod`` makes it a storage
    precondition, ``pkg/registry/core/pod/storage/storage.go``): a pod deleted and
    recreated under the same name since kube-scheduler saw it is refused (409)."""
    return {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, **({"uid": uid} if uid
                                                                 else {})},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}


async def post_binding(api: AsyncKube, namespace: str, name: str, uid: str,
                       node: str) -> None:
    """``POST pods/{name}/binding``."""
    await api.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
                      body=binding_body(namespace, name, uid, node))


async def commit(api: AsyncKube, facts: PodFacts, node: str, value: str,
                 log: FilteringBoundLogger) -> None:
    """Write the pod's own ConfigMap, then post its binding (back to back, no other call
    between them). A ConfigMap that already exists is used only when it is ours for this
    very pod (our label, owned by its UID) and names the same GPU; anything else (a
    tenant's ConfigMap under that name) is refused. A binding that fails deletes the
    ConfigMap this call made before raising, so a failed bind leaves nothing."""
    namespace, cm_name = facts.namespace, facts.configmap
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    created = False
    try:
        await api.request("POST", path, body=configmap(namespace, cm_name, facts.name,
                                                       facts.uid, value))
        created = True
    except kube.KubeError as exc:
        if exc.status != kube.HTTP_CONFLICT:
            raise BindError(f"cannot create ConfigMap {namespace}/{cm_name}: {exc}") from None
    if not created:
        existing = await api.request("GET", f"{path}/{cm_name}")
        entry = configmap_entry(existing)
        labels = (existing.get("metadata") or {}).get("labels") or {}
        if labels.get(CONFIGMAP_LABEL) != "true" or entry.owner_uid != facts.uid:
            raise BindError(f"ConfigMap {namespace}/{cm_name} already exists and was not "
                            f"created by gpu-admission for pod {facts.name} (UID "
                            f"{facts.uid}): not trusted, not used; delete it or recreate "
                            f"the pod")
        if (existing.get("data") or {}).get(GPU_CONFIGMAP_KEY) != value:
            raise BindError(f"ConfigMap {namespace}/{cm_name} (ours, from an earlier bind of "
                            f"this pod) names another GPU; not rebinding over it")
    try:
        await post_binding(api, namespace, facts.name, facts.uid, node)
    except BaseException:
        if created:
            try:
                await api.request("DELETE", f"{path}/{cm_name}")
            except Exception as exc:  # cleanup: logged; the ledger ignores what is left
                log.warning("cleanup_failed", method="DELETE", path=f"{path}/{cm_name}",
                            error=f"{type(exc).__name__}: {str(exc)[:200]}")
        raise


def _in_use(view: NodeView, gpu_id: str) -> bool:
    """Whether a GPU of the node has shares given out (bound pods or binds in flight)."""
    return any(g.gpu_id == gpu_id and g.pods > 0 for g in view.open)


def _epoch(timestamp: str) -> float:
    """Unix seconds of an RFC 3339 ``creationTimestamp`` (0 when unparsable: old enough)."""
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
