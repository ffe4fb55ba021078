"""``gpu-admission extender``: the kube-scheduler extender behind ``gpu-aware-scheduler``.

Plain HTTP on loopback by default: in the shipped install it runs as a sidecar of the
scheduler's own pod and kube-scheduler calls ``http://127.0.0.1:8888/scheduler`` (the layout
HAMi uses), so nothing is reachable from outside the pod. See docs/extender.md.
"""

from __future__ import annotations

import asyncio
import gc
import re
import signal
from pathlib import Path

import click
from aiohttp import web

from gpu_admission.cli.options import kubeconfig_option
from gpu_admission.extender.app import (
    DEFAULT_PREFIX,
    STATE,
    ExtenderConfig,
    create_app,
    create_probe_app,
)
from gpu_admission.extender.binder import BindConfig
from gpu_admission.extender.gpustate import DEFAULT_NODE_LABEL
from gpu_admission.kube.client import KubeSourceError
from gpu_admission.policy.model import PolicyError
from gpu_admission.server.logs import LEVELS, make_logger, route_library_logs_to_stderr
from gpu_admission.server.wire import parse_go_duration

DEFAULT_PORT = 8888
_PROMQL_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")  # PromQL range, e.g. 1m, 90s


def _duration(ctx: click.Context | None, param: click.Parameter | None, value: str) -> float:
    seconds = parse_go_duration(value)
    if seconds is None or seconds <= 0:
        raise click.BadParameter(f"expected a positive duration like 15s, 1m or 500ms, got "
                                 f"{value!r}")
    return seconds


def _window(ctx: click.Context | None, param: click.Parameter | None, value: str) -> str:
    if not _PROMQL_DURATION.match(value):
        raise click.BadParameter(f"expected a PromQL duration like 1m or 90s, got {value!r}")
    return value


def _url(ctx: click.Context | None, param: click.Parameter | None, value: str) -> str:
    if not re.match(r"^https?://[^/\s]+", value):
        raise click.BadParameter(f"expected an http(s):// URL of Prometheus, got {value!r}")
    return value


def _prefix(ctx: click.Context | None, param: click.Parameter | None, value: str) -> str:
    if not re.match(r"^/[A-Za-z0-9._~/-]*$", value) or (value != "/" and value.endswith("/")):
        raise click.BadParameter(f"expected a URL path like /scheduler, got {value!r}")
    return value


@click.command(name="extender", short_help="Serve the kube-scheduler extender.")
@click.option("--policy", "policy_path", type=click.Path(dir_okay=False, exists=True,
              path_type=Path), help="GPUSharingPolicy YAML file (reloaded when it changes). "
              "Default: the built-in policy.")
@click.option("--prometheus", default="http://127.0.0.1:9090", show_default=True,
              callback=_url, help="Prometheus that scrapes dcgm-exporter.")
@click.option("--interval", default="15s", show_default=True, callback=_duration,
              help="Time between Prometheus polls (Go duration).")
@click.option("--window", default="1m", show_default=True, callback=_window,
              help="Smoothing window of avg_over_time (PromQL duration); dcgm-exporter "
                   "collects every 30 s.")
@click.option("--stale-after", type=click.IntRange(min=1), default=3, show_default=True,
              help="Answer neutrally when the last good poll is older than this many "
                   "intervals.")
@click.option("--node-label", default=DEFAULT_NODE_LABEL, show_default=True,
              help="dcgm-exporter label holding the Kubernetes node name (its other case, "
                   "e.g. hostname, is accepted too).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (loopback: only the scheduler in the same pod).")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT,
              show_default=True, help="HTTP port.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Also serve /healthz, /readyz and /metrics (only those) on this port on "
                   "all interfaces, for kubelet probes and Prometheus; 0: off.")
@click.option("--prefix", default=DEFAULT_PREFIX, show_default=True, callback=_prefix,
              help="URL path before /filter and /prioritize (the urlPrefix path).")
@click.option("--reload-interval", type=click.FloatRange(min=0.05), default=1.0,
              show_default=True, help="Seconds between checks of the policy file.")
@kubeconfig_option("--kube",
                   help="Fractional GPU pools: watch pods, ConfigMaps and nodes for the GPU "
                   "ledger and serve the bind verb, through a kubeconfig file or in-cluster "
                   "(the pod's ServiceAccount). Default: off (filter and prioritize only).")
@click.option("--namespace", default="gpu-admission", show_default=True,
              help="Install namespace: reservation pods are created here.")
@click.option("--reservation-image", default="", show_default=False,
              help="Image of reservation pods (the project's image; runs `gpu-admission "
                   "reserve`). Default: this extender container's own image, read from its "
                   "pod (env POD_NAME/POD_NAMESPACE from the downward API).")
@click.option("--reservation-service-account", default="gpu-admission-reservation",
              show_default=True, help="ServiceAccount of reservation pods (may patch pods "
              "in --namespace).")
@click.option("--reservation-timeout", default="60s", show_default=True, callback=_duration,
              help="How long bind waits for a new reservation pod to publish its GPU UUID.")
@click.option("--leader-lease", default="", metavar="NAMESPACE/NAME",
              help="kube-scheduler's leader-election Lease: only the replica whose pod "
                   "(env POD_NAME) holds it deletes empty reservation pods and advertises "
                   "node memory. Default: every replica.")
@click.option("--log-level", type=click.Choice(LEVELS), default="info", show_default=True)
def extender(  # noqa: PLR0917 (click passes every option)
        policy_path: Path | None, prometheus: str, interval: float, window: str,
             stale_after: int, node_label: str, host: str, port: int, metrics_port: int,
             prefix: str, reload_interval: float, kubeconfig: str | None, namespace: str,
             reservation_image: str, reservation_service_account: str,
             reservation_timeout: float, leader_lease: str, log_level: str) -> None:
    """Serve the kube-scheduler extender (filter, prioritize; bind with --kubeconfig)
    until SIGTERM/SIGINT."""
    bind = BindConfig(namespace=namespace, image=reservation_image,
                      reservation_timeout_seconds=reservation_timeout,
                      service_account=reservation_service_account,
                      leader_lease=leader_lease)
    config = ExtenderConfig(prometheus_url=prometheus, interval_seconds=interval,
                            window=window, node_label=node_label,
                            stale_after_intervals=stale_after, policy_path=policy_path,
                            prefix=prefix, reload_interval_seconds=reload_interval,
                            kube_source=kubeconfig, bind=bind)
    logger = make_logger(log_level)
    route_library_logs_to_stderr(log_level)
    try:
        app = create_app(config, logger=logger)
    except PolicyError as exc:
        raise click.ClickException(f"invalid policy {policy_path}: {exc}") from None
    except KubeSourceError as exc:
        raise click.ClickException(f"--kubeconfig: {exc}") from None
    try:
        asyncio.run(_serve(app, host, port, metrics_port or None))
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from None


async def _serve(app: web.Application, host: str, port: int, metrics_port: int | None) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5.0)
    probes = web.AppRunner(create_probe_app(app), access_log=None, handle_signals=False,
                           shutdown_timeout=1.0)
    await runner.setup()
    await probes.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        bound: int | None = None
        if metrics_port is not None:
            probe_site = web.TCPSite(probes, None, metrics_port, reuse_address=True)
            await probe_site.start()
            bound = probe_site.port
        # startup objects are long-lived: keep them out of the cyclic GC's full scans
        gc.collect()
        gc.freeze()
        app[STATE].log.info("listening", host=host, port=site.port, metrics_port=bound)
        await stop.wait()
    finally:
        await probes.cleanup()
        await runner.cleanup()
