"""TLS for the webhook: a server context that picks up a rotated certificate without a restart.

The API server only calls webhooks over HTTPS and verifies our certificate against the
``caBundle`` for ``<service>.<namespace>.svc``
(https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/).
When cert-manager or ``install-certs`` renews the Secret, the kubelet swaps the mounted files
atomically (a ``..data`` symlink flip), and we must serve the new pair on new handshakes
without dropping connections or requests.

How: the listening socket keeps one *base* context whose ``sni_callback`` runs for every
ClientHello (with ``server_name=None`` when the client sends no SNI) and points the handshake
at the *current* context (``SSLObject.context = ...``, as documented for
:attr:`ssl.SSLContext.sni_callback`). Reloading builds a complete new context first, so a
mismatched or half-written pair fails in ``load_cert_chain`` and never replaces a good one.
"""

from __future__ import annotations

import ssl
from pathlib import Path

ALPN: tuple[str, ...] = ("http/1.1",)  # aiohttp's server speaks HTTP/1.1 only


def load_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A server context for the pair: TLS 1.2 minimum, Python's modern cipher defaults.

    Raises :class:`ssl.SSLError` (key does not match, bad PEM) or :class:`OSError`.
    Blocking file reads: call it in a thread from async code.
    """
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(list(ALPN))
    ctx.load_cert_chain(certfile=str(cert_file), keyfile=str(key_file))
    return ctx


class ReloadingContext:
    """Holds the current server context; ``base`` goes to the listening socket once."""

    __slots__ = ("base", "current", "generation")

    def __init__(self, initial: ssl.SSLContext) -> None:
        self.base = initial
        self.current = initial
        self.generation = 0  # bumped on every swap; tests and logs use it
        initial.sni_callback = self._select

    def _select(self, ssl_obj: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                base: ssl.SSLContext) -> None:
        current = self.current
        if ssl_obj.context is not current:
            ssl_obj.context = current
        # returning None continues the handshake

    def swap(self, ctx: ssl.SSLContext) -> None:
        """Use ``ctx`` for every handshake from now on; open connections keep theirs."""
        self.current = ctx
        self.generation += 1
