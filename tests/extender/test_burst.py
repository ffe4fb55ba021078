"""Bursts of fractional binds (issue 36), through the extender's HTTP verbs against the fake
API server and the real ``kubernetes`` client:

* assumed until bound: a bind's share counts in filter and prioritize from the moment the
  bind starts, before its first API call (kube-scheduler sends the next pod's filter while
  the previous pod's bind is in flight);
* never twice: 200 binds at a nearly full ledger, the reservations' UUIDs published at
  random moments: no card over-committed, the ledger equal to what the API holds, and a
  restart rebuilds the same ledger;
* the metrics an operator reads during a burst (scraped from ``/metrics``).
"""

from __future__ import annotations

import asyncio
import random
import re
import ssl
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client as k8s

from gpu_admission.certs.bundle import generate_bundle, write_bundle
from gpu_admission.core.vocab import GPU_CONFIGMAP_ANNOTATION, GPU_UUID_ANNOTATION
from gpu_admission.extender.binder import BindConfig, configmap, reservation_pod
from gpu_admission.kube.aio import AsyncKube
from gpu_admission.kube.client import KubeError
from gpu_admission.placement.fractional import choose
from tests.extender.fractional_support import (
    CARD_MIB,
    HEADROOM_MIB,
    NAMESPACE,
    TENANT,
    Stack,
    binding_args,
    frac_node,
    frac_pod,
    gpu_of,
    memory_by_gpu,
    reservations,
    stack,
    until,
)
from tests.extender_support import args_with_names
from tests.server_support import free_port

pytestmark = pytest.mark.asyncio


# --- builders -------------------------------------------------------------------------------

def placed(s: Stack, name: str, share: int, node: str, uuid: str) -> None:
    """A fractional pod already running on card ``uuid`` of ``node`` (with its ConfigMap),
    and the card's reservation pod, written straight into the API."""
    if not any((r["metadata"].get("annotations") or {}).get(GPU_UUID_ANNOTATION) == uuid
               for r in reservations(s.fake)):
        res = reservation_pod(f"res-{uuid.lower()}", node, BindConfig(NAMESPACE, "img"), "x/y")
        res["metadata"]["annotations"][GPU_UUID_ANNOTATION] = uuid
        res["status"] = {"phase": "Running"}
        s.create(res)
    pod = frac_pod(name, share)
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    stored, = s.create(pod)
    meta = stored["metadata"]
    s.create(configmap(TENANT, meta["annotations"][GPU_CONFIGMAP_ANNOTATION], name,
                       meta["uid"], uuid))


async def scrape(s: Stack) -> str:
    base = s.url("bind").rsplit("/scheduler/", 1)[0]
    async with s.session.get(f"{base}/metrics") as resp:
        return await resp.text()


