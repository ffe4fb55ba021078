"""Certificate rotation under load, against ``gpu-admission serve`` as a subprocess.

The certificate directory is laid out as the kubelet mounts a Secret (``tls.crt`` ->
``..data/tls.crt``, ``..data`` -> a timestamped directory, swapped by renaming a temporary
symlink). While client threads keep opening NEW TLS connections (each request its own
handshake, so each one sees whatever certificate the server serves at that moment):

1. a complete new pair is published: 0 failed requests, and the new certificate (by
   serial number) is served afterwards;
2. a half-written pair is published (new key + old certificate, then new certificate + old
   key): it is never loaded; the server keeps serving the last good certificate, logs the
   failure and counts it in ``gpu_admission_certificate_reloads_total{result="failure"}``;
3. the completed pair is then picked up.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from collections import Counter
from pathlib import Path

import orjson

from tests.hostile_support import (
    ServeProcess,
    client_context,
    gpu_pod,
    new_bundle,
    review,
    serial,
    serve_process,
)
from tests.server_support import SecretDir

RELOAD_INTERVAL_S = 0.1  # the server's file poll period in this test, seconds
SWITCH_BOUND_S = 10.0  # the new certificate must be served well before this, seconds
BODY = orjson.dumps(review(gpu_pod()))


class NewConnectionLoad:
    """Threads that each loop: connect, TLS handshake (CA verified), POST /mutate, read,
    close. Records the serial of every certificate served and every failure."""

    def __init__(self, port: int, ctx: ssl.SSLContext, threads: int = 3) -> None:
        self.port, self.ctx = port, ctx
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.served: list[tuple[float, int]] = []  # (monotonic time, certificate serial)
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> NewConnectionLoad:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=20)

    def _run(self) -> None:
        while not self.stop.is_set():
            conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx,
                                               timeout=10)
            try:
                conn.request("POST", "/mutate", BODY, {"Content-Type": "application/json"})
                assert conn.sock is not None
                der = conn.sock.getpeercert(binary_form=True)
                resp = conn.getresponse()
                data = resp.read()
                ok = resp.status == 200 and orjson.loads(data)["response"]["allowed"]
                with self.lock:
                    if ok and der is not None:
                        self.served.append((time.monotonic(), serial(der)))
                    else:
                        self.failures.append(f"{resp.status} {data[:200]!r}")
            except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
                with self.lock:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
            finally:
                conn.close()

    def serials_since(self, t: float) -> set[int]:
        with self.lock:
            return {s for when, s in self.served if when >= t}

    def wait_for(self, wanted: int, since: float) -> float:
        """Seconds until a request after ``since`` was served certificate ``wanted``."""
        while True:
            with self.lock:
                hit = next((when for when, s in self.served if when >= since and s == wanted),
                           None)
            if hit is not None:
                return hit - since
            assert time.monotonic() - since < SWITCH_BOUND_S, (
                f"serial {wanted:x} not served within {SWITCH_BOUND_S}s; "
                f"served {[hex(s) for s in self.serials_since(since)]}")
            time.sleep(0.02)

    def wait_requests(self, n: int) -> None:
        start = len(self.served)
        deadline = time.monotonic() + SWITCH_BOUND_S
        while len(self.served) < start + n:
            assert time.monotonic() < deadline, "load stalled"
            time.sleep(0.02)


def metric(server: ServeProcess, name: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    for line in text.splitlines():
        if line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric {name} not exported")


def test_rotation_under_load(tmp_path: Path) -> None:
    old, new, newer = new_bundle(), new_bundle(), new_bundle()
    secret = SecretDir(tmp_path / "certs", old)
    # the client trusts all three CAs, as an API server whose caBundle carries old and new
    ctx = client_context(old.ca_pem, new.ca_pem, newer.ca_pem)
    failed_metric = 'gpu_admission_certificate_reloads_total{result="failure"}'
    with serve_process(tmp_path, secret.root, "--reload-interval", str(RELOAD_INTERVAL_S)) \
            as server, NewConnectionLoad(server.port, ctx) as load:
        load.wait_requests(20)
        assert load.serials_since(0) == {serial(old.cert_pem)}

        # 1. a complete pair, swapped atomically
        t1 = time.monotonic()
        secret.publish(new.cert_pem, new.key_pem, new.ca_pem)
        load.wait_for(serial(new.cert_pem), t1)
        load.wait_requests(20)
        switched = time.monotonic()
        load.wait_requests(20)
        assert load.serials_since(switched + 0.5) <= {serial(new.cert_pem)}

        # 2. half-written pairs: never loaded, the last good certificate keeps serving
        failures_before = metric(server, failed_metric)
        for cert_pem, key_pem in ((new.cert_pem, newer.key_pem), (newer.cert_pem, new.key_pem)):
            t2 = time.monotonic()
            secret.publish(cert_pem, key_pem, newer.ca_pem)
            time.sleep(RELOAD_INTERVAL_S * 10)
            load.wait_requests(20)
            assert load.serials_since(t2) == {serial(new.cert_pem)}
        assert metric(server, failed_metric) >= failures_before + 2
        assert "certificate_reload_failed" in server.log_text()

        # 3. the completed pair is picked up
        t3 = time.monotonic()
        secret.publish(newer.cert_pem, newer.key_pem, newer.ca_pem)
        load.wait_for(serial(newer.cert_pem), t3)
        load.wait_requests(20)

    assert load.failures == [], Counter(load.failures).most_common(5)
    assert len(load.served) >= 100
