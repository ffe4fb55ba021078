"""An asynchronous Kubernetes client for the few calls of the extender's bind: JSON dicts in
and out, by path, on aiohttp, with the ``kubernetes`` client's own configuration (server,
TLS, token, token refresh) so both speak to the API server as the same identity.

Why not the blocking client in threads (:mod:`gpu_admission.kube.client`): a burst of binds
puts dozens of calls in flight at once, and each thread that parses a reply holds the GIL
while the event loop waits to get it back after every socket write (5 ms switch interval):
a profile of a 300-pod burst showed the loop stalled 5 s of 22 s in ``socket.send`` that
way (issue 36). Here the calls are coroutines on the loop; nothing waits for a thread.

API conventions: https://kubernetes.io/docs/reference/using-api/api-concepts/. Errors are
:class:`~gpu_admission.kube.client.KubeError` with the ``Status`` message, as the blocking
client raises them; an unreachable server or a timeout is a KubeError with status 0. Not
supported (the extender runs in-cluster or with a plain kubeconfig): an HTTP proxy
(``configuration.proxy``).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any, Final

import aiohttp
import orjson
from kubernetes import client as k8s

from gpu_admission.kube.client import DEFAULT_TIMEOUT, KubeError, error_from

#: Seconds between two reads of the bearer token (a projected ServiceAccount token is
#: rotated by the kubelet; the ``kubernetes`` client's in-cluster hook re-reads it each
#: minute): read in a thread, never on the loop.
TOKEN_REFRESH_SECONDS: Final = 30.0


def ssl_context(configuration: k8s.Configuration) -> ssl.SSLContext | None:
    """The TLS settings of ``configuration`` (CA, client certificate, verification) as an
    ``SSLContext``; None for a plain-HTTP server. Blocking (reads files): at startup."""
    if not str(configuration.host).startswith("https"):
        return None
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif configuration.assert_hostname is False:
        context.check_hostname = False
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    return context


class AsyncKube:
    """One connection pool (``limit`` connections) to the API server of ``configuration``.
    The session is opened on first use, in the running loop; :meth:`close` ends it."""

    def __init__(self, configuration: k8s.Configuration, *, limit: int = 64) -> None:
        self.configuration = configuration
        self.base = str(configuration.host).rstrip("/")
        self.ssl = ssl_context(configuration)
        self.server_hostname: str | None = getattr(configuration, "tls_server_name", None)
        self.limit = limit
        self.session: aiohttp.ClientSession | None = None
        self._token: str | None = None
        self._token_at = float("-inf")  # time.monotonic() of the last read

    async def _authorization(self) -> str | None:
        if time.monotonic() - self._token_at >= TOKEN_REFRESH_SECONDS:
            self._token = await asyncio.to_thread(
                self.configuration.get_api_key_with_prefix, "authorization")
            self._token_at = time.monotonic()
        return self._token

    def _session(self) -> aiohttp.ClientSession:
        if self.session is None:
            connect, read = DEFAULT_TIMEOUT
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.limit, ssl=self.ssl or False),
                timeout=aiohttp.ClientTimeout(total=connect + read, sock_connect=connect))
        return self.session

    async def request(self, method: str, path: str, *, body: Any = None,
                      content_type: str = "application/json") -> dict[str, Any]:
        """One API call; the decoded JSON answer, or :class:`KubeError` for a non-2xx
        status (message from the ``Status`` body when there is one)."""
        headers = {"Accept": "application/json"}
        token = await self._authorization()
        if token:
            headers["Authorization"] = token
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = orjson.dumps(body)
        extra: dict[str, Any] = {}
        if self.ssl is not None and self.server_hostname:
            extra["server_hostname"] = self.server_hostname
        try:
            async with self._session().request(method, self.base + path, data=data,
                                               headers=headers, **extra) as response:
                raw = await response.read()
                status, reason = response.status, str(response.reason or "")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeError(0, "Unreachable", f"{method} {path}: {type(exc).__name__}: "
                                              f"{exc}") from None
        if not 200 <= status <= 299:
            raise error_from(status, reason, raw)
        if not raw:
            return {}
        decoded = orjson.loads(raw)
        return decoded if isinstance(decoded, dict) else {"items": decoded}

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None
