"""The webhook's Node cache: which GPU nodes exist and how they share their GPUs (issue 33).

Why: memory caps belong only on pods that will run on a shared card, and the nodes say which
cards are shared (GPU Feature Discovery's labels, :mod:`gpu_admission.facts.nodepools`). The
decision must not call the API server, so Nodes come from the project's one list/watch module
(:mod:`gpu_admission.kube.watch`: list, watch from the list's resourceVersion, 410 re-list,
back-off) into a store on the event loop, reduced to what the policy reads: the name, the
labels and the GPU resources in ``status.allocatable`` (nothing else of a Node is kept).
:meth:`NodeCache.view` builds the immutable :class:`~gpu_admission.facts.nodepools.NodeView` the
engine reads, at most once per change burst and policy.

Until the first list has arrived, or when listing Nodes is not allowed (RBAC: the webhook's
ClusterRole grants ``get``/``list``/``watch`` on ``nodes``), :meth:`view` is None: the engine
then assumes the policy's declared pools and defaults and each decision says so.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from kubernetes import client as k8s
from prometheus_client import CollectorRegistry, Counter, Gauge
from structlog.typing import FilteringBoundLogger

from gpu_admission.core.vocab import GPU_RESOURCE, MIG_RESOURCE_PREFIX
from gpu_admission.facts.nodepools import NodeView, node_view
from gpu_admission.facts.other_systems import HAMI_NODE_ANNOTATIONS
from gpu_admission.kube import client as kube
from gpu_admission.kube.watch import Resource, Watcher, WatchMetrics
from gpu_admission.policy.model import Policy

NODES: Final = Resource("nodes", "nodes")

__all__ = ["NODES", "NodeCache", "NodeMetrics", "NodeSourceError", "list_nodes", "reduce_node"]


class NodeSourceError(RuntimeError):
    """The cluster's Nodes cannot be read (message names the source and the answer)."""


def reduce_node(obj: dict[str, Any]) -> dict[str, Any]:
    """A Node reduced to what :func:`gpu_admission.facts.nodepools.node_view` reads: name, labels,
    the GPU resources of ``status.allocatable``, and whether HAMi's node annotations are
    there (their values, HAMi's device registry, are dropped)."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    status = obj.get("status")
    allocatable = status.get("allocatable") if isinstance(status, dict) else None
    annotations = meta.get("annotations")
    out: dict[str, Any] = {"kind": "Node", "metadata": {
        "name": meta.get("name", ""), "labels": dict(meta.get("labels") or {}),
        "annotations": {k: "" for k in HAMI_NODE_ANNOTATIONS
                        if isinstance(annotations, dict) and k in annotations}}}
    if isinstance(allocatable, dict):
        out["status"] = {"allocatable": {
            k: v for k, v in allocatable.items()
            if isinstance(k, str) and k.startswith((GPU_RESOURCE, MIG_RESOURCE_PREFIX))}}
    return out


def list_nodes(source: str) -> list[dict[str, Any]]:
    """One list of the cluster's Nodes, reduced (:func:`reduce_node`), for ``gpu-admission
    evaluate --kubeconfig``. ``source``: a kubeconfig path or ``in-cluster``. Blocking."""
    try:
        client = kube.api_client(source, pool_size=2)
    except kube.KubeSourceError as exc:
        raise NodeSourceError(str(exc)) from None
    try:
        body = kube.collection_caller(client, NODES.path("v1"))(_request_timeout=(10, 60))
    except k8s.ApiException as exc:
        raise NodeSourceError(f"listing nodes failed: HTTP {exc.status} {exc.reason}") from None
    except Exception as exc:  # connection refused, TLS, timeouts
        raise NodeSourceError(f"listing nodes failed: {type(exc).__name__}: "
                              f"{str(exc)[:200]}") from None
    finally:
        client.close()  # type: ignore[no-untyped-call]
    return [reduce_node(item) for item in body.get("items") or [] if isinstance(item, dict)]


class NodeMetrics:
    """The cache's series, on the server's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.synced = Gauge("gpu_admission_node_cache_synced",
                            "1 once Nodes have been listed (0: the policy's pools are assumed).",
                            registry=registry)
        self.events = Counter("gpu_admission_node_cache_events",
                              "Node watch events, by type.", ["resource", "type"],
                              registry=registry)
        self.lists = Counter("gpu_admission_node_cache_lists",
                             "Node lists, by reason (initial, gone, error).",
                             ["resource", "reason"], registry=registry)
        self.errors = Counter("gpu_admission_node_cache_errors",
                              "Failed Node lists/watches (e.g. 403: no RBAC for nodes).",
                              ["resource"], registry=registry)
        self.gpu_nodes = Gauge("gpu_admission_node_cache_gpu_nodes",
                               "GPU nodes (GFD labels or a declared pool) in the cache.",
                               registry=registry)


class NodeCache:
    """Nodes on the event loop, fed by a :class:`~gpu_admission.kube.watch.Watcher`."""

    def __init__(self, client: k8s.ApiClient, *, metrics: NodeMetrics,
                 log: FilteringBoundLogger, watch_timeout_seconds: int = 300,
                 backoff_seconds: float = 1.0, max_backoff_seconds: float = 30.0) -> None:
        self._client = client
        self.metrics = metrics
        self._log = log
        self._watcher = Watcher(
            client, (NODES,), on_replace=self._replace, on_event=self._apply,
            metrics=WatchMetrics(metrics.events, metrics.lists, metrics.errors), log=log,
            event_prefix="node", watch_timeout_seconds=watch_timeout_seconds,
            backoff_seconds=backoff_seconds, max_backoff_seconds=max_backoff_seconds)
        self._nodes: dict[str, dict[str, Any]] = {}  # event loop only
        self.synced = False
        self._view: NodeView | None = None
        self._view_policy: Policy | None = None
        self._dirty = True

    def view(self, policy: Policy) -> NodeView | None:
        """The GPU nodes as pools of ``policy`` (rebuilt after a change or a new policy);
        None before the first list or when no node is a GPU node. Event loop only."""
        if not self.synced:
            return None
        if self._dirty or self._view_policy is not policy:
            self._dirty = False
            self._view_policy = policy
            self._view = node_view(self._nodes.values(), policy, "nodes from the watch")
            self.metrics.gpu_nodes.set(len(self._view.nodes) if self._view else 0)
        return self._view

    def _replace(self, resource: str, items: list[dict[str, Any]]) -> None:
        self._nodes = {}
        for obj in items:
            node = reduce_node(obj)
            self._nodes[node["metadata"]["name"]] = node
        self._dirty = True
        if not self.synced:
            self.synced = True
            self.metrics.synced.set(1)
            self._log.info("node_cache_synced", nodes=len(self._nodes))

    def _apply(self, resource: str, kind: str, obj: dict[str, Any]) -> None:
        node = reduce_node(obj)
        name = node["metadata"]["name"]
        if kind == "DELETED":
            self._dirty = self._nodes.pop(name, None) is not None or self._dirty
        elif self._nodes.get(name) != node:  # kubelet status updates change nothing kept
            self._nodes[name] = node
            self._dirty = True

    def start(self) -> None:
        """Start the list/watch thread (call on the event loop)."""
        self._watcher.start()

    async def stop(self, join_seconds: float = 2.0) -> None:
        """Stop the watch and close the client."""
        await self._watcher.stop(join_seconds)
        await asyncio.to_thread(self._client.close)
