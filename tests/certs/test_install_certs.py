"""``gpu-admission install-certs`` against a fake Kubernetes API server.

No cluster exists here, so a small HTTPS server on 127.0.0.1 plays the API server for exactly
the endpoints the command uses (Secret GET/POST/PUT, webhook configuration GET/PATCH). It
keeps state like the real one (404 for absent objects, resourceVersion checks on PUT, RFC 6902
patches applied with ``jsonpatch``), records every request, and can be told to fail a request
with a given status. The command runs as a subprocess with a kubeconfig written to a temp dir,
so the real ``kubernetes`` client, its kubeconfig loader, bearer token and TLS verification
(against the fake server's CA) are all on the path. Tests assert the requests sent: paths,
verbs, bodies.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from gpu_admission.certs.bundle import (
    CertBundle,
    generate_bundle,
    needs_renewal,
    service_dns_names,
    write_bundle,
)

DATA = Path(__file__).parent.parent / "data" / "install"
NS = "gpu-admission"
SVC = "gpu-admission"
SECRET_PATH = f"/api/v1/namespaces/{NS}/secrets/{SVC}-tls"
SECRETS_PATH = f"/api/v1/namespaces/{NS}/secrets"
ADM = "/apis/admissionregistration.k8s.io/v1"
MUT_PATH = f"{ADM}/mutatingwebhookconfigurations/{SVC}"
VAL_PATH = f"{ADM}/validatingwebhookconfigurations/{SVC}"
TOKEN = "test-token-123"


# --------------------------------------------------------------------------- fake API server
@dataclass
class Recorded:
    method: str
    path: str
    content_type: str | None
    body: Any


@dataclass
class FakeCluster:
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> object
    requests: list[Recorded] = field(default_factory=list)
    fail: dict[tuple[str, str], int] = field(default_factory=dict)  # (method, path) -> status
    version: int = 1000

    def calls(self) -> list[tuple[str, str]]:
        return [(r.method, r.path) for r in self.requests]


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class _Handler(BaseHTTPRequestHandler):
    cluster: FakeCluster  # set on a subclass per server

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default stderr access log."""

    def _store(self, path: str, body: dict[str, Any], code: int) -> None:
        """Save ``body`` at ``path`` with a new resourceVersion, answer it with ``code``."""
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(self.cluster.version)
        self.cluster.objects[path] = obj
        self._send(code, obj)

    def _send(self, code: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self) -> None:
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body: Any = json.loads(raw) if raw else None
        c = self.cluster
        c.requests.append(Recorded(self.command, path, self.headers.get("Content-Type"), body))
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._send(401, _status(401, "Unauthorized", "no or wrong bearer token"))
            return
        if (code := c.fail.get((self.command, path))) is not None:
            self._send(code, _status(code, "Forbidden",
                                     f'secrets "{SVC}-tls" is forbidden: User '
                                     f'"system:serviceaccount:x:y" cannot {self.command} it'))
            return
        c.version += 1
        if self.command == "GET":
            if path in c.objects:
                self._send(200, c.objects[path])
            else:
                self._send(404, _status(404, "NotFound", f"{path} not found"))
        elif self.command == "POST" and path == SECRETS_PATH:
            target = f"{path}/{body['metadata']['name']}"
            if target in c.objects:
                self._send(409, _status(409, "AlreadyExists", "already exists"))
                return
            self._store(target, body, 201)
        elif self.command == "PUT" and path in c.objects:
            current = c.objects[path]["metadata"].get("resourceVersion")
            if body["metadata"].get("resourceVersion") != current:
                self._send(409, _status(409, "Conflict", "the object has been modified"))
                return
            self._store(path, body, 200)
        elif self.command == "PATCH" and path in c.objects:
            if self.headers.get("Content-Type") != "application/json-patch+json":
                self._send(415, _status(415, "UnsupportedMediaType", "want json-patch"))
                return
            try:
                c.objects[path] = jsonpatch.apply_patch(c.objects[path], body)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                self._send(422, _status(422, "Invalid", str(exc)))
                return
            self._send(200, c.objects[path])
        else:
            self._send(404, _status(404, "NotFound", f"{self.command} {path} not handled"))

    do_GET = do_POST = do_PUT = do_PATCH = _handle


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeCluster, Path]]:
    """A running fake API server (HTTPS, 127.0.0.1) and a kubeconfig pointing at it."""
    state = FakeCluster()
    tls = generate_bundle("fake-apiserver", "test", dev=True)
    write_bundle(tls, tmp_path / "apiserver")
    handler = type("Handler", (_Handler,), {"cluster": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp_path / "apiserver" / "tls.crt", tmp_path / "apiserver" / "tls.key")
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig.yaml"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {
            "server": f"https://127.0.0.1:{server.server_address[1]}",
            "certificate-authority-data": base64.b64encode(tls.ca_pem).decode()}}],
        "users": [{"name": "tester", "user": {"token": TOKEN}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
    }))
    try:
        yield state, kubeconfig
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def run_cli(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    return subprocess.run(
        [sys.executable, "-m", "gpu_admission", "install-certs", "--kubeconfig",
         str(kubeconfig), "--namespace", NS, "--service", SVC, *args],
        capture_output=True, text=True, timeout=60, env=env, check=False)


# --------------------------------------------------------------------------- helpers
def load_configs(state: FakeCluster) -> None:
    state.objects[MUT_PATH] = json.loads((DATA / "mutating.json").read_text())
    state.objects[VAL_PATH] = json.loads((DATA / "validating.json").read_text())


def secret_object(bundle: CertBundle, *, type_: str = "kubernetes.io/tls") -> dict[str, Any]:
    b64: Callable[[bytes], str] = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return {"apiVersion": "v1", "kind": "Secret", "type": type_,
            "metadata": {"name": f"{SVC}-tls", "namespace": NS, "resourceVersion": "42"},
            "data": {"tls.crt": b64(bundle.cert_pem), "tls.key": b64(bundle.key_pem),
                     "ca.crt": b64(bundle.ca_pem)}}


def bundle_of(secret: dict[str, Any]) -> CertBundle:
    d = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    return CertBundle(ca_pem=d["ca.crt"], cert_pem=d["tls.crt"], key_pem=d["tls.key"])


def ca_bundles(state: FakeCluster) -> list[bytes]:
    return [base64.b64decode(w["clientConfig"]["caBundle"])
            for p in (MUT_PATH, VAL_PATH) for w in state.objects[p]["webhooks"]]


def der_set(pem: bytes) -> set[bytes]:
    return {c.public_bytes(Encoding.DER) for c in x509.load_pem_x509_certificates(pem)}


def expected_patch(state_before: dict[str, Any], ca_b64: str,
                   indexes: list[int]) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    for i in indexes:
        ops.append({"op": "test", "path": f"/webhooks/{i}/name",
                    "value": state_before["webhooks"][i]["name"]})
        ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle",
                    "value": ca_b64})
    return ops


