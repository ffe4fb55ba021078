"""End-to-end tests of the webhook server: the real app on a real TLS socket, clients that
talk like the API server (HTTPS, CA bundle verified for gpu-admission.gpu-admission.svc),
AdmissionReview JSON in, exact JSON out.
"""

from __future__ import annotations

import asyncio
import copy
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch
import kubernetes_validate
import orjson
import pytest

from gpu_admission.certs.bundle import generate_bundle
from gpu_admission.policy.model import default_policy_text
from gpu_admission.server import app as app_module
from gpu_admission.server.app import ssl_context
from gpu_admission.server.config import MiB
from gpu_admission.server.run import stop
from tests.builders import make_container, make_pod, make_review, patch_ops
from tests.server_support import (
    SERVICE_HOST,
    SecretDir,
    Server,
    close_writer,
    make_config,
    new_bundle,
    open_tls,
    peer_cert_der,
    poll_until,
    read_response,
    request_head,
    running_server,
)

INFERENCE = {"gpu-admission.io/workload": "inference"}
TRAINING = {"gpu-admission.io/workload": "training"}
TRITON = "nvcr.io/nvidia/tritonserver:24.05-py3"
CUDA_SOURCE = f"image {TRITON} (spec.containers[0])"
MEMORY_ENV = [  # default policy: 16000 MiB, fraction 0.2 of the card
    {"name": "NVIDIA_MEM_LIMIT_MB", "value": "16000"},
    {"name": "GPU_MEMORY_FRACTION", "value": "0.2"},
    {"name": "XLA_CLIENT_MEM_FRACTION", "value": "0.2"},
    {"name": "XLA_PYTHON_CLIENT_MEM_FRACTION", "value": "0.2"},
    {"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "true"},
]


def expected_mutated(pod: dict[str, Any], memory_env: list[dict[str, str]]) -> dict[str, Any]:
    """The inference pod after mutation, written out by hand from the default policy
    (scheduler, CUDA node-pool selector, memory env, our annotation)."""
    out = copy.deepcopy(pod)
    out["spec"]["schedulerName"] = "gpu-aware-scheduler"
    out["spec"]["nodeSelector"] = {"gpu-admission.io/cuda-version": "12.4"}
    out["spec"]["containers"][0]["env"] = memory_env
    out["metadata"]["annotations"] = {
        "gpu-admission.io/mutated": "env,nodeSelector,schedulerName"}
    return out


INFERENCE_NOTES = {
    "decision": "allowed", "workload": "inference",
    "workload-reason": "label gpu-admission.io/workload", "cuda-version": "12.4",
    "cuda-source": CUDA_SOURCE,
}


@pytest.fixture
def secret(tmp_path: Path) -> SecretDir:
    return SecretDir(tmp_path / "certs", new_bundle())


@pytest.fixture
async def server(secret: SecretDir, tmp_path: Path) -> AsyncIterator[Server]:
    config = make_config(secret, audit_log=str(tmp_path / "audit.log"))
    async with running_server(config, secret.bundles[0].ca_pem) as srv:
        yield srv


# --- decisions --------------------------------------------------------------------------

async def test_mutate_inference_pod_patch_yields_the_mutated_pod(server: Server) -> None:
    pod = make_pod(labels=INFERENCE)
    review = make_review(pod, uid="uid-mutate-1")
    status, body, headers = await server.post("/mutate?timeout=10s", review)
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    response = body["response"]
    patched = jsonpatch.apply_patch(pod, patch_ops(response))
    assert patched == expected_mutated(pod, MEMORY_ENV)
    assert body == {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {
            "uid": "uid-mutate-1", "allowed": True, "patchType": "JSONPatch",
            "patch": response["patch"],
            "auditAnnotations": {
                **INFERENCE_NOTES,
                "patch": "spec.schedulerName; spec.nodeSelector; spec.containers[0].env; "
                         "metadata.annotations"},
        },
    }


DATA = Path(__file__).parent.parent / "data" / "server"


async def test_a_review_as_the_api_server_sends_it_gives_the_expected_pod(
        server: Server) -> None:
    """A full defaulted Pod from a ReplicaSet (generateName, managedFields, tolerations, an
    existing env list, a sidecar without GPU), read from disk; the expected mutated Pod is
    written out by hand in tests/data/server/pod-mutated-inference.json."""
    raw = (DATA / "review-create-inference.json").read_bytes()
    request_pod = orjson.loads(raw)["request"]["object"]
    status, body, _ = await server.post("/mutate?timeout=10s", None, raw=raw)
    assert status == 200
    response = body["response"]
    patched = jsonpatch.apply_patch(request_pod, patch_ops(response))
    expected = orjson.loads((DATA / "pod-mutated-inference.json").read_bytes())
    assert patched == expected
    kubernetes_validate.validate(patched, "1.30", strict=True)  # still a schema-valid Pod
    assert (response["uid"], response["allowed"]) == ("705ab4f5-6393-11e8-b7cc-42010a800002",
                                                      True)
    records = [x for x in server.log_lines() if x["event"] == "review"]
    assert {k: records[-1][k] for k in ("namespace", "pod", "user", "decision")} == {
        "namespace": "ml-serving", "pod": "triton-7d9c8b6f5-", "decision": "mutated",
        "user": "system:serviceaccount:kube-system:replicaset-controller"}


async def test_validate_never_returns_a_patch(server: Server) -> None:
    review = make_review(make_pod(labels=INFERENCE), uid="uid-validate-1")
    status, body, _ = await server.post("/validate", review)
    assert (status, body) == (200, {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": "uid-validate-1", "allowed": True,
                     "auditAnnotations": INFERENCE_NOTES}})


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
async def test_training_on_shared_gpu_is_denied_with_403_and_a_fix(server: Server,
                                                                    path: str) -> None:
    pod = make_pod(labels=TRAINING,
                   containers=[make_container(resource="nvidia.com/gpu.shared")])
    status, body, _ = await server.post(path, make_review(pod, uid="uid-deny"))
    assert status == 200
    response = body["response"]
    message = response["status"].pop("message")
    assert message.startswith("[no-training-on-shared-gpu] spec.containers[0].resources: "
                              "training pod targets a time-sliced GPU")
    assert "Request nvidia.com/gpu on a dedicated node pool" in message  # how to fix it
    assert response == {
        "uid": "uid-deny", "allowed": False,
        "status": {"status": "Failure", "code": 403, "reason": "Forbidden"},
        "auditAnnotations": {
            "decision": "denied", "workload": "training",
            "workload-reason": "label gpu-admission.io/workload", "cuda-version": "12.4",
            "cuda-source": CUDA_SOURCE, "violations": "no-training-on-shared-gpu=enforce"},
    }


