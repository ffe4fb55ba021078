"""A small, synchronous client for the Prometheus HTTP API (``/api/v1``), for command-line tools.

Why not a library: the Python Prometheus API clients on PyPI pull in pandas/matplotlib; we need
two endpoints and exact error messages. The wire format is Prometheus' documented one
(https://prometheus.io/docs/prometheus/latest/querying/api/, facts sheet
``shared/reference/scheduling-and-dcgm.md`` section 3.1): a JSON envelope
``{"status": "success"|"error", "data", "errorType", "error", "warnings"}``; values are strings
(``"NaN"``, ``"+Inf"`` fit), timestamps are unix **seconds** (float).

Two layers: :func:`decode` turns one HTTP response (status, content type, body) into ``data`` or
a :class:`PromError` with a message a person can act on; it does no I/O, so an asyncio user
(the scheduler extender, with aiohttp) can reuse it. :class:`PrometheusClient` does the
blocking I/O with urllib3 (POST form bodies, so long PromQL never hits URL limits). It blocks:
do not call it on an event loop.
"""

from __future__ import annotations

import threading
from typing import Any, Final
from urllib.parse import urlsplit

import orjson
import urllib3

#: Prometheus refuses range queries with more points per series than this (400 bad_data
#: "exceeded maximum resolution of 11,000 points per timeseries"), ``web/api/v1/api.go``.
MAX_POINTS_PER_SERIES: Final = 11_000


class PromError(Exception):
    """A Prometheus query failed; ``str()`` is the message for the user."""


def decode(url: str, status: int, content_type: str, body: bytes) -> Any:
    """The ``data`` of a Prometheus API response, or :class:`PromError` saying what went wrong.

    ``url`` only appears in messages. Non-JSON answers (a proxy's HTML page, a wrong port) are
    reported as "not a Prometheus API response" rather than a JSON traceback.
    """
    try:
        envelope = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        envelope = None
    if not isinstance(envelope, dict) or envelope.get("status") not in ("success", "error"):
        kind = content_type.split(";", maxsplit=1)[0].strip() or "no content type"
        snippet = body[:80].decode("utf-8", "replace").strip()
        raise PromError(f"{url}: not a Prometheus API response (HTTP {status}, {kind})"
                        + (f": {snippet!r}" if snippet else ""))
    if envelope["status"] == "error":
        raise PromError(f"{url}: Prometheus answered HTTP {status} "
                        f"{envelope.get('errorType') or 'error'}: "
                        f"{envelope.get('error') or 'no message'}")
    return envelope.get("data")


class PrometheusClient:
    """Blocking client for ``/api/v1/series`` and ``/api/v1/query_range`` (POST, keep-alive).

    ``queries`` counts the HTTP requests sent, for benchmarks and progress. Thread-safe
    (urllib3's pool is), so independent queries may run in worker threads.
    """

    def __init__(self, base_url: str, *, timeout: float = 120.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise PromError(f"--prometheus: expected an http(s):// URL like "
                            f"http://prometheus:9090, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.queries = 0
        self._count = threading.Lock()  # queries may be sent from worker threads
        self._pool = urllib3.PoolManager(
            # callers run a few queries at once (usage.query.IN_FLIGHT): keep a connection
            # for each instead of urllib3's default of one ("Connection pool is full")
            maxsize=4,
            retries=urllib3.Retry(total=2, connect=2, read=0, status=0, backoff_factor=0.2,
                                  allowed_methods=None),
            timeout=urllib3.Timeout(connect=10.0, read=timeout))

    def close(self) -> None:
        self._pool.clear()

    def _post(self, path: str, fields: list[tuple[str, str]]) -> Any:
        url = self.base_url + path
        with self._count:
            self.queries += 1
        try:
            response = self._pool.request("POST", url, fields=fields, encode_multipart=False,
                                          preload_content=True)
        except urllib3.exceptions.MaxRetryError as exc:
            reason = exc.reason or exc
            raise PromError(f"cannot reach Prometheus at {self.base_url}: "
                            f"{connection_reason(reason)}") from None
        except urllib3.exceptions.HTTPError as exc:
            raise PromError(f"cannot reach Prometheus at {self.base_url}: "
                            f"{connection_reason(exc)}") from None
        return decode(url, response.status, response.headers.get("Content-Type", ""),
                      response.data)

    def series(self, match: str, start: float, end: float) -> list[dict[str, str]]:
        """Label sets of the series matching ``match`` with samples in [start, end]."""
        data = self._post("/api/v1/series", [("match[]", match), ("start", _ts(start)),
                                             ("end", _ts(end))])
        if not isinstance(data, list):
            raise PromError(f"{self.base_url}/api/v1/series: expected a list of label sets")
        return data

    def query_range(self, query: str, start: float, end: float,
                    step: float) -> list[dict[str, Any]]:
        """The ``result`` of a range query: ``[{"metric": {...}, "values": [[ts, "v"], ...]}]``.

        ``start`` and ``end`` are inclusive, as in Prometheus; the caller keeps
        ``(end - start) / step + 1`` within :data:`MAX_POINTS_PER_SERIES`.
        """
        data = self._post("/api/v1/query_range", [
            ("query", query), ("start", _ts(start)), ("end", _ts(end)), ("step", _ts(step)),
            ("timeout", f"{int(self.timeout)}s")])
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise PromError(f"{self.base_url}/api/v1/query_range: expected a matrix result")
        result = data.get("result")
        return result if isinstance(result, list) else []


def _ts(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def connection_reason(exc: BaseException) -> str:
    """The root cause of a urllib3 error in a few words (``connection refused``); also used
    for the API server by ``gpu_admission.reclaim.kube``."""
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "timed out",
                   "No route to host", "certificate verify failed",
                   "Temporary failure in name resolution"):
        if marker.lower() in text.lower():
            return marker[0].lower() + marker[1:]
    return text.split(": ", 1)[-1] if ": " in text else text