def sample(text: str, name: str, **labels: str) -> float | None:
    """One sample's value from an exposition text (None when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if m and ",".join(sorted((m[1] or "").split(","))) == want:
            return float(m[2])
    return None


# --- assumed until bound --------------------------------------------------------------------

@pytest.mark.parametrize("held", [("POST", "/configmaps"), ("POST|GET", ".")],
                         ids=["configmap-write", "every-call"])
async def test_a_bind_counts_in_filter_and_prioritize_from_its_start(
        tmp_path: Path, held: tuple[str, str]) -> None:
    """n1's one card holds 40000 MiB; b (30000) fits there, then c (20000) no longer does.
    While b's bind is held at its first API call (whatever it is), c's filter already
    refuses n1 and c's prioritize scores n1 0: b's share was placed before any call."""
    async with stack(tmp_path, frac_node("n1", gpus=1), frac_node("n2", gpus=1)) as s:
        placed(s, "first", 40000, "n1", "GPU-n1-0")
        await s.start_extender()
        b, c = s.create(frac_pod("b", 30000), frac_pod("c", 20000))
        assert (await s.post("filter", args_with_names(b, ["n1", "n2"])))["NodeNames"] == [
            "n1", "n2"]
        methods, pattern = held
        gate = asyncio.Event()
        for method in methods.split("|"):
            s.fake.holds[(method, pattern)] = gate
        bind = asyncio.create_task(s.post("bind", binding_args(b, "n1")))
        await until(lambda: bool(s.fake.held), "b's bind at its first API call")
        assert s.fake.writes == []  # nothing written yet: the share is only assumed
        result = await s.post("filter", args_with_names(c, ["n1", "n2"]))
        assert result["NodeNames"] == ["n2"]
        assert result["FailedNodes"]["n1"].startswith(
            "no GPU with 21024 MiB free (20000 MiB share + 1024 MiB headroom, card 81920 "
            "MiB): best open GPU GPU-n1-0 has 11920 MiB free of 1 open")
        scores = {h["Host"]: h["Score"] for h in
                  await s.post("prioritize", args_with_names(c, ["n1", "n2"]))}
        assert scores["n1"] == 0 < scores["n2"]
        gate.set()
        assert await bind == {"Error": ""}
        assert gpu_of(s.fake, b) == "GPU-n1-0"


async def test_a_pod_bind_has_not_seen_is_read_then_placed(tmp_path: Path) -> None:
    """No filter and no watch event for the pod (a restart between them): bind reads the
    pod (one GET) and places it as usual."""
    async with stack(tmp_path, frac_node("n1", gpus=1)) as s:
        state = await s.start_extender()
        pod, = s.create(frac_pod("a", 20000))
        await until(lambda: pod["metadata"]["uid"] in state.kube.pending, "watch saw a")
        state.kube.pending.clear()
        assert await s.post("bind", binding_args(pod, "n1")) == {"Error": ""}
        assert [m for m, p, _ in s.fake.writes] == ["POST", "POST", "POST"]
        assert gpu_of(s.fake, pod) == s.plugin.published[0][1]


async def test_a_replaced_pod_is_not_bound(tmp_path: Path) -> None:
    """kube-scheduler's UID is not the stored pod's (deleted and recreated under the same
    name): the binding's UID precondition refuses it and the bind leaves nothing."""
    async with stack(tmp_path, frac_node("n1", gpus=1)) as s:
        state = await s.start_extender()
        pod, = s.create(frac_pod("a", 20000))
        old = {**pod, "metadata": {**pod["metadata"], "uid": "uid-of-the-old-pod"}}
        await s.post("filter", args_with_names(old, ["n1"]))  # the scheduler's stale copy
        error = (await s.post("bind", binding_args(old, "n1")))["Error"]
        assert "Precondition failed: UID in precondition: uid-of-the-old-pod" in error
        assert not s.obj("pods", TENANT, "a")["spec"].get("nodeName")
        assert s.fake.objects["configmaps"] == {}
        await until(lambda: state.kube.ledger.usage() in ({}, {"n1": {
            s.plugin.published[0][1]: 0}}), "nothing held")


# --- never twice, under a burst -------------------------------------------------------------

