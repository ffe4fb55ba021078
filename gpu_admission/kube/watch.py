"""The one list/watch cache machinery (a client-go informer, reduced): every face that
watches the API server uses it (the webhook's DRA cache, :mod:`gpu_admission.kube.dra`; the
extender's GPU ledger, :mod:`gpu_admission.extender.kubestate`).

Per resource, in a thread of its own (the real ``kubernetes`` client blocks):

* **list, then watch** from the list's ``resourceVersion``, with ``allowWatchBookmarks``
  (bookmarks only move the resourceVersion on);
* on **410 Gone** (an ``ERROR`` event with code 410, or the HTTP status) the resourceVersion is
  too old: **re-list** (the owner replaces its store) and watch again; other errors: back off
  (doubling, capped), re-list;
* a watch that ends normally (``timeoutSeconds``) is resumed from the last resourceVersion;
* a resource the API server does not serve (404, or no version of its group in discovery)
  counts as listed and empty, and is looked up again every :data:`NOT_SERVED_RETRY_SECONDS`;
* for an API group served in several versions (``resource.k8s.io`` v1 / v1beta2 / v1beta1)
  the first served of :attr:`Resource.versions` is chosen by discovery before each list, and
  :attr:`Watcher.versions` says which one is watched.

Docs: https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes
and #watch-bookmarks. Every list and change is handed to the event loop with
``loop.call_soon_threadsafe`` (``on_replace(resource, items)``, ``on_event(resource, type,
obj)``), so the owner's store is only ever touched by the loop: nothing on a request path
blocks or takes a lock.
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
from kubernetes import watch as k8s_watch
from prometheus_client import Counter
from structlog.typing import FilteringBoundLogger

from gpu_admission.kube.client import (
    HTTP_GONE,
    HTTP_NOT_FOUND,
    collection_caller,
    served_version,
)

#: Seconds between lists of a resource the API server does not serve: it counts as listed
#: and empty meanwhile (an upgrade that adds the API is noticed within this time).
NOT_SERVED_RETRY_SECONDS: Final = 60.0


@dataclass(frozen=True, slots=True)
class Resource:
    """One watched collection, cluster-wide: ``/api/<version>/<plural>`` for the core group
    (``group=""``) or ``/apis/<group>/<version>/<plural>``."""

    name: str  # key the owner knows it by, e.g. "resourceclaims"
    plural: str
    group: str = ""
    versions: tuple[str, ...] = ("v1",)  # preferred first
    label_selector: str = ""
    field_selector: str = ""

    def path(self, version: str) -> str:
        if not self.group:
            return f"/api/{version}/{self.plural}"
        return f"/apis/{self.group}/{version}/{self.plural}"


@dataclass(frozen=True, slots=True)
class WatchMetrics:
    """Counters the watcher feeds (the owner names them): ``events`` labelled (resource,
    type), ``lists`` (resource, reason: initial | gone | error), ``errors`` (resource)."""

    events: Counter
    lists: Counter
    errors: Counter


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): re-list."""


class _NotServed(Exception):
    """The API server does not serve the resource (404): nothing to cache."""


