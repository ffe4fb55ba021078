"""``gpu-admission serve`` as a subprocess: first start from an empty directory, SIGTERM
with requests in flight, and command-line errors."""

from __future__ import annotations

import asyncio
import shutil
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from gpu_admission.certs.bundle import write_bundle
from tests.builders import make_pod, make_review
from tests.server_support import (
    SERVICE_HOST,
    close_writer,
    free_port,
    new_bundle,
    open_tls,
    poll_until,
    port_is_free,
    read_response,
    request_head,
    subprocess_env,
)


def command() -> list[str]:
    exe = shutil.which("gpu-admission")
    return [exe] if exe else [sys.executable, "-m", "gpu_admission"]


def spawn(args: list[str], cwd: Path, logs: Path) -> subprocess.Popen[bytes]:
    """Start ``serve`` in ``cwd``; stdout/stderr go to ``logs/serve.out``/``serve.err``: a
    full pipe nobody reads would block the server's log writes."""
    logs.mkdir(exist_ok=True)
    with (logs / "serve.out").open("wb") as out, (logs / "serve.err").open("wb") as err:
        return subprocess.Popen([*command(), "serve", *args], cwd=cwd, env=subprocess_env(),
                                stdout=out, stderr=err)


def stderr_of(logs: Path) -> str:
    return (logs / "serve.err").read_text(errors="replace")


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Started servers; any still running at the end are killed (by their own pid)."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


async def wait_ready(url: str, ctx: ssl.SSLContext | None, proc: subprocess.Popen[bytes],
                     *, server_hostname: str | None = None, within: float = 20) -> None:
    async with asyncio.timeout(within), aiohttp.ClientSession() as session:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode}")
            try:
                async with session.get(url, ssl=ctx if ctx is not None else False,
                                       server_hostname=server_hostname) as resp:
                    if resp.status == 200:
                        return
            except (aiohttp.ClientError, OSError):
                pass
            await asyncio.sleep(0.1)


async def stop_process(proc: subprocess.Popen[bytes],
                       sig: signal.Signals = signal.SIGTERM) -> int:
    proc.send_signal(sig)
    await poll_until(lambda: proc.poll() is not None, within=15)
    return proc.returncode


def ca_context(ca_file: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_file))


@pytest.mark.parametrize("default_ports", [False, True], ids=["free-ports", "default-ports"])
async def test_serve_without_arguments_from_an_empty_directory(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]], default_ports: bool) -> None:
    if default_ports:
        if not (port_is_free(8443) and port_is_free(8080)):
            pytest.skip("ports 8443/8080 are in use on this machine")
        args: list[str] = []
        port, metrics = 8443, 8080
    else:
        port, metrics = free_port(), free_port()
        args = ["--port", str(port), "--metrics-port", str(metrics)]
    workdir = tmp_path / "empty"
    workdir.mkdir()
    proc = spawn([*args, "--shutdown-delay", "0"], workdir, tmp_path / "logs")
    procs.append(proc)
    ca_file = workdir / "certs" / "ca.crt"
    # the dev certificate is valid for localhost and for the Service name
    await wait_ready(f"https://localhost:{port}/readyz", None, proc)
    ctx = ca_context(ca_file)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"https://localhost:{port}/readyz", ssl=ctx) as resp:
            assert resp.status == 200
        async with session.get(f"https://127.0.0.1:{port}/readyz", ssl=ctx,
                               server_hostname=SERVICE_HOST) as resp:
            assert resp.status == 200
        async with session.get(f"http://127.0.0.1:{metrics}/readyz") as resp:
            assert resp.status == 200
    assert sorted(p.name for p in (workdir / "certs").iterdir()) == \
        ["ca.crt", "tls.crt", "tls.key"]
    assert (workdir / "certs" / "tls.key").stat().st_mode & 0o777 == 0o600
    assert await stop_process(proc, signal.SIGINT) == 0  # Ctrl-C: same graceful stop
    assert f"CA bundle: {ca_file}" in stderr_of(tmp_path / "logs")