# --------------------------------------------------------------------------- tests
def test_create_when_secret_absent(cluster: tuple[FakeCluster, Path]) -> None:
    state, kubeconfig = cluster
    load_configs(state)
    before_val = copy.deepcopy(state.objects[VAL_PATH])
    before_mut = copy.deepcopy(state.objects[MUT_PATH])

    result = run_cli(kubeconfig)

    assert result.returncode == 0, result.stderr
    assert state.calls() == [
        ("GET", SECRET_PATH), ("POST", SECRETS_PATH),
        ("GET", MUT_PATH), ("PATCH", MUT_PATH),
        ("GET", VAL_PATH), ("PATCH", VAL_PATH),
    ]
    post = state.requests[1]
    assert post.body["type"] == "kubernetes.io/tls"
    assert post.body["metadata"]["name"] == f"{SVC}-tls"
    assert post.body["metadata"]["namespace"] == NS
    assert sorted(post.body["data"]) == ["ca.crt", "tls.crt", "tls.key"]
    bundle = bundle_of(post.body)
    assert needs_renewal(bundle, service_dns_names(SVC, NS),
                         min_remaining=dt.timedelta(days=300)) is None
    ca_b64 = post.body["data"]["ca.crt"]
    # every webhook of both configurations gets exactly the new CA (the second validating
    # webhook had a garbage caBundle, which counts as "lacks the CA")
    assert state.requests[3].content_type == "application/json-patch+json"
    assert state.requests[3].body == expected_patch(before_mut, ca_b64, [0])
    assert state.requests[5].body == expected_patch(before_val, ca_b64, [0, 1])
    assert ca_bundles(state) == [bundle.ca_pem] * 3
    assert f"created Secret {NS}/{SVC}-tls" in result.stdout


