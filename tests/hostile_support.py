"""Helpers for the hostile-input, slow-client, rotation and shutdown suites (no tests here).

- certificates laid out like a mounted Secret (:class:`tests.server_support.SecretDir`),
  so rotation is tested the way Kubernetes does it;
- the real server two ways: in-process on a background event loop (fast, for the corpus and
  hypothesis) and as ``gpu-admission serve`` subprocess (signals, exit codes, rotation);
- a blocking HTTPS client that verifies the CA bundle, and the checks every AdmissionReview
  reply must pass (uid echoed, version echoed, patch decodes, applies and keeps the Pod valid).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import contextlib
import functools
import http.client
import io
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate
import orjson
from cryptography import x509
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource

from gpu_admission.certs.bundle import CertBundle, generate_bundle
from gpu_admission.server.app import create_app
from gpu_admission.server.config import ServerConfig
from gpu_admission.server.logs import make_logger
from gpu_admission.server.run import Running, start, stop
from tests.server_support import free_port

DATA = Path(__file__).parent / "data" / "hostile"
POLICY_FILE = DATA / "policy.yaml"  # two time-sliced pools + a dedicated training pool
K8S_VERSION = kubernetes_validate.latest_version()  # the newest schema the package ships
SERVICE, NAMESPACE = "gpu-admission", "gpu-admission"


def new_bundle() -> CertBundle:
    """CA + serving certificate valid for the Service names and 127.0.0.1/localhost."""
    return generate_bundle(SERVICE, NAMESPACE, dev=True)


def serial(cert_pem_or_der: bytes) -> int:
    """Serial number of a PEM or DER certificate."""
    if cert_pem_or_der.startswith(b"-----"):
        return x509.load_pem_x509_certificate(cert_pem_or_der).serial_number
    return x509.load_der_x509_certificate(cert_pem_or_der).serial_number


def client_context(*ca_pems: bytes) -> ssl.SSLContext:
    """Verifies the server for 127.0.0.1 against the given CA bundle(s), as the API server
    verifies against ``caBundle``."""
    ctx = ssl.create_default_context(cadata="".join(p.decode() for p in ca_pems))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


# --- servers --------------------------------------------------------------------------------

class ThreadServer:
    """The real app (``create_app`` + ``run.start``: TLS, handshake timeout, probe port) on
    its own event loop in a background thread, so blocking clients and hypothesis can drive
    it from the test thread. ``log`` collects the server's JSON log lines."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.log = io.BytesIO()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.running: Running | None = None

    @property
    def port(self) -> int:
        assert self.running is not None
        return self.running.port

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        app = create_app(self.config, logger=make_logger("info", self.log))
        fut = asyncio.run_coroutine_threadsafe(
            start(app, host="127.0.0.1", port=0, metrics_port=0), self.loop)
        self.running = fut.result(timeout=20)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.running is not None:
            asyncio.run_coroutine_threadsafe(stop(self.running, delay=0),
                                             self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@dataclass
class ServeProcess:
    """``gpu-admission serve`` as a subprocess (the command users run)."""

    proc: subprocess.Popen[bytes]
    port: int
    metrics_port: int
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def sigterm(self) -> None:
        self.proc.send_signal(signal.SIGTERM)


def serve_command(cert_dir: Path, port: int, metrics_port: int, audit_log: Path,
                  *extra: str) -> list[str]:
    return [sys.executable, "-m", "gpu_admission", "serve", "--cert-dir", str(cert_dir),
            "--policy", str(POLICY_FILE), "--host", "127.0.0.1", "--port", str(port),
            "--metrics-port", str(metrics_port), "--audit-log", str(audit_log), *extra]


@contextlib.contextmanager
def serve_process(tmp: Path, cert_dir: Path, *extra: str,
                  ready_timeout: float = 20.0) -> Iterator[ServeProcess]:
    """Start the server, wait for ``/readyz`` on the plain-HTTP port, kill it on exit if the
    test did not stop it."""
    port, metrics_port = free_port(), free_port()
    log_path = tmp / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(serve_command(cert_dir, port, metrics_port,
                                              tmp / "audit.jsonl", *extra),
                                stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    server = ServeProcess(proc, port, metrics_port, log_path)
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"server exited with {proc.returncode}:\n"
                                     f"{server.log_text()}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=1)
                conn.request("GET", "/readyz")
                if conn.getresponse().status == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"server not ready in {ready_timeout}s:\n"
                                     f"{server.log_text()}")
            time.sleep(0.05)
        yield server
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


# --- a blocking HTTPS client -----------------------------------------------------------------

@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


class Client:
    """One keep-alive HTTPS connection to the server; reconnects when the server closed it."""

    def __init__(self, port: int, ctx: ssl.SSLContext, timeout: float = 15.0) -> None:
        self.port, self.ctx, self.timeout = port, ctx, timeout
        self.conn: http.client.HTTPSConnection | None = None

    def post(self, path: str, body: bytes,
             content_type: str | None = "application/json") -> Reply:
        headers = {"Content-Type": content_type} if content_type is not None else {}
        return self.request("POST", path, body, headers)

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> Reply:
        if self.conn is None:
            self.conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx,
                                                    timeout=self.timeout)
        try:
            self.conn.request(method, path, body=body, headers=headers or {})
            resp = self.conn.getresponse()
            data = resp.read()
        except (ConnectionError, http.client.RemoteDisconnected, ssl.SSLError):
            self.close()
            raise
        reply = Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
        if reply.headers.get("connection", "").lower() == "close":
            self.close()
        return reply

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


