"""The decision-log writer: one JSON line per record, off the event loop, never blocking.

Why it is built this way:

* ``write()`` runs on the aiohttp event loop inside an admission request. It serialises the
  record with orjson (microseconds; it also snapshots the dict) and hands the bytes to a
  bounded :class:`queue.Queue` with ``put_nowait``. If the queue is full the record is
  *dropped and counted* rather than making admission wait: the API server's webhook timeout
  (default 10 s, ``admissionregistration.k8s.io/v1`` ``timeoutSeconds``) matters more than a
  log line, and the drop is visible in metrics and logs.
* One background thread owns the file. It alone writes, so lines can neither interleave nor
  tear between requests; it batches what is queued into one ``os.write`` on an ``O_APPEND``
  descriptor and rotates only between batches, so a line never spans two files.
* I/O errors (``ENOSPC``, ``EACCES``, a vanished directory) are counted in
  ``gpu_admission_audit_write_errors_total``, logged with structlog (rate-limited), and the
  affected records counted as dropped; the thread keeps running and retries (re-opening the
  file) on the next batch, so logging resumes once space is freed. A half-written batch is
  truncated away (or, if that fails too, the next write starts with a newline) so a partial
  line never glues onto the next record.

Rotation is size based, named like :class:`logging.handlers.RotatingFileHandler`
(``audit.log`` → ``audit.log.1`` … ``audit.log.N``). That handler is not reused because it
formats ``LogRecord`` text one line per write and swallows errors into ``handleError``;
here we need byte batches and exact error accounting.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import stat
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

import orjson
import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Counter

log = structlog.get_logger("gpu_admission.audit")

DEFAULT_MAX_BYTES: Final = 100 * 1024 * 1024  # 100 MiB per file before rotating
DEFAULT_BACKUPS: Final = 5  # rotated files kept: audit.log.1 … audit.log.5
DEFAULT_QUEUE_SIZE: Final = 10_000  # records; ~1 KiB each → ~10 MiB worst-case buffer
MAX_BATCH: Final = 512  # records joined into one os.write
BATCH_WINDOW_S: Final = 0.005  # seconds the writer waits after a wake-up so records batch up
LOG_EVERY_S: Final = 10.0  # at most one error log line per kind per 10 s
STDOUT: Final = "-"
DEFAULT_CLOSE_TIMEOUT: Final = 10.0  # seconds; below the default 30 s grace period

_STOP: Final = object()
_NON_STR_KEYS_NEWLINE: Final = orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE


@dataclass(frozen=True, slots=True)
class AuditMetrics:
    """The writer's Prometheus series (low cardinality: ``reason`` is a fixed set).

    ``written`` counts records on disk; ``write_errors`` failed I/O or encode attempts
    (reason ``io`` | ``encode``); ``dropped`` records lost (reason ``queue_full`` |
    ``io`` | ``encode`` | ``closed``).
    """

    written: Counter
    write_errors: Counter
    dropped: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry | None) -> AuditMetrics:
        """Register the series on ``registry`` (None: an unregistered private set)."""
        return cls(
            written=Counter("gpu_admission_audit_records_written_total",
                            "Decision records written to the audit log.", registry=registry),
            write_errors=Counter("gpu_admission_audit_write_errors_total",
                                 "Failed audit-log writes, by reason (io|encode).",
                                 ["reason"], registry=registry),
            dropped=Counter("gpu_admission_audit_records_dropped_total",
                            "Decision records lost, by reason (queue_full|io|encode|closed).",
                            ["reason"], registry=registry),
        )


# A memo, not configuration: prometheus-client refuses to register the same series twice on
# one registry, but a process may open several logs (tests, re-opening after reconfiguring).
_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, AuditMetrics] = (
    weakref.WeakKeyDictionary())
_METRICS_LOCK = threading.Lock()


def metrics_for(registry: CollectorRegistry) -> AuditMetrics:
    """The writer metrics registered on ``registry`` (created on first use)."""
    with _METRICS_LOCK:
        found = _METRICS.get(registry)
        if found is None:
            found = _METRICS[registry] = AuditMetrics.create(registry)
        return found


class _RateLimitedLog:
    """Log an error at most once per ``LOG_EVERY_S``, with the count suppressed meanwhile."""

    def __init__(self, event: str) -> None:
        self._event = event
        self._last = -LOG_EVERY_S
        self._suppressed = 0
        self._lock = threading.Lock()

    def __call__(self, **fields: Any) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last < LOG_EVERY_S:
                self._suppressed += 1
                return
            suppressed, self._suppressed, self._last = self._suppressed, 0, now
        log.error(self._event, suppressed_since_last=suppressed, **fields)


class DecisionLog:
    """Writes decision records, one JSON line each, without blocking the event loop."""

    def __init__(self, target: str, *, max_bytes: int, backups: int, queue_size: int,
                 metrics: AuditMetrics, stream: IO[bytes] | None = None) -> None:
        if max_bytes < 0 or backups < 0 or queue_size < 1:
            raise ValueError("max_bytes and backups must be >= 0 and queue_size >= 1")
        self.target = target
        self.max_bytes = max_bytes  # bytes; 0 disables rotation
        self.backups = backups
        self.metrics = metrics
        self._queue: queue.Queue[bytes | object] = queue.Queue(maxsize=queue_size)
        self._stream = stream  # only for "-"
        self._fd: int | None = None
        self._regular = True
        self._in_flight = 0  # records taken by the thread, not yet written or dropped
        self._size = 0  # bytes in the current file, as far as we wrote/observed
        self._torn = False  # a partial line may end the file: start the next write with \n
        self._closed = False
        self._log_drop = _RateLimitedLog("audit_record_dropped")
        self._log_io = _RateLimitedLog("audit_write_failed")
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="audit-log-writer", daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, target: str, *, max_bytes: int = DEFAULT_MAX_BYTES,
             backups: int = DEFAULT_BACKUPS, queue_size: int = DEFAULT_QUEUE_SIZE,
             registry: CollectorRegistry | None = REGISTRY,
             metrics: AuditMetrics | None = None) -> DecisionLog:
        """``target`` is a file path (size-rotated) or ``-`` for stdout.

        The file is opened lazily by the writer thread, so an unwritable path does not stop
        the server from starting: it shows up as write errors (metric + log) instead.
        Metrics go on ``registry`` (the process default unless the server passes its own);
        ``metrics`` overrides that entirely.
        """
        stream = sys.stdout.buffer if target == STDOUT else None
        return cls(target, max_bytes=max_bytes, backups=backups, queue_size=queue_size,
                   metrics=metrics or (metrics_for(registry) if registry is not None
                                       else AuditMetrics.create(None)),
                   stream=stream)

    # ---- producer side (event loop or any thread) -------------------------------------

    def write(self, record: Mapping[str, Any]) -> None:
        """Enqueue; never blocks, never raises (failures are counted and logged)."""
        try:
            if self._closed:
                self._drop("closed")
                return
            try:
                try:  # string keys (every server record): orjson's fast path
                    line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
                except TypeError:  # e.g. int keys: the slower option that allows them
                    line = orjson.dumps(record, option=_NON_STR_KEYS_NEWLINE)
            except (TypeError, orjson.JSONEncodeError) as exc:
                self.metrics.write_errors.labels(reason="encode").inc()
                self._drop("encode", error=str(exc))
                return
            try:
                self._queue.put_nowait(line)
            except queue.Full:
                self._drop("queue_full", queue_size=self._queue.maxsize)
        except Exception:  # a log line must never fail an admission request
            with contextlib.suppress(Exception):
                log.exception("audit_write_unexpected_error")

    def _drop(self, reason: str, count: int = 1, **fields: Any) -> None:
        self.metrics.dropped.labels(reason=reason).inc(count)
        self._log_drop(reason=reason, target=self.target, records=count, **fields)

    # ---- shutdown ---------------------------------------------------------------------

    async def aclose(self, wait_s: float | None = DEFAULT_CLOSE_TIMEOUT) -> None:
        """Flush everything enqueued and close (the waiting happens in a worker thread).

        ``wait_s`` (seconds) bounds the wait so a hung disk cannot stall a graceful
        shutdown past the pod's termination grace period; what is left is counted as
        dropped (reason ``closed``) and logged.
        """
        await asyncio.to_thread(self.close, wait_s)

    def close(self, timeout: float | None = DEFAULT_CLOSE_TIMEOUT) -> None:
        """Synchronous :meth:`aclose` for code without an event loop (CLI, tests)."""
        stop_queued = False
        if not self._closed:
            self._closed = True
            with contextlib.suppress(queue.Full):
                self._queue.put(_STOP, timeout=timeout)  # waits only for a free slot
                stop_queued = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            # Not yet written: what is still queued (minus our stop marker) and what the
            # stuck thread holds.
            left = max(self._queue.qsize() - stop_queued, 0) + self._in_flight
            self.metrics.dropped.labels(reason="closed").inc(left)
            log.error("audit_close_timeout", target=self.target, timeout_s=timeout,
                      records_left=left)

    # ---- writer thread ----------------------------------------------------------------

    def _run(self) -> None:
        caught_up = True  # the last batch emptied the queue
        try:
            while True:
                item = self._queue.get()
                stop = item is _STOP
                if not stop and caught_up:
                    # Let a batch gather: waking this thread (and taking the GIL from the
                    # event loop) once per record cost ~135 us of CPU per request under load.
                    # (A 20 or 50 ms window measured no better than 5 ms per request, and
                    # 50 ms held ~4 MiB more RSS.) Records wait at most BATCH_WINDOW_S; the
                    # request path never waits.
                    # With a backlog (a full batch last time) there is no wait, so the
                    # writer's throughput is not capped at MAX_BATCH per window.
                    time.sleep(BATCH_WINDOW_S)
                batch: list[bytes] = [] if stop else [item]  # type: ignore[list-item]
                while not stop and len(batch) < MAX_BATCH:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is _STOP:
                        stop = True
                    else:
                        batch.append(more)  # type: ignore[arg-type]
                caught_up = len(batch) < MAX_BATCH
                if batch:
                    self._in_flight = len(batch)
                    self._write_batch(batch)
                    self._in_flight = 0
                if stop:
                    # Records enqueued while close() raced with write(): keep them too.
                    late: list[bytes] = []
                    with contextlib.suppress(queue.Empty):
                        while True:
                            extra = self._queue.get_nowait()
                            if extra is not _STOP:
                                late.append(extra)  # type: ignore[arg-type]
                    if late:
                        self._in_flight = len(late)
                        self._write_batch(late)
                        self._in_flight = 0
                    return
        finally:
            self._close_fd()

    def _write_batch(self, batch: list[bytes]) -> None:
        done = 0  # records safely written; the rest of the batch is lost on an error
        try:
            if self._stream is not None:
                self._stream.write(b"".join(batch))
                self._stream.flush()
                done = len(batch)
            else:
                for chunk in self._chunks(batch):
                    self._write_file(b"".join(chunk))
                    done += len(chunk)
        except OSError as exc:
            lost = len(batch) - done
            self.metrics.written.inc(done)
            self.metrics.write_errors.labels(reason="io").inc()
            self.metrics.dropped.labels(reason="io").inc(lost)
            self._failing = True
            self._log_io(target=self.target, error=str(exc), errno=exc.errno, records=lost)
            self._close_fd()  # re-open (and re-check the path) on the next batch
            return
        self.metrics.written.inc(done)
        if self._failing:
            self._failing = False
            log.info("audit_write_recovered", target=self.target)

    def _chunks(self, batch: list[bytes]) -> Iterator[list[bytes]]:
        """Split a batch so each file stays within ``max_bytes``, rotating between chunks.

        A single line longer than ``max_bytes`` gets a file of its own (lines are never
        split).
        """
        self._open_fd()
        chunk: list[bytes] = []
        pending = 0  # bytes in ``chunk``
        for line in batch:
            limit_hit = self._size + pending + len(line) > self.max_bytes
            if self._regular and self.max_bytes and (self._size or chunk) and limit_hit:
                if chunk:
                    yield chunk
                    chunk, pending = [], 0
                if self._size:
                    self._rotate()
                    self._open_fd()
            chunk.append(line)
            pending += len(line)
        if chunk:
            yield chunk

    def _open_fd(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            info = os.fstat(self._fd)
            self._regular = stat.S_ISREG(info.st_mode)  # no rotation for /dev/..., FIFOs
            self._size = info.st_size if self._regular else 0
            # A file left by a crash mid-line: terminate that line before appending.
            if self._size and _last_byte(self.target, self._size) != b"\n":
                self._torn = True
        return self._fd

    def _write_file(self, data: bytes) -> None:
        fd = self._open_fd()
        if self._torn:
            data = b"\n" + data
        start = self._size
        try:
            _write_all(fd, data)
        except OSError:
            # Remove a partial batch so no half line stays in the file; if even that fails
            # (rare: truncation frees space), make the next write start on a fresh line.
            try:
                if self._regular:
                    os.ftruncate(fd, start)
                else:
                    self._torn = True
            except OSError:
                self._torn = True
            raise
        self._torn = False
        self._size = start + len(data)

    def _rotate(self) -> None:
        """audit.log.(N-1) → audit.log.N, …, audit.log → audit.log.1 (oldest is removed)."""
        self._close_fd()
        base = Path(self.target)
        if self.backups == 0:
            base.unlink(missing_ok=True)
            return
        for index in range(self.backups - 1, 0, -1):
            src = base.with_name(f"{base.name}.{index}")
            if src.exists():
                src.replace(base.with_name(f"{base.name}.{index + 1}"))
        if base.exists():
            base.replace(base.with_name(f"{base.name}.1"))

    def _close_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _last_byte(path: str, size: int) -> bytes:
    """The byte before ``size`` in ``path`` (a separate read-only open: the log itself is
    opened write-only, which also keeps a FIFO target blocking until it has a reader)."""
    try:
        with Path(path).open("rb") as handle:
            handle.seek(size - 1)
            return handle.read(1)
    except OSError:  # unreadable (e.g. mode 0200): assume the line is complete
        return b"\n"
