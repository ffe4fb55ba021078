"""A real Prometheus for the tests (no tests here): Debian's ``prometheus`` on a free loopback
port, started on a config and a TSDB directory of the test's choosing, stopped afterwards.

Used by every suite that reads metrics through Prometheus (the scheduler extender, the
utilisation report), so the process handling lives in one place. Facts:
``shared/reference/scheduling-and-dcgm.md`` section 3 (``/-/ready``, ``promtool tsdb
create-blocks-from openmetrics``, retention).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.server_support import free_port


def require_binary(name: str) -> str:
    """The path of a Debian tool the test drives; CI must have it (``.ci/run`` installs it)."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is required in CI (.ci/run installs Debian's prometheus)")
        pytest.skip(f"{name} not installed (apt-get install prometheus)")
    return path


@dataclass
class PrometheusProcess:
    url: str  # http://127.0.0.1:<port>
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def scrape_config(targets: list[str], interval: str = "1s",
                  job: str = "dcgm-exporter") -> dict[str, Any]:
    """A Prometheus config that scrapes ``targets`` (``host:port``) every ``interval``."""
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [{"job_name": job, "scrape_interval": interval,
                                "static_configs": [{"targets": targets}]}]}


@contextmanager
def running_prometheus(workdir: Path, config: dict[str, Any] | None = None,
                       storage: Path | None = None, *, retention: str = "3650d",
                       ready_timeout: float = 60.0) -> Iterator[PrometheusProcess]:
    """Start ``prometheus`` on 127.0.0.1:<free port>; wait for ``/-/ready``; stop on exit.

    ``storage`` may hold backfilled blocks (``create_blocks``); the default is a fresh
    directory under ``workdir``. The long default retention keeps backfilled fixtures whose
    timestamps lie in the past from being deleted at start.
    """
    binary = require_binary("prometheus")
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config or {}), encoding="utf-8")
    storage = storage or workdir / "tsdb"
    storage.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = workdir / "prometheus.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [binary, f"--config.file={config_file}", f"--storage.tsdb.path={storage}",
             f"--storage.tsdb.retention.time={retention}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=sink, stderr=subprocess.STDOUT)
    running = PrometheusProcess(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"prometheus exited {process.returncode}: "
                                   f"{log.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(running.url + "/-/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus not ready after {ready_timeout} s")
            time.sleep(0.2)
        yield running
    finally:
        running.stop()


def create_blocks(openmetrics: Path, storage: Path, *,
                  max_block_duration: str | None = None) -> None:
    """Backfill an OpenMetrics file (timestamps in seconds, ending ``# EOF``) into ``storage``
    with ``promtool tsdb create-blocks-from openmetrics``.

    ``max_block_duration`` (promtool's hidden ``--max-block-duration``, e.g. ``"720h"``) cuts
    fewer, longer blocks than the default 2 h ones: ~20x faster for days of history."""
    promtool = require_binary("promtool")
    storage.mkdir(parents=True, exist_ok=True)
    extra = [f"--max-block-duration={max_block_duration}"] if max_block_duration else []
    result = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "-q",
                             *extra, str(openmetrics), str(storage)],
                            capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"promtool failed ({result.returncode}): "
                           f"{(result.stderr or result.stdout)[-2000:]}")