# --- what every reply must satisfy ------------------------------------------------------------

def check_error(reply: Reply, expected: int) -> str:
    """A malformed request: the expected 4xx with a JSON ``{"error": ...}`` that says what is
    wrong, and no traceback."""
    assert reply.status == expected, (reply.status, reply.body[:300])
    message = reply.json()["error"]
    assert isinstance(message, str)
    assert message
    assert "Traceback" not in message
    return message


def schema_errors(pod: Any) -> str | None:
    """The first Kubernetes OpenAPI schema error of ``pod`` (strict: unknown fields count),
    or None when it is a valid Pod."""
    if not isinstance(pod, dict) or pod.get("apiVersion") != "v1" or pod.get("kind") != "Pod":
        return "not a v1 Pod"
    error = jsonschema.exceptions.best_match(pod_validator().iter_errors(pod))
    return None if error is None else f"{list(error.absolute_path)}: {error.message[:200]}"


@functools.cache
def pod_validator() -> jsonschema.protocols.Validator:
    """The strict v1 Pod schema that ``kubernetes_validate`` ships for :data:`K8S_VERSION`,
    built once (``kubernetes_validate.validate`` re-reads the schema files on every call,
    ~10 ms a pod; the cached validator checks a pod in about a millisecond)."""
    folder = f"kubernetes-json-schema/v{K8S_VERSION}-local-strict"
    schema = schema_contents(f"{folder}/pod-v1.json", K8S_VERSION)
    definitions = schema_contents(f"{folder}/_definitions.json", K8S_VERSION)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema)
                                                      @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def env_name_counts(pod: dict[str, Any]) -> dict[tuple[str, int, str], int]:
    counts: collections.Counter[tuple[str, int, str]] = collections.Counter()
    spec = pod.get("spec") or {}
    for kind in ("containers", "initContainers"):
        for i, c in enumerate(spec.get(kind) or []):
            for var in c.get("env") or []:
                counts[(kind, i, var.get("name"))] += 1
    return dict(counts)


