"""The pure planner (gpu_admission/reclaim/plan.py) and the policy's ``spec.reclaim``."""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from gpu_admission.core.timeframe import Range
from gpu_admission.policy.model import PolicyError, policy_from_dict
from gpu_admission.reclaim.plan import (
    Action,
    Cluster,
    build_plan,
    duration_text,
    memory_text,
    resolve_owner,
)
from gpu_admission.usage.data import Fetched, GpuData
from tests.reclaim.scenario import deployment_pod, namespace, notebook_pod

WED_NOON = 1_764_763_200  # 2025-12-03T12:00:00Z, a Wednesday
STEP = 300


def policy(**reclaim: Any) -> Any:
    return policy_from_dict({"apiVersion": "gpu-admission.io/v1alpha1",
                             "kind": "GPUSharingPolicy", "spec": {"reclaim": reclaim}})


@pytest.mark.parametrize(("reclaim", "message"), [
    pytest.param({"idleHours": 0}, "spec.reclaim.idleHours: expected a number of hours in "
                 "(0, 24], got 0", id="idle-hours"),
    pytest.param({"workingHours": "Mon-Fri 18:00-08:00"}, "spec.reclaim.workingHours: the end "
                 "08:00 must be after the start 18:00 on the same day", id="working-hours"),
    pytest.param({"timeZone": "Mars/Olympus"}, "spec.reclaim.timeZone: expected an IANA time "
                 'zone like UTC or Europe/Berlin, got "Mars/Olympus"', id="tz"),
    pytest.param({"graceMinutes": -1}, "spec.reclaim.graceMinutes: expected an integer >= 0",
                 id="grace"),
    pytest.param({"workloads": ["batch"]}, "spec.reclaim.workloads[0]: expected 'training', "
                 "'inference' or 'notebook'", id="workloads"),
    pytest.param({"maxActionsPerInterval": "5"}, "spec.reclaim.maxActionsPerInterval: "
                 "expected an integer >= 0", id="limit"),
    pytest.param({"idleMinutes": 5}, "spec.reclaim.idleMinutes", id="unknown-field"),
])
def test_policy_errors_name_the_field(reclaim: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyError) as info:
        policy(**reclaim)
    assert message in str(info.value)


def test_policy_defaults() -> None:
    rc = policy().spec.reclaim
    assert (rc.idle_hours, rc.working_hours, rc.time_zone, rc.grace_minutes, rc.workloads,
            rc.max_actions_per_interval) == (2.0, "Mon-Fri 08:00-18:00", "UTC", 60,
                                            ["notebook", "inference"], 5)


@pytest.mark.parametrize(("seconds", "text"), [(9600, "2 h 40 min"), (2700, "45 min"),
                                               (10800, "3 h"), (0, "0 min")])
def test_duration_text(seconds: int, text: str) -> None:
    assert duration_text(seconds) == text


@pytest.mark.parametrize(("mib", "text"), [(16384, "16 GiB"), (9523, "9.3 GiB")])
def test_memory_text(mib: float, text: str) -> None:
    assert memory_text(mib) == text


def _objects(objs: list[dict[str, Any]], kind: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objs
            if o["kind"] == kind}


@pytest.mark.parametrize(("objs", "want"), [
    pytest.param(deployment_pod("ml", "a"), ("Deployment", "a", True), id="deployment"),
    pytest.param(notebook_pod("ml", "nb"), ("Notebook", "nb", True), id="kubeflow-notebook"),
    pytest.param(deployment_pod("ml", "a")[1:], ("ReplicaSet", "a-7d9f", False),
                 id="replicaset-without-deployment"),
    pytest.param(notebook_pod("ml", "nb")[1:], ("StatefulSet", "nb", True),
                 id="statefulset-without-notebook"),
    pytest.param([deployment_pod("ml", "a")[2] | {"metadata": {"name": "p", "namespace": "ml"}}],
                 ("Pod", "p", False), id="bare-pod"),
])
def test_resolve_owner(objs: list[dict[str, Any]], want: tuple[str, str, bool]) -> None:
    pod = objs[-1]
    owner = resolve_owner(pod, replicasets=_objects(objs, "ReplicaSet"),
                          deployments=_objects(objs, "Deployment"),
                          statefulsets=_objects(objs, "StatefulSet"),
                          notebooks=_objects(objs, "Notebook"))
    assert (owner.kind, owner.name, owner.actionable) == want


def _fetched(pods: list[tuple[str, str]], util: float, points: int = 36) -> Fetched:
    rng = Range(WED_NOON - (points - 1) * STEP, WED_NOON, STEP)
    gpus = []
    for i, key in enumerate(pods):
        data = GpuData("node", str(i), f"GPU-{i}", "A100", array("d", [util] * points),
                       array("d", [1024.0] * points))
        data.holders[key] = bytearray([1] * points)
        gpus.append(data)
    return Fetched(rng, gpus, "pod", 2, [])


