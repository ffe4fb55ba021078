"""A load generator for AdmissionReview webhooks, run in its own process.

Why our own: ``wrk`` measures raw throughput well (``run.py`` uses it when installed) but
cannot check that each answer carries the request's uid, cannot run open-loop at a fixed
rate, and cannot tell a request refused at connect from one cut mid-flight. This client does
all three, over HTTPS with the CA verified, and records every request's latency.

Modes:
- closed loop (default): ``--connections C`` workers, each sends its next request as soon as
  the previous one is answered (keep-alive), for ``--duration`` seconds or ``--count`` requests;
- open loop: ``--rate R`` requests/s on a fixed schedule; latency is measured from the
  *scheduled* send time, so a stalled server is not hidden by a stalled client
  (coordinated omission);
- ``--new-connections``: a fresh TCP+TLS connection per request (certificate rotation).

Prints one JSON object (also written to ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import ssl
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

UID_PLACEHOLDER = b"00000000-0000-4000-8000-00000000beef"
MAX_EVENTS = 2000  # error events kept with their time, for the shutdown analysis


@dataclass
class Stats:
    """Everything measured, appended to by all workers (one event loop, no locks needed)."""

    latencies_ok: list[float] = field(default_factory=list)  # seconds, 200 + uid echoed
    latencies_other: list[float] = field(default_factory=list)  # seconds, non-200 answers
    status: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    events: list[tuple[float, str]] = field(default_factory=list)  # (t since start, kind)
    uid_mismatch: int = 0
    lag: list[float] = field(default_factory=list)  # open loop: actual - scheduled send


def classify(exc: BaseException) -> str:
    """Name the failure the way the shutdown test needs it: refused at connect vs cut."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "disconnected"
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientOSError):
        return "oserror"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "payload"
    return type(exc).__name__


class Client:
    """Sends the mix; one instance per run."""

    def __init__(self, args: argparse.Namespace, mix: list[tuple[str, bytes]]) -> None:
        self.args = args
        self.mix = mix
        self.stats = Stats()
        self.next = 0
        self.t0 = 0.0

    def _take(self) -> tuple[str, bytes, bytes]:
        i = self.next
        self.next += 1
        path, body = self.mix[i % len(self.mix)]
        uid = f"00000000-0000-4000-8000-{i:012x}".encode()
        return path, body.replace(UID_PLACEHOLDER, uid), uid

    async def one(self, session: aiohttp.ClientSession, scheduled: float | None) -> None:
        path, body, uid = self._take()
        start = time.perf_counter()
        if scheduled is not None:
            self.stats.lag.append(start - scheduled)
            start = scheduled
        try:
            async with session.post(self.args.url + path, data=body,
                                    headers={"Content-Type": "application/json"}) as resp:
                data = await resp.read()
                took = time.perf_counter() - start
                self.stats.status[resp.status] += 1
                if resp.status == 200:
                    if uid not in data[:4096] and orjson.loads(data)["response"]["uid"] != \
                            uid.decode():
                        self.stats.uid_mismatch += 1
                    self.stats.latencies_ok.append(took)
                else:
                    self.stats.latencies_other.append(took)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            kind = classify(exc)
            self.stats.errors[kind] += 1
            if len(self.stats.events) < MAX_EVENTS:
                self.stats.events.append((time.perf_counter() - self.t0, kind))
            if kind == "connect":
                await asyncio.sleep(0.01)  # do not spin on a closed port

    async def closed_loop(self, session: aiohttp.ClientSession, deadline: float) -> None:
        async def worker() -> None:
            while time.perf_counter() < deadline and (
                    self.args.count is None or self.next < self.args.count):
                await self.one(session, None)
        await asyncio.gather(*(worker() for _ in range(self.args.connections)))

    async def open_loop(self, session: aiohttp.ClientSession, deadline: float) -> None:
        interval = 1.0 / self.args.rate
        tasks: set[asyncio.Task[None]] = set()
        i = 0
        while True:
            scheduled = self.t0 + i * interval
            if scheduled >= deadline:
                break
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(self.one(session, scheduled))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
        if tasks:
            await asyncio.wait(tasks, timeout=self.args.timeout)

    async def run(self) -> dict[str, Any]:
        ctx = ssl.create_default_context(cafile=str(self.args.ca))  # verifies host name
        connector = aiohttp.TCPConnector(limit=self.args.connections, ssl=ctx,
                                         force_close=self.args.new_connections)
        timeout = aiohttp.ClientTimeout(total=self.args.timeout)
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            self.t0 = time.perf_counter()
            deadline = self.t0 + self.args.duration
            if self.args.rate:
                await self.open_loop(session, deadline)
            else:
                await self.closed_loop(session, deadline)
            elapsed = time.perf_counter() - self.t0
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        client_cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
        return self.summary(elapsed, client_cpu)

    def summary(self, elapsed: float, client_cpu: float) -> dict[str, Any]:
        s = self.stats
        ok = len(s.latencies_ok)
        return {
            "mode": "open" if self.args.rate else "closed",
            "rate": self.args.rate, "connections": self.args.connections,
            "new_connections": self.args.new_connections,
            "elapsed_s": round(elapsed, 3), "sent": self.next, "ok": ok,
            "rps": round(ok / elapsed, 1) if elapsed else 0.0,
            "status": {str(k): v for k, v in sorted(s.status.items())},
            "errors": dict(s.errors), "uid_mismatch": s.uid_mismatch,
            "latency_ms": percentiles(s.latencies_ok),
            "other_latency_ms": percentiles(s.latencies_other),
            "client_cpu_s": round(client_cpu, 3),
            "client_cpu_util": round(client_cpu / elapsed, 3) if elapsed else 0.0,
            "lag_ms": percentiles(s.lag) if s.lag else None,
            "events": [[round(t, 4), k] for t, k in s.events],
        }


def percentiles(values: list[float]) -> dict[str, float] | None:
    """p50/p90/p99/p99.9/max/mean in milliseconds (nearest-rank)."""
    if not values:
        return None
    v = sorted(values)
    n = len(v)

    def rank(p: float) -> float:
        return round(v[min(n - 1, max(0, int(p * n + 0.999999) - 1))] * 1000, 3)

    return {"n": n, "p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99),
            "p999": rank(0.999), "max": round(v[-1] * 1000, 3),
            "mean": round(sum(v) / n * 1000, 3)}


def load_mix(path: Path) -> list[tuple[str, bytes]]:
    out = []
    for line in path.read_bytes().splitlines():
        entry = orjson.loads(line)
        out.append((entry["path"], entry["body"].encode()))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="https://127.0.0.1:8443 (no path)")
    p.add_argument("--ca", type=Path, required=True, help="CA bundle to verify the server")
    p.add_argument("--mix", type=Path, required=True, help="JSON lines from reviews.write_mix")
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--duration", type=float, default=10.0, help="seconds")
    p.add_argument("--count", type=int, default=None, help="stop after this many requests")
    p.add_argument("--rate", type=float, default=0.0, help="open loop: requests per second")
    p.add_argument("--new-connections", action="store_true", help="new TLS conn per request")
    p.add_argument("--timeout", type=float, default=10.0, help="per-request timeout, seconds")
    p.add_argument("--cpu", type=int, default=None, help="pin this process to one CPU")
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    client = Client(args, load_mix(args.mix))
    result = asyncio.run(client.run())
    text = orjson.dumps(result)
    if args.out:
        args.out.write_bytes(text)
    print(text.decode())


if __name__ == "__main__":
    main()