async def test_warnings_are_sent_without_prefix(server: Server) -> None:
    pod = make_pod(labels={"gpu-admission.io/workload": "bogus"})
    status, body, _ = await server.post("/mutate", make_review(pod))
    assert status == 200
    assert body["response"]["warnings"] == [
        "workload-label: unknown workload 'bogus'; use one of training, inference, notebook "
        "(classified as inference)"]
    assert body["response"]["auditAnnotations"]["warnings"] == "1"


async def test_v1beta1_is_answered_in_v1beta1(server: Server) -> None:
    pod = make_pod(labels=INFERENCE)
    review = make_review(pod, uid="uid-beta", api_version="admission.k8s.io/v1beta1")
    status, body, _ = await server.post("/mutate", review)
    assert status == 200
    assert body["apiVersion"] == "admission.k8s.io/v1beta1"
    assert body["kind"] == "AdmissionReview"
    assert body["response"]["uid"] == "uid-beta"
    assert jsonpatch.apply_patch(pod, patch_ops(body["response"])) == \
        expected_mutated(pod, MEMORY_ENV)


async def test_dry_run_is_decided_the_same_and_recorded_as_dry_run(
        secret: SecretDir, tmp_path: Path) -> None:
    audit = tmp_path / "audit.log"
    pod = make_pod(labels=INFERENCE)
    config = make_config(secret, audit_log=str(audit))
    async with running_server(config, secret.bundles[0].ca_pem) as srv:
        _, wet, _ = await srv.post("/mutate", make_review(pod, uid="wet"))
        _, dry, _ = await srv.post("/mutate", make_review(pod, uid="dry", dry_run=True))
    wet["response"].pop("uid")
    dry["response"].pop("uid")
    assert dry == wet
    records = [orjson.loads(line) for line in audit.read_bytes().splitlines()]
    assert [(r["uid"], r["dryRun"], r["decision"], r["mutated"]) for r in records] == [
        ("wet", False, "allowed", True), ("dry", True, "allowed", True)]
    assert records[1]["instance"] == "test-instance"
    assert records[1]["policyDigest"].startswith("sha256:")


