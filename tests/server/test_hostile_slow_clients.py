"""Slow clients over raw TLS sockets: a slowloris (headers trickled byte by byte, never
finished), a half-sent body, and a TCP connection that never starts its TLS handshake are
each cut by the server's idle/read/handshake timeouts, while a normal client keeps getting
answers the whole time (issue 6, "Slow clients").

The server runs in-process with short timeouts (1 s) so the suite stays fast; the bounds
asserted below are generous multiples of them (they check that a cut happens, not speed).
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.hostile_support import (
    Client,
    ThreadServer,
    check_review,
    client_context,
    gpu_pod,
    in_process_config,
    new_bundle,
    review,
)

TIMEOUT_S = 1.0  # the server's idle (header), read (body) and handshake timeouts, seconds
CUT_BOUND_S = 8.0  # a slow connection must be closed well before this, seconds


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    tmp: Path = tmp_path_factory.mktemp("slow")
    bundle = new_bundle()
    config = in_process_config(tmp, bundle, idle_timeout_seconds=TIMEOUT_S,
                               read_timeout_seconds=TIMEOUT_S,
                               handshake_timeout_seconds=TIMEOUT_S)
    with ThreadServer(config) as srv:
        srv.ca = bundle.ca_pem  # type: ignore[attr-defined]
        yield srv


def tls_socket(server: ThreadServer) -> ssl.SSLSocket:
    ctx = client_context(server.ca)  # type: ignore[attr-defined]
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=CUT_BOUND_S)
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def peer_closed(sock: socket.socket) -> bool:
    """Read what is there without blocking; True once the peer has closed (EOF or reset).
    Bytes the server sends first (a 408 reply) are read and ignored here."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except (BlockingIOError, ssl.SSLWantReadError):
        return False
    except (ConnectionError, ssl.SSLError, OSError):
        return True


BODY = orjson.dumps(review(gpu_pod()))


def good_request(client: Client) -> None:
    check_review(orjson.loads(BODY), client.post("/mutate", BODY), schema=False)


def wait_until_cut(socks: list[socket.socket], client: Client,
                   trickle: bool = False) -> tuple[float, int]:
    """Serve normal requests while waiting for every slow socket to be closed by the
    server. Returns (seconds until the last was cut, normal requests answered)."""
    start = time.monotonic()
    open_socks = list(socks)
    answered = 0
    i = 0
    while open_socks:
        assert time.monotonic() - start < CUT_BOUND_S, f"{len(open_socks)} slow sockets not cut"
        good_request(client)
        answered += 1
        if trickle:
            for sock in open_socks:
                with contextlib.suppress(ConnectionError, ssl.SSLError, OSError):
                    sock.setblocking(True)
                    sock.send(f"X-Slow-{i}: y\r\n".encode())
        readable, _, _ = select.select(open_socks, [], [], 0.05)
        open_socks = [s for s in open_socks if s not in readable or not peer_closed(s)]
        i += 1
    return time.monotonic() - start, answered


def test_slowloris_is_cut_while_others_are_served(server: ThreadServer) -> None:
    client = Client(server.port, client_context(server.ca))  # type: ignore[attr-defined]
    sock = tls_socket(server)
    sock.send(b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")
    took, answered = wait_until_cut([sock], client, trickle=True)
    assert answered > 0
    assert took >= TIMEOUT_S * 0.5  # it was trickling, not refused at once
    sock.close()
    client.close()


def test_half_sent_body_gets_408_and_is_cut(server: ThreadServer) -> None:
    client = Client(server.port, client_context(server.ca))  # type: ignore[attr-defined]
    sock = tls_socket(server)
    sock.send(b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: 5000\r\n\r\n" + BODY[:100])
    start = time.monotonic()
    data = b""
    while True:  # keep serving a normal client until the server answers and closes
        good_request(client)
        sock.settimeout(0.1)
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ssl.SSLWantReadError):
            assert time.monotonic() - start < CUT_BOUND_S, "half-sent request not cut"
            continue
        except (ConnectionError, ssl.SSLError, OSError):
            break
        if not chunk:
            break
        data += chunk
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert b"request body not received in time" in data
    sock.close()
    client.close()


def test_silent_connection_without_tls_handshake_is_cut(server: ThreadServer) -> None:
    client = Client(server.port, client_context(server.ca))  # type: ignore[attr-defined]
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=CUT_BOUND_S)
    _, answered = wait_until_cut([raw], client)
    assert answered > 0
    raw.close()
    client.close()


def test_many_slow_clients_do_not_starve_others(server: ThreadServer) -> None:
    """32 slowloris, 32 half-sent bodies and 32 silent sockets at once (all below the
    in-flight bound): every normal request is still answered, and all 96 are cut."""
    client = Client(server.port, client_context(server.ca))  # type: ignore[attr-defined]
    socks: list[socket.socket] = []
    for _ in range(32):
        s = tls_socket(server)
        s.send(b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        socks.append(s)
        h = tls_socket(server)
        h.send(b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: 5000\r\n\r\n{")
        socks.append(h)
        socks.append(socket.create_connection(("127.0.0.1", server.port), timeout=CUT_BOUND_S))
    _, answered = wait_until_cut(socks, client)
    assert answered > 0
    for sock in socks:
        sock.close()
    client.close()
