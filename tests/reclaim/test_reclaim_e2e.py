"""``gpu-admission reclaim`` end to end: the real Prometheus serving backfilled dcgm-exporter
history (tests/reclaim/scenario.py, written and backfilled like the report's fixture), the
real ``kubernetes`` client against the fake API (tests/reclaim/fake_api.py), the command
through click, and the exact requests it sends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner, Result

from gpu_admission.cli import main
from gpu_admission.core.timeframe import iso
from tests.prometheus_support import PrometheusProcess
from tests.reclaim.fake_api import FakeKube, fake_kube
from tests.reclaim.scenario import (
    NIGHT,
    T0,
    T1,
    deployment_pod,
    namespace,
    notebook_pod,
    pod,
)
from tests.server_support import free_port

POD = "jupyter-alice-7d9f-abcde"
MESSAGE = "GPU 0 on node-a under 10 % SM for 2 h 10 min of working hours, holding 16 GiB"


def run(prom_url: str, kubeconfig: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["reclaim", "--prometheus", prom_url, "--kubeconfig",
                                     str(kubeconfig), *args], catch_exceptions=False)


def once(prom: PrometheusProcess, kubeconfig: Path, log: Path, now: int, *args: str) -> Result:
    return run(prom.url, kubeconfig, "--once", "--now", str(now), "--audit-log", str(log),
               "-o", "json", *args)


def records(log: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in log.read_bytes().splitlines()] if log.exists() else []


def writes(fake: FakeKube, since: int = 0) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in fake.requests[since:] if r.method != "GET"]


def body(fake: FakeKube, method: str, path: str) -> Any:
    found = [r.body for r in fake.requests if r.method == method and r.path == path]
    assert len(found) == 1, (method, path, found)
    return found[0]


def alice_world() -> list[dict[str, Any]]:
    return [namespace("ml", scale_down=True), namespace("lab", scale_down=False),
            *deployment_pod("ml", "jupyter-alice"), *deployment_pod("lab", "jupyter-bob"),
            *deployment_pod("ml", "night-owl"), *deployment_pod("ml", "gappy"),
            *deployment_pod("ml", "share-idle"),
            *deployment_pod("ml", "share-busy", notebook=False), *notebook_pod("ml", "carol")]


def notice_writes(ns: str, pod: str, owner_kind: str, owner: str) -> list[tuple[str, str]]:
    return [("POST", f"/api/v1/namespaces/{ns}/events"),
            *([("POST", f"/api/v1/namespaces/{ns}/events")] if owner_kind else []),
            ("PATCH", f"/api/v1/namespaces/{ns}/pods/{pod}")]


def test_dry_run_prints_the_plan_and_writes_nothing(prom: PrometheusProcess,
                                                    tmp_path: Path) -> None:
    with fake_kube(tmp_path, *alice_world()) as (fake, kubeconfig):
        result = run(prom.url, kubeconfig, "--dry-run", "--now", str(T0), "-o", "json",
                     "--audit-log", str(tmp_path / "log"))
        table = run(prom.url, kubeconfig, "--dry-run", "--now", str(T0))
    assert result.exit_code == 0, result.output
    assert fake.writes() == []
    assert not (tmp_path / "log").exists()
    plan = orjson.loads(result.stdout)
    pods = {p["pod"]: p for p in plan["pods"]}
    # idle only at night, a gap in the data, a GPU shared with a busy pod: not in the plan
    assert sorted(pods) == ["carol-0", "jupyter-alice-7d9f-abcde", "jupyter-bob-7d9f-abcde"]
    alice = pods[POD]
    assert alice == {
        "namespace": "ml", "pod": POD, "workload": "notebook",
        "owner": {"kind": "Deployment", "name": "jupyter-alice"}, "action": "notice",
        "reason": "idle 2 h 10 min of working hours", "message": MESSAGE, "idle": True,
        "idleSince": iso(T0 - 130 * 60), "idleHoursWorking": round(130 / 60, 3),
        "gpus": [{"node": "node-a", "gpu": "0", "uuid": alice["gpus"][0]["uuid"],
                  "memoryUsedMiB": 16384.0}],
        "noticeAt": iso(T0), "scaleDownAt": iso(T1)}
    assert pods["jupyter-bob-7d9f-abcde"]["action"] == "notice"
    assert pods["jupyter-bob-7d9f-abcde"]["scaleDownAt"] is None  # lab is not labelled
    assert pods["carol-0"]["owner"] == {"kind": "Notebook", "name": "carol"}
    assert plan["counts"]["notice"] == 3
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[0].split() == ["NAMESPACE", "POD", "WORKLOAD", "OWNER", "IDLE", "ACTION",
                                "SCALE-DOWN", "AT", "REASON"]
    assert any(line.split()[:9] == ["ml", POD, "notebook", "Deployment/jupyter-alice", "2",
                                    "h", "10", "min", "notice"] for line in lines)
    assert "3 pods (3 notice)" in table.output


def test_notice_then_scale_down_then_restore(prom: PrometheusProcess, tmp_path: Path) -> None:
    log = tmp_path / "decisions.log"
    with fake_kube(tmp_path, *alice_world()) as (fake, kubeconfig):
        first = once(prom, kubeconfig, log, T0)
        assert first.exit_code == 0, first.output
        assert writes(fake) == [  # in (namespace, pod) order
            *notice_writes("lab", "jupyter-bob-7d9f-abcde", "Deployment", "jupyter-bob"),
            *notice_writes("ml", "carol-0", "Notebook", "carol"),
            *notice_writes("ml", POD, "Deployment", "jupyter-alice")]
        patch = next(r for r in fake.requests if r.method == "PATCH" and r.path.endswith(POD))
        assert patch.content_type == "application/merge-patch+json"
        assert patch.body == {"metadata": {"annotations": {
            "gpu-admission.io/idle-since": iso(T0 - 130 * 60),
            "gpu-admission.io/idle-notice-at": iso(T0)}}}
        events = fake.store["events"]
        pod_event = next(e for e in events.values()
                         if e["involvedObject"] == {"kind": "Pod", "name": POD,
                                                    "apiVersion": "v1", "uid": f"uid-{POD}",
                                                    "namespace": "ml"})
        assert (pod_event["reason"], pod_event["message"], pod_event["type"]) == (
            "GPUIdle", MESSAGE, "Warning")
        assert any(e["involvedObject"]["kind"] == "Deployment"
                   and e["message"] == f"pod {POD}: {MESSAGE}" for e in events.values())

        mark = len(fake.requests)
        second = once(prom, kubeconfig, log, T1)
        assert second.exit_code == 0, second.output
        dep = "/apis/apps/v1/namespaces/ml/deployments/jupyter-alice"
        nb = "/apis/kubeflow.org/v1/namespaces/ml/notebooks/carol"
        assert [(r.method, r.path) for r in fake.requests[mark:]
                if "/namespaces/ml/" in r.path or "/namespaces/lab/" in r.path] == [
            ("PATCH", nb), ("POST", "/api/v1/namespaces/ml/events"),
            ("GET", f"{dep}/scale"), ("PATCH", dep), ("PUT", f"{dep}/scale"),
            ("POST", "/api/v1/namespaces/ml/events")]  # bob (lab): notice only, no writes
        assert body(fake, "PUT", f"{dep}/scale")["spec"] == {"replicas": 0}
        deployment = fake.get("Deployment", "ml", "jupyter-alice")
        assert deployment is not None
        assert deployment["spec"]["replicas"] == 0
        assert deployment["metadata"]["annotations"] == {
            "gpu-admission.io/reclaimed-replicas": "1",
            "gpu-admission.io/reclaimed-at": iso(T1)}
        notebook = fake.get("Notebook", "ml", "carol")
        assert notebook is not None
        assert notebook["metadata"]["annotations"] == {"kubeflow-resource-stopped": iso(T1),
                                                       "gpu-admission.io/reclaimed-at": iso(T1)}
        plan = {p["pod"]: p for p in orjson.loads(second.stdout)["pods"]}
        assert plan["jupyter-bob-7d9f-abcde"]["action"] == "notice-only"
        assert plan["jupyter-bob-7d9f-abcde"]["reason"] == (
            "namespace lab is not labelled gpu-admission.io/reclaim=scale-down")

        mark = len(fake.requests)
        restored = CliRunner().invoke(main, [
            "reclaim", "restore", "deployment/jupyter-alice", "-n", "ml", "--kubeconfig",
            str(kubeconfig), "--audit-log", str(log), "--now", str(T1 + 600)],
            catch_exceptions=False)
        assert restored.exit_code == 0, restored.output
        assert [(r.method, r.path) for r in fake.requests[mark:]] == [
            ("GET", dep), ("GET", f"{dep}/scale"), ("PUT", f"{dep}/scale"), ("PATCH", dep),
            ("POST", "/api/v1/namespaces/ml/events")]
        deployment = fake.get("Deployment", "ml", "jupyter-alice")
        assert deployment is not None
        assert deployment["spec"]["replicas"] == 1
        assert "annotations" not in deployment["metadata"] or not \
            deployment["metadata"]["annotations"]
        again = CliRunner().invoke(main, [
            "reclaim", "--kubeconfig", str(kubeconfig), "--audit-log", str(log), "restore",
            "deployment/jupyter-alice", "-n", "ml"])
        assert again.exit_code == 2
        assert "was not reclaimed" in again.output
    decided = [(r["decision"], r["pod"], r["reclaim"].get("phase")) for r in records(log)]
    assert decided == [
        ("reclaim-notice", "jupyter-bob-7d9f-abcde", None),
        ("reclaim-notice", "carol-0", None), ("reclaim-notice", POD, None),
        ("reclaim-scale-down", "carol-0", "started"), ("reclaim-scale-down", "carol-0", "done"),
        ("reclaim-scale-down", POD, "started"), ("reclaim-scale-down", POD, "done"),
        ("reclaim-restore", "", None)]
    listed = CliRunner().invoke(main, ["audit", "list", "-o", "json", str(log)])
    assert listed.exit_code == 0, listed.output
    assert sorted(r["decision"] for r in orjson.loads(listed.stdout)) == sorted(
        d for d, _, _ in decided)
    summary = CliRunner().invoke(main, ["audit", "summary", "-o", "json", str(log)])
    assert summary.exit_code == 0, summary.output
    assert orjson.loads(summary.stdout)["total"] == len(decided)
    uid = records(log)[0]["uid"]
    shown = CliRunner().invoke(main, ["audit", "show", uid, str(log)])
    assert shown.exit_code == 0, shown.output
    assert "reclaim-notice" in shown.stdout


def test_busy_again_before_the_grace_clears_the_notice(prom: PrometheusProcess,
                                                        tmp_path: Path) -> None:
    log = tmp_path / "log"
    with fake_kube(tmp_path, namespace("ml", scale_down=True),
                   *deployment_pod("ml", "dave")) as (fake, kubeconfig):
        assert once(prom, kubeconfig, log, T0).exit_code == 0
        pod = "dave-7d9f-abcde"
        assert writes(fake) == notice_writes("ml", pod, "Deployment", "dave")
        assert len(fake.store["events"]) == 2
        mark = len(fake.requests)
        result = once(prom, kubeconfig, log, T1)
        assert result.exit_code == 0, result.output
        sent = writes(fake, mark)
        assert [m for m, _ in sent] == ["DELETE", "DELETE", "PATCH"]
        assert sent[0][1].startswith(f"/api/v1/namespaces/ml/events/{pod}.gpuidle.")
        assert sent[1][1].startswith("/api/v1/namespaces/ml/events/dave.gpuidle.")
        assert sent[2][1] == f"/api/v1/namespaces/ml/pods/{pod}"
        assert fake.store["events"] == {}
        stored = fake.get("Pod", "ml", pod)
        assert stored is not None
        assert not stored["metadata"].get("annotations")
        assert orjson.loads(result.stdout)["pods"][0]["reason"] == (
            f"busy again at {iso(T1)}")  # the newest busy sample
    assert [r["decision"] for r in records(log)] == ["reclaim-notice", "reclaim-clear"]


def test_idle_only_at_night_is_left_alone(prom: PrometheusProcess, tmp_path: Path) -> None:
    with fake_kube(tmp_path, namespace("ml", scale_down=True),
                   *deployment_pod("ml", "night-owl")) as (fake, kubeconfig):
        for now in (T0, NIGHT):
            result = run(prom.url, kubeconfig, "--dry-run", "--now", str(now), "-o", "json")
            assert result.exit_code == 0, result.output
            assert orjson.loads(result.stdout)["pods"] == []
    assert fake.writes() == []


def test_action_limit_holds_when_ten_pods_qualify(prom: PrometheusProcess,
                                                   tmp_path: Path) -> None:
    log = tmp_path / "log"
    world = [namespace("bulk", scale_down=True)]
    for i in range(10):
        world += deployment_pod("bulk", f"nb-{i}")
    with fake_kube(tmp_path, *world) as (fake, kubeconfig):
        assert once(prom, kubeconfig, log, T0).exit_code == 0
        scaled = []
        for now in (T1, T1 + 300):
            mark = len(fake.requests)
            result = once(prom, kubeconfig, log, now)
            assert result.exit_code == 0, result.output
            scaled.append(sorted(r.path.split("/")[-2] for r in fake.requests[mark:]
                                 if r.method == "PUT"))
            counts = orjson.loads(result.stdout)["counts"]
            assert counts["scale-down"] == 5
        assert counts["deferred"] == 0
    assert scaled == [[f"nb-{i}" for i in range(5)], [f"nb-{i}" for i in range(5, 10)]]


def test_api_failing_mid_way_leaves_every_step_recorded(prom: PrometheusProcess,
                                                        tmp_path: Path) -> None:
    log = tmp_path / "log"
    world = [namespace("bulk", scale_down=True)]
    for i in range(3):
        world += deployment_pod("bulk", f"nb-{i}")
    with fake_kube(tmp_path, *world) as (fake, kubeconfig):
        assert once(prom, kubeconfig, log, T0).exit_code == 0
        fake.fail = lambda method, path: (
            503 if method == "PUT" and path.endswith("/deployments/nb-1/scale") else None)
        mark = len(fake.requests)
        result = once(prom, kubeconfig, log, T1)
        assert result.exit_code == 1, result.output
        sent = writes(fake, mark)
        base = "/apis/apps/v1/namespaces/bulk/deployments"
        assert sent == [("PATCH", f"{base}/nb-0"), ("PUT", f"{base}/nb-0/scale"),
                        ("POST", "/api/v1/namespaces/bulk/events"),
                        ("PATCH", f"{base}/nb-1"), ("PUT", f"{base}/nb-1/scale")]  # nb-2: none
        half = fake.get("Deployment", "bulk", "nb-1")
        assert half is not None
        assert half["spec"]["replicas"] == 1
        assert half["metadata"]["annotations"]["gpu-admission.io/reclaimed-replicas"] == "1"
    _next_interval_after_a_failure_is_notice_only(prom, tmp_path)
    scale = [(r["pod"], r["reclaim"]["phase"], r["reclaim"].get("done"))
             for r in records(log) if r["decision"] == "reclaim-scale-down"]
    assert scale == [
        ("nb-0-7d9f-abcde", "started", None),
        ("nb-0-7d9f-abcde", "done", ["read-scale", "annotated", "scaled", "event"]),
        ("nb-1-7d9f-abcde", "started", None),
        ("nb-1-7d9f-abcde", "failed", ["read-scale", "annotated"])]
    failed = next(r for r in records(log) if r["reclaim"].get("phase") == "failed")
    assert "HTTP 503" in failed["reclaim"]["error"]


def test_prometheus_down_pauses_everything(tmp_path: Path) -> None:
    with fake_kube(tmp_path, namespace("ml", scale_down=True),
                   *deployment_pod("ml", "jupyter-alice")) as (fake, kubeconfig):
        result = run(f"http://127.0.0.1:{free_port()}", kubeconfig, "--once", "--now",
                     str(T1), "--audit-log", str(tmp_path / "log"), "-o", "json")
    assert result.exit_code == 1, result.output
    assert fake.writes() == []
    assert orjson.loads(result.stdout)["actionsAllowed"] is False


def _next_interval_after_a_failure_is_notice_only(prom: PrometheusProcess,
                                                   tmp_path: Path) -> None:
    """The loop's own object across intervals: after a failed one, the next acts on notices
    only (``held``), so an outage never ends in a burst; the one after acts again."""
    from gpu_admission.policy.model import default_policy  # noqa: PLC0415
    from gpu_admission.reclaim.controller import Controller, RecordLog  # noqa: PLC0415
    from gpu_admission.reclaim.kube import KubeSource  # noqa: PLC0415
    from gpu_admission.server.logs import make_logger  # noqa: PLC0415
    from gpu_admission.usage.prom import PrometheusClient  # noqa: PLC0415

    world = [namespace("bulk", scale_down=True)]
    for i in range(2):
        world += deployment_pod("bulk", f"nb-{i}")
    log = tmp_path / "loop.log"
    with fake_kube(tmp_path, *world) as (fake, kubeconfig):
        controller = Controller(policy=default_policy(), prom=PrometheusClient(prom.url),
                                kube=KubeSource(str(kubeconfig)).open(),
                                records=RecordLog(str(log)), log=make_logger("error"))
        controller.run_once(T0)
        fake.fail = lambda method, path: 503 if method == "PUT" else None
        controller.run_once(T1)
        assert controller.metrics.paused._value.get() == 1
        fake.fail = lambda method, path: None
        mark = len(fake.requests)
        held = controller.run_once(T1 + 300)
        assert held is not None
        assert [(i.pod, i.action.value) for i in held.items] == [
            ("nb-0-7d9f-abcde", "held"), ("nb-1-7d9f-abcde", "held")]
        assert writes(fake, mark) == []
        assert controller.metrics.paused._value.get() == 0
        again = controller.run_once(T1 + 600)
        assert again is not None
        assert [i.action.value for i in again.items] == ["scale-down", "scale-down"]
        controller.records.close()
        controller.kube.close()


def test_bare_pods_and_jobs_get_notices_only(prom: PrometheusProcess, tmp_path: Path) -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "batch"}}
    world = [namespace("ml", scale_down=True),
             pod("ml", "batch-x7k2p", job, labels={"gpu-admission.io/workload": "inference"}),
             pod("ml", "scratch", None, labels={"notebook-name": "scratch"})]
    log = tmp_path / "log"
    with fake_kube(tmp_path, *world) as (fake, kubeconfig):
        assert once(prom, kubeconfig, log, T0).exit_code == 0
        assert writes(fake) == [*notice_writes("ml", "batch-x7k2p", "Job", "batch"),
                                *notice_writes("ml", "scratch", "", "")]
        mark = len(fake.requests)
        later = once(prom, kubeconfig, log, T1 + 3600)
        assert later.exit_code == 0, later.output
        assert writes(fake, mark) == []  # never scaled, never deleted
        assert {(p["pod"], p["action"], p["reason"]) for p in orjson.loads(later.stdout)[
            "pods"]} == {
            ("batch-x7k2p", "notice-only", "owner Job/batch is never scaled down (only "
             "Deployments, StatefulSets and Kubeflow Notebooks are)"),
            ("scratch", "notice-only", "owner Pod/scratch is never scaled down (only "
             "Deployments, StatefulSets and Kubeflow Notebooks are)")}
    assert len(fake.store["pods"]) == 2


def test_api_server_down_is_one_clear_error(prom: PrometheusProcess, tmp_path: Path) -> None:
    from tests.kube_api_support import write_kubeconfig  # noqa: PLC0415

    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", free_port())
    result = run(prom.url, kubeconfig, "--once", "--now", str(T0), "--audit-log",
                 str(tmp_path / "log"))
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-1] == (
        "Error: API server: GET /api/v1/namespaces: cannot reach the API server: connection "
        "refused"), result.stderr
    assert result.stderr.count("reclaim_paused") == 1
    assert "Traceback" not in result.output
    assert not (tmp_path / "log").exists()