def test_second_run_is_a_no_op(cluster: tuple[FakeCluster, Path]) -> None:
    state, kubeconfig = cluster
    load_configs(state)
    assert run_cli(kubeconfig).returncode == 0
    snapshot = copy.deepcopy(state.objects)
    state.requests.clear()

    result = run_cli(kubeconfig)

    assert result.returncode == 0, result.stderr
    assert state.calls() == [("GET", SECRET_PATH), ("GET", MUT_PATH), ("GET", VAL_PATH)]
    assert state.objects == snapshot
    assert "not renewed" in result.stdout
    assert "caBundle up to date" in result.stdout


@pytest.mark.parametrize(
    ("existing", "reason"),
    [
        (lambda: generate_bundle(SVC, NS, days=10), "expires in"),
        (lambda: generate_bundle("other-service", NS, days=365), "lacks DNS names"),
    ],
    ids=["near-expiry", "wrong-sans"],
)
def test_rotates_bad_certificate(cluster: tuple[FakeCluster, Path], existing: Any,
                                 reason: str) -> None:
    state, kubeconfig = cluster
    load_configs(state)
    old = existing()
    state.objects[SECRET_PATH] = secret_object(old)
    # the configs already trust the old CA, as after an earlier install
    for p in (MUT_PATH, VAL_PATH):
        for w in state.objects[p]["webhooks"]:
            w["clientConfig"]["caBundle"] = base64.b64encode(old.ca_pem).decode()

    result = run_cli(kubeconfig, "--renew-before", "30")

    assert result.returncode == 0, result.stderr
    assert state.calls() == [
        ("GET", SECRET_PATH), ("PUT", SECRET_PATH),
        ("GET", MUT_PATH), ("PATCH", MUT_PATH),
        ("GET", VAL_PATH), ("PATCH", VAL_PATH),
    ]
    put = state.requests[1]
    assert put.body["metadata"]["resourceVersion"] == "42"  # optimistic concurrency
    assert put.body["type"] == "kubernetes.io/tls"
    new = bundle_of(put.body)
    assert new.ca_pem != old.ca_pem
    assert needs_renewal(new, service_dns_names(SVC, NS),
                         min_remaining=dt.timedelta(days=300)) is None
    assert reason in result.stdout
    # during the switch-over the API server trusts the new CA and the old one
    for pem in ca_bundles(state):
        assert der_set(pem) == der_set(new.ca_pem) | der_set(old.ca_pem)
        assert pem.startswith(new.ca_pem)


def test_valid_secret_but_stale_ca_bundle_patches_only_configs(
        cluster: tuple[FakeCluster, Path]) -> None:
    state, kubeconfig = cluster
    load_configs(state)
    good = generate_bundle(SVC, NS, days=365)
    state.objects[SECRET_PATH] = secret_object(good)
    stale = generate_bundle(SVC, NS, days=365)  # another CA, e.g. from an earlier install
    state.objects[MUT_PATH]["webhooks"][0]["clientConfig"]["caBundle"] = \
        base64.b64encode(stale.ca_pem).decode()
    state.objects[VAL_PATH]["webhooks"][0]["clientConfig"]["caBundle"] = \
        base64.b64encode(good.ca_pem).decode()
    before_val = copy.deepcopy(state.objects[VAL_PATH])

    result = run_cli(kubeconfig)

    assert result.returncode == 0, result.stderr
    assert state.calls() == [("GET", SECRET_PATH), ("GET", MUT_PATH), ("PATCH", MUT_PATH),
                             ("GET", VAL_PATH), ("PATCH", VAL_PATH)]
    good_b64 = base64.b64encode(good.ca_pem).decode()
    # only the validating webhook that lacks the CA is patched; index 0 is already right
    assert state.requests[4].body == expected_patch(before_val, good_b64, [1])
    assert ca_bundles(state) == [good.ca_pem] * 3
    assert state.objects[SECRET_PATH] == secret_object(good)


