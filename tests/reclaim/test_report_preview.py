"""``gpu-admission report`` shows, per idle pod, what reclaim would do and when: the same
measure, window and settings as the controller (tests/reclaim/scenario.py's history)."""

from __future__ import annotations

import orjson
from click.testing import CliRunner

from gpu_admission.cli import main
from gpu_admission.core.timeframe import iso
from tests.prometheus_support import PrometheusProcess
from tests.reclaim.scenario import T0, T1


def test_report_lists_what_reclaim_would_do(prom: PrometheusProcess) -> None:
    args = ["report", "--prometheus", prom.url, "--start", str(T0 - 86400), "--end", str(T0)]
    result = CliRunner().invoke(main, [*args, "-o", "json"])
    assert result.exit_code == 1, result.output  # partial: the gap GPU
    rows = {(r["namespace"], r["pod"]): r for r in orjson.loads(result.stdout)["reclaim"]}
    # idle at night only, a gap, a GPU shared with a busy pod, busy again later: absent;
    # GPUs whose series start 3 h before the end: idle since (nothing before is missing)
    assert sorted(rows) == sorted([
        ("ml", "jupyter-alice-7d9f-abcde"), ("lab", "jupyter-bob-7d9f-abcde"),
        ("ml", "carol-0"), ("ml", "llm-0"), ("ml", "dave-7d9f-abcde"), ("ml", "batch-x7k2p"),
        ("ml", "scratch"), ("ml", "fresh-nb-7d9f-abcde"), ("ml", "fresh-kf-0"),
        *(("bulk", f"nb-{i}-7d9f-abcde") for i in range(10))])
    assert rows[("ml", "jupyter-alice-7d9f-abcde")] == {
        "namespace": "ml", "pod": "jupyter-alice-7d9f-abcde", "gpus": ["node-a/0"],
        "idleSince": iso(T0 - 130 * 60), "idleHoursWorking": round(130 / 60, 3),
        "message": "GPU 0 on node-a under 10 % SM for 2 h 10 min of working hours, "
                   "holding 16 GiB",
        "action": "notice", "noticeAt": iso(T0), "scaleDownAt": iso(T1),
        "condition": "notice if its workload class is one of notebook, inference; "
                     "scale-down only if namespace ml is labelled "
                     "gpu-admission.io/reclaim=scale-down and its owner is a Deployment, "
                     "StatefulSet or Kubeflow Notebook"}
    table = CliRunner().invoke(main, args)
    assert "What `gpu-admission reclaim` would do" in table.stdout
    line = next(x for x in table.stdout.splitlines() if "jupyter-alice-7d9f-abcde" in x
                and "notice" in x)
    assert line.split()[2:] == ["node-a/0", iso(T0 - 130 * 60), "2.167", "notice", iso(T0),
                                iso(T1)]
