"""A real OCI registry for tests (Debian's ``docker-registry``, the CNCF distribution
registry v2.8) and a client that pushes small images through its API, as ``docker push`` does.

* :func:`running_registry` starts ``docker-registry serve`` on a free port with filesystem
  storage, anonymous, with ``auth.htpasswd`` (bcrypt file written here) or with ``auth.token``
  backed by :class:`TokenServer` (JWTs signed ES256 with an ``x5c`` certificate the registry
  trusts via ``rootcertbundle``), and stops it (by the pid it started) afterwards.
* :class:`Pusher` uploads blobs (``POST /v2/<name>/blobs/uploads/`` then ``PUT
  <location>&digest=``), manifests and image indexes (``PUT /v2/<name>/manifests/<ref>``).
  Distribution spec: https://github.com/opencontainers/distribution-spec/blob/main/spec.md.

Other suites may import these; no tests here.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from tests.server_support import free_port

REGISTRY_BIN = "docker-registry"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer:
    """A token service per https://distribution.github.io/distribution/spec/auth/token/:
    ``GET /token?service=&scope=`` with basic credentials -> ``{"token": <JWT>}``."""

    SERVICE = "test-registry"
    ISSUER = "test-token-issuer"

    def __init__(self, directory: Path, users: dict[str, str]) -> None:
        self.users = users
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test token signer")])
        now = datetime.now(UTC)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - timedelta(minutes=5))
                     .not_valid_after(now + timedelta(hours=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                     .sign(self.key, hashes.SHA256()))
        self.bundle = directory / "token-signer.pem"
        self.bundle.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self.port = free_port()
        self.realm = f"http://127.0.0.1:{self.port}/token"
        self.requests: list[dict[str, Any]] = []  # what the scanner asked for

    def token(self, subject: str, scope: str) -> str:
        access = []
        if scope:
            kind, _, rest = scope.partition(":")
            repo, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": repo, "actions": actions.split(",")})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "ES256", "x5c": [base64.b64encode(
            self.cert.public_bytes(serialization.Encoding.DER)).decode()]}
        claims = {"iss": self.ISSUER, "sub": subject, "aud": self.SERVICE, "exp": now + 300,
                  "nbf": now - 10, "iat": now, "jti": uuid.uuid4().hex, "access": access}
        signing_input = (_b64url(json.dumps(header).encode()) + "."
                         + _b64url(json.dumps(claims).encode()))
        r, s = decode_dss_signature(self.key.sign(signing_input.encode(),
                                                  ec.ECDSA(hashes.SHA256())))
        return signing_input + "." + _b64url(r.to_bytes(32, "big") + s.to_bytes(32, "big"))

    @contextmanager
    def serving(self) -> Iterator[TokenServer]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                user = ""
                header = self.headers.get("Authorization", "")
                if header.startswith("Basic "):
                    user, _, password = base64.b64decode(header[6:]).decode().partition(":")
                    if server.users.get(user) != password:
                        user = "!bad"
                server.requests.append({"path": url.path, "query": query, "user": user})
                if url.path != "/token" or not user or user == "!bad":
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps({"token": server.token(user, query.get("scope", ""))})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, format: str, *args: Any) -> None:
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            httpd.shutdown()
            httpd.server_close()
            thread.join(5)


@dataclass
class Registry:
    """A running registry: ``host`` is ``127.0.0.1:<port>`` (plain HTTP)."""

    host: str
    log: Path
    basic: tuple[str, str] | None = None
    token_server: TokenServer | None = None
    pushed: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://{self.host}"


@contextmanager
def running_registry(tmp_path: Path, *, htpasswd: dict[str, str] | None = None,
                     token_users: dict[str, str] | None = None) -> Iterator[Registry]:
    """Start ``docker-registry serve`` (anonymous, htpasswd or token auth); stop it after."""
    binary = shutil.which(REGISTRY_BIN)
    if binary is None:
        pytest.fail("docker-registry (Debian package docker-registry) is required")
    root = tmp_path / "registry"
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config: dict[str, Any] = {
        "version": 0.1, "log": {"level": "info"},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")},
                    "delete": {"enabled": False}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "test-secret"},
    }
    token_server: TokenServer | None = None
    if htpasswd is not None:
        lines = [f"{user}:{bcrypt.hashpw(pw.encode(), bcrypt.gensalt(rounds=4)).decode()}"
                 for user, pw in htpasswd.items()]
        (root / "htpasswd").write_text("\n".join(lines) + "\n")
        config["auth"] = {"htpasswd": {"realm": "test", "path": str(root / "htpasswd")}}
    if token_users is not None:
        token_server = TokenServer(root, token_users)
        config["auth"] = {"token": {"realm": token_server.realm, "service": TokenServer.SERVICE,
                                    "issuer": TokenServer.ISSUER,
                                    "rootcertbundle": str(token_server.bundle)}}
    (root / "config.yml").write_text(yaml.safe_dump(config))
    log = root / "registry.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([binary, "serve", str(root / "config.yml")], stdout=sink,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
                break
            except urllib.error.HTTPError:
                break  # 401: up, and asking for credentials
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"docker-registry did not start: {log.read_text()[-2000:]}")
                time.sleep(0.05)
        first = next(iter(htpasswd.items())) if htpasswd else None
        registry = Registry(host=f"127.0.0.1:{port}", log=log, basic=first,
                            token_server=token_server)
        if token_server is not None:
            with token_server.serving():
                yield registry
        else:
            yield registry
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - registry ignores SIGTERM
            proc.kill()
            proc.wait()


def layer(files: dict[str, bytes]) -> tuple[bytes, str]:
    """A gzip'ed tar layer and its diff id (sha256 of the uncompressed tar)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    tar_bytes = raw.getvalue()
    return gzip.compress(tar_bytes, mtime=0), sha256(tar_bytes)