@pytest.mark.parametrize(
    ("fail", "expected"),
    [
        (("GET", SECRET_PATH), f"GET Secret {NS}/{SVC}-tls: HTTP 403"),
        (("POST", SECRETS_PATH), f"POST (create) Secret {NS}/{SVC}-tls: HTTP 403"),
        (("PATCH", VAL_PATH), f"PATCH ValidatingWebhookConfiguration {SVC}: HTTP 403"),
    ],
    ids=["get-secret-forbidden", "create-secret-forbidden", "patch-config-forbidden"],
)
def test_api_errors_are_reported_clearly(cluster: tuple[FakeCluster, Path],
                                         fail: tuple[str, str], expected: str) -> None:
    state, kubeconfig = cluster
    load_configs(state)
    state.fail[fail] = 403

    result = run_cli(kubeconfig)

    assert result.returncode == 1
    assert expected in result.stderr
    assert "is forbidden" in result.stderr  # the API server's own Status.message
    assert "Traceback" not in result.stderr
    assert state.calls()[-1] == fail  # stopped at the failing call


def test_missing_webhook_configuration_is_named(cluster: tuple[FakeCluster, Path]) -> None:
    state, kubeconfig = cluster
    state.objects[VAL_PATH] = json.loads((DATA / "validating.json").read_text())

    result = run_cli(kubeconfig)

    assert result.returncode == 1
    assert f"MutatingWebhookConfiguration {SVC} not found" in result.stderr
    assert "Traceback" not in result.stderr


def test_secret_of_wrong_type_is_left_alone(cluster: tuple[FakeCluster, Path]) -> None:
    state, kubeconfig = cluster
    load_configs(state)
    state.objects[SECRET_PATH] = secret_object(generate_bundle(SVC, NS), type_="Opaque")

    result = run_cli(kubeconfig)

    assert result.returncode == 1
    assert "has type 'Opaque', expected 'kubernetes.io/tls'" in result.stderr
    assert state.calls() == [("GET", SECRET_PATH)]


def test_custom_secret_and_config_names(cluster: tuple[FakeCluster, Path]) -> None:
    state, kubeconfig = cluster
    for src, path in (("mutating.json", f"{ADM}/mutatingwebhookconfigurations/custom"),
                      ("validating.json", f"{ADM}/validatingwebhookconfigurations/custom")):
        state.objects[path] = json.loads((DATA / src).read_text())

    result = run_cli(kubeconfig, "--secret", "my-tls", "--webhook-config", "custom")

    assert result.returncode == 0, result.stderr
    assert [c for c in state.calls() if c[0] != "GET"] == [
        ("POST", SECRETS_PATH),
        ("PATCH", f"{ADM}/mutatingwebhookconfigurations/custom"),
        ("PATCH", f"{ADM}/validatingwebhookconfigurations/custom")]
    assert state.requests[1].body["metadata"]["name"] == "my-tls"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--days", "30", "--renew-before", "30"], "must be less than --days"),
        (["--days", "0"], "--days"),
    ],
    ids=["renew-window-covers-validity", "zero-days"],
)
def test_bad_options_fail_before_any_call(cluster: tuple[FakeCluster, Path], args: list[str],
                                          expected: str) -> None:
    state, kubeconfig = cluster
    result = run_cli(kubeconfig, *args)
    assert result.returncode == 2
    assert expected in result.stderr
    assert state.requests == []


def test_unreadable_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig.yaml"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    result = run_cli(bad)
    assert result.returncode == 1
    assert "cannot load Kubernetes credentials" in result.stderr
    assert "Traceback" not in result.stderr


def test_kubeconfig_env_is_used_without_the_option(cluster: tuple[FakeCluster, Path],
                                                   tmp_path: Path) -> None:
    """Without --kubeconfig: $KUBECONFIG first (before ~/.kube/config and in-cluster), as
    every command resolves it (gpu_admission.cli.options.resolve_kubeconfig)."""
    state, kubeconfig = cluster
    load_configs(state)
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    result = subprocess.run(
        [sys.executable, "-m", "gpu_admission", "install-certs", "--namespace", NS,
         "--service", SVC], capture_output=True, text=True, timeout=60, check=False,
        env={**env, "KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": "10.96.0.1",
             "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert state.calls()[:2] == [("GET", SECRET_PATH), ("POST", SECRETS_PATH)]
    nothing = subprocess.run(
        [sys.executable, "-m", "gpu_admission", "install-certs"], capture_output=True,
        text=True, timeout=60, check=False, env={**env, "HOME": str(tmp_path)})
    assert nothing.returncode == 1
    assert nothing.stderr.strip().endswith(
        "no cluster to talk to: pass --kubeconfig FILE, set KUBECONFIG, create "
        "~/.kube/config, or run in a pod (its ServiceAccount)")
