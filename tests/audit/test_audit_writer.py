"""DecisionLog: concurrency (no torn or lost lines), rotation, disk full, unwritable paths,
queue overflow, stdout. All against real files."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import cast

import orjson
import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from gpu_admission.auditlog.writer import AuditMetrics, DecisionLog


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels or None)
    return 0.0 if found is None else found


def read_lines(*paths: Path) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for path in paths:
        if path.exists():
            out.extend(orjson.loads(line) for line in path.read_bytes().splitlines())
    return out


def record(n: int, pad: int = 0) -> dict[str, object]:
    return {"schemaVersion": 1, "uid": f"uid-{n}", "n": n, "pad": "x" * pad}


async def test_concurrent_coroutines_and_threads_lose_and_tear_nothing(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    target = tmp_path / "audit.log"
    # Small files force many rotations; enough backups that nothing is rotated away.
    log = DecisionLog.open(str(target), max_bytes=64 * 1024, backups=1000, queue_size=100_000,
                           registry=registry)

    async def producer(start: int) -> None:
        for n in range(start, start + 250):
            log.write(record(n, pad=n % 300))
            if n % 10 == 0:
                await asyncio.sleep(0)

    def thread_producer(start: int) -> None:
        for n in range(start, start + 2500):
            log.write(record(n, pad=n % 300))

    threads = [threading.Thread(target=thread_producer, args=(100_000 + i * 10_000,))
               for i in range(4)]
    for t in threads:
        t.start()
    await asyncio.gather(*(producer(i * 1000) for i in range(40)))
    for t in threads:
        t.join()
    await log.aclose()
    check_all_lines(tmp_path, registry)


def check_all_lines(tmp_path: Path, registry: CollectorRegistry) -> None:
    files = sorted(tmp_path.iterdir())
    assert len(files) > 10  # rotation happened many times
    for path in files:  # every file ends on a line boundary and is within the size limit
        data = path.read_bytes()
        assert data.endswith(b"\n")
        assert len(data) <= 64 * 1024
    numbers = [r["n"] for r in read_lines(*files)]
    expected = {*range(40_000)} & {n for i in range(40) for n in range(i * 1000, i * 1000 + 250)}
    expected |= {100_000 + i * 10_000 + k for i in range(4) for k in range(2500)}
    assert len(numbers) == len(expected) == 20_000
    assert set(numbers) == expected
    assert value(registry, "gpu_admission_audit_records_written_total") == 20_000
    assert value(registry, "gpu_admission_audit_records_dropped_total",
                 reason="queue_full") == 0


def test_rotation_keeps_backups_and_drops_the_oldest(tmp_path: Path) -> None:
    target = tmp_path / "audit.log"
    log = DecisionLog.open(str(target), max_bytes=1000, backups=2, registry=CollectorRegistry())
    for n in range(60):  # ~100 bytes per line → ~6 files' worth, only 3 kept
        log.write(record(n, pad=50))
    log.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["audit.log", "audit.log.1", "audit.log.2"]
    kept = read_lines(target.with_name("audit.log.2"), target.with_name("audit.log.1"), target)
    numbers = [r["n"] for r in kept]
    assert numbers == list(range(cast(int, numbers[0]), 60))  # newest survive, in order, no gaps
    assert all(p.stat().st_size <= 1000 for p in tmp_path.iterdir())


def test_appends_to_existing_file_and_repairs_a_torn_last_line(tmp_path: Path) -> None:
    target = tmp_path / "audit.log"
    target.write_bytes(b'{"n": -1}\n{"n": -2, "trunc')  # a crash mid-line earlier
    log = DecisionLog.open(str(target), registry=CollectorRegistry())
    log.write(record(1))
    log.close()
    lines = target.read_bytes().splitlines()
    assert lines[0] == b'{"n": -1}'
    assert lines[1] == b'{"n": -2, "trunc'  # still corrupt, but on its own line
    assert orjson.loads(lines[2])["n"] == 1


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="/dev/full is Linux-only")
async def test_disk_full_is_counted_logged_and_never_raises() -> None:
    registry = CollectorRegistry()
    with capture_logs() as logs:
        log = DecisionLog.open("/dev/full", registry=registry)
        for n in range(50):
            log.write(record(n))  # must return immediately without raising
        await log.aclose()
    assert value(registry, "gpu_admission_audit_write_errors_total", reason="io") >= 1
    assert value(registry, "gpu_admission_audit_records_dropped_total", reason="io") == 50
    assert value(registry, "gpu_admission_audit_records_written_total") == 0
    failures = [e for e in logs if e["event"] == "audit_write_failed"]
    assert failures and failures[0]["log_level"] == "error"
    assert "No space left on device" in failures[0]["error"]
    assert failures[0]["target"] == "/dev/full"


def test_unwritable_path_then_recovery(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    target = tmp_path / "missing-dir" / "audit.log"  # parent does not exist (yet)
    log = DecisionLog.open(str(target), registry=registry)
    log.write(record(1))
    deadline = 0
    while value(registry, "gpu_admission_audit_write_errors_total", reason="io") < 1:
        deadline += 1
        assert deadline < 500, "writer never reported the failure"
        threading.Event().wait(0.01)
    target.parent.mkdir()  # the operator fixes it; the next record must land
    log.write(record(2))
    log.close()
    assert [r["n"] for r in read_lines(target)] == [2]
    assert value(registry, "gpu_admission_audit_records_dropped_total", reason="io") == 1
    assert value(registry, "gpu_admission_audit_records_written_total") == 1


@pytest.mark.parametrize("layout", ["parent-is-a-file", "target-is-a-directory"])
def test_unopenable_targets_are_errors_even_for_root(tmp_path: Path, layout: str) -> None:
    registry = CollectorRegistry()
    if layout == "parent-is-a-file":
        (tmp_path / "file").write_bytes(b"")
        target = tmp_path / "file" / "audit.log"  # ENOTDIR
    else:
        target = tmp_path / "dir"  # EISDIR
        target.mkdir()
    with capture_logs() as logs:
        log = DecisionLog.open(str(target), registry=registry)
        log.write(record(1))
        log.close()
    assert value(registry, "gpu_admission_audit_records_dropped_total", reason="io") == 1
    assert [e["event"] for e in logs] == ["audit_write_failed"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_file_is_an_error_not_a_crash(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    target = tmp_path / "audit.log"
    target.write_bytes(b"")
    target.chmod(0o400)
    log = DecisionLog.open(str(target), registry=registry)
    log.write(record(1))
    log.close()
    assert value(registry, "gpu_admission_audit_records_dropped_total", reason="io") == 1


def test_queue_overflow_drops_and_counts_without_blocking(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    fifo = tmp_path / "stalled"
    os.mkfifo(fifo)
    # Opening a FIFO for writing blocks until a reader appears: the writer thread stalls,
    # exactly like a hung disk. write() must keep returning immediately.
    log = DecisionLog.open(str(fifo), queue_size=5, registry=registry)
    log.write(record(-1))
    waited = 0
    while log._queue.qsize():  # the thread took it and now hangs opening the FIFO
        waited += 1
        assert waited < 500, "writer thread never picked up the first record"
        threading.Event().wait(0.01)
    for n in range(100):
        log.write(record(n))
    dropped = value(registry, "gpu_admission_audit_records_dropped_total", reason="queue_full")
    assert dropped == 95  # exactly 5 fit in the queue
    with fifo.open("rb") as reader:  # unblock it and let close() flush
        closer = threading.Thread(target=log.close)
        closer.start()
        data = reader.read()
        closer.join()
    numbers = [orjson.loads(line)["n"] for line in data.splitlines()]
    assert numbers == [-1, 0, 1, 2, 3, 4]


def test_close_gives_up_on_a_hung_target(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    fifo = tmp_path / "hung"
    os.mkfifo(fifo)
    log = DecisionLog.open(str(fifo), registry=registry)
    for n in range(3):
        log.write(record(n))
    with capture_logs() as logs:
        log.close(timeout=0.2)  # nobody ever reads the FIFO: must return anyway
    assert [e["event"] for e in logs] == ["audit_close_timeout"]
    lost = value(registry, "gpu_admission_audit_records_dropped_total", reason="closed")
    assert lost == 3  # queued or held by the thread blocked in open(): all counted
    with fifo.open("rb") as reader:  # release the thread so it does not outlive the test
        reader.read()
    log.close()


def test_unserialisable_record_is_counted(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    log = DecisionLog.open(str(tmp_path / "a.log"), registry=registry)
    log.write({"bad": object()})
    log.write(record(1))
    log.close()
    assert value(registry, "gpu_admission_audit_write_errors_total", reason="encode") == 1
    assert [r["n"] for r in read_lines(tmp_path / "a.log")] == [1]


def test_write_after_close_is_dropped_and_counted(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    log = DecisionLog.open(str(tmp_path / "a.log"), registry=registry)
    log.close()
    log.write(record(1))
    log.close()  # idempotent
    assert value(registry, "gpu_admission_audit_records_dropped_total", reason="closed") == 1


def test_default_registry_can_be_used_by_several_logs(tmp_path: Path) -> None:
    first = DecisionLog.open(str(tmp_path / "a.log"))
    second = DecisionLog.open(str(tmp_path / "b.log"))
    assert first.metrics is second.metrics
    first.close()
    second.close()
    private = AuditMetrics.create(None)
    third = DecisionLog.open(str(tmp_path / "c.log"), metrics=private)
    assert third.metrics is private
    third.close()


def test_stdout_target_in_a_real_process() -> None:
    code = (
        "import asyncio\n"
        "from gpu_admission.auditlog.writer import DecisionLog\n"
        "async def main():\n"
        "    log = DecisionLog.open('-')\n"
        "    await asyncio.gather(*(asyncio.to_thread(lambda i=i: [log.write({'n': i * 100 + k})"
        " for k in range(100)]) for i in range(20)))\n"
        "    await log.aclose()\n"
        "asyncio.run(main())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True,
                          timeout=60)
    numbers = sorted(orjson.loads(line)["n"] for line in done.stdout.splitlines())
    assert numbers == list(range(2000))
