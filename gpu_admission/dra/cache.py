"""The watch-backed DRA cache the webhook server keeps: DeviceClasses, ResourceClaimTemplates,
ResourceClaims, and which pods name which ResourceClaim.

Why: the decision must not call the API server (a webhook on the pod path that blocks on the
API server is a latency and availability risk), yet a DRA pod can only be judged with the
objects it names (``shared/reference/dra-gpus.md`` §1.2). So, like a client-go informer:

* **list, then watch** from the list's ``resourceVersion``, with ``allowWatchBookmarks``
  (bookmarks only move the resourceVersion on), per resource, ``resource.k8s.io/v1`` explicitly;
* on **410 Gone** (an ``ERROR`` event with code 410, or the HTTP status) the resourceVersion is
  too old: **re-list** (replacing the store) and watch again; other errors: back off, re-list;
* a watch that ends normally (``timeoutSeconds``) is resumed from the last resourceVersion.

Docs: https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes
and #watch-bookmarks. The real ``kubernetes`` client runs the blocking list/watch calls in one
thread per resource; every change is handed to the event loop with
``loop.call_soon_threadsafe``, and the loop builds the immutable
:class:`~gpu_admission.dra.model.DraSnapshot` the engine reads (lazily, at most once per
change burst), so nothing on the request path blocks or takes a lock.

Pods are reduced to the claim names they reference (S3 only needs counts), so the pod watch
costs little memory. ``managedFields`` are dropped from stored objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.config.config_exception import ConfigException
from prometheus_client import CollectorRegistry, Counter, Gauge
from structlog.typing import FilteringBoundLogger

from gpu_admission.dra.model import (
    DraSnapshot,
    DraSourceError,
    Key,
    object_key,
    pod_claim_names,
)

IN_CLUSTER: Final = "in-cluster"
HTTP_GONE: Final = 410
HTTP_NOT_FOUND: Final = 404
#: Seconds between lists of a resource the API server does not serve (404: a cluster before
#: resource.k8s.io/v1, i.e. Kubernetes < 1.34): it counts as listed and empty meanwhile.
NOT_SERVED_RETRY_SECONDS: Final = 60.0


@dataclass(frozen=True, slots=True)
class Resource:
    """One watched resource: its plural name, the list function and the API it belongs to."""

    name: str  # e.g. "resourceclaims"
    api: str  # "resource" (ResourceV1Api) | "core" (CoreV1Api)
    list_method: str


RESOURCES: Final = (
    Resource("deviceclasses", "resource", "list_device_class"),
    Resource("resourceclaimtemplates", "resource",
             "list_resource_claim_template_for_all_namespaces"),
    Resource("resourceclaims", "resource", "list_resource_claim_for_all_namespaces"),
    Resource("pods", "core", "list_pod_for_all_namespaces"),
)


def api_client(source: str) -> k8s.ApiClient:
    """A client for ``source``: ``in-cluster`` (the pod's ServiceAccount) or a kubeconfig
    path. Blocking (reads files): call it at startup."""
    configuration = k8s.Configuration()
    try:
        if source == IN_CLUSTER:
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration)
        else:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=source, client_configuration=configuration)
    except (ConfigException, OSError, ValueError, TypeError) as exc:
        where = "in-cluster ServiceAccount" if source == IN_CLUSTER else f"kubeconfig {source}"
        raise DraSourceError(f"cannot load the {where}: {exc}") from None
    configuration.connection_pool_maxsize = len(RESOURCES) + 2
    return k8s.ApiClient(configuration)


_KINDS: Final = {"deviceclasses": "DeviceClass", "resourceclaimtemplates":
                  "ResourceClaimTemplate", "resourceclaims": "ResourceClaim", "pods": "Pod"}


def list_objects(source: str) -> dict[str, list[dict[str, Any]]]:
    """One list of each watched resource (``gpu-admission evaluate --cluster``), by kind.
    Blocking. Raises DraSourceError with the resource and the API server's answer."""
    client = api_client(source)
    apis = {"resource": k8s.ResourceV1Api(client), "core": k8s.CoreV1Api(client)}
    out: dict[str, list[dict[str, Any]]] = {}
    try:
        for r in RESOURCES:
            kind = _KINDS[r.name]
            try:
                response = getattr(apis[r.api], r.list_method)(
                    _preload_content=False, _request_timeout=(10, 60))
            except k8s.ApiException as exc:
                if exc.status == HTTP_NOT_FOUND:  # no resource.k8s.io/v1 in this cluster
                    out[kind] = []
                    continue
                raise DraSourceError(f"listing {r.name} failed: HTTP {exc.status} "
                                     f"{exc.reason}") from None
            except Exception as exc:  # connection refused, TLS, timeouts
                raise DraSourceError(f"listing {r.name} failed: "
                                     f"{type(exc).__name__}: {str(exc)[:200]}") from None
            items = orjson.loads(response.data).get("items") or []
            out[kind] = [{**item, "kind": kind} for item in items]  # list items lack kind
    finally:
        client.close()  # type: ignore[no-untyped-call]
    return out


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): re-list."""


class _NotServed(Exception):
    """The API server does not serve the resource (404): nothing to cache."""


class CacheMetrics:
    """The cache's series, on the server's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.synced = Gauge("gpu_admission_dra_cache_synced",
                            "1 once every DRA resource has been listed.", registry=registry)
        self.events = Counter("gpu_admission_dra_cache_events",
                              "Watch events applied to the DRA cache, by resource and type "
                              "(ADDED, MODIFIED, DELETED, BOOKMARK).", ["resource", "type"],
                              registry=registry)
        self.lists = Counter("gpu_admission_dra_cache_lists",
                             "Lists of a DRA resource, by reason (initial, gone = 410 on the "
                             "watch, error = after a failed list/watch).",
                             ["resource", "reason"], registry=registry)
        self.errors = Counter("gpu_admission_dra_cache_errors",
                              "Failed lists/watches of a DRA resource.", ["resource"],
                              registry=registry)
        self.objects = Gauge("gpu_admission_dra_cache_objects",
                             "Objects in the DRA cache (pods: only those naming a claim).",
                             ["resource"], registry=registry)