async def test_update_is_validated_never_mutated(server: Server) -> None:
    pod = make_pod(labels=INFERENCE)
    review = make_review(pod, operation="UPDATE", old=pod, uid="uid-update")
    status, body, _ = await server.post("/mutate", review)
    assert (status, body["response"]) == (200, {
        "uid": "uid-update", "allowed": True, "auditAnnotations": INFERENCE_NOTES})
    denied = make_pod(labels=TRAINING,
                      containers=[make_container(resource="nvidia.com/gpu.shared")])
    _, body, _ = await server.post("/mutate", make_review(denied, operation="UPDATE",
                                                          old=denied))
    assert body["response"]["allowed"] is False
    assert "patch" not in body["response"]


@pytest.mark.parametrize(("review", "path"), [
    (make_review(make_pod(), operation="DELETE", old=make_pod(), uid="u"), "/mutate"),
    (make_review({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}},
                 kind="Service", uid="u"), "/mutate"),
    (make_review(make_pod(), operation="CONNECT", uid="u"), "/validate"),
    ({**make_review(make_pod(), operation="UPDATE", old=make_pod(), uid="u"),
      "request": {**make_review(make_pod(), operation="UPDATE", old=make_pod(),
                                uid="u")["request"], "subResource": "status"}}, "/mutate"),
], ids=["delete", "service", "connect", "pods-status-subresource"])
async def test_other_operations_and_kinds_are_allowed_untouched(
        server: Server, review: dict[str, Any], path: str) -> None:
    status, body, _ = await server.post(path, review)
    assert (status, body) == (200, {"apiVersion": "admission.k8s.io/v1",
                                    "kind": "AdmissionReview",
                                    "response": {"uid": "u", "allowed": True}})


async def test_largest_update_the_api_server_can_send_is_accepted(server: Server) -> None:
    big = "x" * (3 * MiB - 4096)  # an object near the API server's 3 MiB write limit
    pod = make_pod(labels=INFERENCE, annotations={"big": big})
    review = make_review(pod, operation="UPDATE", old=pod, uid="big")
    status, body, _ = await server.post("/validate", review)
    assert (status, body["response"]["uid"], body["response"]["allowed"]) == (200, "big", True)


async def test_exception_in_the_engine_is_a_500_admission_review_with_uid(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom-secret-detail")

    monkeypatch.setattr(app_module, "evaluate", broken)
    status, body, _ = await server.post("/mutate", make_review(make_pod(), uid="uid-500"))
    assert (status, body) == (500, {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": "uid-500", "allowed": False, "status": {
            "status": "Failure", "code": 500, "reason": "InternalError",
            "message": "gpu-admission failed to evaluate the pod (RuntimeError); see the "
                       "webhook log for uid uid-500"}}})
    failures = [line for line in server.log_lines() if line["event"] == "decision_failed"]
    assert len(failures) == 1
    assert "boom-secret-detail" in failures[0]["exception"]  # traceback in the log only


