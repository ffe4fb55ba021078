"""A test Kubernetes API endpoint that serves list and watch for the DRA resources the way
kube-apiserver does (no tests here), plus a kubeconfig pointing the real ``kubernetes``
client at it.

Protocol (https://kubernetes.io/docs/reference/using-api/api-concepts/):

* ``GET <collection>``: a ``<Kind>List`` with ``metadata.resourceVersion``; the items carry no
  ``kind``/``apiVersion`` (as the API server serves built-in lists);
* ``GET <collection>?watch=true&resourceVersion=N&allowWatchBookmarks=true&timeoutSeconds=T``:
  a chunked stream of JSON lines ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR,
  "object": {...}}``: every change after N, then live changes, until T seconds pass;
* a resourceVersion older than the compaction point gets a single ``ERROR`` event with a
  ``Status`` of code 410 (``Expired``, "too old resource version"), then the stream ends;
  :meth:`FakeApiServer.expire` also sends it to open watches (what etcd compaction does).
"""

from __future__ import annotations

import asyncio
import copy
import queue as queue_module
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiohttp import web

from tests.server_support import free_port


@dataclass(frozen=True)
class Collection:
    resource: str
    list_kind: str
    api_version: str
    kind: str
    namespaced: bool


COLLECTIONS: dict[str, Collection] = {
    "/apis/resource.k8s.io/v1/deviceclasses": Collection(
        "deviceclasses", "DeviceClassList", "resource.k8s.io/v1", "DeviceClass", False),
    "/apis/resource.k8s.io/v1/resourceclaimtemplates": Collection(
        "resourceclaimtemplates", "ResourceClaimTemplateList", "resource.k8s.io/v1",
        "ResourceClaimTemplate", True),
    "/apis/resource.k8s.io/v1/resourceclaims": Collection(
        "resourceclaims", "ResourceClaimList", "resource.k8s.io/v1", "ResourceClaim", True),
    "/api/v1/pods": Collection("pods", "PodList", "v1", "Pod", True),
    # compiled admission policies (gpu-admission compile --guard --check)
    "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies": Collection(
        "mutatingadmissionpolicies", "MutatingAdmissionPolicyList",
        "admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy", False),
    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies": Collection(
        "validatingadmissionpolicies", "ValidatingAdmissionPolicyList",
        "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", False),
}
BY_RESOURCE = {c.resource: c for c in COLLECTIONS.values()}
BY_KIND = {c.kind: c for c in COLLECTIONS.values()}


