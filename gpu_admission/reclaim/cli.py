"""``gpu-admission reclaim``: notice idle GPU pods and, where a namespace asked for it, scale
their owners down; ``gpu-admission reclaim restore KIND/NAME -n NS`` undoes a scale-down.
See docs/reclaim.md.

Exit codes: 0 done (``--once``/``--dry-run``: the interval ran; the controller: stopped by
SIGTERM/SIGINT); 2 bad input or a source that cannot be used (one message, no traceback).
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import click
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpu_admission.cli.options import kubeconfig_option, resolve_kubeconfig
from gpu_admission.core.timeframe import parse_duration, parse_instant, parse_zone
from gpu_admission.policy.model import Policy, PolicyError, default_policy, load_policy
from gpu_admission.usage.prom import PromError, PrometheusClient


class ReclaimError(click.ClickException):
    exit_code = 2


def _policy(path: Path | None) -> Policy:
    try:
        return load_policy(path) if path is not None else default_policy()
    except PolicyError as exc:
        raise ReclaimError(f"--policy {path}: {exc}") from None


def _now(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_instant(value, "--now", parse_zone("UTC"))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@click.group("reclaim", invoke_without_command=True,
             short_help="Notice idle GPU pods; scale them down.")
@click.option("--prometheus", "prometheus_url", metavar="URL",
              help="Prometheus that scrapes dcgm-exporter, e.g. http://prometheus:9090.")
@click.option("--policy", "policy_file", type=click.Path(path_type=Path, dir_okay=False),
              help="GPUSharingPolicy file (spec.reclaim, spec.placement.idleBelowPercent, "
                   "spec.exemptions); default the built-in policy.")
@kubeconfig_option(help="kubeconfig file, or in-cluster (the pod's ServiceAccount). "
                   "Default: $KUBECONFIG, ~/.kube/config, then in-cluster in a pod.")
@click.option("--interval", default="5m", show_default=True, metavar="DURATION",
              help="Time between intervals (5m, 1h).")
@click.option("--once", is_flag=True, help="Run one interval and exit.")
@click.option("--dry-run", is_flag=True, help="Print the plan of one interval; write nothing.")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help="Format of the --dry-run/--once plan.")
@click.option("--audit-log", default="-", show_default=True, metavar="FILE|-",
              help="Decision log the records are appended to (gpu-admission audit reads it).")
@click.option("--lease", default=None, metavar="NAMESPACE/NAME",
              help="Leader election on this coordination.k8s.io Lease (several replicas: "
                   "only the holder acts).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Serve /healthz, /readyz and /metrics on this port; 0: off.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
@click.option("--now", "now_text", default=None, hidden=True,
              help="Evaluate as if it were this time (replays, tests).")
@click.pass_context
def reclaim(ctx: click.Context, /, prometheus_url: str | None, policy_file: Path | None,  # noqa: PLR0917
            kubeconfig: str | None, interval: str, once: bool, dry_run: bool,
            output: str,
            audit_log: str, lease: str | None, metrics_port: int, log_level: str,
            now_text: str | None) -> None:
    """Notice idle GPU pods; scale their owners down where namespaces opted in.

    Start with --dry-run: it prints what would happen and writes nothing.
    """
    ctx.obj = {"kubeconfig": kubeconfig, "policy_file": policy_file, "audit_log": audit_log}
    if ctx.invoked_subcommand is not None:
        return
    if prometheus_url is None:
        raise click.UsageError("--prometheus: required (the Prometheus that scrapes "
                               "dcgm-exporter), e.g. --prometheus http://prometheus:9090")
    try:
        interval_s = parse_duration(interval, "--interval")
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    now = _now(now_text)
    policy = _policy(policy_file)
    # imported here: the kubernetes client takes ~0.5 s to import
    from gpu_admission.reclaim.controller import Controller, RecordLog  # noqa: PLC0415
    from gpu_admission.reclaim.kube import KubeError, KubeSource  # noqa: PLC0415
    from gpu_admission.reclaim.plan import plan_json, plan_table  # noqa: PLC0415
    from gpu_admission.server.logs import make_logger  # noqa: PLC0415

    try:
        prom = PrometheusClient(prometheus_url)
    except PromError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        kube = KubeSource(resolve_kubeconfig(kubeconfig)).open()
    except KubeError as exc:
        raise ReclaimError(f"--kubeconfig: {exc}") from None
    records = RecordLog(audit_log)
    controller = Controller(policy=policy, prom=prom, kube=kube, records=records,
                            log=make_logger(log_level))
    try:
        if dry_run or once:
            plan = controller.plan(now if now is not None else time.time()) if dry_run \
                else controller.run_once(now)
            if plan is None:
                raise ReclaimError(controller.failing or "the interval failed")
            click.echo(orjson.dumps(plan_json(plan), option=orjson.OPT_INDENT_2).decode()
                       if output == "json" else plan_table(plan), nl=output == "json")
            if controller.failing:
                click.echo(f"error: {controller.failing}; actions paused", err=True)
                sys.exit(1)
            return
        _loop(controller, interval_s, lease, metrics_port, policy_file, now)
    finally:
        records.close()
        kube.close()
        prom.close()


def _loop(controller: Any, interval: int, lease: str | None,  # noqa: PLR0917
          metrics_port: int, policy_file: Path | None, start: float | None) -> None:
    """Every ``interval``: re-read the policy (a ConfigMap mounted as a directory changes in
    place; an invalid one is logged and the last good one kept), then one interval while
    leader; SIGTERM/SIGINT ends it. ``start`` (``--now``): a replay clock that starts there
    and runs at the wall clock's pace."""
    from gpu_admission.reclaim.lease import LeaseElector  # noqa: PLC0415

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    elector = None
    if lease is not None:
        namespace, _, name = lease.partition("/")
        if not namespace or not name:
            raise click.UsageError(f"--lease: expected NAMESPACE/NAME, got {lease!r}")
        elector = LeaseElector(controller.kube, namespace, name, socket.gethostname())
        controller.is_leader = elector.is_leader
        renew = threading.Thread(target=_renew, args=(elector, stop), daemon=True)
        renew.start()
    ready = threading.Event()
    server = _probes(controller, metrics_port, ready) if metrics_port else None
    began = time.monotonic()
    try:
        while not stop.is_set():
            if policy_file is not None:
                try:
                    controller.policy = load_policy(policy_file)
                except PolicyError as exc:
                    controller.log.error(  # noqa: TRY400 - the message says it all
                        "policy_reload_failed", path=str(policy_file),
                        error=str(exc), detail="keeping the last good policy")
            leader = elector is None or elector.is_leader()
            controller.metrics.leader.set(1 if leader else 0)
            if leader:
                try:
                    controller.run_once(None if start is None else
                                        start + time.monotonic() - began)
                except Exception as exc:  # a bug must not end the loop
                    controller.pause(f"interval failed: {type(exc).__name__}: {exc}")
            ready.set()
            stop.wait(interval if leader else 2.0)
    finally:
        if server is not None:
            server.shutdown()


