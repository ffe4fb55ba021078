"""Certificates for the webhook: a private CA and a serving certificate signed by it.

The API server calls a webhook only over HTTPS and verifies the serving certificate against
the ``caBundle`` of the webhook configuration, for the Service DNS name
``<service>.<namespace>.svc`` (https://kubernetes.io/docs/reference/access-authn-authz/
extensible-admission-controllers/#contacting-the-webhook). Hostname checks use the
subjectAltName only, so every name the webhook is reached by must be a SAN.

Keys are ECDSA P-256: small, fast to handshake, accepted by the API server's Go TLS stack.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import click
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE = "ca.crt"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
DEFAULT_SERVICE = "gpu-admission"
DEFAULT_NAMESPACE = "gpu-admission"
DEV_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True, slots=True)
class CertBundle:
    """PEM bytes of the CA certificate and the serving certificate/key it signed."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


def service_dns_names(service: str, namespace: str) -> list[str]:
    """Every name a Service is reached by inside the cluster."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local"]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _san(names: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def generate_bundle(service: str, namespace: str, *, days: int = 365,
                    dev: bool = False) -> CertBundle:
    """A fresh CA (valid ``days`` + 1 year, so renewals can reuse the bundle window) and a
    serving certificate for the Service names (plus localhost/127.0.0.1/::1 with ``dev``)."""
    if days < 1:
        raise ValueError(f"--days must be at least 1, got {days}")
    now = _now() - dt.timedelta(minutes=5)  # tolerate small clock skew between nodes
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{service}-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(now + dt.timedelta(days=days + 365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    names = service_dns_names(service, namespace) + (list(DEV_NAMES) if dev else [])
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                    f"{service}.{namespace}.svc")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(_san(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return CertBundle(
        ca_pem=ca_cert.public_bytes(serialization.Encoding.PEM),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()),
    )


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Write via a temp file + rename so a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bundle(bundle: CertBundle, out_dir: Path) -> None:
    """Write ``ca.crt``, ``tls.crt`` (0644) and ``tls.key`` (0600). The key is written first
    and the certificate last, so a watcher that keys on ``tls.crt`` sees a matching pair."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _atomic_write(out_dir / KEY_FILE, bundle.key_pem, 0o600)
    _atomic_write(out_dir / CA_FILE, bundle.ca_pem, 0o644)
    _atomic_write(out_dir / CERT_FILE, bundle.cert_pem, 0o644)


def ensure_dev_certs(cert_dir: Path) -> bool:
    """Create a self-signed dev bundle in ``cert_dir`` unless tls.crt and tls.key exist.

    Returns True when new files were written (the caller prints where ``ca.crt`` is)."""
    if (cert_dir / CERT_FILE).exists() and (cert_dir / KEY_FILE).exists():
        return False
    write_bundle(generate_bundle(DEFAULT_SERVICE, DEFAULT_NAMESPACE, dev=True), cert_dir)
    return True


def load_certificate(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def not_after(pem: bytes) -> dt.datetime:
    """Expiry (UTC) of a PEM certificate."""
    return load_certificate(pem).not_valid_after_utc


def needs_renewal(bundle: CertBundle, dns_names: list[str], *,
                  min_remaining: dt.timedelta) -> str | None:
    """Why ``bundle`` must be replaced for ``dns_names``, or None when it is still good.

    Checks: parseable, the key matches the certificate, the CA signed it, every DNS name is a
    SAN, and at least ``min_remaining`` of validity is left.
    """
    try:
        cert = load_certificate(bundle.cert_pem)
        ca = load_certificate(bundle.ca_pem)
        key = serialization.load_pem_private_key(bundle.key_pem, password=None)
    except ValueError as exc:
        return f"unreadable certificate or key: {exc}"
    if key.public_key().public_bytes(serialization.Encoding.DER,
                                     serialization.PublicFormat.SubjectPublicKeyInfo) != \
            cert.public_key().public_bytes(serialization.Encoding.DER,
                                           serialization.PublicFormat.SubjectPublicKeyInfo):
        return "private key does not match the certificate"
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):  # bad signature, wrong issuer or key type
        return "certificate is not signed by the CA bundle"
    sans = set(cert.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName))
    missing = [n for n in dns_names if n not in sans]
    if missing:
        return f"certificate lacks DNS names {missing}"
    remaining = cert.not_valid_after_utc - _now()
    if remaining < min_remaining:
        return f"certificate expires in {remaining.days} days (renew below {min_remaining.days})"
    return None


@click.group(name="certs", short_help="Create the webhook's TLS certificates.")
def certs() -> None:
    """Create certificates for the webhook's HTTPS endpoint."""


@certs.command(name="generate", short_help="Write a new CA and serving certificate.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              required=True, help="Directory for ca.crt, tls.crt, tls.key.")
@click.option("--service", default=DEFAULT_SERVICE, show_default=True,
              help="Service name of the webhook.")
@click.option("--namespace", default=DEFAULT_NAMESPACE, show_default=True,
              help="Namespace of the Service.")
@click.option("--days", type=click.IntRange(min=1), default=365, show_default=True,
              help="Validity of the serving certificate, in days.")
@click.option("--dev", is_flag=True, help="Also valid for localhost, 127.0.0.1 and ::1.")
def generate(out_dir: Path, service: str, namespace: str, days: int, dev: bool) -> None:
    """Write a new CA and a serving certificate for SERVICE.NAMESPACE.svc (keys mode 0600)."""
    write_bundle(generate_bundle(service, namespace, days=days, dev=dev), out_dir)
    names = service_dns_names(service, namespace) + (list(DEV_NAMES) if dev else [])
    click.echo(f"wrote {out_dir / CA_FILE}, {out_dir / CERT_FILE}, {out_dir / KEY_FILE}")
    click.echo(f"valid for: {', '.join(names)}; caBundle = base64 of {out_dir / CA_FILE}")