@dataclass
class FakeApiServer:
    """The store, the change log per resource and the open watches."""

    version: int = 100
    objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = field(
        default_factory=lambda: {c.resource: {} for c in COLLECTIONS.values()})
    changes: dict[str, list[tuple[int, dict[str, Any]]]] = field(
        default_factory=lambda: {c.resource: [] for c in COLLECTIONS.values()})
    compacted: dict[str, int] = field(
        default_factory=lambda: {c.resource: 0 for c in COLLECTIONS.values()})
    watches: dict[str, set[asyncio.Queue[dict[str, Any] | None]]] = field(
        default_factory=lambda: {c.resource: set() for c in COLLECTIONS.values()})
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    lists_open: asyncio.Event = field(default_factory=asyncio.Event)
    not_served: set[str] = field(default_factory=set)  # resources answered with 404

    def __post_init__(self) -> None:
        self.lists_open.set()

    # --- changing the store (what controllers/users would do) ------------------------------

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        collection = BY_KIND[obj["kind"]]
        self.version += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self.version)
        stored["metadata"].setdefault("uid", f"uid-{self.version}")
        stored["metadata"].setdefault("creationTimestamp", "2026-12-02T10:00:00Z")
        key = (stored["metadata"].get("namespace", ""), stored["metadata"]["name"])
        if kind == "DELETED":
            self.objects[collection.resource].pop(key, None)
        else:
            self.objects[collection.resource][key] = stored
        event = {"type": kind, "object": stored}
        self.changes[collection.resource].append((self.version, event))
        for queue in self.watches[collection.resource]:
            queue.put_nowait(event)

    def apply(self, *objs: dict[str, Any]) -> None:
        """Create or update objects (ADDED / MODIFIED events)."""
        for obj in objs:
            collection = BY_KIND[obj["kind"]]
            key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            exists = key in self.objects[collection.resource]
            self._event("MODIFIED" if exists else "ADDED", obj)

    def delete(self, obj: dict[str, Any]) -> None:
        self._event("DELETED", obj)

    def bookmark(self, resource: str) -> None:
        collection = BY_RESOURCE[resource]
        event = {"type": "BOOKMARK", "object": {
            "kind": collection.kind, "apiVersion": collection.api_version,
            "metadata": {"resourceVersion": str(self.version)}}}
        for queue in self.watches[resource]:
            queue.put_nowait(event)

    def expire(self, resource: str) -> None:
        """Compact history: every resourceVersion up to now is too old (410) for
        ``resource``; open watches get the ERROR event and end."""
        self.compacted[resource] = self.version
        for queue in self.watches[resource]:
            queue.put_nowait(self._gone(0))
            queue.put_nowait(None)

    def _gone(self, asked: int) -> dict[str, Any]:
        return {"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f"too old resource version: {asked} ({self.version})",
            "reason": "Expired", "code": 410}}

    def count(self, resource: str, *, watch: bool) -> int:
        """Requests seen for ``resource`` (lists or watches)."""
        path = next(p for p, c in COLLECTIONS.items() if c.resource == resource)
        return sum(1 for p, q in self.requests
                   if p == path and (q.get("watch") in ("true", "1")) is watch)

    # --- HTTP ---------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        collection = COLLECTIONS.get(request.path)
        if (collection is None or request.method != "GET"
                or collection.resource in self.not_served):
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                      "reason": "NotFound", "code": 404}, status=404)
        query = dict(request.query)
        self.requests.append((request.path, query))
        if query.get("watch") in ("true", "1"):
            return await self._watch(request, collection, query)
        await self.lists_open.wait()
        items = []
        for obj in self.objects[collection.resource].values():
            item = copy.deepcopy(obj)
            item.pop("kind", None)
            item.pop("apiVersion", None)
            items.append(item)
        return web.Response(body=orjson.dumps({
            "kind": collection.list_kind, "apiVersion": collection.api_version,
            "metadata": {"resourceVersion": str(self.version)}, "items": items}),
            content_type="application/json")

    async def _watch(self, request: web.Request, collection: Collection,
                     query: dict[str, str]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        since = int(query.get("resourceVersion") or 0)
        if since < self.compacted[collection.resource]:
            await response.write(orjson.dumps(self._gone(since)) + b"\n")
            await response.write_eof()
            return response
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        for version, change in self.changes[collection.resource]:
            if version > since:
                queue.put_nowait(change)
        self.watches[collection.resource].add(queue)
        try:
            async with asyncio.timeout(float(query.get("timeoutSeconds") or 1800)):
                while (event := await queue.get()) is not None:
                    await response.write(orjson.dumps(event) + b"\n")
            await response.write_eof()
        except (TimeoutError, ConnectionResetError):
            pass  # the watch's timeoutSeconds passed, or the client went away
        finally:
            self.watches[collection.resource].discard(queue)
        return response


def write_kubeconfig(path: Path, port: int) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "webhook", "user": {"token": "test-token"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "webhook"}}]}))
    return path


@asynccontextmanager
async def running_api(tmp: Path) -> AsyncIterator[tuple[FakeApiServer, Path]]:
    """The fake API on a free port and a kubeconfig for it."""
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield fake, write_kubeconfig(tmp / "kubeconfig", port)
    finally:
        for queues in fake.watches.values():
            for queue in queues:
                queue.put_nowait(None)
        await runner.cleanup()


@contextmanager
def api_in_thread(tmp: Path, *objs: dict[str, Any]) -> Iterator[Path]:
    """The fake API, holding ``objs``, on its own event loop in a thread (for tests that run
    the webhook as a subprocess); yields the kubeconfig."""
    ready: queue_module.Queue[Path] = queue_module.Queue()
    done = threading.Event()

    async def serve() -> None:
        async with running_api(tmp) as (fake, kubeconfig):
            fake.apply(*objs)
            ready.put(kubeconfig)
            await asyncio.to_thread(done.wait)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    try:
        yield ready.get(timeout=10)
    finally:
        done.set()
        thread.join(10)
