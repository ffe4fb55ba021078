"""One backfilled Prometheus for the reclaim tests (tests/reclaim/scenario.py's history)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.dcgm_history_support import write_file
from tests.prometheus_support import PrometheusProcess, create_blocks, running_prometheus
from tests.reclaim.scenario import history


@pytest.fixture(scope="session")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusProcess]:
    work = tmp_path_factory.mktemp("reclaim-prom")
    write_file(history(), work / "history.om")
    create_blocks(work / "history.om", work / "tsdb", max_block_duration="720h")
    with running_prometheus(work / "prom", None, work / "tsdb") as running:
        yield running
