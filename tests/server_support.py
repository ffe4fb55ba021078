"""Helpers for the server tests (no tests here): certificates laid out like a mounted
Secret, a real in-process server on free ports, and clients that talk like the API server
(HTTPS verified against the CA bundle for the Service DNS name).

Other suites (hostile input, benchmarks) may import these.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from gpu_admission.certs.bundle import (
    CA_FILE,
    CERT_FILE,
    KEY_FILE,
    CertBundle,
    generate_bundle,
    service_dns_names,
)
from gpu_admission.server.app import STATE, ServerState, create_app
from gpu_admission.server.config import ServerConfig
from gpu_admission.server.logs import LineSink, make_logger
from gpu_admission.server.run import Running, start, stop

SERVICE = "gpu-admission"
NAMESPACE = "gpu-admission"
SERVICE_HOST = service_dns_names(SERVICE, NAMESPACE)[2]  # gpu-admission.gpu-admission.svc
JSON_HEADERS = {"Content-Type": "application/json"}


def new_bundle() -> CertBundle:
    """A fresh CA + serving certificate for the Service (no localhost names)."""
    return generate_bundle(SERVICE, NAMESPACE)


class SecretDir:
    """A directory laid out the way the kubelet mounts a Secret: ``tls.crt`` ->
    ``..data/tls.crt``, ``..data`` -> ``..<version>``; :meth:`rotate` writes a new version
    directory and flips ``..data`` atomically (rename of a symlink), like ``atomic_writer.go``.
    """

    def __init__(self, root: Path, bundle: CertBundle) -> None:
        self.root = root
        self.version = 0
        root.mkdir(parents=True, exist_ok=True)
        self.bundles: list[CertBundle] = []
        self.rotate(bundle)
        for name in (CA_FILE, CERT_FILE, KEY_FILE):
            (root / name).symlink_to(Path("..data") / name)

    @property
    def cert_file(self) -> Path:
        return self.root / CERT_FILE

    @property
    def key_file(self) -> Path:
        return self.root / KEY_FILE

    def publish(self, cert_pem: bytes, key_pem: bytes, ca_pem: bytes) -> None:
        """Write one version directory and flip ``..data`` to it (any pair, even a
        mismatched or truncated one)."""
        self.version += 1
        version_dir = self.root / f"..v{self.version}"
        version_dir.mkdir()
        (version_dir / CA_FILE).write_bytes(ca_pem)
        (version_dir / CERT_FILE).write_bytes(cert_pem)
        (version_dir / KEY_FILE).write_bytes(key_pem)
        tmp_link = self.root / "..data_tmp"
        tmp_link.symlink_to(version_dir.name)
        tmp_link.replace(self.root / "..data")  # atomic rename over the old symlink

    def rotate(self, bundle: CertBundle, *, key_pem: bytes | None = None) -> None:
        """Publish ``bundle`` (or its cert with a foreign ``key_pem``: a mismatched pair)."""
        self.publish(bundle.cert_pem, key_pem if key_pem is not None else bundle.key_pem,
                     bundle.ca_pem)
        self.bundles.append(bundle)


def client_context(*ca_pems: bytes) -> ssl.SSLContext:
    """What the API server does: trust only the caBundle, verify the hostname."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.load_verify_locations(cadata="".join(p.decode() for p in ca_pems))
    return ctx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


@dataclass
class Server:
    """A running in-process server and a client session that trusts its CA."""

    running: Running
    session: aiohttp.ClientSession
    log: io.BytesIO
    sink: LineSink
    ca_pems: list[bytes] = field(default_factory=list)

    @property
    def state(self) -> ServerState:
        return self.running.app[STATE]

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.running.port}{path}"

    def probe_url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.running.metrics_port}{path}"

    async def post(self, path: str, body: Any, *, raw: bytes | None = None,
                   headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
        """POST like the API server; returns (status, parsed JSON body, headers)."""
        data = raw if raw is not None else orjson.dumps(body)
        async with self.session.post(self.url(path), data=data,
                                     headers=JSON_HEADERS if headers is None else headers,
                                     server_hostname=SERVICE_HOST) as resp:
            payload = await resp.read()
            return resp.status, orjson.loads(payload), resp.headers

    def log_lines(self) -> list[dict[str, Any]]:
        self.sink.flush()
        return [orjson.loads(line) for line in self.log.getvalue().splitlines() if line]


def make_config(secret: SecretDir, **overrides: Any) -> ServerConfig:
    values: dict[str, Any] = {"cert_file": secret.cert_file, "key_file": secret.key_file,
                              "instance": "test-instance", "reload_interval_seconds": 0.05,
                              "shutdown_delay_seconds": 0.0, "drain_timeout_seconds": 5.0}
    values.update(overrides)
    return ServerConfig(**values)


@asynccontextmanager
async def running_server(config: ServerConfig, *ca_pems: bytes) -> AsyncIterator[Server]:
    """Start the real server (TLS, probes on a free port) and a trusting client session."""
    log = io.BytesIO()
    sink = LineSink(log)
    app = create_app(config, logger=make_logger("debug", sink=sink))
    running = await start(app, host="127.0.0.1", port=0, metrics_port=0)
    connector = aiohttp.TCPConnector(ssl=client_context(*ca_pems), limit=100)
    session = aiohttp.ClientSession(connector=connector)
    try:
        yield Server(running=running, session=session, log=log, sink=sink,
                     ca_pems=list(ca_pems))
    finally:
        await session.close()
        await stop(running, delay=0, grace=0)


@asynccontextmanager
async def serving(tmp_path: Path, **overrides: Any) -> AsyncIterator[Server]:
    """The real server on a new certificate in ``tmp_path/certs``, configured as
    :func:`make_config` with ``overrides``: where most end-to-end tests start."""
    secret = SecretDir(tmp_path / "certs", new_bundle())
    async with running_server(make_config(secret, **overrides), secret.bundles[0].ca_pem) as srv:
        yield srv


async def open_tls(port: int, ca_pems: list[bytes], *, server_hostname: str = SERVICE_HOST,
                   ctx: ssl.SSLContext | None = None
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw TLS connection (for slow clients and for looking at the served certificate)."""
    return await asyncio.open_connection("127.0.0.1", port,
                                         ssl=ctx or client_context(*ca_pems),
                                         server_hostname=server_hostname)


def peer_cert_der(writer: asyncio.StreamWriter) -> bytes:
    sslobj = writer.get_extra_info("ssl_object")
    der = sslobj.getpeercert(binary_form=True)
    assert der is not None
    return bytes(der)


def request_head(path: str, length: int, *, content_type: str = "application/json",
                 extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {length}\r\n{extra}\r\n").encode()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP/1.1 response with a Content-Length body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with suppress(OSError, ssl.SSLError, asyncio.TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), 1)


async def poll_until(cond: Callable[[], object], within: float = 5.0,
                     every: float = 0.02) -> None:
    """Wait until ``cond()`` is true (state owned by another thread/process: no Event to
    wait on), failing with TimeoutError after ``within`` seconds."""
    async with asyncio.timeout(within):
        while not cond():  # noqa: ASYNC110
            await asyncio.sleep(every)


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def sigterm_and_collect(proc: subprocess.Popen[str], timeout: float = 30) -> str:
    """SIGTERM a server subprocess and return its stderr once it exited (killed, and the
    timeout re-raised, when it does not exit): the caller asserts on ``proc.returncode``."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
