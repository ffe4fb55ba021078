"""A fake Kubernetes API for ``gpu-admission reclaim`` (no tests here): the objects and verbs
reclaim uses, answered the way kube-apiserver does, every request recorded.

* ``GET`` collections (``/api/v1/pods``, ``/api/v1/namespaces``, ``/apis/apps/v1/
  {replicasets,deployments,statefulsets}``, ``/apis/kubeflow.org/v1/notebooks``): a
  ``<Kind>List`` whose items carry no ``kind``/``apiVersion``; ``notebooks`` can be switched
  off (404, a cluster without Kubeflow);
* objects: ``GET``, ``PATCH`` (``application/merge-patch+json``, RFC 7386: ``null``
  deletes), ``PUT`` (with ``metadata.resourceVersion``: 409 Conflict when stale), ``POST``
  to a collection (409 AlreadyExists), ``DELETE`` (404 when absent);
* the ``scale`` subresource of Deployments and StatefulSets (``autoscaling/v1`` Scale);
* ``fail``: a function of (method, path) giving an HTTP status to answer instead (an API
  server failing mid-way).

The shared tests/kube_api_support.py serves list/watch for the admission webhook's caches;
this one lives with the reclaim tests so the two evolve independently.
"""

from __future__ import annotations

import asyncio
import copy
import queue as queue_module
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from tests.kube_api_support import write_kubeconfig
from tests.server_support import free_port

KINDS = {  # plural -> (kind, apiVersion, list kind, namespaced)
    "namespaces": ("Namespace", "v1", "NamespaceList", False),
    "pods": ("Pod", "v1", "PodList", True),
    "events": ("Event", "v1", "EventList", True),
    "replicasets": ("ReplicaSet", "apps/v1", "ReplicaSetList", True),
    "deployments": ("Deployment", "apps/v1", "DeploymentList", True),
    "statefulsets": ("StatefulSet", "apps/v1", "StatefulSetList", True),
    "notebooks": ("Notebook", "kubeflow.org/v1", "NotebookList", True),
    "leases": ("Lease", "coordination.k8s.io/v1", "LeaseList", True),
}
PLURAL = {kind: plural for plural, (kind, *_rest) in KINDS.items()}
_PATH = re.compile(r"^/(?:api/v1|apis/[^/]+/v1)(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)"
                   r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>scale))?$")
_CLUSTER_NS = re.compile(r"^/api/v1/namespaces(?:/(?P<name>[^/]+))?$")


@dataclass
class Request:
    method: str
    path: str
    body: Any  # decoded JSON, None without a body
    content_type: str