async def test_sigterm_with_requests_in_flight_loses_none(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    bundle = new_bundle()
    write_bundle(bundle, tmp_path / "certs")
    port, metrics = free_port(), free_port()
    audit = tmp_path / "audit.log"
    proc = spawn(["--cert-dir", str(tmp_path / "certs"), "--port", str(port),
                  "--metrics-port", str(metrics), "--audit-log", str(audit),
                  "--shutdown-delay", "1.5", "--drain-timeout", "5"], tmp_path,
                 tmp_path / "logs")
    procs.append(proc)
    ctx = ca_context(tmp_path / "certs" / "ca.crt")
    await wait_ready(f"https://127.0.0.1:{port}/readyz", ctx, proc,
                     server_hostname=SERVICE_HOST)

    # three reviews in flight: headers and half the body sent before SIGTERM
    body = orjson.dumps(make_review(make_pod(labels={"gpu-admission.io/workload": "inference"}),
                                    uid="in-flight"))
    held = []
    for _ in range(3):
        reader, writer = await open_tls(port, [bundle.ca_pem])
        writer.write(request_head("/mutate?timeout=10s", len(body)) + body[: len(body) // 2])
        await writer.drain()
        held.append((reader, writer))

    failures: list[str] = []
    ok = 0
    stop_clients = asyncio.Event()

    async def api_server_like_client() -> None:
        """Keeps POSTing over keep-alive until told to go (Connection: close), as the API
        server stops using an endpoint that left the Service."""
        nonlocal ok
        connector = aiohttp.TCPConnector(ssl=ctx, limit=1)
        async with aiohttp.ClientSession(connector=connector) as session:
            while not stop_clients.is_set():
                try:
                    async with session.post(
                            f"https://127.0.0.1:{port}/mutate",
                            data=orjson.dumps(make_review(make_pod())),
                            headers={"Content-Type": "application/json"},
                            server_hostname=SERVICE_HOST) as resp:
                        await resp.read()
                        if resp.status != 200:
                            failures.append(f"HTTP {resp.status}")
                        ok += resp.status == 200
                        if resp.headers.get("Connection") == "close":
                            return
                except (aiohttp.ClientError, OSError) as exc:
                    failures.append(repr(exc))
                    return

    clients = [asyncio.create_task(api_server_like_client()) for _ in range(4)]
    await asyncio.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    async with aiohttp.ClientSession() as probe:  # readiness goes false first
        async with asyncio.timeout(4):
            while True:
                async with probe.get(f"http://127.0.0.1:{metrics}/readyz") as resp:
                    if resp.status == 503:
                        break
                await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    for _, writer in held:  # the in-flight requests complete after SIGTERM
        writer.write(body[len(body) // 2:])
        await writer.drain()
    for reader, writer in held:
        status, headers, reply = await asyncio.wait_for(read_response(reader), 5)
        assert (status, headers["connection"]) == (200, "close")
        assert orjson.loads(reply)["response"]["uid"] == "in-flight"
        await close_writer(writer)
    async with asyncio.timeout(5):
        await asyncio.gather(*clients)
    stop_clients.set()
    await poll_until(lambda: proc.poll() is not None, within=15)
    assert proc.returncode == 0, stderr_of(tmp_path / "logs")[-2000:]
    assert failures == []
    assert ok >= 4
    # every decision reached the decision log (flushed before exit)
    records = [orjson.loads(line) for line in audit.read_bytes().splitlines()]
    assert len(records) == ok + 3
    assert sum(r["uid"] == "in-flight" for r in records) == 3


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--tls-cert", "x.crt"], 2, "--tls-cert and --tls-key go together"),
    (["--tls-cert", "a", "--tls-key", "b", "--cert-dir", "d"], 2,
     "use either --tls-cert/--tls-key or --cert-dir, not both"),
    (["--cert-dir", "nowhere"], 2, "no TLS certificate at nowhere/tls.crt"),
    (["--policy", "bad.yaml", "--cert-dir", "certs"], 1, "invalid policy bad.yaml"),
], ids=["cert-without-key", "both-cert-options", "missing-cert-dir", "invalid-policy"])
def test_serve_command_line_errors(tmp_path: Path, args: list[str], code: int,
                                   message: str) -> None:
    write_bundle(new_bundle(), tmp_path / "certs")
    (tmp_path / "bad.yaml").write_text("apiVersion: gpu-admission.io/v1alpha1\nkind: Nope\n")
    result = subprocess.run([*command(), "serve", *args], cwd=tmp_path, env=subprocess_env(),
                            capture_output=True, timeout=60, check=False)
    assert result.returncode == code
    assert message in result.stderr.decode()
    assert "Traceback" not in result.stderr.decode()


async def test_audit_log_on_stdout_carries_only_decision_records(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    bundle = new_bundle()
    write_bundle(bundle, tmp_path / "certs")
    port = free_port()
    proc = spawn(["--cert-dir", str(tmp_path / "certs"), "--port", str(port),
                  "--metrics-port", "0", "--audit-log", "-", "--shutdown-delay", "0"],
                 tmp_path, tmp_path / "logs")
    procs.append(proc)
    ctx = ca_context(tmp_path / "certs" / "ca.crt")
    await wait_ready(f"https://127.0.0.1:{port}/readyz", ctx, proc,
                     server_hostname=SERVICE_HOST)
    async with aiohttp.ClientSession() as session:
        for uid in ("one", "two"):
            async with session.post(f"https://127.0.0.1:{port}/mutate", ssl=ctx,
                                    server_hostname=SERVICE_HOST,
                                    data=orjson.dumps(make_review(make_pod(), uid=uid)),
                                    headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 200
    assert await stop_process(proc) == 0
    stdout = (tmp_path / "logs" / "serve.out").read_bytes().splitlines()
    assert [orjson.loads(line)["uid"] for line in stdout] == ["one", "two"]
    events = [orjson.loads(line)["event"] for line in
              stderr_of(tmp_path / "logs").splitlines()]
    assert events[:2] == ["server_started", "listening"]
    assert events.count("review") == 2
    assert events[-1] == "server_stopped"