async def test_a_bug_outside_the_decision_is_a_plain_500_without_traceback(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(body: bytes) -> Any:
        raise RuntimeError("parser-internals")

    monkeypatch.setattr(app_module, "parse_review", broken)
    status, body, _ = await server.post("/mutate", make_review(make_pod()))
    assert (status, body) == (500, {"error": "internal error in gpu-admission; see the "
                                             "webhook log"})
    assert any("parser-internals" in line.get("exception", "")
               for line in server.log_lines())
    assert server.state.in_flight == 0


# --- malformed requests ----------------------------------------------------------------

def _review_with(**request_fields: Any) -> bytes:
    review = make_review(make_pod(), uid="u")
    review["request"].update(request_fields)
    return orjson.dumps(review)


def _review_pod(mutate: Any) -> bytes:
    pod = make_pod()
    mutate(pod)
    return orjson.dumps(make_review(pod, uid="u"))


MALFORMED = [
    ("bad-json", b"{", 400, "body is not valid JSON: unexpected end of data: line 1 column 2 "
                            "(char 1)"),
    ("empty-body", b"", 400, "body is not valid JSON: Input is a zero-length, empty document: "
                             "line 1 column 1 (char 0)"),
    ("json-array", b"[1,2]", 400, "body must be a JSON object (an AdmissionReview), got array"),
    ("json-null", b"null", 400, "body must be a JSON object (an AdmissionReview), got null"),
    ("wrong-kind", b'{"kind":"Pod","apiVersion":"admission.k8s.io/v1"}', 400,
     "kind must be \"AdmissionReview\", got 'Pod'"),
    ("wrong-api-version", b'{"kind":"AdmissionReview","apiVersion":"v1"}', 400,
     "apiVersion must be admission.k8s.io/v1 or admission.k8s.io/v1beta1, got 'v1'"),
    ("no-request", b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}', 400,
     "request must be an object, got null"),
    ("missing-uid", _review_with(uid=None), 400,
     "request.uid must be a non-empty string, got null"),
    ("empty-uid", _review_with(uid=""), 400,
     "request.uid must be a non-empty string, got an empty string"),
    ("uid-number", _review_with(uid=7), 400, "request.uid must be a non-empty string, "
                                              "got number"),
    ("operation-bad", _review_with(operation="PATCH"), 400,
     "request.operation must be one of CREATE, UPDATE, DELETE, CONNECT, got 'PATCH'"),
    ("object-string", _review_with(object="pod"), 400,
     "request.object must be an object or null, got string"),
    ("object-null-create", _review_with(object=None), 400,
     "request.object must be a Pod on CREATE, got null"),
    ("dry-run-string", _review_with(dryRun="yes"), 400,
     "request.dryRun must be a boolean, got string"),
    ("groups-not-strings", _review_with(userInfo={"username": "a", "groups": [1]}), 400,
     "request.userInfo.groups must be an array of strings, got array"),
    ("containers-object", _review_pod(lambda p: p["spec"].update(containers={})), 400,
     "request.object.spec.containers must be an array, got object"),
    ("label-number", _review_pod(lambda p: p["metadata"].update(labels={"a": 1})), 400,
     "request.object.metadata.labels['a'] must be a string, got number"),
    ("env-value-number", _review_pod(
        lambda p: p["spec"]["containers"][0].update(env=[{"name": "A", "value": 5}])), 400,
     "request.object.spec.containers[0].env[0].value must be a string, got number"),
    ("limit-bool", _review_pod(
        lambda p: p["spec"]["containers"][0]["resources"]["limits"].update(x=True)), 400,
     "request.object.spec.containers[0].resources.limits['x'] must be a quantity "
     "(string or number), got boolean"),
    ("huge-label-key", _review_pod(lambda p: p["metadata"].update(labels={"k" * 100000: 1})),
     400, ("request.object.metadata.labels['" + "k" * 100000)[:199] + "… must be a string, "
     "got number"),  # the field path is cut at 200 characters
    ("deeply-nested", b"[" * 5000 + b"]" * 5000, 400,
     "body is not valid JSON: depth limit exceeded: line 1 column 1026 (char 1025)"),
]


@pytest.mark.parametrize(("body", "code", "error"), [m[1:] for m in MALFORMED],
                         ids=[m[0] for m in MALFORMED])
async def test_malformed_review_is_400_naming_the_problem(server: Server, body: bytes,
                                                          code: int, error: str) -> None:
    status, payload, _ = await server.post("/mutate", None, raw=body)
    assert (status, payload) == (code, {"error": error})


@pytest.mark.parametrize(("headers", "error"), [
    ({"Content-Type": "text/plain"}, "Content-Type must be application/json, got 'text/plain'"),
    ({}, "Content-Type must be application/json, got 'application/octet-stream'"),
], ids=["text-plain", "no-content-type"])
async def test_wrong_content_type_is_415(server: Server, headers: dict[str, str],
                                         error: str) -> None:
    status, payload, _ = await server.post("/validate", None, raw=b"{}", headers=headers)
    assert (status, payload) == (415, {"error": error})


async def test_undecodable_content_encoding_is_400(server: Server) -> None:
    reader, writer = await open_tls(server.running.port, server.ca_pems)
    writer.write(request_head("/mutate", 5, extra="Content-Encoding: gzip\r\n") + b"abcde")
    await writer.drain()
    status, headers, reply = await asyncio.wait_for(read_response(reader), 5)
    assert (status, orjson.loads(reply)) == (400, {
        "error": "request body could not be read: Can not decode content-encoding: gzip"})
    assert headers["connection"] == "close"
    await close_writer(writer)


async def test_wrong_method_is_405_with_allow(server: Server) -> None:
    async with server.session.get(server.url("/mutate"), server_hostname=SERVICE_HOST) as resp:
        assert resp.status == 405
        assert resp.headers["Allow"] == "POST"
        assert await resp.json() == {"error": "/mutate accepts POST only, got GET"}