def _world(ns: str, names: list[str], noticed: float | None) -> tuple[Cluster, list[Any]]:
    objs: list[dict[str, Any]] = []
    for name in names:
        objs += deployment_pod(ns, name)
    pods = [o for o in objs if o["kind"] == "Pod"]
    if noticed is not None:
        for p in pods:
            p["metadata"]["annotations"] = {"gpu-admission.io/idle-notice-at":
                                            "2025-12-03T10:00:00Z"}
    cluster = Cluster(pods=pods, namespaces={ns: namespace(ns, scale_down=True)["metadata"][
        "labels"]}, replicasets=_objects(objs, "ReplicaSet"),
                      deployments=_objects(objs, "Deployment"))
    return cluster, [(ns, p["metadata"]["name"]) for p in pods]


def test_limit_and_pause() -> None:
    cluster, keys = _world("ml", [f"n{i}" for i in range(8)], noticed=WED_NOON - 7200)
    fetched = _fetched(keys, 1.0)
    pol = policy(maxActionsPerInterval=3)
    plan = build_plan(fetched, cluster, pol, now=WED_NOON, window=fetched.range)
    assert [i.action for i in plan.items] == [Action.SCALE_DOWN] * 3 + [Action.DEFERRED] * 5
    paused = build_plan(fetched, cluster, pol, now=WED_NOON, window=fetched.range,
                        actions_allowed=False)
    assert {i.action for i in paused.items} == {Action.HELD}


@pytest.mark.parametrize(("spec", "ns", "util", "action", "reason"), [
    pytest.param({}, "ml", 1.0, Action.NOTICE, "idle 3 h of working hours", id="idle"),
    pytest.param({}, "kube-system", 1.0, Action.SKIP, "namespace kube-system is exempt "
                 "(spec.exemptions)", id="exempt"),
    pytest.param({"workloads": ["inference"]}, "ml", 1.0, Action.SKIP,
                 "workload notebook is not in spec.reclaim.workloads", id="workload"),
    pytest.param({"idleHours": 4}, "ml", 1.0, None, "", id="run-too-short"),
    pytest.param({}, "ml", 10.0, None, "", id="at-threshold-is-busy"),
    pytest.param({"workingHours": "Sat-Sun 08:00-18:00"}, "ml", 1.0, None, "",
                 id="outside-working-hours"),
])
def test_one_pod(spec: dict[str, Any], ns: str, util: float, action: Action | None,
                 reason: str) -> None:
    cluster, keys = _world(ns, ["nb"], noticed=None)
    for p in cluster.pods:
        p["metadata"]["labels"] = {"notebook-name": "nb"}
    fetched = _fetched(keys, util)
    plan = build_plan(fetched, cluster, policy(**spec), now=WED_NOON, window=fetched.range)
    if action is None:
        assert plan.items == ()
    else:
        assert [(i.action, i.reason) for i in plan.items] == [(action, reason)]


NAN = float("nan")


def _series(*parts: tuple[int, float]) -> list[float]:
    """``(count, value)`` runs, oldest first; NaN is a missing sample."""
    return [value for count, value in parts for _ in range(count)]


@pytest.mark.parametrize(("util", "cause", "reason"), [
    pytest.param(_series((12, NAN), (24, 1.0)), None, "idle 2 h of working hours",
                 id="gpu-series-start-2h-ago"),
    pytest.param(_series((3, 1.0), (3, NAN), (30, 1.0)), None,
                 "idle 2 h 30 min of working hours", id="gap-before-the-idle-run"),
    pytest.param(_series((30, 1.0), (1, NAN), (5, 1.0)), "missing-samples",
                 "1 of 36 samples missing on GPU node/0 since its idle run began at "
                 "2025-12-03T09:00:00Z: no data is never idle", id="gap-after-the-run-began"),
    pytest.param(_series((10, 1.0), (6, NAN), (20, 1.0)), "missing-samples",
                 "6 of 36 samples missing on GPU node/0 since the pod first held it at "
                 "2025-12-03T09:00:00Z: no data is never idle", id="gap-and-no-run"),
    pytest.param(_series((24, NAN), (12, 1.0)), "not-idle-long-enough",
                 "no idle run of 2 h of working hours on GPU node/0 in the window",
                 id="gpu-too-new"),
    pytest.param(_series((30, 1.0), (6, 50.0)), "busy", "busy at 2025-12-03T12:00:00Z",
                 id="busy-after-an-idle-run"),
])
def test_missing_samples_count_only_in_the_span_judged(util: list[float], cause: str | None,
                                                       reason: str) -> None:
    """Samples missing before the GPU's series began, or before the idle run, do not make a
    pod "never idle"; one missing inside the run does. Pods left out say why."""
    cluster, keys = _world("ml", ["nb"], noticed=None)
    for p in cluster.pods:
        p["metadata"]["labels"] = {"notebook-name": "nb"}
    fetched = _fetched(keys, 1.0)
    data = fetched.gpus[0]
    data.util[:] = array("d", util)
    data.holders[keys[0]][:] = bytearray(0 if v != v else 1 for v in util)  # v != v: NaN
    plan = build_plan(fetched, cluster, policy(), now=WED_NOON, window=fetched.range)
    if cause is None:
        assert ([(i.action, i.reason) for i in plan.items], plan.left_out) == (
            [(Action.NOTICE, reason)], ())
    else:
        assert plan.items == ()
        assert [(o.pod, o.workload, o.cause.value, o.reason) for o in plan.left_out] == [
            (keys[0][1], "notebook", cause, reason)]
