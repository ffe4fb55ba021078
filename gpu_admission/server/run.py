"""Listening and stopping: the HTTPS site, the plain-HTTP probe site, graceful shutdown.

Shutdown order on SIGTERM/SIGINT (a Pod gets ``terminationGracePeriodSeconds``, 30 s by
default, between SIGTERM and SIGKILL:
https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination):

1. ``/readyz`` turns 503 and every response carries ``Connection: close``;
2. for ``shutdown_delay_seconds`` we keep accepting, because the endpoint removal reaches
   the API server's connection pool only after a moment and it would otherwise get
   "connection refused";
3. the listener closes; for a short grace (``LISTENER_GRACE_SECONDS``) connections that
   were accepted just before get to send their first request (answered, with
   ``Connection: close``) instead of being closed under a client that is about to write;
4. idle keep-alive connections close, in-flight requests finish (at most
   ``drain_timeout_seconds``), then the decision log is flushed and the process exits 0.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import ssl
from dataclasses import dataclass

from aiohttp import web

from gpu_admission.server.app import STATE, create_probe_app, ssl_context
from gpu_admission.server.config import ServerConfig

#: Seconds between closing the listener and closing idle connections (see step 3 above).
LISTENER_GRACE_SECONDS = 0.5


class TLSSite(web.BaseSite):
    """A TCP site that also bounds the TLS handshake (``TCPSite`` leaves asyncio's 60 s)."""

    __slots__ = ("_handshake_timeout", "_host", "_port", "_runner_ref")

    def __init__(self, runner: web.BaseRunner, *, host: str | None, port: int,
                 ssl_context: ssl.SSLContext, handshake_timeout: float,
                 backlog: int = 1024) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._runner_ref = runner
        self._host = host
        self._port = port
        self._handshake_timeout = handshake_timeout

    @property
    def name(self) -> str:
        return f"https://{self._host or '0.0.0.0'}:{self.port}"

    @property
    def port(self) -> int:
        if self._server is not None and self._server.sockets:  # type: ignore[attr-defined]
            return int(self._server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
        return self._port

    async def start(self) -> None:
        await super().start()
        server = self._runner_ref.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            server, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=True, ssl_handshake_timeout=self._handshake_timeout)


@dataclass(slots=True)
class Running:
    """A started server: its runners and the ports it actually bound (0 -> a free one)."""

    app: web.Application
    https: web.AppRunner
    probes: web.AppRunner | None
    port: int
    metrics_port: int | None
    stopped: bool = False


async def start(app: web.Application, *, host: str | None = None, port: int = 8443,
                metrics_port: int | None = 8080) -> Running:
    """Start listening: HTTPS on ``port`` and, unless None, plain HTTP probes on
    ``metrics_port``. Port 0 picks a free port (see :attr:`Running.port`)."""
    cfg: ServerConfig = app[STATE].config
    # lingering_time: after answering a request whose body was not read (408, 413, 429),
    # aiohttp reads and discards the rest for this long before closing (closing with unread
    # data would RST the connection and could destroy our answer); 1 s bounds slow clients.
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=cfg.idle_timeout_seconds,
                           shutdown_timeout=cfg.drain_timeout_seconds, handle_signals=False,
                           lingering_time=1.0)
    await runner.setup()
    probes: web.AppRunner | None = None
    try:
        site = TLSSite(runner, host=host, port=port, ssl_context=ssl_context(app),
                       handshake_timeout=cfg.handshake_timeout_seconds)
        await site.start()
        bound_metrics: int | None = None
        if metrics_port is not None:
            probes = web.AppRunner(create_probe_app(app), access_log=None,
                                   keepalive_timeout=cfg.idle_timeout_seconds,
                                   shutdown_timeout=1.0)
            await probes.setup()
            probe_site = web.TCPSite(probes, host, metrics_port, reuse_address=True)
            await probe_site.start()
            bound_metrics = probe_site.port
    except BaseException:
        await runner.cleanup()
        if probes is not None:
            await probes.cleanup()
        raise
    return Running(app=app, https=runner, probes=probes, port=site.port,
                   metrics_port=bound_metrics)


async def stop(running: Running, *, delay: float | None = None,
               grace: float = LISTENER_GRACE_SECONDS) -> None:
    """Graceful stop (see the module docstring). ``delay`` overrides the configured
    ``shutdown_delay_seconds``; ``grace`` is step 3's wait."""
    if running.stopped:
        return
    running.stopped = True
    state = running.app[STATE]
    if not state.draining:
        state.draining = True
        state.log.info("shutdown_started", in_flight=state.in_flight,
                       delay_seconds=state.config.shutdown_delay_seconds,
                       drain_timeout_seconds=state.config.drain_timeout_seconds)
    await asyncio.sleep(state.config.shutdown_delay_seconds if delay is None else delay)
    for site in list(running.https.sites):
        await site.stop()  # stop accepting new connections
    await asyncio.sleep(min(grace, state.config.drain_timeout_seconds))
    await running.https.cleanup()  # close idle connections, drain in-flight, close the app
    if running.probes is not None:
        await running.probes.cleanup()
    await asyncio.sleep(0)  # let buffered log lines (flushed via call_soon) go out


async def serve_until_signal(app: web.Application, *, host: str | None, port: int,
                             metrics_port: int | None) -> None:
    """Run until SIGTERM or SIGINT, then stop gracefully."""
    loop = asyncio.get_running_loop()
    stop_event = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_event.set)
    running = await start(app, host=host, port=port, metrics_port=metrics_port)
    # Everything loaded at startup (modules, policy, TLS) is long-lived: move it out of the
    # cyclic GC's sight so a full collection scans only request garbage (tens of µs instead
    # of tens of ms, which would otherwise show up in p99 latency).
    gc.collect()
    gc.freeze()
    state = app[STATE]
    state.log.info("listening", https_port=running.port, metrics_port=running.metrics_port,
                   host=host or "0.0.0.0")
    try:
        await stop_event.wait()
    finally:
        await stop(running)  # a second signal during the drain is ignored (bounded anyway)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