async def test_unknown_path_is_404_json(server: Server) -> None:
    status, payload, _ = await server.post("/nope", {})
    assert status == 404
    assert payload["error"].startswith("no such endpoint '/nope'")


async def test_probe_paths_accept_get_only(server: Server) -> None:
    status, payload, headers = await server.post("/healthz", {})
    assert (status, payload) == (405, {"error": "/healthz accepts GET only, got POST"})
    assert headers["Allow"] == "GET, HEAD"


async def test_body_over_the_limit_is_413(secret: SecretDir) -> None:
    config = make_config(secret, max_body_bytes=64 * 1024)
    async with running_server(config, secret.bundles[0].ca_pem) as srv:
        status, payload, _ = await srv.post("/mutate", None, raw=b" " * (64 * 1024 + 1))
        assert (status, payload) == (413, {
            "error": "body of 65537 bytes is over the limit of 65536 bytes"})

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked upload
            for _ in range(20):
                yield b" " * 8192

        async with srv.session.post(srv.url("/mutate"), data=chunks(), headers={
                "Content-Type": "application/json"}, server_hostname=SERVICE_HOST) as resp:
            assert resp.status == 413
            assert await resp.json() == {"error": "body is over the limit of 65536 bytes"}
        # the server still answers afterwards
        status, _, _ = await srv.post("/validate", make_review(make_pod()))
        assert status == 200


# --- probes and metrics -----------------------------------------------------------------

async def test_probes_on_https_and_on_the_plain_metrics_port(server: Server) -> None:
    async with aiohttp.ClientSession() as plain:
        for url in (server.probe_url("/healthz"),):
            async with plain.get(url) as resp:
                assert (resp.status, await resp.json()) == (200, {"status": "ok"})
        async with plain.get(server.probe_url("/readyz")) as resp:
            assert resp.status == 200
            assert (await resp.json())["status"] == "ready"
        async with plain.post(server.probe_url("/mutate"), data=b"{}") as resp:
            assert resp.status == 404  # no webhook over plain HTTP
    async with server.session.get(server.url("/readyz"), server_hostname=SERVICE_HOST) as resp:
        assert resp.status == 200
    server.state.draining = True
    async with server.session.get(server.url("/readyz"), server_hostname=SERVICE_HOST) as resp:
        assert (resp.status, await resp.json()) == (503, {"status": "not ready",
                                                          "reasons": ["shutting down"]})
        assert resp.headers.get("Connection") != "keep-alive"
    server.state.draining = False


async def test_metrics_count_requests_decisions_and_rules(server: Server) -> None:
    await server.post("/mutate", make_review(make_pod(labels=INFERENCE)))
    shared = make_pod(labels=TRAINING,
                      containers=[make_container(resource="nvidia.com/gpu.shared")])
    await server.post("/validate", make_review(shared, dry_run=True))
    await server.post("/validate", None, raw=b"{")
    async with aiohttp.ClientSession() as plain, plain.get(server.probe_url("/metrics")) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    for line in (
        'gpu_admission_requests_total{code="200",path="/mutate"} 1.0',
        'gpu_admission_requests_total{code="200",path="/validate"} 1.0',
        'gpu_admission_requests_total{code="400",path="/validate"} 1.0',
        'gpu_admission_request_duration_seconds_count{path="/validate"} 2.0',
        'gpu_admission_decisions_total{dry_run="false",result="mutated",stage="mutate"} 1.0',
        'gpu_admission_decisions_total{dry_run="true",result="denied",stage="validate"} 1.0',
        'gpu_admission_rule_violations_total{mode="enforce",rule="no-training-on-shared-gpu",'
        'stage="validate"} 1.0',
        "gpu_admission_in_flight_requests 0.0",
        "gpu_admission_receiving_requests 0.0",
        'gpu_admission_overload_rejections_total{reason="in_flight"} 0.0',
        'gpu_admission_policy_reloads_total{result="failure"} 0.0',
        "gpu_admission_ready 1.0",
    ):
        assert line in text.splitlines(), line
    expiry = next(float(x.split()[1]) for x in text.splitlines()
                  if x.startswith("gpu_admission_certificate_expiry_timestamp_seconds "))
    assert expiry > 1.7e9
    # one structured line per request, with who/what/decision/duration
    reviews = [x for x in server.log_lines() if x["event"] == "review"]
    assert {k: reviews[0][k] for k in ("namespace", "pod", "operation", "user", "decision")} \
        == {"namespace": "team-a", "pod": "pod", "operation": "CREATE",
            "user": "alice@example.com", "decision": "mutated"}
    assert reviews[0]["duration_ms"] >= 0 and reviews[0]["uid"]