class Pusher:
    """Pushes blobs, manifests and indexes to a :class:`Registry` (as ``docker push``)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._tokens: dict[str, str] = {}

    def _auth(self, name: str) -> dict[str, str]:
        reg = self.registry
        if reg.basic is not None:
            user, password = reg.basic
            return {"Authorization": "Basic " + base64.b64encode(
                f"{user}:{password}".encode()).decode()}
        if reg.token_server is not None:
            token = self._tokens.setdefault(name, reg.token_server.token(
                "pusher", f"repository:{name}:pull,push"))
            return {"Authorization": f"Bearer {token}"}
        return {}

    def _request(self, method: str, url: str, name: str, *, data: bytes | None = None,
                 headers: dict[str, str] | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(url, data=data, method=method,
                                     headers={**self._auth(name), **(headers or {})})
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, response.headers

    def blob(self, name: str, data: bytes) -> str:
        digest = sha256(data)
        status, headers = self._request("POST", f"{self.registry.base}/v2/{name}/blobs/uploads/",
                                        name)
        assert status == 202, status
        location = urllib.parse.urljoin(self.registry.base, headers["Location"])
        sep = "&" if "?" in location else "?"
        status, _ = self._request("PUT", f"{location}{sep}digest={digest}", name, data=data,
                                  headers={"Content-Type": "application/octet-stream"})
        assert status == 201, status
        return digest

    def manifest(self, name: str, reference: str, body: bytes, media_type: str) -> str:
        status, headers = self._request(
            "PUT", f"{self.registry.base}/v2/{name}/manifests/{reference}", name, data=body,
            headers={"Content-Type": media_type})
        assert status == 201, status
        digest = sha256(body)
        assert headers["Docker-Content-Digest"] == digest
        self.registry.pushed.append(f"{name}@{digest}")
        return digest

    def image(self, name: str, tag: str | None, env: list[str], *, arch: str = "amd64",
              docker: bool = False) -> tuple[str, int]:
        """Push a one-layer image whose config has ``Env``; returns (manifest digest, size)."""
        gz, diff_id = layer({"app/README": f"{name} {arch}\n".encode()})
        config = json.dumps({
            "architecture": arch, "os": "linux", "created": "2026-01-01T00:00:00Z",
            "config": {"Env": env, "Cmd": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]}}, sort_keys=True).encode()
        config_digest = self.blob(name, config)
        layer_digest = self.blob(name, gz)
        media = DOCKER_MANIFEST if docker else OCI_MANIFEST
        body = json.dumps({
            "schemaVersion": 2, "mediaType": media,
            "config": {"mediaType": DOCKER_CONFIG_TYPE if docker else OCI_CONFIG,
                       "digest": config_digest, "size": len(config)},
            "layers": [{"mediaType": DOCKER_LAYER if docker else OCI_LAYER,
                        "digest": layer_digest, "size": len(gz)}]}, indent=3).encode()
        digest = self.manifest(name, tag or sha256(body), body, media)
        return digest, len(body)

    def index(self, name: str, tag: str, platforms: dict[str, tuple[str, int]], *,
              docker: bool = False) -> str:
        """Push an index (OCI) or manifest list (Docker) of ``os/arch -> (digest, size)``."""
        media = DOCKER_LIST if docker else OCI_INDEX
        child = DOCKER_MANIFEST if docker else OCI_MANIFEST
        entries = []
        for platform, (digest, size) in platforms.items():
            os_name, arch = platform.split("/", 1)
            entries.append({"mediaType": child, "digest": digest, "size": size,
                            "platform": {"os": os_name, "architecture": arch}})
        body = json.dumps({"schemaVersion": 2, "mediaType": media, "manifests": entries},
                          indent=2).encode()
        return self.manifest(name, tag, body, media)
