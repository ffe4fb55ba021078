"""Reclaim judges the span that decides (issue 33): the real Prometheus with GPU series that
start 3 hours before T0 (tests/reclaim/scenario.py ``fresh``: a node, exporter or Prometheus
that is new), ``gpu-admission reclaim`` in a subprocess that finds the cluster through
``KUBECONFIG`` (no ``--kubeconfig``), the fake API server behind it.

Two notebooks idle at 2 % SM since their GPUs' first sample are found by ``--dry-run``; the
GPU pods left out are listed with the reason in the plan (JSON and table) and in the
``gpu_admission_reclaim_left_out_pods`` metric of the running controller.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from gpu_admission.core.timeframe import iso
from tests.prometheus_support import PrometheusProcess
from tests.reclaim.fake_api import fake_kube
from tests.reclaim.scenario import T0, deployment_pod, namespace, notebook_pod
from tests.server_support import free_port

FRESH_NB = "fresh-nb-7d9f-abcde"
FRESH_KF = "fresh-kf-0"
GAPPY = "gappy-7d9f-abcde"
NIGHT_OWL = "night-owl-7d9f-abcde"


def world() -> list[dict[str, Any]]:
    return [namespace("ml", scale_down=True), *deployment_pod("ml", "fresh-nb"),
            *notebook_pod("ml", "fresh-kf"), *deployment_pod("ml", "gappy"),
            *deployment_pod("ml", "night-owl")]


def env_with(kubeconfig: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    return {**env, "KUBECONFIG": str(kubeconfig), "HOME": str(home)}


def reclaim(prom: PrometheusProcess, env: dict[str, str], *args: str,
            ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "gpu_admission", "reclaim", "--prometheus",
                           prom.url, *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_dry_run_finds_notebooks_on_gpus_whose_series_start_3h_ago(
        prom: PrometheusProcess, tmp_path: Path) -> None:
    with fake_kube(tmp_path, *world()) as (fake, kubeconfig):
        env = env_with(kubeconfig, tmp_path)
        plan_json = reclaim(prom, env, "--dry-run", "--now", str(T0), "-o", "json")
        table = reclaim(prom, env, "--dry-run", "--now", str(T0))
    assert plan_json.returncode == 0, plan_json.stderr
    assert fake.writes() == []
    plan = orjson.loads(plan_json.stdout)
    pods = {p["pod"]: p for p in plan["pods"]}
    assert sorted(pods) == [FRESH_KF, FRESH_NB]
    for name, owner in ((FRESH_NB, "Deployment"), (FRESH_KF, "Notebook")):
        found = pods[name]
        assert (found["action"], found["idle"], found["owner"]["kind"]) == (
            "notice", True, owner)
        # idle from the GPU's first sample (08:10, standing for the step 08:05-08:10) on;
        # the 21 hours of the window before it are not "missing"
        assert found["idleSince"] == iso(T0 - 3 * 3600 - 300)
        assert found["reason"] == "idle 3 h 5 min of working hours"
    left = {o["pod"]: o for o in plan["leftOut"]}
    assert sorted(left) == [GAPPY, NIGHT_OWL]
    assert left[GAPPY]["cause"] == "missing-samples"
    assert left[GAPPY]["reason"].startswith("6 of 289 samples missing on GPU node-a/3 since "
                                            "the pod first held it at ")
    assert left[NIGHT_OWL] == {
        "namespace": "ml", "pod": NIGHT_OWL, "workload": "notebook",
        "cause": "not-idle-long-enough",
        "reason": "no idle run of 2 h of working hours on GPU node-a/2 in the window"}
    assert table.returncode == 0, table.stderr
    assert "2 pods (2 notice)" in table.stdout
    assert "left out: 2 GPU pods not idle" in table.stdout
    assert f"  ml/{GAPPY} (notebook) missing-samples: 6 of 289 samples missing" in table.stdout


def test_the_controller_lists_left_out_pods_in_its_metrics(prom: PrometheusProcess,
                                                           tmp_path: Path) -> None:
    port = free_port()
    with fake_kube(tmp_path, *world()) as (_fake, kubeconfig):
        process = subprocess.Popen(
            [sys.executable, "-m", "gpu_admission", "reclaim", "--prometheus", prom.url,
             "--interval", "1h", "--metrics-port", str(port), "--now", str(T0),
             "--audit-log", str(tmp_path / "log")],
            env=env_with(kubeconfig, tmp_path), stderr=subprocess.PIPE)
        text = ""
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and "left_out_pods{" not in text:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                timeout=2) as response:
                        text = response.read().decode()
                except OSError:
                    pass
                time.sleep(0.3)
        finally:
            process.terminate()
            _, stderr = process.communicate(timeout=20)
    assert "Traceback" not in stderr.decode(), stderr.decode()
    lines = {line for line in text.splitlines() if line.startswith("gpu_admission_reclaim_")}
    assert ('gpu_admission_reclaim_left_out_pods{namespace="ml",pod="gappy-7d9f-abcde",'
            'reason="missing-samples"} 1.0') in lines
    assert ('gpu_admission_reclaim_left_out_pods{namespace="ml",pod="night-owl-7d9f-abcde",'
            'reason="not-idle-long-enough"} 1.0') in lines
    assert "gpu_admission_reclaim_idle_pods 2.0" in lines