async def test_two_hundred_binds_at_a_nearly_full_ledger(tmp_path: Path) -> None:
    """4 nodes x 4 cards; 10 cards already hold 52-72 GiB. 200 pods of 2-24 GiB bind at
    once, to random nodes, while reservation pods publish their UUIDs 0-150 ms after
    creation. No card gets more than it has (share + headroom checked at every choice),
    every bound pod's card is a live reservation of its node, the refused binds say why and
    left nothing, the ledger equals the API, and a restart rebuilds it exactly."""
    rng = random.Random(36)
    nodes = [frac_node(f"n{i}", gpus=4) for i in range(4)]
    async with stack(tmp_path, *nodes) as s:
        for i in range(10):
            placed(s, f"old{i}", rng.randrange(52, 73) * 1024, f"n{i % 4}",
                   f"GPU-n{i % 4}-{i // 4}")
        s.plugin.delay, s.plugin.jitter = 0.0, 0.15
        state = await s.start_extender()
        pods = s.create(*(frac_pod(f"p{i:03d}", rng.randrange(2, 25) * 1024)
                          for i in range(200)))
        await until(lambda: all(p["metadata"]["uid"] in state.kube.pending for p in pods),
                    "the watch saw the pods")
        targets = [f"n{rng.randrange(4)}" for _ in pods]
        results = await asyncio.gather(*(
            s.post("bind", binding_args(p, node)) for p, node in zip(pods, targets,
                                                                     strict=True)))
        errors = [r["Error"] for r in results if r["Error"]]
        bound = [p for p, r in zip(pods, results, strict=True) if not r["Error"]]
        assert errors and all("another pod took the memory" in e for e in errors), errors[:3]
        usage = memory_by_gpu(s.fake)
        assert all(mib + HEADROOM_MIB <= CARD_MIB for mib in usage.values()), usage
        held = {(r["spec"]["nodeName"], r["metadata"]["annotations"][GPU_UUID_ANNOTATION])
                for r in reservations(s.fake)}
        for p in bound:
            node = s.obj("pods", TENANT, p["metadata"]["name"])["spec"]["nodeName"]
            assert (node, gpu_of(s.fake, p)) in held
        assert len(s.fake.objects["configmaps"]) == 10 + len(bound)  # refused: no ConfigMap
        def flat(u: dict[str, dict[str, int]]) -> dict[str, int]:
            return {g: m for n in u.values() for g, m in n.items() if m}

        await until(lambda: flat(state.kube.ledger.usage()) == usage
                    and not state.kube.ledger.assumed, "ledger = API")
        before = state.kube.ledger.usage()
        await s.stop_extender()
        again = await s.start_extender()
        assert again.kube.ledger.usage() == before
        # refused only when it did not fit: memory only grew during the burst, so a pod
        # refused then fits on no card of its node now, by the extender's own rule
        placement = again.kube.policy().spec.placement
        for p, r, node in zip(pods, results, targets, strict=True):
            if r["Error"]:
                share = int(p["metadata"]["annotations"]["gpu-admission.io/gpu-memory"])
                view = again.kube.ledger.view(node)
                assert choose(view, CARD_MIB, share, placement) is None, (
                    p["metadata"]["name"], node, share, view.open)
        text = await scrape(s)
        for node, uuid, mib in ((n, g, m) for n, gpus in before.items()
                                for g, m in gpus.items()):
            assert sample(text, "gpu_admission_extender_gpu_free_mib", node=node,
                          gpu=uuid) == CARD_MIB - mib


# --- metrics --------------------------------------------------------------------------------

async def test_metrics_show_races_cards_and_free_memory(tmp_path: Path) -> None:
    async with stack(tmp_path, frac_node("n1", gpus=2)) as s:
        # long enough for a loaded CI host to deliver a UUID; c's reservation never reports
        state = await s.start_extender(reservation_timeout=1.5)
        a, b, c, d = s.create(frac_pod("a", 50000), frac_pod("b", 20000),
                              frac_pod("c", 50000), frac_pod("d", 20000))
        assert await s.post("bind", binding_args(a, "n1")) == {"Error": ""}
        assert await s.post("bind", binding_args(b, "n1")) == {"Error": ""}
        uuid = gpu_of(s.fake, a)
        assert uuid is not None and gpu_of(s.fake, b) == uuid
        text = await scrape(s)
        assert sample(text, "gpu_admission_extender_gpu_free_mib", node="n1",
                      gpu=uuid) == CARD_MIB - 70000
        assert sample(text, "gpu_admission_extender_gpus_opened_total") == 1
        # the second card's reservation never reports: the bind fails, the card is released
        s.plugin.stall = True
        assert "did not publish" in (await s.post("bind", binding_args(c, "n1")))["Error"]
        # a bind whose node filled up after its filter: a race
        s.plugin.stall = False
        placed(s, "late", 62000, "n1", "GPU-n1-1")
        # late's 62000 MiB on the second card (not c's released reservation still listed)
        await until(lambda: state.kube.ledger.usage().get("n1", {}).get("GPU-n1-1") == 62000,
                    "late seen")
        error = (await s.post("bind", binding_args(d, "n1")))["Error"]
        assert "another pod took the memory" in error
        # a's and b's card empties: housekeeping releases it
        for name in ("a", "b"):
            s.fake.delete(s.obj("pods", TENANT, name))
        await until(lambda: state.kube.ledger.usage()["n1"].get(uuid) == 0, "card empty")
        assert len(await state.binder.release_empty(now=time.time() + 3600)) == 1
        text = await scrape(s)
        assert sample(text, "gpu_admission_extender_gpus_opened_total") == 2
        assert sample(text, "gpu_admission_extender_gpus_released_total",
                      reason="failed") == 1
        assert sample(text, "gpu_admission_extender_gpus_released_total",
                      reason="empty") == 1
        assert sample(text, "gpu_admission_extender_bind_races_total") == 1
        assert sample(text, "gpu_admission_extender_bind_gpu_wait_seconds_count") == 2
        assert sample(text, "gpu_admission_extender_gpu_free_mib", node="n1",
                      gpu="GPU-n1-1") == CARD_MIB - 62000
        assert sample(text, "gpu_admission_extender_gpu_free_mib", node="n1",
                      gpu=uuid) is None  # closed: no longer offered