# --- TLS ---------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
async def test_tls_1_1_is_refused_and_1_2_accepted(server: Server) -> None:
    # A client that really offers TLS 1.0/1.1 (OpenSSL 3 refuses them at its default
    # security level, so lower it): the server's TLS 1.2 minimum is what refuses it.
    old = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                     cadata=server.ca_pems[0].decode())
    old.minimum_version = ssl.TLSVersion.TLSv1
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await open_tls(server.running.port, server.ca_pems, ctx=old)
    v12 = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=server.ca_pems[0].decode())
    v12.maximum_version = ssl.TLSVersion.TLSv1_2
    _, writer = await open_tls(server.running.port, server.ca_pems, ctx=v12)
    assert writer.get_extra_info("ssl_object").version() == "TLSv1.2"
    await close_writer(writer)


async def test_certificate_is_verified_for_the_service_name_only(server: Server) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        await open_tls(server.running.port, server.ca_pems, server_hostname="evil.example")


async def test_cert_rotation_under_load_fails_no_request_and_serves_the_new_cert(
        secret: SecretDir) -> None:
    first, second = secret.bundles[0], new_bundle()
    config = make_config(secret)
    async with running_server(config, first.ca_pem, second.ca_pem) as srv:
        failures: list[str] = []
        sent = 0
        stop = asyncio.Event()

        async def client() -> None:  # new TLS connection for every request
            nonlocal sent
            connector = aiohttp.TCPConnector(ssl=srv.session.connector._ssl,  # type: ignore[union-attr]
                                             force_close=True)
            async with aiohttp.ClientSession(connector=connector) as session:
                while not stop.is_set():
                    try:
                        async with session.post(
                                srv.url("/mutate"), data=orjson.dumps(make_review(make_pod())),
                                headers={"Content-Type": "application/json"},
                                server_hostname=SERVICE_HOST) as resp:
                            await resp.read()
                            if resp.status != 200:
                                failures.append(f"HTTP {resp.status}")
                    except (aiohttp.ClientError, ssl.SSLError, OSError) as exc:
                        failures.append(repr(exc))
                    sent += 1

        tasks = [asyncio.create_task(client()) for _ in range(4)]
        await asyncio.sleep(0.3)
        # a mismatched pair (new cert, old key) is never loaded
        secret.rotate(second, key_pem=first.key_pem)
        await poll_until(lambda: srv.state.metrics.cert_reloads.labels("failure")._value.get()
                        >= 1)
        # a half-written key file is never loaded either
        secret.rotate(second, key_pem=second.key_pem[:60])
        await poll_until(lambda: srv.state.metrics.cert_reloads.labels("failure")._value.get()
                         >= 2)
        _, writer = await open_tls(srv.running.port, srv.ca_pems)
        assert peer_cert_der(writer) == _der(first.cert_pem)
        await close_writer(writer)
        assert srv.state.tls.generation == 0
        # the real rotation
        secret.rotate(second)
        await poll_until(lambda: srv.state.tls.generation == 1)
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.gather(*tasks)
        assert failures == []
        assert sent > 20
        for hostname in (SERVICE_HOST, "127.0.0.1"):  # with SNI and without (IP: no SNI)
            ctx = ssl.create_default_context(cadata=second.ca_pem.decode())
            ctx.check_hostname = hostname == SERVICE_HOST
            _, writer = await open_tls(srv.running.port, srv.ca_pems, ctx=ctx,
                                       server_hostname=hostname)
            assert peer_cert_der(writer) == _der(second.cert_pem)
            await close_writer(writer)


def _der(pem: bytes) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.decode())


# --- policy reload --------------------------------------------------------------------------

