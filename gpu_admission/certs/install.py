"""``gpu-admission install-certs``: the self-managed certificate path inside a cluster.

The API server calls the webhook over HTTPS and checks the serving certificate against the
``caBundle`` of each webhook in the Mutating/ValidatingWebhookConfiguration
(https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/
#contacting-the-webhook). This command keeps the two in step:

1. the TLS Secret (``type: kubernetes.io/tls`` with ``tls.crt``, ``tls.key`` and ``ca.crt``,
   https://kubernetes.io/docs/concepts/configuration/secret/#tls-secrets) is created when
   absent and replaced only when :func:`gpu_admission.certs.bundle.needs_renewal` says so
   (near expiry, wrong DNS names, key or CA mismatch);
2. every webhook of the named Mutating and Validating configurations gets the Secret's CA in
   ``clientConfig.caBundle`` when it is not there yet.

Running it again changes nothing (only GETs), so it is safe as a Job or CronJob.

Rotation without a trust gap: the server picks up the new Secret only after the kubelet has
synced the volume (up to about a minute) and its certificate watcher has fired, while the API
server uses a new ``caBundle`` at once. On rotation the new ``caBundle`` therefore holds the new
CA *and* the previous one (while it is unexpired), so the API server accepts the old and the new
serving certificate alike. The previous CA's private key was never stored (``generate_bundle``
does not return it), so trusting it a while longer lets nobody sign anything new.

All cluster calls go through the official ``kubernetes`` client; reads use the raw JSON
(``_preload_content=False``) so the code sees exactly what the API server sent (base64 strings)
whatever the client's model classes do with ``bytes`` fields.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import urllib3.exceptions
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from gpu_admission.certs.bundle import (
    CA_FILE,
    CERT_FILE,
    DEFAULT_NAMESPACE,
    DEFAULT_SERVICE,
    KEY_FILE,
    CertBundle,
    generate_bundle,
    needs_renewal,
    not_after,
    service_dns_names,
)
from gpu_admission.cli.options import NoClusterError, resolve_kubeconfig
from gpu_admission.core.vocab import IN_CLUSTER

TLS_SECRET_TYPE = "kubernetes.io/tls"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpu-admission-install-certs"}
# (kind shown in messages, read method, patch method) of AdmissionregistrationV1Api
WEBHOOK_KINDS = (
    ("MutatingWebhookConfiguration", "read_mutating_webhook_configuration",
     "patch_mutating_webhook_configuration"),
    ("ValidatingWebhookConfiguration", "read_validating_webhook_configuration",
     "patch_validating_webhook_configuration"),
)


class InstallError(click.ClickException):
    """A failure with the object and the API error named; shown without a traceback."""


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    namespace: str
    service: str
    secret: str
    webhook_configs: tuple[str, ...]
    days: int
    renew_before: int


def _api_error(action: str, exc: ApiException) -> InstallError:
    """``GET Secret ns/name: HTTP 403 Forbidden: <the API server's Status.message>``."""
    message = ""
    if exc.body:
        try:
            body = json.loads(exc.body)
            message = str(body.get("message", "")) if isinstance(body, dict) else ""
        except ValueError:
            message = str(exc.body)[:300]
    detail = f": {message}" if message else ""
    return InstallError(f"{action}: HTTP {exc.status} {exc.reason}{detail}")