def _renew(elector: Any, stop: threading.Event) -> None:
    while not stop.is_set():
        elector.try_acquire_or_renew(time.time())
        stop.wait(max(1.0, elector.duration / 3))


def _probes(controller: Any, port: int, ready: threading.Event) -> ThreadingHTTPServer:
    """/healthz (the process answers), /readyz (the first interval ran or it stands by),
    /metrics, in a thread of their own."""
    registry = controller.metrics.registry

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                body, kind, code = generate_latest(registry), CONTENT_TYPE_LATEST, 200
            elif self.path == "/healthz":
                body, kind, code = b"ok\n", "text/plain", 200
            elif self.path == "/readyz":
                code = 200 if ready.is_set() else 503
                body, kind = (b"ok\n" if code == 200 else b"starting\n"), "text/plain"
            else:
                body, kind, code = b"not found\n", "text/plain", 404
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@reclaim.command("restore", short_help="Scale a reclaimed owner back up.")
@click.argument("target", metavar="KIND/NAME")
@click.option("-n", "--namespace", required=True, help="Namespace of the owner.")
@kubeconfig_option(help="kubeconfig file, or in-cluster [default: the reclaim option's, "
                   "then $KUBECONFIG, ~/.kube/config, in-cluster].")
@click.option("--audit-log", "audit_log", default=None, metavar="FILE|-",
              help="Decision log the record is appended to [default: the reclaim option's].")
@click.option("--now", "now_text", default=None, hidden=True)
@click.pass_obj
def restore_command(obj: dict[str, Any], /, target: str, namespace: str,  # noqa: PLR0917
                    kubeconfig: str | None, audit_log: str | None,
                    now_text: str | None) -> None:
    """Scale KIND/NAME back to the replicas recorded at the scale-down (or restart a
    Notebook), remove reclaim's annotations, and record it."""
    from gpu_admission.reclaim.controller import RecordLog, RestoreError, restore  # noqa: PLC0415
    from gpu_admission.reclaim.kube import KubeError, KubeSource  # noqa: PLC0415

    kind, _, name = target.partition("/")
    kinds = {"deployment": "Deployment", "deploy": "Deployment", "statefulset": "StatefulSet",
             "sts": "StatefulSet", "notebook": "Notebook"}
    canonical = kinds.get(kind.lower())
    if canonical is None or not name:
        raise click.UsageError(f"KIND/NAME: expected deployment/NAME, statefulset/NAME or "
                               f"notebook/NAME, got {target!r}")
    policy = _policy(obj["policy_file"])
    now = _now(now_text)
    try:
        kube = KubeSource(resolve_kubeconfig(kubeconfig or obj["kubeconfig"])).open()
    except KubeError as exc:
        raise ReclaimError(f"--kubeconfig: {exc}") from None
    audit_log = audit_log or obj["audit_log"]
    records = RecordLog(audit_log)
    try:
        what = restore(kube, records, kind=canonical, name=name, namespace=namespace,
                       policy=policy, instance=socket.gethostname(),
                       now=now if now is not None else time.time())
    except (RestoreError, KubeError) as exc:
        raise ReclaimError(str(exc)) from None
    finally:
        records.close()
        kube.close()
    click.echo(what, err=audit_log == "-")
    sys.stdout.flush()
