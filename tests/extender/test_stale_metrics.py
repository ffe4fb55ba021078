"""Proof 4: Prometheus stops, the extender keeps answering, neutrally (every node passes, equal
scores), the stale gauge turns 1, and one log line says so. Its own Prometheus, since the
test stops it; the extender is the real command (``--interval 0.5s --stale-after 2``:
stale one second after the last good poll)."""

from __future__ import annotations

from pathlib import Path

from tests.builders import make_container, make_pod
from tests.dcgm_support import FakeDcgmExporter, FakeGpu
from tests.extender_support import (
    args_with_names,
    args_with_nodes,
    make_node,
    metric_value,
    post,
    running_extender,
    wait_for,
)
from tests.prometheus_support import running_prometheus, scrape_config

STALE = "gpu_admission_extender_metrics_stale"


def test_prometheus_stopped_gives_neutral_answers_and_the_stale_gauge(tmp_path: Path) -> None:
    exporter = FakeDcgmExporter().start()
    exporter.set([FakeGpu("busy", 0, 95, 79000, 1000), FakeGpu("target", 0, 45, 8000, 73000)])
    pod = make_pod("infer", containers=[make_container()])
    names = ["busy", "target"]
    try:
        with running_prometheus(tmp_path / "prom", scrape_config([exporter.target], "1s")) \
                as prom, running_extender(tmp_path / "ext", prom.url, "--stale-after", "2",
                                          interval="0.5s") as ext:
            wait_for(lambda: ext.status().get("gpus") == 2, 60, "both GPUs")
            assert metric_value(ext.metrics(), STALE) == 0
            _, body = post(ext.verb("prioritize"), args_with_names(pod, names))
            assert body == [{"Host": "busy", "Score": 0}, {"Host": "target", "Score": 10}]
            _, body = post(ext.verb("filter"), args_with_names(pod, names))
            assert body["NodeNames"] == ["target"] and list(body["FailedNodes"]) == ["busy"]

            prom.stop()
            wait_for(lambda: metric_value(ext.metrics(), STALE) == 1, 20, "the stale gauge")
            assert ext.status()["metrics"] == "stale"
            _, body = post(ext.verb("prioritize"), args_with_names(pod, names))
            assert body == [{"Host": "busy", "Score": 5}, {"Host": "target", "Score": 5}]
            nodes = [make_node(n) for n in names]
            code, body = post(ext.verb("filter"), args_with_nodes(pod, nodes))
            assert (code, body) == (200, {
                "Nodes": {"apiVersion": "v1", "kind": "NodeList", "items": nodes},
                "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                "Error": ""})
            text = ext.metrics()
            assert (metric_value(text, "gpu_admission_extender_poll_errors_total",
                                 'reason="unreachable"') or 0) >= 1
            assert metric_value(text, "gpu_admission_extender_neutral_answers_total",
                                'reason="metrics_stale",verb="filter"') == 1
            assert metric_value(text, "gpu_admission_extender_neutral_answers_total",
                                'reason="metrics_stale",verb="prioritize"') == 1
        events = [line["event"] for line in ext.log_lines()]
        # one line per transition (Prometheus was ready before the first poll), not per poll
        assert [e for e in events if e in ("metrics_stale", "metrics_fresh")] == [
            "metrics_fresh", "metrics_stale"]
        assert events.count("metrics_poll_failed") >= 2
    finally:
        exporter.stop()