# --- the bind's asynchronous client -------------------------------------------------------

async def test_the_async_client_speaks_as_the_kubernetes_client_configures_it(
        tmp_path: Path) -> None:
    """The bearer token of the ``kubernetes`` configuration on every call, JSON bodies, a
    ``Status`` error as KubeError with its reason and message, an unreachable server as
    KubeError (status 0) naming the call."""
    seen: list[tuple[str, str, str | None, Any]] = []

    async def handler(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        seen.append((request.method, request.path, request.headers.get("Authorization"),
                     body))
        if request.path.endswith("/missing"):
            return web.json_response({"kind": "Status", "status": "Failure",
                                      "reason": "NotFound", "message": 'pods "missing" not '
                                      "found", "code": 404}, status=404)
        return web.json_response({"kind": "Pod", "metadata": {"name": "x"}}, status=201)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    configuration = k8s.Configuration(host=f"http://127.0.0.1:{port}",
                                      api_key={"authorization": "secret-token"},
                                      api_key_prefix={"authorization": "Bearer"})
    api = AsyncKube(configuration)
    try:
        assert await api.request("POST", "/api/v1/namespaces/t/pods",
                                 body={"kind": "Pod"}) == {"kind": "Pod",
                                                           "metadata": {"name": "x"}}
        with pytest.raises(KubeError) as info:
            await api.request("GET", "/api/v1/namespaces/t/pods/missing")
        assert (info.value.status, info.value.reason, info.value.message) == (
            404, "NotFound", 'pods "missing" not found')
        assert seen == [("POST", "/api/v1/namespaces/t/pods", "Bearer secret-token",
                         {"kind": "Pod"}),
                        ("GET", "/api/v1/namespaces/t/pods/missing", "Bearer secret-token",
                         None)]
    finally:
        await api.close()
        await runner.cleanup()
    gone = AsyncKube(configuration)
    try:
        with pytest.raises(KubeError, match=r"HTTP 0 Unreachable: GET /api/v1/nodes: "):
            await gone.request("GET", "/api/v1/nodes")
    finally:
        await gone.close()


async def test_the_async_client_verifies_the_api_server_with_the_configured_ca(
        tmp_path: Path) -> None:
    """TLS as the kubeconfig or ServiceAccount configures it: the server's certificate is
    checked against ``ssl_ca_cert``; without that CA the call fails (status 0, a
    certificate error), it is never sent unverified."""
    bundle = generate_bundle("kubernetes", "default", dev=True)
    write_bundle(bundle, tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")

    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"kind": "NodeList", "items": []})

    app = web.Application()
    app.router.add_get("/api/v1/nodes", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=server_tls).start()
    trusted = AsyncKube(k8s.Configuration(host=f"https://127.0.0.1:{port}",
                                          ssl_ca_cert=str(tmp_path / "ca.crt")))
    stranger = AsyncKube(k8s.Configuration(host=f"https://127.0.0.1:{port}"))
    try:
        assert await trusted.request("GET", "/api/v1/nodes") == {"kind": "NodeList",
                                                                  "items": []}
        with pytest.raises(KubeError, match=r"HTTP 0 Unreachable: .*[Cc]ertificate"):
            await stranger.request("GET", "/api/v1/nodes")
    finally:
        await trusted.close()
        await stranger.close()
        await runner.cleanup()