class DraCache:
    """List+watch of the DRA resources in threads; :meth:`snapshot` on the event loop."""

    def __init__(self, client: k8s.ApiClient, *, metrics: CacheMetrics,
                 log: FilteringBoundLogger, watch_timeout_seconds: int = 300,
                 backoff_seconds: float = 1.0, max_backoff_seconds: float = 30.0) -> None:
        self._client = client
        self._apis = {"resource": k8s.ResourceV1Api(client), "core": k8s.CoreV1Api(client)}
        self.metrics = metrics
        self._log = log
        self._timeout = watch_timeout_seconds
        self._backoff = backoff_seconds
        self._max_backoff = max_backoff_seconds
        # Owned by the event loop thread only:
        self._stores: dict[str, dict[Key, Any]] = {r.name: {} for r in RESOURCES}
        self._listed: set[str] = set()
        self._snapshot = DraSnapshot(synced=False)
        self._dirty = False
        # Shared with the threads:
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: dict[str, k8s_watch.Watch] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        for r in RESOURCES:
            metrics.objects.labels(r.name).set_function(
                lambda name=r.name: len(self._stores[name]))  # type: ignore[misc]

    # --- the event loop side ------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return len(self._listed) == len(RESOURCES)

    def snapshot(self) -> DraSnapshot:
        """The current immutable snapshot (rebuilt only after a change). Event loop only."""
        if self._dirty:
            self._dirty = False
            users: dict[Key, set[str]] = {}
            for (namespace, pod), names in self._stores["pods"].items():
                for name in names:
                    users.setdefault((namespace, name), set()).add(f"{namespace}/{pod}")
            self._snapshot = DraSnapshot.build(
                classes=self._stores["deviceclasses"].values(),
                templates=self._stores["resourceclaimtemplates"].values(),
                claims=self._stores["resourceclaims"].values(), claim_users=users,
                synced=self.synced)
        return self._snapshot

    def _replace(self, resource: str, items: list[dict[str, Any]]) -> None:
        store = self._stores[resource]
        store.clear()
        for obj in items:
            self._put(resource, store, obj)
        first = resource not in self._listed
        self._listed.add(resource)
        self._dirty = True
        if first and self.synced:
            self.metrics.synced.set(1)
            self._log.info("dra_cache_synced", **{r: len(s) for r, s in self._stores.items()})

    def _apply(self, resource: str, kind: str, obj: dict[str, Any]) -> None:
        store = self._stores[resource]
        if kind == "DELETED":
            store.pop(object_key(obj), None)
        else:
            self._put(resource, store, obj)
        self._dirty = True

    @staticmethod
    def _put(resource: str, store: dict[Key, Any], obj: dict[str, Any]) -> None:
        key = object_key(obj)
        if resource == "pods":
            names = pod_claim_names(obj)
            if names:
                store[key] = names
            else:
                store.pop(key, None)
            return
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            meta.pop("managedFields", None)
        store[key] = obj

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start one list/watch thread per resource (call on the event loop)."""
        self._loop = asyncio.get_running_loop()
        self._stop.clear()
        for r in RESOURCES:
            thread = threading.Thread(target=self._run, args=(r,), name=f"dra-watch-{r.name}",
                                      daemon=True)
            self._threads.append(thread)
            thread.start()

    async def stop(self, join_seconds: float = 2.0) -> None:
        """Stop the threads: flag, stop the watches, cut their connections, join."""
        self._stop.set()
        for w in list(self._watches.values()):
            w.stop()  # type: ignore[no-untyped-call]
            resp = getattr(w, "_resp", None)
            if resp is not None:
                with contextlib.suppress(Exception):
                    resp.shutdown()  # unblocks a read waiting for the next event
        threads, self._threads = self._threads, []
        await asyncio.to_thread(_join, threads, join_seconds)
        await asyncio.to_thread(self._client.close)

    # --- the thread side --------------------------------------------------------------------

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not self._stop.is_set():
            with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                loop.call_soon_threadsafe(fn, *args)

    def _run(self, resource: Resource) -> None:
        reason, delay = "initial", self._backoff
        while not self._stop.is_set():
            try:
                version = self._list(resource, reason)
                delay = self._backoff
                self._watch(resource, version)
            except _NotServed:
                reason = "error"
                self._stop.wait(NOT_SERVED_RETRY_SECONDS)
            except _Gone:
                reason = "gone"
                self._log.info("dra_watch_expired", resource=resource.name,
                               action="re-listing")
            except Exception as exc:
                if self._stop.is_set():
                    return
                reason = "error"
                self.metrics.errors.labels(resource.name).inc()
                self._log.warning("dra_watch_failed", resource=resource.name,
                                  error=f"{type(exc).__name__}: {str(exc)[:300]}",
                                  retry_in_seconds=delay)
                self._stop.wait(delay)
                delay = min(delay * 2, self._max_backoff)

    def _list(self, resource: Resource, reason: str) -> str:
        fn = getattr(self._apis[resource.api], resource.list_method)
        try:
            response = fn(_preload_content=False, _request_timeout=(10, 60))
        except k8s.ApiException as exc:
            if exc.status == HTTP_GONE:
                raise _Gone from None
            if exc.status == HTTP_NOT_FOUND:
                # No such API (cluster without resource.k8s.io/v1): nothing can name it, so
                # the cache is complete while empty; look again later (an upgrade).
                self.metrics.lists.labels(resource.name, reason).inc()
                self._log.warning("dra_api_not_served", resource=resource.name,
                                  retry_in_seconds=NOT_SERVED_RETRY_SECONDS)
                self._post(self._replace, resource.name, [])
                raise _NotServed from None
            raise
        body = orjson.loads(response.data)
        items = body.get("items") or []
        version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        self.metrics.lists.labels(resource.name, reason).inc()
        self._post(self._replace, resource.name, items)
        return version

    def _watch(self, resource: Resource, version: str) -> None:
        fn = getattr(self._apis[resource.api], resource.list_method)
        while not self._stop.is_set():
            # return_type=object: events stay plain dicts. Without it Watch derives the model
            # from the list method's docstring, "V1ResourceClaim", which kubernetes 37 lacks
            # (the model is ResourceV1ResourceClaim). Not deserialize=False either: Watch then
            # fails on an ERROR event (it reads event["raw_object"], set only when
            # deserializing), so a 410 would look like a broken connection.
            w = k8s_watch.Watch(return_type=object)  # type: ignore[no-untyped-call]
            self._watches[resource.name] = w
            try:
                for event in w.stream(  # type: ignore[no-untyped-call]
                        fn, resource_version=version, allow_watch_bookmarks=True,
                        timeout_seconds=self._timeout, _request_timeout=(10, self._timeout + 30)):
                    kind, obj = event.get("type"), event.get("raw_object")
                    if not isinstance(obj, dict):
                        continue
                    meta = obj.get("metadata")
                    if isinstance(meta, Mapping) and meta.get("resourceVersion"):
                        version = str(meta["resourceVersion"])
                    self.metrics.events.labels(resource.name, str(kind)).inc()
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self._post(self._apply, resource.name, kind, obj)
            except k8s.ApiException as exc:
                if exc.status == HTTP_GONE:
                    raise _Gone from None
                raise
            finally:
                self._watches.pop(resource.name, None)


def _join(threads: list[threading.Thread], timeout: float) -> None:
    for thread in threads:
        thread.join(timeout)
