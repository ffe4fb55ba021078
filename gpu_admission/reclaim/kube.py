"""The Kubernetes half of ``gpu-admission reclaim``: read the cluster once per interval, write
notices, scale-downs and restores. Blocking (the real ``kubernetes`` client's REST layer);
the controller is a plain loop, never an event loop.

Requests are the API server's own (https://kubernetes.io/docs/reference/using-api/
api-concepts/): plain lists (``GET <collection>``) of pods, namespaces, ReplicaSets,
Deployments, StatefulSets and Kubeflow Notebooks; JSON merge patches (RFC 7386,
``application/merge-patch+json``: ``null`` deletes a key) for annotations; the ``scale``
subresource (``autoscaling/v1`` Scale, ``GET`` then ``PUT`` with the read
``resourceVersion``, so a concurrent change is a 409 rather than a lost update) for
replicas; ``core/v1`` Events with deterministic names (a repeated notice is a 409, not a
second Event).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
import urllib3
from kubernetes import client as k8s

from gpu_admission.core import vocab
from gpu_admission.core.timeframe import iso
from gpu_admission.kube import client as kube_client
from gpu_admission.reclaim.names import (
    DEPLOYMENT,
    EVENT_COMPONENT,
    NOTEBOOK,
    STATEFULSET,
)
from gpu_admission.reclaim.plan import Cluster, Owner
from gpu_admission.usage.prom import connection_reason

IN_CLUSTER: Final = vocab.IN_CLUSTER
MERGE_PATCH: Final = kube_client.MERGE_PATCH
HTTP_NOT_FOUND: Final = kube_client.HTTP_NOT_FOUND
HTTP_CONFLICT: Final = kube_client.HTTP_CONFLICT
TIMEOUT: Final = (10, 60)  # s: connect, read

PLURALS: Final = {DEPLOYMENT: "deployments", STATEFULSET: "statefulsets",
                  NOTEBOOK: "notebooks"}


class KubeError(Exception):
    """An API request failed; ``str()`` names the request and the answer."""

    def __init__(self, what: str, status: int | None, detail: str) -> None:
        self.what = what
        self.status = status
        super().__init__(f"{what}: {f'HTTP {status} ' if status else ''}{detail}")


def api_client(source: str) -> k8s.ApiClient:
    """``in-cluster`` (the pod's ServiceAccount) or a kubeconfig path, through
    :func:`gpu_admission.kube.client.api_client` (one connection: the loop is sequential)."""
    try:
        return kube_client.api_client(source, pool_size=1)
    except kube_client.KubeSourceError as exc:
        raise KubeError("loading the client configuration", None, str(exc)) from None


class Kube:
    """JSON requests through the ``kubernetes`` client (its auth, TLS and connection pool)."""

    def __init__(self, client: k8s.ApiClient) -> None:
        self.client = client
        self.requests = 0

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]

    def request(self, method: str, path: str, body: Any = None, *,
                content_type: str = "application/json",
                query: Mapping[str, str] | None = None, missing_ok: bool = False,
                conflict_ok: bool = False) -> dict[str, Any] | None:
        """One request; the decoded JSON answer, or None for an allowed 404/409."""
        what = f"{method} {path}"
        self.requests += 1
        try:
            response = kube_client.raw_request(self.client, method, path, query=query,
                                               body=body, content_type=content_type,
                                               timeout=TIMEOUT)
            data = response.read()
        except k8s.ApiException as exc:
            status, data = exc.status or 0, exc.body
            reason = str(exc.reason)
        except urllib3.exceptions.MaxRetryError as exc:
            raise KubeError(what, None, "cannot reach the API server: "
                            f"{connection_reason(exc.reason or exc)}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(what, None, "cannot reach the API server: "
                            f"{connection_reason(exc)}") from None
        else:
            status, reason = response.status, str(response.reason or "")
        if status >= 300:
            if (status == HTTP_NOT_FOUND and missing_ok) or (status == HTTP_CONFLICT
                                                             and conflict_ok):
                return None
            error = kube_client.error_from(status, reason, data if isinstance(data, bytes)
                                           else (data or "").encode())
            raise KubeError(what, status, error.message[:300] or error.reason)
        try:
            decoded: Any = orjson.loads(data) if data else {}
        except orjson.JSONDecodeError:
            raise KubeError(what, status, "the answer is not JSON") from None
        return decoded if isinstance(decoded, dict) else {}

    def list(self, path: str, *, missing_ok: bool = False) -> list[dict[str, Any]]:
        data = self.request("GET", path, missing_ok=missing_ok)
        return list((data or {}).get("items") or [])

    # --- reading ---------------------------------------------------------------------

    def read_cluster(self) -> Cluster:
        """Pods, namespaces and the owners reclaim may act on: one list each. A cluster
        without Kubeflow (no ``notebooks`` resource: 404) has no Notebooks."""
        def by_key(items: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
            return {(str(i["metadata"].get("namespace", "")), str(i["metadata"]["name"])): i
                    for i in items}

        namespaces = {str(n["metadata"]["name"]): dict(n["metadata"].get("labels") or {})
                      for n in self.list("/api/v1/namespaces")}
        return Cluster(
            pods=self.list("/api/v1/pods"), namespaces=namespaces,
            replicasets=by_key(self.list("/apis/apps/v1/replicasets")),
            deployments=by_key(self.list("/apis/apps/v1/deployments")),
            statefulsets=by_key(self.list("/apis/apps/v1/statefulsets")),
            notebooks=by_key(self.list("/apis/kubeflow.org/v1/notebooks", missing_ok=True)))

    # --- writing ---------------------------------------------------------------------

    def patch_annotations(self, path: str, annotations: Mapping[str, str | None]
                          ) -> dict[str, Any]:
        """Merge-patch ``metadata.annotations`` (``None`` removes a key); the new object."""
        return self.request("PATCH", path, {"metadata": {"annotations": dict(annotations)}},
                            content_type=MERGE_PATCH) or {}

    def get_scale(self, namespace: str, kind: str, name: str) -> dict[str, Any]:
        scale = self.request("GET", scale_path(namespace, kind, name))
        assert scale is not None
        return scale

    def put_scale(self, namespace: str, kind: str, name: str, scale: Mapping[str, Any],
                  replicas: int) -> None:
        """PUT the Scale read before with ``spec.replicas`` changed (its resourceVersion
        makes a concurrent change a 409)."""
        meta = scale.get("metadata") or {}
        self.request("PUT", scale_path(namespace, kind, name), {
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": name, "namespace": namespace,
                         "resourceVersion": meta.get("resourceVersion")},
            "spec": {"replicas": replicas}})

    def event(self, namespace: str, involved: Mapping[str, str], reason: str, message: str,
              *, name: str, now: float, warning: bool, instance: str) -> None:
        """Create a core/v1 Event (``kubectl describe`` shows it); one that exists is kept."""
        stamp = iso(int(now))
        self.request("POST", f"/api/v1/namespaces/{namespace}/events", {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {**involved, "namespace": namespace},
            "reason": reason, "message": message, "type": "Warning" if warning else "Normal",
            "source": {"component": EVENT_COMPONENT}, "count": 1,
            "firstTimestamp": stamp, "lastTimestamp": stamp,
            "reportingComponent": f"gpu-admission.io/{EVENT_COMPONENT}",
            "reportingInstance": instance}, conflict_ok=True)

    def delete_event(self, namespace: str, name: str) -> None:
        self.request("DELETE", f"/api/v1/namespaces/{namespace}/events/{name}",
                     missing_ok=True)


def scale_path(namespace: str, kind: str, name: str) -> str:
    return f"{object_path(namespace, kind, name)}/scale"


def object_path(namespace: str, kind: str, name: str) -> str:
    if kind == "Pod":
        return f"/api/v1/namespaces/{namespace}/pods/{name}"
    if kind == NOTEBOOK:
        return f"/apis/kubeflow.org/v1/namespaces/{namespace}/notebooks/{name}"
    return f"/apis/apps/v1/namespaces/{namespace}/{PLURALS[kind]}/{name}"


def involved(owner: Owner) -> dict[str, str]:
    return {"kind": owner.kind, "name": owner.name, "apiVersion": owner.api_version}


def event_name(target: str, reason: str, pod: str) -> str:
    """Deterministic (a repeat is a 409) and a valid DNS subdomain (<= 253 characters)."""
    digest = hashlib.sha256(f"{target}/{pod}".encode()).hexdigest()[:10]
    return f"{target[:200]}.{reason.lower()}.{digest}"


@dataclass(frozen=True, slots=True)
class KubeSource:
    """Where the client comes from: ``in-cluster`` or a kubeconfig path."""

    source: str

    def open(self) -> Kube:
        return Kube(api_client(self.source))
