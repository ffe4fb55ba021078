"""Hostile input over HTTPS: the hand-written corpus, every quantity form, huge and deep
bodies, and hypothesis-generated requests, posted to ``/mutate`` and ``/validate`` of the real
app (in-process, real TLS verified against the CA bundle).

What must hold for every request (issue 6): 400/413/415 with a clear ``error`` for a
malformed request, a well-formed AdmissionReview for every well-formed one (uid and
apiVersion echoed; for an allowed pod, a patch that applies with ``jsonpatch`` and leaves a
schema-valid Pod schema-valid), never a 5xx, never a hang (client timeout 15 s), and the
server still healthy afterwards.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import patch_ops
from tests.hostile_support import (
    DATA,
    Client,
    Reply,
    ThreadServer,
    check_error,
    check_review,
    client_context,
    gpu_pod,
    in_process_config,
    new_bundle,
    review,
)

CASES: dict[str, str] = {name: str(expected) for name, expected in
                         yaml.safe_load((DATA / "cases.yaml").read_text())["cases"].items()}
QUANTITIES: dict[str, list[Any]] = yaml.safe_load((DATA / "quantities.yaml").read_text())
PATHS = ("/mutate", "/validate")
MAX_BODY = 8 * 2**20  # bytes: the server's default body limit (ServerConfig)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    tmp = tmp_path_factory.mktemp("hostile")
    bundle = new_bundle()
    with ThreadServer(in_process_config(tmp, bundle)) as srv:
        srv.ca = bundle.ca_pem  # type: ignore[attr-defined]
        yield srv


@pytest.fixture(scope="module")
def client(server: ThreadServer) -> Iterator[Client]:
    c = Client(server.port, client_context(server.ca))  # type: ignore[attr-defined]
    yield c
    c.close()


def expect(expected: str, body: bytes, reply: Reply) -> None:
    """Check ``reply`` against a cases.yaml expectation."""
    assert reply.status < 500, (reply.status, reply.body[:500])
    if expected in ("400", "413", "415"):
        check_error(reply, int(expected))
        return
    if expected == "400-or-review" and reply.status == 400:
        check_error(reply, 400)
        return
    request_doc = json.loads(body)  # same duplicate-key rule as orjson: the last one wins
    response = check_review(request_doc, reply)
    if expected == "allowed-untouched":
        assert response["allowed"] is True
        assert "patch" not in response
    elif expected == "denied":
        assert response["allowed"] is False
        assert response["status"]["code"] == 403


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("name", "expected"), sorted(CASES.items()),
                         ids=sorted(CASES))
def test_corpus(client: Client, name: str, expected: str, path: str) -> None:
    body = (DATA / "bodies" / name).read_bytes()
    expect(expected, body, client.post(path, body))


def test_corpus_lists_every_file() -> None:
    """A body file without an expectation would silently go untested."""
    assert sorted(CASES) == sorted(p.name for p in (DATA / "bodies").iterdir())


@pytest.mark.parametrize(("content_type", "expected"), [
    ("text/plain", "415"),
    (None, "415"),
    ("application/x-www-form-urlencoded", "415"),
    ("application/merge-patch+json", "415"),
    ("application/yaml", "415"),
    ("application/json; charset=utf-8", "review"),
    ("application/JSON", "review"),  # media types are case-insensitive (RFC 9110 8.3.1)
], ids=["text", "none", "form", "merge-patch", "yaml", "charset", "uppercase"])
@pytest.mark.parametrize("path", PATHS)
def test_content_types(client: Client, content_type: str | None, expected: str,
                       path: str) -> None:
    body = (DATA / "bodies" / "valid-gpu-pod.json").read_bytes()
    expect(expected, body, client.post(path, body, content_type=content_type))


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/mutate", 405), ("PUT", "/validate", 405), ("DELETE", "/mutate", 405),
    ("POST", "/mutate/", 404), ("POST", "/Mutate", 404), ("GET", "/../etc/passwd", 404),
], ids=["get-mutate", "put-validate", "delete-mutate", "trailing-slash", "case", "traversal"])
def test_wrong_method_or_path(client: Client, method: str, path: str, status: int) -> None:
    body = b"{}" if method != "GET" else None
    reply = client.request(method, path, body, {"Content-Type": "application/json"})
    check_error(reply, status)


def _quantity_cases() -> list[tuple[str, Any]]:
    """Every form for nvidia.com/gpu; a representative dozen for the other GPU resources."""
    values = (QUANTITIES["valid_grammar"] + QUANTITIES["json_numbers"]
              + QUANTITIES["not_quantities"])
    primary, *others = QUANTITIES["resources"]
    sample = values[::6]
    return [(primary, v) for v in values] + [(r, v) for r in others for v in sample]


@pytest.mark.parametrize(("resource", "quantity"), _quantity_cases(),
                         ids=[f"{r}={v!r}" for r, v in _quantity_cases()])
def test_quantities(client: Client, resource: str, quantity: Any) -> None:
    """Every quantity form in limits (and the same in requests): a review, never a 5xx."""
    pod = gpu_pod(quantity, resource)
    pod["spec"]["containers"][0]["resources"]["requests"] = {resource: quantity}
    doc = review(pod)
    body = orjson.dumps(doc)
    for path in PATHS:
        expect("review", body, client.post(path, body))


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _huge_label() -> dict[str, Any]:
    pod = gpu_pod()
    pod["metadata"]["labels"] = {"app": "x" * (2 * 2**20)}  # 2 MiB string
    return review(pod)


def _huge_env() -> dict[str, Any]:
    env = [{"name": f"VAR_{i}", "value": "v" * 16} for i in range(50_000)]
    return review(gpu_pod(env=env))


def _deep_unknown_field(depth: int) -> bytes:
    pod = orjson.dumps(gpu_pod())
    nested = _nested(depth)
    text = pod[:-1] + b',"x-deep":' + nested + b"}"
    return orjson.dumps(review(None)).replace(b'"object":null', b'"object":' + text)


@pytest.mark.parametrize(("name", "build", "expected"), [
    ("deep-array-100k", lambda: _nested(100_000), "400"),
    ("deep-object-100k", lambda: b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "400"),
    ("deep-in-pod-100k", lambda: _deep_unknown_field(100_000), "400"),
    ("deep-in-pod-200", lambda: _deep_unknown_field(200), "400-or-review"),
    ("label-value-2MiB", lambda: orjson.dumps(_huge_label()), "review"),
    ("env-50k-entries", lambda: orjson.dumps(_huge_env()), "review"),
    ("body-over-limit", lambda: b'{"a":"' + b"x" * (MAX_BODY + 1) + b'"}', "413"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_huge_and_deep(client: Client, name: str, build: Any, expected: str) -> None:
    body = build()
    for path in PATHS:
        reply = client.post(path, body)
        if expected == "review" or (expected == "400-or-review" and reply.status == 200):
            # schema validation of a 50k-entry pod is slow and proves nothing new here
            response = check_review(json.loads(body), reply, schema=False)
            assert response["allowed"] in (True, False)
        else:
            expect(expected, body, reply)


def test_content_length_claims_more_than_the_limit(server: ThreadServer) -> None:
    """A header announcing 100 MiB is refused from the header alone: no waiting for a body
    that never comes, no buffering of one that does."""
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=10,
                                       context=client_context(server.ca))  # type: ignore[attr-defined]
    conn.putrequest("POST", "/mutate")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(100 * 2**20))
    conn.endheaders()
    conn.send(b'{"apiVersion":')
    resp = conn.getresponse()
    assert resp.status == 413
    assert "error" in orjson.loads(resp.read())
    conn.close()


# --- hypothesis ---------------------------------------------------------------------------

FUZZ = settings(max_examples=120, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8),
                                                                       children, max_size=4),
    max_leaves=20)


@FUZZ
@given(body=st.binary(max_size=2000), path=st.sampled_from(PATHS))
def test_fuzz_bytes(client: Client, body: bytes, path: str) -> None:
    check_error(client.post(path, body), 400)


@FUZZ
@given(value=json_values, path=st.sampled_from(PATHS))
def test_fuzz_json_values(client: Client, value: Any, path: str) -> None:
    check_error(client.post(path, json.dumps(value).encode()), 400)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out += _paths(value, (*prefix, i))
    return out


ENVELOPE = review(gpu_pod(env=[{"name": "A", "value": "1"}], ports=[{"containerPort": 80}]))
ENVELOPE["request"]["object"]["metadata"]["labels"] = {"app": "x"}
ENVELOPE["request"]["object"]["spec"]["nodeSelector"] = {"gpu-pool": "inference"}
ENVELOPE_PATHS = _paths(ENVELOPE)


@FUZZ
@given(where=st.sampled_from(ENVELOPE_PATHS), value=json_values, path=st.sampled_from(PATHS))
def test_fuzz_one_field_replaced(client: Client, where: tuple[Any, ...], value: Any,
                                 path: str) -> None:
    """Any single field of a valid review replaced by any JSON value: 400 or a valid review."""
    doc = json.loads(json.dumps(ENVELOPE))
    target = doc
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    body = json.dumps(doc).encode()  # json: integers beyond 64 bits too
    reply = client.post(path, body)
    if reply.status == 400:
        check_error(reply, 400)
    else:
        check_review(doc, reply)


QUANTITY_VALUES = (QUANTITIES["valid_grammar"] + QUANTITIES["json_numbers"]
                   + QUANTITIES["not_quantities"])
ENV_NAMES = ["NVIDIA_MEM_LIMIT_MB", "GPU_MEMORY_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION",
             "XLA_CLIENT_MEM_FRACTION", "TF_FORCE_GPU_ALLOW_GROWTH", "CUDA_VISIBLE_DEVICES",
             "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "PYTORCH_CUDA_ALLOC_CONF", "A", "PATH"]
IMAGES = ["nvcr.io/nvidia/tritonserver:24.05-py3", "nvcr.io/nvidia/pytorch:25.12-py3",
          "nvidia/cuda:12.1.0-base-ubuntu22.04", "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
          "vllm/vllm-openai:latest", "registry.local/llm:1.0-cu121", "busybox", "nginx:1.27",
          "tensorflow/tensorflow:2.15.0-gpu", "nvcr.io/nvidia/tritonserver:99.99-py3"]

env_var = st.one_of(
    st.builds(lambda n, v: {"name": n, "value": v},
              st.sampled_from(ENV_NAMES) | st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True),
              st.text(max_size=12)),
    st.builds(lambda n: {"name": n, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
              st.sampled_from(ENV_NAMES)),
)
quantities = st.dictionaries(
    st.sampled_from(["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb",
                     "nvidia.com/mig-3g.40gb.shared", "cpu", "memory", "amd.com/gpu"]),
    st.sampled_from(QUANTITY_VALUES) | st.integers(-3, 16), max_size=3)
container = st.fixed_dictionaries(
    {"name": st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True),
     "image": st.sampled_from(IMAGES) | st.text(max_size=24)},
    optional={"resources": st.fixed_dictionaries({}, optional={"limits": quantities,
                                                               "requests": quantities}),
              "env": st.lists(env_var, max_size=6)})
label_keys = st.sampled_from(["gpu-admission.io/workload", "gpu-admission.io/cuda-version",
                              "training.kubeflow.org/job-name", "notebook-name", "app"])
label_values = st.sampled_from(["training", "inference", "notebook", "12.4", "12.1", "11.8",
                                "13.0", "x", ""]) | st.text(max_size=10)
selector = st.dictionaries(
    st.sampled_from(["gpu-pool", "gpu-admission.io/cuda-version", "a~b/c",
                     "nvidia.com/gpu.sharing-strategy"]),
    st.sampled_from(["inference", "training", "12.4", "12.1", "time-slicing", "none", ""]),
    max_size=3)
affinity = st.sampled_from([
    {}, {"nodeAffinity": {}},
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu-pool", "operator": "In", "values": ["inference"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}]}}},
    {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [
            {"key": "gpu-admission.io/cuda-version", "operator": "In", "values": ["12.4"]}]}}]}},
])


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": "team-a",
                                "labels": draw(st.dictionaries(label_keys, label_values,
                                                               max_size=3))}
    if draw(st.booleans()):
        metadata["ownerReferences"] = [{
            "apiVersion": "kubeflow.org/v1", "name": "owner", "uid": "1",
            "kind": draw(st.sampled_from(["PyTorchJob", "TFJob", "ReplicaSet", "Notebook"]))}]
    spec: dict[str, Any] = {"containers": draw(st.lists(container, min_size=1, max_size=3))}
    if draw(st.booleans()):
        spec["initContainers"] = draw(st.lists(container, max_size=2))
    if draw(st.booleans()):
        spec["nodeSelector"] = draw(selector)
    if draw(st.booleans()):
        spec["affinity"] = draw(affinity)
    scheduler = draw(st.sampled_from([None, "default-scheduler", "gpu-aware-scheduler",
                                      "volcano"]))
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


@settings(FUZZ, max_examples=150)
@given(pod=pods(), api_version=st.sampled_from(["admission.k8s.io/v1",
                                                 "admission.k8s.io/v1beta1"]))
def test_fuzz_pods(client: Client, pod: dict[str, Any], api_version: str) -> None:
    """Generated pods: /mutate answers a valid review; an allowed pod's patch applies and a
    valid Pod stays valid; the mutated pod then gets a valid review from /validate."""
    doc = review(pod, api_version=api_version)
    response = check_review(doc, client.post("/mutate", orjson.dumps(doc)))
    if not response["allowed"]:
        return
    final = pod
    if "patch" in response:
        final = jsonpatch.apply_patch(pod, patch_ops(response))
    doc2 = review(final, api_version=api_version)
    check_review(doc2, client.post("/validate", orjson.dumps(doc2)))


def test_server_still_healthy(server: ThreadServer, client: Client, tmp_path: Path) -> None:
    """After everything above: /healthz answers, no exception was logged, and the decision
    log has records (nothing was silently dropped on the floor)."""
    reply = client.request("GET", "/healthz")
    assert reply.status == 200
    log = server.log.getvalue().decode()
    for line in log.splitlines():
        record = json.loads(line)
        assert record.get("level") != "error", line[:500]
        assert "exception" not in record, line[:500]
