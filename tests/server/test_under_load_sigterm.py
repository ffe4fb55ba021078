"""SIGTERM under load, against ``gpu-admission serve`` as a subprocess.

Kubernetes sends SIGTERM, removes the Pod from the Service endpoints (which reaches the API
server's connection pool a moment later) and kills the process after
``terminationGracePeriodSeconds`` (https://kubernetes.io/docs/concepts/workloads/pods/
pod-lifecycle/#pod-termination). So while 16 keep-alive clients keep sending reviews and one
request is half-way through its body, we send SIGTERM and check:

- 0 requests cut mid-flight: every request either got its 200 AdmissionReview, or was
  refused at connect after shutdown began (the listener is closed);
- the half-sent request that was in flight at SIGTERM is completed with a 200;
- ``/readyz`` answers 503 at once, and answers during the drain carry ``Connection: close``
  (so clients stop reusing the connection instead of having it closed under them);
- the process exits 0, within shutdown delay + drain timeout.
"""

from __future__ import annotations

import asyncio
import http.client
import ssl
import time
from collections import Counter
from pathlib import Path

import aiohttp
import orjson

from tests.hostile_support import (
    client_context,
    gpu_pod,
    new_bundle,
    review,
    serve_process,
)
from tests.server_support import SecretDir

SHUTDOWN_DELAY_S = 0.5  # --shutdown-delay: keep serving, not ready, after SIGTERM
DRAIN_TIMEOUT_S = 5.0  # --drain-timeout: wait at most this long for in-flight requests
CLIENTS = 16


async def half_sent_request(port: int, ctx: ssl.SSLContext, body: bytes,
                            sent_half: asyncio.Event, finish: asyncio.Event) -> bytes:
    """Send the headers and half the body, wait for ``finish``, send the rest, return the
    raw response."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx,
                                                   server_hostname="127.0.0.1")
    head = (f"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    writer.write(head + body[: len(body) // 2])
    await writer.drain()
    sent_half.set()
    await finish.wait()
    writer.write(body[len(body) // 2:])
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), timeout=DRAIN_TIMEOUT_S + 5)
    writer.close()
    return data


async def test_sigterm_under_load(tmp_path: Path) -> None:
    bundle = new_bundle()
    secret = SecretDir(tmp_path / "certs", bundle)
    ctx = client_context(bundle.ca_pem)
    body = orjson.dumps(review(gpu_pod()))
    outcomes: Counter[str] = Counter()
    closes_after: list[bool] = []  # Connection: close on answers to requests sent in drain
    errors_before_term: list[str] = []
    term_at: list[float] = []
    cut_at: list[tuple[float, float]] = []  # (request start - SIGTERM, duration) in seconds

    with serve_process(tmp_path, secret.root, "--shutdown-delay", str(SHUTDOWN_DELAY_S),
                       "--drain-timeout", str(DRAIN_TIMEOUT_S)) as server:
        url = f"https://127.0.0.1:{server.port}/mutate"

        async def client(session: aiohttp.ClientSession) -> None:
            while True:
                started = time.monotonic()
                try:
                    async with session.post(url, data=body,
                                            headers={"Content-Type": "application/json"}) as r:
                        data = await r.read()
                        doc = orjson.loads(data)
                        assert r.status == 200, data[:200]
                        assert doc["response"]["allowed"] is True
                        outcomes["ok"] += 1
                        if term_at and started > term_at[0] + 0.1:
                            closes_after.append(r.headers.get("Connection", "").lower()
                                                == "close")
                except aiohttp.ClientConnectorError as exc:
                    if not term_at:
                        errors_before_term.append(repr(exc))
                    outcomes["refused at connect"] += 1
                    return  # the listener is closed: this client is done
                except (TimeoutError, aiohttp.ClientError, AssertionError) as exc:
                    outcomes[f"cut: {type(exc).__name__}: {exc}"[:160]] += 1
                    if term_at:  # when, relative to SIGTERM, and how long it had run
                        cut_at.append((round(started - term_at[0], 3),
                                       round(time.monotonic() - started, 3)))
                    if not term_at:
                        errors_before_term.append(repr(exc))
                    await asyncio.sleep(0.01)

        connector = aiohttp.TCPConnector(ssl=ctx, limit=CLIENTS)
        async with aiohttp.ClientSession(connector=connector,
                                         timeout=aiohttp.ClientTimeout(total=15)) as session:
            tasks = [asyncio.create_task(client(session)) for _ in range(CLIENTS)]
            sent_half, finish = asyncio.Event(), asyncio.Event()
            slow = asyncio.create_task(half_sent_request(server.port, ctx, body, sent_half,
                                                         finish))
            await asyncio.wait_for(sent_half.wait(), timeout=10)
            await asyncio.sleep(1.0)  # steady load
            ok_before = outcomes["ok"]
            term_at.append(time.monotonic())
            server.sigterm()
            await asyncio.sleep(0.1)
            ready = await asyncio.to_thread(_readyz, server.metrics_port)
            await asyncio.sleep(0.2)
            finish.set()  # the in-flight request completes during the drain
            slow_reply = await slow
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=SHUTDOWN_DELAY_S
                                   + DRAIN_TIMEOUT_S + 10)
        code = await asyncio.to_thread(server.proc.wait, SHUTDOWN_DELAY_S + DRAIN_TIMEOUT_S + 10)
        exited_after = time.monotonic() - term_at[0]

    assert errors_before_term == []
    assert ok_before > 0
    assert outcomes["ok"] > ok_before  # still answering during the shutdown delay
    cut = {k: v for k, v in outcomes.items() if k.startswith("cut")}
    assert cut == {}, (outcomes, "cut requests (start after SIGTERM s, ran s):", cut_at)
    assert outcomes["refused at connect"] == CLIENTS
    assert slow_reply.startswith(b"HTTP/1.1 200"), slow_reply[:300]
    assert ready == 503
    assert closes_after, "no answer was received during the drain"
    assert all(closes_after), f"{closes_after.count(False)} drain answers without close"
    assert code == 0, server.log_text()[-2000:]
    assert exited_after < SHUTDOWN_DELAY_S + DRAIN_TIMEOUT_S + 5


def _readyz(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/readyz")
        return conn.getresponse().status
    finally:
        conn.close()