def _call(action: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run one API call; turn client errors into a message naming ``action``."""
    try:
        return fn(*args, **kwargs)
    except ApiException as exc:
        raise _api_error(action, exc) from None
    except urllib3.exceptions.HTTPError as exc:
        raise InstallError(f"{action}: cannot reach the API server: {exc}") from None


def _read_json(action: str, fn: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
    """GET an object as raw JSON; None when the API server answers 404."""
    try:
        resp = fn(*args, _preload_content=False)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise _api_error(action, exc) from None
    except urllib3.exceptions.HTTPError as exc:
        raise InstallError(f"{action}: cannot reach the API server: {exc}") from None
    try:
        data = json.loads(resp.data)
    except ValueError as exc:
        raise InstallError(f"{action}: the API server sent invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InstallError(f"{action}: the API server sent a {type(data).__name__}, not an object")
    return data


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _certificates(pem: bytes) -> list[x509.Certificate]:
    """Every certificate in a PEM bundle; an unreadable bundle counts as empty."""
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def _secret_bundle(secret: dict[str, Any], where: str) -> CertBundle | str:
    """The bundle stored in a TLS Secret, or why it cannot be one (a renewal reason)."""
    data = secret.get("data") or {}
    missing = [k for k in (CA_FILE, CERT_FILE, KEY_FILE) if not data.get(k)]
    if missing:
        return f"Secret {where} lacks {', '.join(missing)}"
    try:
        return CertBundle(ca_pem=base64.b64decode(data[CA_FILE], validate=True),
                          cert_pem=base64.b64decode(data[CERT_FILE], validate=True),
                          key_pem=base64.b64decode(data[KEY_FILE], validate=True))
    except ValueError as exc:
        return f"Secret {where} holds invalid base64: {exc}"


def _secret_body(opts: Options, bundle: CertBundle,
                 resource_version: str | None = None) -> k8s.V1Secret:
    metadata = k8s.V1ObjectMeta(name=opts.secret, namespace=opts.namespace,
                                labels=dict(MANAGED_BY), resource_version=resource_version)
    return k8s.V1Secret(api_version="v1", kind="Secret", metadata=metadata,
                        type=TLS_SECRET_TYPE,
                        data={CERT_FILE: _b64(bundle.cert_pem), KEY_FILE: _b64(bundle.key_pem),
                              CA_FILE: _b64(bundle.ca_pem)})


def ensure_secret(core: k8s.CoreV1Api, opts: Options,
                  echo: Callable[[str], None]) -> tuple[bytes, bytes | None]:
    """Create or rotate the TLS Secret when needed.

    Returns (the Secret's CA PEM, the CA it replaced when it was rotated just now and is
    still unexpired -- kept in ``caBundle`` during the switch-over)."""
    where = f"{opts.namespace}/{opts.secret}"
    secret = _read_json(f"GET Secret {where}", core.read_namespaced_secret,
                        opts.secret, opts.namespace)
    if secret is None:
        bundle = generate_bundle(opts.service, opts.namespace, days=opts.days)
        _call(f"POST (create) Secret {where}", core.create_namespaced_secret, opts.namespace,
              _secret_body(opts, bundle), _preload_content=False)
        echo(f"created Secret {where} (valid until {not_after(bundle.cert_pem):%Y-%m-%d})")
        return bundle.ca_pem, None

    if secret.get("type") != TLS_SECRET_TYPE:
        # A Secret's type is immutable; replacing it would need a delete we refuse to do.
        raise InstallError(
            f"Secret {where} has type {secret.get('type')!r}, expected {TLS_SECRET_TYPE!r}; "
            f"delete it or pass another --secret")
    current = _secret_bundle(secret, where)
    names = service_dns_names(opts.service, opts.namespace)
    reason = current if isinstance(current, str) else needs_renewal(
        current, names, min_remaining=dt.timedelta(days=opts.renew_before))
    if reason is None:
        assert isinstance(current, CertBundle)
        echo(f"Secret {where} is valid until {not_after(current.cert_pem):%Y-%m-%d}; "
             f"not renewed")
        return current.ca_pem, None

    bundle = generate_bundle(opts.service, opts.namespace, days=opts.days)
    resource_version = (secret.get("metadata") or {}).get("resourceVersion")
    # PUT with the resourceVersion we read: two concurrent runs get a 409 instead of one
    # silently overwriting the other's key (optimistic concurrency,
    # https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions).
    _call(f"PUT (replace) Secret {where}", core.replace_namespaced_secret, opts.secret,
          opts.namespace, _secret_body(opts, bundle, resource_version), _preload_content=False)
    echo(f"rotated Secret {where}: {reason}; new certificate valid until "
         f"{not_after(bundle.cert_pem):%Y-%m-%d}")
    previous = None
    if isinstance(current, CertBundle):
        old = _certificates(current.ca_pem)
        now = dt.datetime.now(dt.UTC)
        previous = b"".join(c.public_bytes(serialization.Encoding.PEM)
                            for c in old if c.not_valid_after_utc > now) or None
    return bundle.ca_pem, previous


def ca_bundle_ops(config: dict[str, Any], ca_pem: bytes,
                  previous_ca: bytes | None) -> list[dict[str, Any]]:
    """JSON Patch (RFC 6902) ops that put ``ca_pem`` into every webhook lacking it.

    A ``test`` on each webhook's name guards against the list changing between our GET and
    PATCH (the API server then answers 422 and nothing is written)."""
    wanted = {_der(c) for c in _certificates(ca_pem)}
    new_bundle = _b64(ca_pem + (previous_ca or b""))
    ops: list[dict[str, Any]] = []
    for index, webhook in enumerate(config.get("webhooks") or []):
        raw = ((webhook.get("clientConfig") or {}).get("caBundle")) or ""
        try:
            present = {_der(c) for c in _certificates(base64.b64decode(raw))}
        except ValueError:
            present = set()
        if wanted <= present:
            continue
        ops.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook.get("name")})
        ops.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle",
                    "value": new_bundle})
    return ops


def ensure_ca_bundles(admission: k8s.AdmissionregistrationV1Api, opts: Options, ca_pem: bytes,
                      previous_ca: bytes | None, echo: Callable[[str], None]) -> None:
    """Patch the CA into every webhook of each named Mutating and Validating configuration."""
    for name in opts.webhook_configs:
        for kind, read, patch in WEBHOOK_KINDS:
            config = _read_json(f"GET {kind} {name}", getattr(admission, read), name)
            if config is None:
                raise InstallError(
                    f"{kind} {name} not found: apply the webhook manifests first "
                    f"(kubectl apply -k webhook-manifests/) or pass the right --webhook-config")
            if not config.get("webhooks"):
                raise InstallError(f"{kind} {name} has no webhooks to patch")
            ops = ca_bundle_ops(config, ca_pem, previous_ca)
            if not ops:
                echo(f"{kind} {name}: caBundle up to date")
                continue
            _call(f"PATCH {kind} {name}", getattr(admission, patch), name, ops,
                  _preload_content=False)
            echo(f"{kind} {name}: caBundle set on {len(ops) // 2} webhook(s)")


def api_client(kubeconfig: Path | None, context: str | None) -> k8s.ApiClient:
    """An ApiClient from ``--kubeconfig``, else $KUBECONFIG, else ~/.kube/config, else
    in-cluster credentials when running in a pod (:func:`~gpu_admission.cli.options.
    resolve_kubeconfig`, as every command). No global client state."""
    try:
        where = resolve_kubeconfig(str(kubeconfig) if kubeconfig else None)
    except NoClusterError as exc:
        raise InstallError(exc.message) from None
    try:
        if where == IN_CLUSTER:
            configuration = k8s.Configuration()
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration)
            return k8s.ApiClient(configuration)
        api: k8s.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=where, context=context, persist_config=False)
        return api
    except (ConfigException, OSError, ValueError) as exc:
        raise InstallError(f"cannot load Kubernetes credentials ({where}): {exc}") from None


@click.command(name="install-certs", short_help="Create or rotate the webhook's TLS Secret.")
@click.option("--namespace", default=DEFAULT_NAMESPACE, show_default=True,
              help="Namespace of the webhook Service and the TLS Secret.")
@click.option("--service", default=DEFAULT_SERVICE, show_default=True,
              help="Service name of the webhook; the certificate is valid for its DNS names.")
@click.option("--secret", default=None, help="TLS Secret name.  [default: SERVICE-tls]")
@click.option("--webhook-config", "webhook_configs", multiple=True,
              help="Name of the Mutating AND Validating webhook configurations to patch "
                   "(repeatable).  [default: SERVICE]")
@click.option("--days", type=click.IntRange(min=1), default=365, show_default=True,
              help="Validity of a newly issued serving certificate, in days.")
@click.option("--renew-before", type=click.IntRange(min=0), default=30, show_default=True,
              help="Renew when fewer than this many days of validity are left.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Kubeconfig file. Default: $KUBECONFIG, ~/.kube/config, then in-cluster "
                   "credentials inside a pod.")
@click.option("--context", default=None, help="Kubeconfig context to use.")
def install_certs(*, namespace: str, service: str, secret: str | None,
                  webhook_configs: tuple[str, ...], days: int, renew_before: int,
                  kubeconfig: Path | None, context: str | None) -> None:
    """Create or rotate the webhook's TLS Secret and put its CA into both webhook
    configurations. Idempotent: renews only near expiry or when the certificate does not
    match the Service; patches a caBundle only when it lacks the Secret's CA."""
    if renew_before >= days:
        raise click.BadParameter(
            f"--renew-before ({renew_before}) must be less than --days ({days}), or every run "
            f"would issue a new certificate", param_hint="--renew-before")
    opts = Options(namespace=namespace, service=service, secret=secret or f"{service}-tls",
                   webhook_configs=webhook_configs or (service,), days=days,
                   renew_before=renew_before)
    with api_client(kubeconfig, context) as api:
        ca_pem, previous_ca = ensure_secret(k8s.CoreV1Api(api), opts, click.echo)
        ensure_ca_bundles(k8s.AdmissionregistrationV1Api(api), opts, ca_pem, previous_ca,
                          click.echo)
