"""Server settings: one frozen value, built by the CLI (or a test) and passed to ``create_app``.

Every timeout here is in seconds and every size in bytes. The defaults follow the Kubernetes
webhook contract (https://kubernetes.io/docs/reference/access-authn-authz/
extensible-admission-controllers/):

* ``timeoutSeconds`` of a webhook defaults to 10 s (1..30 allowed); the API server sends the
  time it has left as ``?timeout=<Go duration>`` and we answer before that (``deadline_*``).
* the API server refuses writes over 3 MiB per object (kubernetes/kubernetes#105863); an
  UPDATE review carries ``object`` and ``oldObject``, so the body limit is 8 MiB.
* a Pod's default ``terminationGracePeriodSeconds`` is 30 s, so the whole shutdown
  (``shutdown_delay_seconds`` + ``drain_timeout_seconds``) stays well below it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

MiB: Final = 1024 * 1024  # mebibyte, 2**20 bytes

DEFAULT_PORT: Final = 8443
DEFAULT_METRICS_PORT: Final = 8080
DEFAULT_MAX_BODY_BYTES: Final = 8 * MiB  # 2 x 3 MiB objects + options + envelope
DEFAULT_MAX_IN_FLIGHT: Final = 256  # concurrent reviews still receiving their body


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything the server needs; no module globals, no environment lookups inside."""

    cert_file: Path  # PEM serving certificate (chain), watched and reloaded
    key_file: Path  # PEM private key matching ``cert_file``, watched and reloaded
    policy_path: Path | None = None  # None: the built-in default policy, no reload
    audit_log: str | None = None  # decision log: file path, "-" for stdout, None for off
    instance: str = field(default_factory=socket.gethostname)  # recorded in each decision
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # bytes; larger bodies get 413
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT  # reviews receiving a body; more get 429
    default_deadline_seconds: float = 10.0  # used when the request has no ?timeout=
    deadline_margin_seconds: float = 1.0  # answer this long before the API server gives up
    read_timeout_seconds: float = 5.0  # cap on reading one request body
    idle_timeout_seconds: float = 30.0  # idle keep-alive / unfinished request headers
    handshake_timeout_seconds: float = 10.0  # TLS handshake
    reload_interval_seconds: float = 1.0  # poll period for cert/key/policy files
    shutdown_delay_seconds: float = 2.0  # keep serving while not ready (endpoint removal)
    drain_timeout_seconds: float = 15.0  # wait at most this long for in-flight requests
    #: DRA cache source (docs/dra.md): "in-cluster" (ServiceAccount) or a kubeconfig path;
    #: None keeps no cache, so every DRA reference counts as unknown.
    dra_source: str | None = None
    dra_watch_timeout_seconds: int = 300  # server-side timeout of one watch request
    #: Node cache source (docs/pools.md): "in-cluster" or a kubeconfig path; None (or until
    #: the first list, or when RBAC refuses it): the policy's declared pools are assumed.
    node_source: str | None = None
    node_watch_timeout_seconds: int = 300  # server-side timeout of one watch request

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be at least 1024, got {self.max_body_bytes}")
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {self.max_in_flight}")
        for name in ("default_deadline_seconds", "read_timeout_seconds", "idle_timeout_seconds",
                     "handshake_timeout_seconds", "reload_interval_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("deadline_margin_seconds", "shutdown_delay_seconds",
                     "drain_timeout_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
