"""Bad input over HTTP against the in-process extender app (its factory, as the CLI builds it):
malformed ExtenderArgs get a 400 naming the field, a Prometheus that answers garbage gives
neutral answers and a counted poll error, never a crash. Prometheus is faked here (an aiohttp
app answering what each test sets), because these are the replies a real one never gives."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpu_admission.extender.app import STATE, ExtenderConfig, create_app
from tests.builders import make_container, make_pod
from tests.extender_support import args_with_names, args_with_nodes, make_node, metric_value
from tests.server_support import free_port

PodClient = TestClient[web.Request, web.Application]
AiohttpClient = Callable[[web.Application], Awaitable[PodClient]]
AiohttpServer = Callable[[web.Application], Awaitable[TestServer]]


def vector(*samples: tuple[dict[str, str], str]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels, "value": [1764700000.123, value]} for labels, value in samples]}}


def gpu_labels(node: str, index: int = 0) -> dict[str, str]:
    return {"gpu": str(index), "UUID": f"GPU-{node}-{index}", "Hostname": node,
            "modelName": "NVIDIA A100-SXM4-80GB"}


class FakePrometheus:
    """/api/v1/query answering ``reply(metric)`` -> (status, body bytes)."""

    def __init__(self) -> None:
        self.reply: Callable[[str], tuple[int, bytes]] = lambda metric: (
            200, orjson.dumps(vector()))
        self.queries: list[str] = []

    async def query(self, request: web.Request) -> web.Response:
        query = request.query["query"]
        self.queries.append(query)
        metric = query.split("(", 1)[1].split("[", 1)[0]
        status, body = self.reply(metric)
        return web.Response(status=status, body=body, content_type="application/json")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/query", self.query)
        return app


@pytest.fixture
async def prom(aiohttp_server: AiohttpServer) -> tuple[FakePrometheus, str]:
    fake = FakePrometheus()
    server = await aiohttp_server(fake.app())
    return fake, str(server.make_url("")).rstrip("/")


@pytest.fixture
async def client(prom: tuple[FakePrometheus, str], aiohttp_client: AiohttpClient) -> PodClient:
    config = ExtenderConfig(prometheus_url=prom[1], interval_seconds=0.05, window="1m")
    return await aiohttp_client(create_app(config))


def pod() -> dict[str, Any]:
    return make_pod("infer", containers=[make_container()])


async def polls(client: PodClient, n: int = 2) -> str:
    """Wait until the app has polled ``n`` more times; return /metrics."""
    state = client.app[STATE]
    start = state.metrics.polls.labels("success")._value.get() + \
        state.metrics.polls.labels("failure")._value.get()
    for _ in range(200):
        done = state.metrics.polls.labels("success")._value.get() + \
            state.metrics.polls.labels("failure")._value.get()
        if done >= start + n:
            break
        await asyncio.sleep(0.02)
    return await (await client.get("/metrics")).text()


# --------------------------------------------------------------------------- malformed args
NAMES = ["n1"]
BAD_ARGS = [
    pytest.param(b"{", "body is not JSON", id="not-json"),
    pytest.param(b"[]", "body: expected an ExtenderArgs object, got an array", id="array"),
    pytest.param(orjson.dumps({"Nodes": None, "NodeNames": NAMES}),
                 "Pod: expected a v1.Pod object, got null", id="no-pod"),
    pytest.param(orjson.dumps({"Pod": "p", "NodeNames": NAMES}),
                 "Pod: expected a v1.Pod object, got a string", id="pod-string"),
    pytest.param(orjson.dumps({"Pod": {"spec": []}, "NodeNames": NAMES}),
                 "Pod.spec: expected an object, got an array", id="pod-spec-array"),
    pytest.param(orjson.dumps({"Pod": {}, "Nodes": None, "NodeNames": None}),
                 "Nodes, NodeNames: expected one of them (a v1.NodeList or an array of node "
                 "names), got neither", id="no-nodes"),
    pytest.param(orjson.dumps({"Pod": {}, "NodeNames": "n1"}),
                 "NodeNames: expected an array of strings, got a string", id="names-string"),
    pytest.param(orjson.dumps({"Pod": {}, "NodeNames": ["n1", 7]}),
                 "NodeNames[1]: expected a node name, got a number", id="names-number"),
    pytest.param(orjson.dumps({"Pod": {}, "Nodes": ["n1"]}),
                 "Nodes: expected a v1.NodeList object, got an array", id="nodes-array"),
    pytest.param(orjson.dumps({"Pod": {}, "Nodes": {"items": {}}}),
                 "Nodes.items: expected an array, got an object", id="items-object"),
    pytest.param(orjson.dumps({"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}),
                 "Nodes.items[0].metadata.name: expected a node name, got null",
                 id="node-without-name"),
]


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
@pytest.mark.parametrize(("body", "message"), BAD_ARGS)
async def test_malformed_args_get_400_naming_the_field(client: PodClient, verb: str,
                                                       body: bytes, message: str) -> None:
    resp = await client.post(f"/scheduler/{verb}", data=body,
                             headers={"Content-Type": "application/json"})
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error.startswith(message), error
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "gpu_admission_extender_requests_total",
                        f'code="400",verb="{verb}"') == 1


async def test_wrong_content_type_method_and_path(client: PodClient) -> None:
    resp = await client.post("/scheduler/filter", data=b"{}",
                             headers={"Content-Type": "text/plain"})
    assert resp.status == 415
    assert (await resp.json())["error"] == "Content-Type must be application/json, got " \
                                           "'text/plain'"
    resp = await client.get("/scheduler/filter")
    assert resp.status == 404
    assert "POST /scheduler/filter, POST /scheduler/prioritize" in (await resp.json())["error"]
    resp = await client.post("/filter", json=args_with_names(pod(), NAMES))
    assert resp.status == 404


async def test_empty_node_lists_are_answered(client: PodClient) -> None:
    resp = await client.post("/scheduler/filter", json={"Pod": pod(), "Nodes": {"items": None},
                                                        "NodeNames": None})
    assert await resp.json() == {"Nodes": {"apiVersion": "v1", "kind": "NodeList",
                                           "items": []}, "NodeNames": None, "FailedNodes": {},
                                 "FailedAndUnresolvableNodes": {}, "Error": ""}
    resp = await client.post("/scheduler/prioritize", json=args_with_names(pod(), []))
    assert await resp.json() == []


# --------------------------------------------------------------------------- Prometheus garbage
GARBAGE = [
    pytest.param(lambda m: (200, b"<html>proxy error</html>"), "bad_response", id="html"),
    pytest.param(lambda m: (502, b"Bad Gateway"), "bad_response", id="502-text"),
    pytest.param(lambda m: (200, b'{"status":"success","data":{"resultType":"matrix",'
                                 b'"result":[]}}'), "bad_response", id="matrix"),
    pytest.param(lambda m: (200, b'"success"'), "bad_response", id="json-string"),
    pytest.param(lambda m: (422, b'{"status":"error","errorType":"execution",'
                                 b'"error":"query timed out"}'), "query_error", id="error"),
    pytest.param(lambda m: (503, b"{}"), "http_error", id="503-json"),
]


@pytest.mark.parametrize(("reply", "reason"), GARBAGE)
async def test_prometheus_garbage_gives_neutral_answers_and_counts(
        prom: tuple[FakePrometheus, str], client: PodClient,
        reply: Callable[[str], tuple[int, bytes]], reason: str) -> None:
    prom[0].reply = reply
    text = await polls(client)
    assert (metric_value(text, "gpu_admission_extender_poll_errors_total",
                         f'reason="{reason}"') or 0) >= 1
    assert metric_value(text, "gpu_admission_extender_metrics_stale") == 1
    resp = await client.post("/scheduler/prioritize",
                             json=args_with_nodes(pod(), [make_node("n1"), make_node("n2")]))
    assert await resp.json() == [{"Host": "n1", "Score": 5}, {"Host": "n2", "Score": 5}]


async def test_unreachable_prometheus_is_counted(aiohttp_client: AiohttpClient) -> None:
    config = ExtenderConfig(prometheus_url=f"http://127.0.0.1:{free_port()}",
                            interval_seconds=0.05)
    client = await aiohttp_client(create_app(config))
    text = await polls(client)
    assert (metric_value(text, "gpu_admission_extender_poll_errors_total",
                         'reason="unreachable"') or 0) >= 1
    resp = await client.post("/scheduler/filter", json=args_with_names(pod(), ["n1"]))
    assert (await resp.json())["NodeNames"] == ["n1"]


async def test_bad_samples_are_counted_per_reason(prom: tuple[FakePrometheus, str],
                                                  client: PodClient) -> None:
    """One good GPU (n1) next to garbage samples: the good one is used, each bad one is
    dropped and counted under its reason."""
    good = gpu_labels("n1")
    samples = {
        "DCGM_FI_DEV_GPU_UTIL": [(good, "45"), (gpu_labels("n2"), "NaN"),
                                 (gpu_labels("n3"), "+Inf"), (gpu_labels("n4"), "150"),
                                 ({"gpu": "0", "UUID": "GPU-x"}, "5"),
                                 ({"Hostname": "n5", "gpu": "0"}, "5")],
        "DCGM_FI_DEV_FB_USED": [(good, "1000"), (gpu_labels("n2"), "-1"),
                                (gpu_labels("n3"), "lots")],
        "DCGM_FI_DEV_FB_FREE": [(good, "70000")],
    }
    prom[0].reply = lambda metric: (200, orjson.dumps(vector(*samples[metric])))
    text = await polls(client)
    expected = {("DCGM_FI_DEV_GPU_UTIL", "nan"), ("DCGM_FI_DEV_GPU_UTIL", "infinite"),
                ("DCGM_FI_DEV_GPU_UTIL", "out_of_range"),
                ("DCGM_FI_DEV_GPU_UTIL", "no_node_label"), ("DCGM_FI_DEV_GPU_UTIL", "no_uuid"),
                ("DCGM_FI_DEV_FB_USED", "negative"), ("DCGM_FI_DEV_FB_USED", "unparsable")}
    for metric, reason in expected:
        value = metric_value(text, "gpu_admission_extender_bad_values_total",
                             f'metric="{metric}",reason="{reason}"')
        assert value is not None and value >= 1, (metric, reason)
    assert metric_value(text, "gpu_admission_extender_gpus") == 1
    resp = await client.post("/scheduler/prioritize",
                             json=args_with_names(pod(), ["n1", "n2", "n3"]))
    assert await resp.json() == [{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 5},
                                 {"Host": "n3", "Score": 5}]
    assert all(q.startswith("avg_over_time(DCGM_FI_DEV_") and q.endswith("[1m])")
               for q in prom[0].queries)


async def test_probes(client: PodClient) -> None:
    assert (await client.get("/healthz")).status == 200
    body = await (await client.get("/readyz")).json()
    assert body["status"] == "ready" and body["metrics"] in ("fresh", "stale")
