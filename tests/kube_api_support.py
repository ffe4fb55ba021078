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
* ``labelSelector`` (equality and existence terms) filters lists and watches;
* discovery ``GET /apis/resource.k8s.io`` (an ``APIGroup``) lists
  :attr:`FakeApiServer.dra_versions`; the DRA collections are served under each of those
  versions (the same store: objects are handed on as stored) and 404 under the others;
* object endpoints for pods, ConfigMaps, nodes and Leases (the extender's bind): ``POST`` a
  namespaced collection (create; 409 ``AlreadyExists``; ``generateName``), ``GET``,
  ``DELETE`` (deleting a pod also deletes the objects it owns, as the garbage collector
  does), ``PATCH`` with a JSON merge patch (RFC 7386) or a JSON patch (RFC 6902), ``PATCH
  nodes/{name}/status``, and ``POST pods/{name}/binding`` (sets ``spec.nodeName``; 409 when
  already bound). Every write is logged in order in :attr:`FakeApiServer.writes`, and
  :attr:`FakeApiServer.on_write` callbacks see each one (a test plays the kubelet there).
"""

from __future__ import annotations

import asyncio
import copy
import queue as queue_module
import re
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
    "/api/v1/configmaps": Collection("configmaps", "ConfigMapList", "v1", "ConfigMap", True),
    "/api/v1/nodes": Collection("nodes", "NodeList", "v1", "Node", False),
    "/apis/coordination.k8s.io/v1/leases": Collection(
        "leases", "LeaseList", "coordination.k8s.io/v1", "Lease", True),
}
DRA_PREFIX = "/apis/resource.k8s.io/"
DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")
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
    #: resource.k8s.io versions served (discovery and the DRA collections' paths)
    dra_versions: list[str] = field(default_factory=lambda: ["v1"])
    #: (method, path, body) of every write, in the order the server received them
    writes: list[tuple[str, str, Any]] = field(default_factory=list)
    #: called after each successful write with (method, path, the stored object)
    on_write: list[Any] = field(default_factory=list)
    #: (method, path regex) -> HTTP status answered instead (a failing API server)
    failures: dict[tuple[str, str], int] = field(default_factory=dict)
    #: the body of ``GET /metrics`` (the Prometheus text format, as kube-apiserver serves it
    #: to a client allowed ``get`` on the non-resource URL); None: 403 Forbidden
    metrics: str | None = ""
    #: (method, path regex) -> a gate: matching object calls wait until it is set (a call
    #: held in flight); :attr:`held` lists (method, path) of each call that reached one
    holds: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    held: list[tuple[str, str]] = field(default_factory=list)
    #: seconds every object call waits before it is served (a remote API server's latency,
    #: for benchmarks; 0 in tests)
    latency: float = 0.0

    def __post_init__(self) -> None:
        self.lists_open.set()

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored object, or None."""
        return self.objects[resource].get((namespace, name))

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
        """Requests seen for ``resource`` (lists or watches), in any served version."""
        return sum(1 for p, q in self.requests
                   if (c := self.collection(p)) is not None and c.resource == resource
                   and (q.get("watch") in ("true", "1")) is watch)

    def collection(self, path: str) -> Collection | None:
        """The collection a list/watch path names (DRA paths in any served version)."""
        if path.startswith(DRA_PREFIX):
            version, _, plural = path[len(DRA_PREFIX):].partition("/")
            if version not in self.dra_versions:
                return None
            return COLLECTIONS.get(f"{DRA_PREFIX}v1/{plural}")
        return COLLECTIONS.get(path)

    # --- HTTP ---------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/metrics" and request.method == "GET":
            if self.metrics is None:
                return status_response(403, "Forbidden", 'forbidden: User "webhook" cannot '
                                       'get path "/metrics"')
            return web.Response(body=self.metrics.encode(), headers={
                "Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
        if request.path == DRA_PREFIX.rstrip("/") and request.method == "GET":
            return self._discovery()
        collection = self.collection(request.path)
        if collection is None or request.method != "GET":
            return await handle_object(self, request)
        if collection.resource in self.not_served:
            return status_response(404, "NotFound", f"{request.path} not found")
        query = dict(request.query)
        self.requests.append((request.path, query))
        if query.get("watch") in ("true", "1"):
            return await self._watch(request, collection, query)
        await self.lists_open.wait()
        items = []
        selector = query.get("labelSelector", "")
        for obj in self.objects[collection.resource].values():
            if not label_selected(obj, selector):
                continue
            item = copy.deepcopy(obj)
            item.pop("kind", None)
            item.pop("apiVersion", None)
            items.append(item)
        return web.Response(body=orjson.dumps({
            "kind": collection.list_kind, "apiVersion": collection.api_version,
            "metadata": {"resourceVersion": str(self.version)}, "items": items}),
            content_type="application/json")

    def _discovery(self) -> web.Response:
        versions = [{"groupVersion": f"resource.k8s.io/{v}", "version": v}
                    for v in DRA_VERSIONS if v in self.dra_versions]
        if not versions:
            return status_response(404, "NotFound", "the server could not find the resource")
        return web.json_response({"kind": "APIGroup", "apiVersion": "v1",
                                  "name": "resource.k8s.io", "versions": versions,
                                  "preferredVersion": versions[0]})

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
        selector = query.get("labelSelector", "")
        try:
            async with asyncio.timeout(float(query.get("timeoutSeconds") or 1800)):
                while (event := await queue.get()) is not None:
                    if (event["type"] in ("ADDED", "MODIFIED", "DELETED")
                            and not label_selected(event["object"], selector)):
                        continue
                    await response.write(orjson.dumps(event) + b"\n")
            await response.write_eof()
        except (TimeoutError, ConnectionResetError):
            pass  # the watch's timeoutSeconds passed, or the client went away
        finally:
            self.watches[collection.resource].discard(queue)
        return response


def status_response(code: int, reason: str, message: str) -> web.Response:
    """A ``Status`` failure, as the API server answers errors."""
    return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Failure", "message": message, "reason": reason,
                              "code": code}, status=code)


def label_selected(obj: dict[str, Any], selector: str) -> bool:
    """Equality (``k=v``, ``k==v``, ``k!=v``) and existence (``k``, ``!k``) terms, ANDed
    (https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def json_patch(target: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add/replace/remove (what the extender sends)."""
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for part in parts[:-1]:
            parent = parent.setdefault(part, {})
        if op["op"] in ("add", "replace"):
            parent[parts[-1]] = op["value"]
        elif op["op"] == "remove":
            del parent[parts[-1]]
        else:
            raise ValueError(f"unsupported op {op['op']}")
    return doc


_OBJECT_PATH = re.compile(
    r"^/api(?:s/coordination\.k8s\.io)?/v1/(?:namespaces/(?P<ns>[^/]+)/)?"
    r"(?P<resource>pods|configmaps|nodes|leases)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>binding|status))?)?$")


async def handle_object(fake: FakeApiServer, request: web.Request) -> web.Response:
    """Create / get / delete / patch one object, ``pods/binding``, ``nodes/status``."""
    m = _OBJECT_PATH.match(request.path)
    if m is None or (m["ns"] is None) != (m["resource"] == "nodes"):
        return status_response(404, "NotFound", f"{request.path} not found")
    for (method, pattern), code in fake.failures.items():
        if method == request.method and re.search(pattern, request.path):
            return status_response(code, "InternalError", "injected failure")
    if fake.latency:
        await asyncio.sleep(fake.latency)
    for (method, pattern), gate in list(fake.holds.items()):
        if method == request.method and re.search(pattern, request.path):
            fake.held.append((request.method, request.path))
            await gate.wait()  # a test holds this call in flight until it sets the gate
    resource, namespace, name, sub = m["resource"], m["ns"] or "", m["name"], m["sub"]
    collection = BY_RESOURCE[resource]
    body: Any = None
    if request.can_read_body:
        body = orjson.loads(await request.read())
    if request.method != "GET":
        fake.writes.append((request.method, request.path, body))
    stored = fake.objects[resource].get((namespace, name)) if name else None
    if request.method == "POST" and name is None:  # create
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{fake.version + 1:05x}"
        meta["namespace"] = namespace
        if (namespace, meta.get("name")) in fake.objects[resource]:
            return status_response(409, "AlreadyExists",
                                   f'{resource} "{meta.get("name")}" already exists')
        meta.pop("resourceVersion", None)
        meta["uid"] = f"uid-{resource}-{namespace}-{meta['name']}-{fake.version + 1}"
        obj["kind"], obj["apiVersion"] = collection.kind, collection.api_version
        fake._event("ADDED", obj)
        result = fake.objects[resource][(namespace, meta["name"])]
        code = 201
    elif stored is None:
        return status_response(404, "NotFound", f'{resource} "{name}" not found')
    elif request.method == "GET" and sub is None:
        return web.json_response(stored)
    elif request.method == "DELETE" and sub is None:
        fake._event("DELETED", stored)
        result, code = stored, 200
        if resource == "pods":  # the garbage collector: objects the pod owns go with it
            uid = stored["metadata"].get("uid")
            for owned in list(fake.objects["configmaps"].values()):
                refs = owned["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == uid for r in refs):
                    fake._event("DELETED", owned)
    elif request.method == "POST" and sub == "binding" and resource == "pods":
        uid = ((body or {}).get("metadata") or {}).get("uid")
        if uid and uid != stored["metadata"].get("uid"):  # BindingREST's UID precondition
            return status_response(409, "Conflict", f'Operation cannot be fulfilled on pods '
                                   f'"{name}": Precondition failed: UID in precondition: '
                                   f'{uid}, UID in object meta: {stored["metadata"]["uid"]}')
        if stored.get("spec", {}).get("nodeName"):
            return status_response(409, "Conflict", f'pod {name} is already assigned to node '
                                   f'"{stored["spec"]["nodeName"]}"')
        target = (body or {}).get("target") or {}
        if (body or {}).get("kind") != "Binding" or target.get("kind") != "Node":
            return status_response(400, "BadRequest", "expected a Binding to a Node")
        obj = copy.deepcopy(stored)
        obj.setdefault("spec", {})["nodeName"] = target["name"]
        fake._event("MODIFIED", obj)
        result = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                  "code": 201}
        code = 201
    elif request.method == "PATCH" and sub in (None, "status"):
        if request.content_type == "application/json-patch+json":
            obj = json_patch(stored, body)
        else:
            obj = merge_patch(stored, body)
        if sub == "status":  # the status subresource changes status only
            obj = {**copy.deepcopy(stored), "status": obj.get("status", {})}
        else:
            obj["status"] = copy.deepcopy(stored.get("status", {}))
        fake._event("MODIFIED", obj)
        result, code = fake.objects[resource][(namespace, name)], 200
    else:
        return status_response(405, "MethodNotAllowed", f"{request.method} {request.path}")
    for callback in fake.on_write:
        callback(request.method, request.path, result)
    return web.json_response(result, status=code)


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
def api_in_thread(tmp: Path, *objs: dict[str, Any],
                  on_write: list[Any] | None = None, metrics: str | None = "") -> Iterator[Path]:
    """The fake API, holding ``objs``, on its own event loop in a thread (for tests that run
    the webhook as a subprocess); yields the kubeconfig. ``on_write``: gets (method, path,
    body, the stored object's annotations) of each write. ``metrics``: what ``GET /metrics``
    serves (None: 403)."""
    ready: queue_module.Queue[Path] = queue_module.Queue()
    done = threading.Event()

    async def serve() -> None:
        async with running_api(tmp) as (fake, kubeconfig):
            fake.apply(*objs)
            fake.metrics = metrics
            if on_write is not None:
                fake.on_write.append(lambda method, path, obj: on_write.append(
                    (method, path, fake.writes[-1][2],
                     (obj.get("metadata") or {}).get("annotations"))))
            ready.put(kubeconfig)
            await asyncio.to_thread(done.wait)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    try:
        yield ready.get(timeout=10)
    finally:
        done.set()
        thread.join(10)