def check_review(request_doc: dict[str, Any], reply: Reply, *,
                 schema: bool = True) -> dict[str, Any]:
    """A well-formed AdmissionReview reply to ``request_doc``; returns ``response``.

    For an allowed pod with a patch: the patch is ``JSONPatch`` base64, applies cleanly with
    ``jsonpatch`` to ``request.object``, adds no duplicate env names, and (``schema``) a Pod
    that was schema-valid before is schema-valid after.
    """
    assert reply.status == 200, (reply.status, reply.body[:500])
    assert reply.headers.get("content-type", "").startswith("application/json")
    doc = reply.json()
    assert doc["apiVersion"] == request_doc["apiVersion"]
    assert doc["kind"] == "AdmissionReview"
    response: dict[str, Any] = doc["response"]
    assert response["uid"] == request_doc["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    for warning in response.get("warnings", []):
        assert isinstance(warning, str)
        assert 0 < len(warning) <= 256
        assert not warning.lower().startswith("warning:")
    for key, value in (response.get("auditAnnotations") or {}).items():
        assert isinstance(key, str)
        assert isinstance(value, str)
    if not response["allowed"]:
        status = response["status"]
        assert status["code"] >= 400
        assert status["message"]
        assert "patch" not in response
        return response
    if "patch" not in response:
        assert "patchType" not in response
        return response
    assert response["patchType"] == "JSONPatch"
    try:
        ops = orjson.loads(base64.b64decode(response["patch"], validate=True))
    except (binascii.Error, orjson.JSONDecodeError) as exc:
        raise AssertionError(f"patch is not base64 JSON: {exc}") from None
    assert isinstance(ops, list)
    assert ops
    pod = request_doc["request"]["object"]
    patched = jsonpatch.apply_patch(pod, ops)  # raises on a patch that does not apply
    before, after = env_name_counts(pod), env_name_counts(patched)
    for key, count in after.items():
        assert count <= max(1, before.get(key, 0)), f"patch duplicated env {key}"
    if schema and schema_errors(pod) is None:
        assert schema_errors(patched) is None, (schema_errors(patched), ops)
    return response


def review(obj: Any, *, uid: str = "7a1c2e4f-0000-4000-8000-000000000001",
           operation: str = "CREATE", api_version: str = "admission.k8s.io/v1",
           kind: str = "Pod", group: str = "", old: Any = None) -> dict[str, Any]:
    """An AdmissionReview request as the API server sends it."""
    resource = kind.lower() + "s"
    return {
        "apiVersion": api_version, "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": "v1", "kind": kind},
            "resource": {"group": group, "version": "v1", "resource": resource},
            "requestKind": {"group": group, "version": "v1", "kind": kind},
            "requestResource": {"group": group, "version": "v1", "resource": resource},
            "name": "p", "namespace": "team-a", "operation": operation,
            "userInfo": {"username": "alice", "uid": "u-1",
                         "groups": ["system:authenticated"]},
            "object": obj, "oldObject": old, "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def gpu_pod(quantity: Any = 1, resource: str = "nvidia.com/gpu",
            image: str = "nvcr.io/nvidia/tritonserver:24.05-py3",
            **container_extra: Any) -> dict[str, Any]:
    """A schema-valid Pod with one container asking ``quantity`` of ``resource``."""
    container: dict[str, Any] = {"name": "main", "image": image,
                                 "resources": {"limits": {resource: quantity}}}
    container.update(container_extra)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {"containers": [container]}}


def in_process_config(tmp: Path, bundle: CertBundle, **overrides: Any) -> ServerConfig:
    """A ServerConfig for :class:`ThreadServer` with the test policy and an audit file."""
    certs = tmp / "certs"
    certs.mkdir(exist_ok=True)
    (certs / "tls.crt").write_bytes(bundle.cert_pem)
    (certs / "tls.key").write_bytes(bundle.key_pem)
    return ServerConfig(cert_file=certs / "tls.crt", key_file=certs / "tls.key",
                        policy_path=POLICY_FILE, audit_log=str(tmp / "audit.jsonl"),
                        instance="test", **overrides)