async def test_policy_reload_good_then_bad_keeps_the_last_good(secret: SecretDir,
                                                               tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    text = default_policy_text()
    policy.write_text(text)
    config = make_config(secret, policy_path=policy)
    pod = make_pod(labels=INFERENCE)
    async with running_server(config, secret.bundles[0].ca_pem) as srv:
        _, body, _ = await srv.post("/mutate", make_review(pod))
        assert jsonpatch.apply_patch(pod, patch_ops(body["response"])) == \
            expected_mutated(pod, MEMORY_ENV)
        digest = srv.state.policy_digest

        tmp = tmp_path / "policy.new"  # replace atomically, as a ConfigMap update does
        tmp.write_text(text.replace("defaultMemoryMiB: 16000", "defaultMemoryMiB: 8000"))
        tmp.replace(policy)
        await poll_until(lambda: srv.state.policy_digest != digest)
        _, body, _ = await srv.post("/mutate", make_review(pod))
        env = [{**e, "value": "8000"} if e["name"] == "NVIDIA_MEM_LIMIT_MB" else e
               for e in MEMORY_ENV]
        assert jsonpatch.apply_patch(pod, patch_ops(body["response"])) == \
            expected_mutated(pod, env)
        good = srv.state.policy_digest

        policy.write_text(text.replace("defaultMemoryMiB: 16000", "defaultMemoryMiB: -5"))
        await poll_until(lambda: srv.state.metrics.policy_reloads.labels("failure")
                        ._value.get() == 1)
        assert srv.state.policy_digest == good
        _, body, _ = await srv.post("/mutate", make_review(pod))
        assert jsonpatch.apply_patch(pod, patch_ops(body["response"])) == \
            expected_mutated(pod, env)
        errors = [x for x in srv.log_lines() if x["event"] == "policy_reload_failed"]
        assert len(errors) == 1 and "defaultMemoryMiB" in errors[0]["error"]
        assert srv.state.metrics.policy_reloads.labels("success")._value.get() == 1


# --- overload and slow clients ---------------------------------------------------------

async def test_half_sent_reviews_over_the_bound_get_a_fast_429(secret: SecretDir) -> None:
    config = make_config(secret, max_in_flight=2)
    async with running_server(config, secret.bundles[0].ca_pem) as srv:
        body = orjson.dumps(make_review(make_pod(), uid="slow"))

        async def half_sent() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            reader, writer = await open_tls(srv.running.port, srv.ca_pems)
            writer.write(request_head("/mutate", len(body)) + body[:10])
            await writer.drain()
            return reader, writer

        held = [await half_sent(), await half_sent()]  # the bound: two bodies still coming
        await poll_until(lambda: srv.state.receiving == 2)
        # A third half-sent review is refused at once, before its body is read ...
        reader, writer = await half_sent()
        async with asyncio.timeout(2):
            code, _, reply = await read_response(reader)
        assert (code, orjson.loads(reply)) == (429, {
            "error": "overloaded: 2 admission reviews are still sending their body (limit 2); "
                     "retry later"})
        await close_writer(writer)
        # ... while complete reviews (the API server sends each body in one go) are not
        # starved by the held ones: decided at once, every time.
        for _ in range(3):
            status, payload, _ = await srv.post("/mutate", make_review(make_pod(), uid="ok"))
            assert (status, payload["response"]["uid"]) == (200, "ok")
        for reader, writer in held:  # the held reviews finish normally
            writer.write(body[10:])
            await writer.drain()
            code, _, reply = await read_response(reader)
            assert (code, orjson.loads(reply)["response"]["uid"]) == (200, "slow")
            await close_writer(writer)
        assert (srv.state.receiving, srv.state.in_flight) == (0, 0)
        assert srv.state.metrics.overload.labels("in_flight")._value.get() == 1


@pytest.mark.parametrize(("query", "read_timeout"), [("", 0.3), ("?timeout=1s", 30.0)],
                         ids=["read-timeout", "api-server-timeout-param"])
async def test_half_sent_body_is_cut_with_408(secret: SecretDir, query: str,
                                              read_timeout: float) -> None:
    config = make_config(secret, read_timeout_seconds=read_timeout)
    async with running_server(config, secret.bundles[0].ca_pem) as srv:
        reader, writer = await open_tls(srv.running.port, srv.ca_pems)
        writer.write(request_head(f"/mutate{query}", 1000) + b'{"kind":')
        await writer.drain()
        async with asyncio.timeout(3):
            code, headers, reply = await read_response(reader)
            assert await reader.read() == b""  # and the connection is closed
        assert (code, orjson.loads(reply)) == (408, {"error": "request body not received "
                                                              "in time"})
        assert headers["connection"] == "close"
        await close_writer(writer)


async def test_slowloris_headers_are_cut_and_others_are_served(secret: SecretDir) -> None:
    config = make_config(secret, idle_timeout_seconds=0.5)
    async with running_server(config, secret.bundles[0].ca_pem) as srv:
        conns = [await open_tls(srv.running.port, srv.ca_pems) for _ in range(5)]
        head = request_head("/mutate", 10)
        closed_after: list[float] = []

        async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            loop = asyncio.get_running_loop()
            start = loop.time()
            try:
                for i in range(len(head)):
                    writer.write(head[i:i + 1])
                    await writer.drain()
                    await asyncio.sleep(0.05)
                    if reader.at_eof():
                        break
                await reader.read()
            except (ConnectionError, ssl.SSLError):
                pass
            closed_after.append(loop.time() - start)

        async with asyncio.timeout(5):
            tasks = [asyncio.create_task(trickle(r, w)) for r, w in conns]
            for _ in range(5):  # meanwhile, a normal client is served promptly
                status, _, _ = await srv.post("/validate", make_review(make_pod()))
                assert status == 200
            await asyncio.gather(*tasks)
        assert len(closed_after) == 5
        assert max(closed_after) < 3.0  # cut near the 0.5 s idle/header timeout (a full
        # trickle of the headers would take ~6 s; aiohttp's default idle timeout is 3630 s)
        for _, writer in conns:
            await close_writer(writer)


async def test_graceful_stop_finishes_in_flight_and_closes_connections(
        secret: SecretDir) -> None:
    config = make_config(secret, shutdown_delay_seconds=0.3)
    async with running_server(config, secret.bundles[0].ca_pem) as srv:
        body = orjson.dumps(make_review(make_pod(), uid="inflight"))
        reader, writer = await open_tls(srv.running.port, srv.ca_pems)
        writer.write(request_head("/mutate", len(body)) + body[:20])
        await writer.drain()
        await poll_until(lambda: srv.state.in_flight == 1)
        stopping = asyncio.create_task(stop(srv.running))
        await asyncio.sleep(0.1)
        status, _, headers = await srv.post("/validate", make_review(make_pod()))
        assert (status, headers["Connection"]) == (200, "close")  # still served, told to go
        writer.write(body[20:])
        await writer.drain()
        code, headers2, reply = await read_response(reader)
        assert (code, orjson.loads(reply)["response"]["uid"]) == (200, "inflight")
        assert headers2["connection"] == "close"
        await asyncio.wait_for(stopping, 5)
        await close_writer(writer)


async def test_a_client_that_never_handshakes_is_cut(secret: SecretDir) -> None:
    config = make_config(secret, handshake_timeout_seconds=0.3)
    async with running_server(config, secret.bundles[0].ca_pem) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.running.port)
        async with asyncio.timeout(3):  # plain TCP, no ClientHello: closed after ~0.3 s
            assert await reader.read() == b""
        writer.close()
        status, _, _ = await srv.post("/validate", make_review(make_pod()))
        assert status == 200
        assert ssl_context(srv.running.app).minimum_version is ssl.TLSVersion.TLSv1_2


