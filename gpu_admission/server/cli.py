"""``gpu-admission serve``: the webhook server's command line.

With no certificate options it runs from ``./certs`` and creates a development CA and a
serving certificate there on first start, so ``gpu-admission serve`` in an empty directory
answers at once. In a cluster, mount the Secret and pass ``--cert-dir /certs``.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path

import click

from gpu_admission.certs.bundle import CA_FILE, CERT_FILE, KEY_FILE, ensure_dev_certs
from gpu_admission.cli.options import kubeconfig_option
from gpu_admission.dra.model import DraSourceError
from gpu_admission.policy.model import PolicyError
from gpu_admission.server.app import create_app
from gpu_admission.server.config import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_METRICS_PORT,
    DEFAULT_PORT,
    ServerConfig,
)
from gpu_admission.server.logs import LEVELS, make_logger, route_library_logs_to_stderr
from gpu_admission.server.run import serve_until_signal

DEFAULT_CERT_DIR = Path("certs")
#: the decision log of a local ``serve`` (outside a pod) when --audit-log is not given
DEFAULT_DECISION_LOG = Path("gpu-admission-decisions.jsonl")
AUDIT_LOG_OFF = "off"

_file = click.Path(dir_okay=False, path_type=Path)


@click.command(name="serve", short_help="Serve the admission webhook over HTTPS.")
@click.option("--policy", "policy_path", type=click.Path(dir_okay=False, exists=True,
              path_type=Path), help="GPUSharingPolicy YAML file (reloaded when it changes). "
              "Default: the built-in policy.")
@click.option("--tls-cert", type=_file, help="Serving certificate (PEM); needs --tls-key.")
@click.option("--tls-key", type=_file, help="Private key (PEM) of --tls-cert.")
@click.option("--cert-dir", type=click.Path(file_okay=False, path_type=Path),
              help=f"Directory holding {CERT_FILE} and {KEY_FILE} (e.g. a mounted Secret). "
              f"Default: ./{DEFAULT_CERT_DIR}, created with a dev CA when empty.")
@click.option("--host", default=None, help="Address to listen on. Default: all interfaces.")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT,
              show_default=True, help="HTTPS port for /mutate, /validate and the probes.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=DEFAULT_METRICS_PORT,
              show_default=True, help="Plain-HTTP port for /metrics, /healthz, /readyz; "
              "0 disables it.")
@click.option("--audit-log", default=None, metavar="FILE|-|off",
              help="Append one JSON decision record per decision to FILE, to stdout with -, "
              f"nowhere with {AUDIT_LOG_OFF}. Default: - in a pod, else "
              f"./{DEFAULT_DECISION_LOG} (named in the first log line).")
@click.option("--max-in-flight", type=click.IntRange(min=1), default=DEFAULT_MAX_IN_FLIGHT,
              show_default=True,
              help="Reviews still receiving their body before answering 429 (complete "
                   "reviews are never refused for it).")
@click.option("--max-body-bytes", type=click.IntRange(min=1024),
              default=DEFAULT_MAX_BODY_BYTES, show_default=True,
              help="Largest AdmissionReview body accepted, in bytes (413 above).")
@click.option("--shutdown-delay", type=click.FloatRange(min=0), default=2.0,
              show_default=True, help="Seconds to keep serving, not ready, after SIGTERM.")
@click.option("--drain-timeout", type=click.FloatRange(min=0), default=15.0,
              show_default=True, help="Seconds to wait for in-flight requests on shutdown.")
@click.option("--read-timeout", type=click.FloatRange(min=0.01), default=5.0,
              show_default=True, help="Seconds allowed for receiving one request body.")
@click.option("--idle-timeout", type=click.FloatRange(min=0.01), default=30.0,
              show_default=True, help="Seconds before closing an idle or header-less "
              "connection.")
@click.option("--reload-interval", type=click.FloatRange(min=0.05), default=1.0,
              show_default=True, help="Seconds between checks of the cert/key/policy files.")
@click.option("--instance", default=None, help="Name recorded in decision records. "
              "Default: the host name (the Pod name in Kubernetes).")
@kubeconfig_option("--dra-watch",
                   help="Watch the cluster (read only): Nodes, to learn which GPUs are shared "
                   "from GPU Feature Discovery's labels (docs/pools.md), and DeviceClasses, "
                   "ResourceClaimTemplates, ResourceClaims and pods to judge DRA GPU pods "
                   "(docs/dra.md), through a kubeconfig file or in-cluster (the pod's "
                   "ServiceAccount). Default: no watch; the policy's declared pools are "
                   "assumed and DRA references are reported as unknown.")
@click.option("--log-level", type=click.Choice(LEVELS), default="info", show_default=True)
def serve(  # noqa: PLR0917 (click passes every option)
          policy_path: Path | None, tls_cert: Path | None, tls_key: Path | None,
          cert_dir: Path | None, host: str | None, port: int, metrics_port: int,
          audit_log: str | None, max_in_flight: int, max_body_bytes: int,
          shutdown_delay: float, drain_timeout: float, read_timeout: float,
          idle_timeout: float, reload_interval: float, instance: str | None,
          kubeconfig: str | None, log_level: str) -> None:
    """Serve the admission webhook over HTTPS until SIGTERM/SIGINT."""
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if tls_cert is not None and cert_dir is not None:
        raise click.UsageError("use either --tls-cert/--tls-key or --cert-dir, not both")
    # every line the server writes is a JSON log line (or a decision record with
    # --audit-log -), so `gpu-admission audit` reads its mixed output without a bad line
    logger = make_logger(log_level)
    if tls_cert is not None and tls_key is not None:
        cert_file, key_file = tls_cert, tls_key
    elif cert_dir is not None:
        cert_file, key_file = cert_dir / CERT_FILE, cert_dir / KEY_FILE
    else:
        created = ensure_dev_certs(DEFAULT_CERT_DIR)
        ca_bundle = (DEFAULT_CERT_DIR / CA_FILE).resolve()
        did = "generated a development CA and serving certificate in" if created else "using"
        logger.info("development_certificates",
                    message=f"{did} {DEFAULT_CERT_DIR.resolve()}/; CA bundle: {ca_bundle}")
        cert_file, key_file = DEFAULT_CERT_DIR / CERT_FILE, DEFAULT_CERT_DIR / KEY_FILE
    for path, what in ((cert_file, "certificate"), (key_file, "private key")):
        if not path.is_file():
            raise click.UsageError(f"no TLS {what} at {path}; create one with "
                                   f"`gpu-admission certs generate --out {path.parent}`")
    defaulted = audit_log is None
    if audit_log is None:
        audit_log = "-" if os.environ.get("KUBERNETES_SERVICE_HOST") else \
            str(DEFAULT_DECISION_LOG.resolve())
        logger.info("decision_log", path=audit_log,
                    message=f"decision records go to {audit_log} (gpu-admission audit "
                    f"summary {audit_log}); --audit-log FILE|-|off to change")
    elif audit_log == AUDIT_LOG_OFF:
        audit_log = None
    extra = {"instance": instance} if instance else {}
    config = ServerConfig(
        cert_file=cert_file, key_file=key_file, policy_path=policy_path, audit_log=audit_log,
        max_body_bytes=max_body_bytes, max_in_flight=max_in_flight,
        read_timeout_seconds=read_timeout, idle_timeout_seconds=idle_timeout,
        reload_interval_seconds=reload_interval, shutdown_delay_seconds=shutdown_delay,
        drain_timeout_seconds=drain_timeout, dra_source=kubeconfig, node_source=kubeconfig,
        **extra)  # type: ignore[arg-type]
    route_library_logs_to_stderr(log_level)
    try:
        app = create_app(config, logger=logger)
    except PolicyError as exc:
        raise click.ClickException(f"invalid policy {policy_path}: {exc}") from None
    except DraSourceError as exc:
        raise click.ClickException(f"--kubeconfig: {exc}") from None
    except RuntimeError as exc:  # NodeSourceError (the kube modules are imported lazily)
        if type(exc).__name__ != "NodeSourceError":
            raise
        raise click.ClickException(f"--kubeconfig: {exc}") from None
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise click.ClickException(f"cannot load TLS pair {cert_file} / {key_file}: "
                                   f"{exc}") from None
    if defaulted and audit_log not in (None, "-"):
        try:  # created now, so it can be read at once and an unwritable cwd shows
            with Path(audit_log).open("ab"):
                pass
        except OSError as exc:
            raise click.ClickException(
                f"cannot write the default decision log {audit_log}: {exc.strerror}; "
                "pass --audit-log FILE, - (stdout) or off") from None
    try:
        asyncio.run(serve_until_signal(app, host=host, port=port,
                                       metrics_port=metrics_port or None))
    except OSError as exc:  # e.g. address already in use
        raise click.ClickException(f"cannot listen: {exc}") from None
