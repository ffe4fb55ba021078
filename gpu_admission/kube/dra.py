"""The watch-backed DRA cache the webhook server keeps: DeviceClasses, ResourceClaimTemplates,
ResourceClaims, and which pods name which ResourceClaim.

Why: the decision must not call the API server (a webhook on the pod path that blocks on the
API server is a latency and availability risk), yet a DRA pod can only be judged with the
objects it names (``shared/reference/dra-gpus.md`` §1.2). The list/watch machinery (threads,
410 re-list, bookmarks, back-off, APIs not served) is the project's one watch module,
:mod:`gpu_admission.kube.watch`; this module keeps the DRA store on the event loop and builds
the immutable :class:`~gpu_admission.dra.model.DraSnapshot` the engine reads (lazily, at most
once per change burst), so nothing on the request path blocks or takes a lock.

``resource.k8s.io`` is watched in the version the API server serves, found by discovery:
v1 (Kubernetes 1.34+), else v1beta2 (1.33), else v1beta1 (1.32); :attr:`DraCache.api_version`
says which (the webhook's ``/readyz`` reports it). Objects are handed on unchanged: reading the
older shapes is :mod:`gpu_admission.dra.analysis`'s job.

Pods are reduced to the claim names they reference (S3 only needs counts), so the pod watch
costs little memory. ``managedFields`` are dropped from stored objects.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from kubernetes import client as k8s
from prometheus_client import CollectorRegistry, Counter, Gauge
from structlog.typing import FilteringBoundLogger

from gpu_admission.core import vocab
from gpu_admission.dra.model import (
    DraSnapshot,
    DraSourceError,
    Key,
    object_key,
    pod_claim_names,
)
from gpu_admission.kube import client as kube
from gpu_admission.kube.watch import NOT_SERVED_RETRY_SECONDS, Resource, Watcher, WatchMetrics

IN_CLUSTER: Final = vocab.IN_CLUSTER
DRA_GROUP: Final = "resource.k8s.io"
#: resource.k8s.io versions, preferred first: v1 (GA, Kubernetes 1.34), v1beta2 (1.33),
#: v1beta1 (1.32). https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/
DRA_VERSIONS: Final = ("v1", "v1beta2", "v1beta1")

__all__ = ["DRA_VERSIONS", "IN_CLUSTER", "NOT_SERVED_RETRY_SECONDS", "RESOURCES", "CacheMetrics",
           "DraCache", "api_client", "list_objects"]

RESOURCES: Final = (
    Resource("deviceclasses", "deviceclasses", DRA_GROUP, DRA_VERSIONS),
    Resource("resourceclaimtemplates", "resourceclaimtemplates", DRA_GROUP, DRA_VERSIONS),
    Resource("resourceclaims", "resourceclaims", DRA_GROUP, DRA_VERSIONS),
    Resource("pods", "pods"),
)


def api_client(source: str) -> k8s.ApiClient:
    """A client for ``source``: ``in-cluster`` (the pod's ServiceAccount) or a kubeconfig
    path. Blocking (reads files): call it at startup."""
    try:
        return kube.api_client(source, pool_size=len(RESOURCES) + 2)
    except kube.KubeSourceError as exc:
        raise DraSourceError(str(exc)) from None


_KINDS: Final = {"deviceclasses": "DeviceClass", "resourceclaimtemplates":
                  "ResourceClaimTemplate", "resourceclaims": "ResourceClaim", "pods": "Pod"}


def list_objects(source: str) -> dict[str, list[dict[str, Any]]]:
    """One list of each watched resource (``gpu-admission evaluate --kubeconfig``), by kind, in
    the DRA version the cluster serves. Blocking. Raises DraSourceError with the resource
    and the API server's answer."""
    client = api_client(source)
    out: dict[str, list[dict[str, Any]]] = {}
    try:
        try:
            version = kube.served_version(client, DRA_GROUP, DRA_VERSIONS)
        except Exception as exc:  # connection refused, TLS, timeouts
            raise DraSourceError(f"listing {RESOURCES[0].name} failed: discovery of "
                                 f"{DRA_GROUP}: {type(exc).__name__}: "
                                 f"{str(exc)[:200]}") from None
        for r in RESOURCES:
            kind = _KINDS[r.name]
            if r.group and version is None:
                out[kind] = []  # no resource.k8s.io in this cluster
                continue
            group = f"{r.group}/{version}" if r.group else "v1"
            try:
                body = kube.collection_caller(client, r.path(version or "v1"))(
                    _request_timeout=(10, 60))
            except k8s.ApiException as exc:
                if exc.status == kube.HTTP_NOT_FOUND:
                    out[kind] = []
                    continue
                raise DraSourceError(f"listing {r.name} failed: HTTP {exc.status} "
                                     f"{exc.reason}") from None
            except Exception as exc:  # connection refused, TLS, timeouts
                raise DraSourceError(f"listing {r.name} failed: "
                                     f"{type(exc).__name__}: {str(exc)[:200]}") from None
            items = body.get("items") or []
            # list items lack kind and apiVersion: restore them, in the version served
            out[kind] = [{**item, "kind": kind, "apiVersion": item.get("apiVersion", group)}
                         for item in items]
    finally:
        client.close()  # type: ignore[no-untyped-call]
    return out


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
    """The DRA store on the event loop, fed by a :class:`~gpu_admission.kube.watch.Watcher`;
    :meth:`snapshot` on the event loop."""

    def __init__(self, client: k8s.ApiClient, *, metrics: CacheMetrics,
                 log: FilteringBoundLogger, watch_timeout_seconds: int = 300,
                 backoff_seconds: float = 1.0, max_backoff_seconds: float = 30.0) -> None:
        self._client = client
        self.metrics = metrics
        self._log = log
        self._watcher = Watcher(
            client, RESOURCES, on_replace=self._replace, on_event=self._apply,
            metrics=WatchMetrics(metrics.events, metrics.lists, metrics.errors), log=log,
            event_prefix="dra", watch_timeout_seconds=watch_timeout_seconds,
            backoff_seconds=backoff_seconds, max_backoff_seconds=max_backoff_seconds)
        # Owned by the event loop thread only:
        self._stores: dict[str, dict[Key, Any]] = {r.name: {} for r in RESOURCES}
        self._listed: set[str] = set()
        self._snapshot = DraSnapshot(synced=False)
        self._dirty = False
        for r in RESOURCES:
            metrics.objects.labels(r.name).set_function(
                lambda name=r.name: len(self._stores[name]))  # type: ignore[misc]

    # --- the event loop side ------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return len(self._listed) == len(RESOURCES)

    @property
    def api_version(self) -> str:
        """The ``resource.k8s.io`` version watched: ``resource.k8s.io/v1`` (or v1beta2,
        v1beta1), ``none`` when the API server serves none, "" before discovery."""
        version = self._watcher.versions.get("resourceclaims", "")
        return f"{DRA_GROUP}/{version}" if version not in ("", "none") else version

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
            self._log.info("dra_cache_synced", api_version=self.api_version,
                           **{r: len(s) for r, s in self._stores.items()})

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
        self._watcher.start()

    async def stop(self, join_seconds: float = 2.0) -> None:
        """Stop the watches and close the client."""
        await self._watcher.stop(join_seconds)
        await asyncio.to_thread(self._client.close)