class Watcher:
    """List+watch of ``resources`` in threads; callbacks run on the event loop."""

    def __init__(self, client: k8s.ApiClient, resources: tuple[Resource, ...], *,
                 on_replace: Callable[[str, list[dict[str, Any]]], None],
                 on_event: Callable[[str, str, dict[str, Any]], None],
                 metrics: WatchMetrics, log: FilteringBoundLogger, event_prefix: str,
                 watch_timeout_seconds: int = 300, backoff_seconds: float = 1.0,
                 max_backoff_seconds: float = 30.0) -> None:
        self.client = client
        self.resources = resources
        self._on_replace = on_replace
        self._on_event = on_event
        self.metrics = metrics
        self._log = log
        self._prefix = event_prefix
        self._timeout = watch_timeout_seconds
        self._backoff = backoff_seconds
        self._max_backoff = max_backoff_seconds
        #: resource name -> the API version watched ("" until found; "none" when the API
        #: server serves none of the versions). Written by the threads, read anywhere.
        self.versions: dict[str, str] = {r.name: "" for r in resources}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: dict[str, k8s_watch.Watch] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Start one list/watch thread per resource (call on the event loop)."""
        self._loop = asyncio.get_running_loop()
        self._stop.clear()
        for r in self.resources:
            thread = threading.Thread(target=self._run, args=(r,),
                                      name=f"{self._prefix}-watch-{r.name}", daemon=True)
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
                path = self._path(resource)
                version = self._list(resource, path, reason)
                delay = self._backoff
                self._watch(resource, path, version)
            except _NotServed:
                reason = "error"
                self._stop.wait(NOT_SERVED_RETRY_SECONDS)
            except _Gone:
                reason = "gone"
                self._log.info(f"{self._prefix}_watch_expired", resource=resource.name,
                               action="re-listing")
            except Exception as exc:
                if self._stop.is_set():
                    return
                reason = "error"
                self.metrics.errors.labels(resource.name).inc()
                self._log.warning(f"{self._prefix}_watch_failed", resource=resource.name,
                                  error=f"{type(exc).__name__}: {str(exc)[:300]}",
                                  retry_in_seconds=delay)
                self._stop.wait(delay)
                delay = min(delay * 2, self._max_backoff)

    def _not_served(self, resource: Resource, reason: str) -> _NotServed:
        self.versions[resource.name] = "none"
        self.metrics.lists.labels(resource.name, reason).inc()
        self._log.warning(f"{self._prefix}_api_not_served", resource=resource.name,
                          versions=list(resource.versions),
                          retry_in_seconds=NOT_SERVED_RETRY_SECONDS)
        self._post(self._on_replace, resource.name, [])
        return _NotServed()

    def _path(self, resource: Resource) -> str:
        """The collection path in the version to watch (discovery for multi-version
        groups)."""
        if not resource.group or len(resource.versions) == 1:
            version = resource.versions[0]
        else:
            found = served_version(self.client, resource.group, resource.versions)
            if found is None:
                raise self._not_served(resource, "error")
            version = found
        if self.versions.get(resource.name) != version:
            self._log.info(f"{self._prefix}_api_version", resource=resource.name,
                           api_version=f"{resource.group}/{version}" if resource.group
                           else version)
        self.versions[resource.name] = version
        return resource.path(version)

    def _caller(self, resource: Resource, path: str) -> Callable[..., Any]:
        return collection_caller(self.client, path, label_selector=resource.label_selector,
                                 field_selector=resource.field_selector)

    def _list(self, resource: Resource, path: str, reason: str) -> str:
        try:
            response = self._caller(resource, path)(_preload_content=False,
                                                    _request_timeout=(10, 60))
        except k8s.ApiException as exc:
            if exc.status == HTTP_GONE:
                raise _Gone from None
            if exc.status == HTTP_NOT_FOUND:
                raise self._not_served(resource, reason) from None
            raise
        body = orjson.loads(response.data)
        items = body.get("items") or []
        version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        self.metrics.lists.labels(resource.name, reason).inc()
        self._post(self._on_replace, resource.name, items)
        return version

    def _watch(self, resource: Resource, path: str, version: str) -> None:
        fn = self._caller(resource, path)
        while not self._stop.is_set():
            # return_type=object: events stay plain dicts (no model lookup). Not
            # deserialize=False: Watch then fails on an ERROR event (it reads
            # event["raw_object"], set only when deserialising), so a 410 would look like a
            # broken connection.
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
                        self._post(self._on_event, resource.name, str(kind), obj)
            except k8s.ApiException as exc:
                if exc.status == HTTP_GONE:
                    raise _Gone from None
                raise
            finally:
                self._watches.pop(resource.name, None)


def _join(threads: list[threading.Thread], timeout: float) -> None:
    for thread in threads:
        thread.join(timeout)
