"""`gpu-admission certs generate` and the certificate helpers, through real TLS handshakes."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cryptography import x509

from gpu_admission.certs.bundle import (
    CertBundle,
    ensure_dev_certs,
    generate_bundle,
    needs_renewal,
    service_dns_names,
)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_admission", *args],
                          capture_output=True, text=True, timeout=60, check=False)


def handshake(cert_dir: Path, server_hostname: str) -> x509.Certificate:
    """Serve one TLS handshake with the directory's pair; verify it as the API server would."""
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert_dir / "tls.crt", cert_dir / "tls.key")
    client_ctx = ssl.create_default_context(cafile=str(cert_dir / "ca.crt"))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def serve() -> None:
            conn, _ = listener.accept()
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError):
                pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        with socket.create_connection(listener.getsockname(), timeout=10) as raw, \
                client_ctx.wrap_socket(raw, server_hostname=server_hostname) as tls:
            der = tls.getpeercert(binary_form=True)
            assert der is not None
            tls.sendall(b"x")
        thread.join(timeout=10)
    return x509.load_der_x509_certificate(der)


def test_generate_writes_files_with_modes_and_sans(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    result = run_cli("certs", "generate", "--out", str(out), "--service", "hook",
                     "--namespace", "gpu", "--days", "30")
    assert result.returncode == 0, result.stderr
    assert "hook.gpu.svc" in result.stdout
    assert stat.S_IMODE((out / "tls.key").stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "hook", "hook.gpu", "hook.gpu.svc", "hook.gpu.svc.cluster.local"]
    assert sans.get_values_for_type(x509.IPAddress) == []
    validity = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert dt.timedelta(days=30) <= validity <= dt.timedelta(days=30, minutes=6)


@pytest.mark.parametrize("name", ["hook.gpu.svc", "hook.gpu.svc.cluster.local", "hook.gpu"],
                         ids=["svc", "fqdn", "short"])
def test_handshake_verifies_for_service_names(tmp_path: Path, name: str) -> None:
    assert run_cli("certs", "generate", "--out", str(tmp_path), "--service", "hook",
                   "--namespace", "gpu").returncode == 0
    cert = handshake(tmp_path, name)
    assert cert.subject.rfc4514_string() == "CN=hook.gpu.svc"


def test_handshake_rejects_other_names(tmp_path: Path) -> None:
    assert run_cli("certs", "generate", "--out", str(tmp_path), "--service", "hook",
                   "--namespace", "gpu").returncode == 0
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(tmp_path, "other.gpu.svc")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(tmp_path, "localhost")  # only with --dev


def test_dev_flag_adds_loopback_names(tmp_path: Path) -> None:
    assert run_cli("certs", "generate", "--out", str(tmp_path), "--dev").returncode == 0
    handshake(tmp_path, "localhost")
    handshake(tmp_path, "gpu-admission.gpu-admission.svc")


@pytest.mark.parametrize("args,expected", [
    (["--days", "0"], "--days"),
    ([], "--out"),
], ids=["zero-days", "missing-out"])
def test_generate_bad_arguments_are_clear(tmp_path: Path, args: list[str], expected: str) -> None:
    extra = [] if expected == "--out" else ["--out", str(tmp_path)]
    result = run_cli("certs", "generate", *extra, *args)
    assert result.returncode == 2
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_ensure_dev_certs_creates_once(tmp_path: Path) -> None:
    assert ensure_dev_certs(tmp_path) is True
    first = (tmp_path / "tls.crt").read_bytes()
    assert ensure_dev_certs(tmp_path) is False
    assert (tmp_path / "tls.crt").read_bytes() == first
    handshake(tmp_path, "localhost")


def test_needs_renewal_reasons() -> None:
    good = generate_bundle("hook", "gpu", days=90)
    other = generate_bundle("hook", "gpu", days=90)
    names = service_dns_names("hook", "gpu")
    month = dt.timedelta(days=30)
    assert needs_renewal(good, names, min_remaining=month) is None
    assert "expires" in str(needs_renewal(good, names, min_remaining=dt.timedelta(days=120)))
    assert "lacks DNS names" in str(needs_renewal(good, ["x.gpu.svc"], min_remaining=month))
    assert "not signed" in str(needs_renewal(
        CertBundle(other.ca_pem, good.cert_pem, good.key_pem), names, min_remaining=month))
    assert "does not match" in str(needs_renewal(
        CertBundle(good.ca_pem, good.cert_pem, other.key_pem), names, min_remaining=month))
    assert "unreadable" in str(needs_renewal(
        CertBundle(good.ca_pem, b"garbage", good.key_pem), names, min_remaining=month))