async def test_a_connection_accepted_just_before_the_listener_closed_is_still_served(
        secret: SecretDir) -> None:
    async with running_server(make_config(secret), secret.bundles[0].ca_pem) as srv:
        reader, writer = await open_tls(srv.running.port, srv.ca_pems)  # idle, no request yet
        stopping = asyncio.create_task(stop(srv.running, delay=0, grace=1.0))

        async def listener_closed() -> bool:
            try:
                _, probe = await asyncio.open_connection("127.0.0.1", srv.running.port)
            except OSError:
                return True
            probe.close()
            return False

        async with asyncio.timeout(3):
            while not await listener_closed():  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        body = orjson.dumps(make_review(make_pod(), uid="late"))
        writer.write(request_head("/validate", len(body)) + body)
        await writer.drain()
        status, headers, reply = await asyncio.wait_for(read_response(reader), 3)
        assert (status, headers["connection"]) == (200, "close")
        assert orjson.loads(reply)["response"]["uid"] == "late"
        await asyncio.wait_for(stopping, 5)
        await close_writer(writer)


async def test_a_certificate_close_to_expiry_is_logged_at_start(tmp_path: Path) -> None:
    short = SecretDir(tmp_path / "short", generate_bundle("gpu-admission", "gpu-admission",
                                                          days=1))
    async with running_server(make_config(short), short.bundles[0].ca_pem) as srv:
        warnings = [x for x in srv.log_lines() if x["event"] == "certificate_expiring"]
        assert len(warnings) == 1
        assert 0.9 < warnings[0]["days_left"] <= 1.0