@dataclass
class FakeKube:
    version: int = 1000
    store: dict[str, dict[tuple[str, str], dict[str, Any]]] = field(
        default_factory=lambda: {p: {} for p in KINDS})
    requests: list[Request] = field(default_factory=list)
    fail: Callable[[str, str], int | None] = lambda method, path: None
    notebooks_served: bool = True

    # --- the store ---------------------------------------------------------------------

    def add(self, *objs: dict[str, Any]) -> None:
        for obj in objs:
            plural = PLURAL[obj["kind"]]
            stored = copy.deepcopy(obj)
            self.version += 1
            meta = stored["metadata"]
            meta["resourceVersion"] = str(self.version)
            meta.setdefault("uid", f"uid-{meta['name']}")
            self.store[plural][(meta.get("namespace", ""), meta["name"])] = stored

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.store[PLURAL[kind]].get((namespace, name))

    def writes(self) -> list[Request]:
        return [r for r in self.requests if r.method != "GET"]

    # --- HTTP --------------------------------------------------------------------------

    @staticmethod
    def _status(code: int, reason: str, message: str) -> web.Response:
        return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                  "status": "Failure", "message": message, "reason": reason,
                                  "code": code}, status=code)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body: Any = orjson.loads(raw) if raw else None
        self.requests.append(Request(request.method, request.path, body,
                                     request.headers.get("Content-Type", "")))
        failing = self.fail(request.method, request.path)
        if failing is not None:
            return self._status(failing, "InternalError", "injected failure")
        match = _CLUSTER_NS.match(request.path)
        if match is not None:
            ns, plural, name, sub = "", "namespaces", match.group("name"), None
        else:
            match = _PATH.match(request.path)
            if match is None or match.group("plural") not in KINDS:
                return self._status(404, "NotFound", f"no route {request.path}")
            ns, plural = match.group("ns") or "", match.group("plural")
            name, sub = match.group("name"), match.group("sub")
        if plural == "notebooks" and not self.notebooks_served:
            return self._status(404, "NotFound", "the server could not find the resource")
        if name is None:
            if request.method == "GET":
                return self._list(plural, ns)
            if request.method == "POST":
                return self._create(plural, ns, body)
            return self._status(405, "MethodNotAllowed", request.method)
        key = (ns, name)
        obj = self.store[plural].get(key)
        if obj is None:
            return self._status(404, "NotFound", f'{plural} "{name}" not found')
        if sub == "scale":
            return self._scale(request.method, plural, obj, body)
        if request.method == "GET":
            return web.json_response(obj)
        if request.method == "DELETE":
            del self.store[plural][key]
            return web.json_response({"kind": "Status", "status": "Success"})
        if request.method == "PATCH":
            if "merge-patch" not in request.headers.get("Content-Type", ""):
                return self._status(415, "UnsupportedMediaType", "merge patch expected")
            merged = merge_patch(obj, body)
            return web.json_response(self._save(plural, merged))
        if request.method == "PUT":
            if body["metadata"].get("resourceVersion") != obj["metadata"]["resourceVersion"]:
                return self._status(409, "Conflict", "the object has been modified")
            return web.json_response(self._save(plural, body))
        return self._status(405, "MethodNotAllowed", request.method)

    def _save(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        meta = obj["metadata"]
        self.store[plural][(meta.get("namespace", ""), meta["name"])] = obj
        return obj

    def _list(self, plural: str, ns: str) -> web.Response:
        _kind, api_version, list_kind, _ = KINDS[plural]
        items = []
        for (item_ns, _name), obj in sorted(self.store[plural].items()):
            if ns and item_ns != ns:
                continue
            item = copy.deepcopy(obj)
            item.pop("kind", None)
            item.pop("apiVersion", None)
            items.append(item)
        return web.json_response({"kind": list_kind, "apiVersion": api_version,
                                  "metadata": {"resourceVersion": str(self.version)},
                                  "items": items})

    def _create(self, plural: str, ns: str, body: dict[str, Any]) -> web.Response:
        name = body["metadata"]["name"]
        if (ns, name) in self.store[plural]:
            return self._status(409, "AlreadyExists", f'{plural} "{name}" already exists')
        obj = copy.deepcopy(body)
        obj["metadata"].setdefault("namespace", ns)
        obj["metadata"]["uid"] = f"uid-{name}"
        return web.json_response(self._save(plural, obj), status=201)

    def _scale(self, method: str, plural: str, obj: dict[str, Any],
               body: dict[str, Any] | None) -> web.Response:
        if plural not in ("deployments", "statefulsets"):
            return self._status(404, "NotFound", "no scale subresource")
        meta = obj["metadata"]
        if method == "PUT" and body is not None:
            if body["metadata"].get("resourceVersion") != meta["resourceVersion"]:
                return self._status(409, "Conflict", "the object has been modified")
            obj["spec"]["replicas"] = body["spec"]["replicas"]
            self._save(plural, obj)
        elif method != "GET":
            return self._status(405, "MethodNotAllowed", method)
        replicas = obj["spec"].get("replicas", 1)
        return web.json_response({
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                         "resourceVersion": meta["resourceVersion"], "uid": meta["uid"]},
            "spec": {"replicas": replicas}, "status": {"replicas": replicas}})


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


@contextmanager
def fake_kube(tmp: Path, *objs: dict[str, Any]) -> Iterator[tuple[FakeKube, Path]]:
    """The fake on its own event loop in a thread; yields it and a kubeconfig."""
    fake = FakeKube()
    fake.add(*objs)
    ready: queue_module.Queue[int] = queue_module.Queue()
    done = threading.Event()

    async def serve() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", fake.handle)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.put(port)
        await asyncio.to_thread(done.wait)
        await runner.cleanup()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    try:
        port = ready.get(timeout=10)
        yield fake, write_kubeconfig(tmp / "kubeconfig", port)
    finally:
        done.set()
        thread.join(10)
