"""The reclaim tests' world (no tests here): a day and a half of dcgm-exporter history around
a fixed Wednesday, and the API objects of the pods that held the GPUs.

Times (UTC; working hours Mon-Fri 08:00-18:00 UTC, the policy default): ``T0`` is Wednesday
11:10, ``T1`` one hour later (the default grace), ``NIGHT`` Thursday 03:00. Every GPU is on
``node-a`` unless said otherwise; the idle value is 2 % SM, busy 50 %.

* ``idle_from_nine``: busy until Wednesday 09:00, idle after: at T0 idle 2 h 10 min;
* ``night_owl``: busy in working hours, idle outside them;
* ``gap``: like ``idle_from_nine``, no samples Wednesday 10:00-10:30;
* ``busy_again``: like ``idle_from_nine``, busy again from Wednesday 11:30;
* shared GPU: an idle and a busy pod on one GPU, both series carrying the device's 40 %.
* ``fresh``: a GPU whose series start 3 hours before T0 (a new node, exporter or Prometheus),
  idle from its first sample: at T0 idle 3 h 5 min of working hours (from 08:05).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.dcgm_history_support import Behaviour, Gpu, Reading, uuid_for

STEP = 300
HOUR = 3600
A100 = "NVIDIA A100-SXM4-80GB"
FB_MIB = 16384  # MiB: "holding 16 GiB"


def wednesday(now: float | None = None) -> int:
    """Midnight (UTC) of the latest Wednesday at least two days before now."""
    day = datetime.fromtimestamp((now or time.time()) - 2 * 86400, UTC).replace(
        hour=0, minute=0, second=0, microsecond=0)
    day -= timedelta(days=(day.weekday() - 2) % 7)
    return int(day.timestamp())


WED = wednesday()
T0 = WED + 11 * HOUR + 10 * 60
T1 = T0 + HOUR
NIGHT = WED + 27 * HOUR  # Thursday 03:00
START = T0 - 26 * HOUR
END = NIGHT + 10 * 60


def idle_from_nine(ts: int) -> int:
    return 50 if ts <= WED + 9 * HOUR else 2


def night_owl(ts: int) -> int:
    hour = datetime.fromtimestamp(ts, UTC).hour
    return 50 if 8 <= hour < 18 else 1


def busy_again(ts: int) -> int:
    return 50 if ts <= WED + 9 * HOUR or ts > WED + 11 * HOUR + 30 * 60 else 2


def gap(ts: int) -> int | None:
    if WED + 10 * HOUR <= ts < WED + 10 * HOUR + 30 * 60:
        return None
    return idle_from_nine(ts)


def fresh(ts: int) -> int | None:
    return None if ts < T0 - 3 * HOUR else 2


def behaviour(util: Callable[[int], int | None], holder: tuple[str, str]) -> Behaviour:
    def behave(ts: int) -> Reading | None:
        value = util(ts)
        return None if value is None else (value, FB_MIB, holder)
    return behave


def gpu(node: str, index: int, util: Callable[[int], int | None],
        holder: tuple[str, str]) -> Gpu:
    g = Gpu(node, index, uuid_for(24, node, index), A100, behaviour(util, holder))
    g.sample(range(START, END + 1, STEP))
    return g


# --- API objects ---------------------------------------------------------------------------

def namespace(name: str, *, scale_down: bool) -> dict[str, Any]:
    labels = {"kubernetes.io/metadata.name": name}
    if scale_down:
        labels["gpu-admission.io/reclaim"] = "scale-down"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name,
                                                                   "labels": labels}}


def pod(ns: str, name: str, owner: dict[str, Any] | None, *,
        labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                    "name": owner["metadata"]["name"],
                                    "uid": f"uid-{owner['metadata']['name']}",
                                    "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "main", "image": "jupyter/base:latest",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}}


def _owned(kind: str, api: str, ns: str, name: str, owner: dict[str, Any] | None,
           spec: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                    "name": owner["metadata"]["name"],
                                    "uid": f"uid-{owner['metadata']['name']}",
                                    "controller": True}]
    return {"apiVersion": api, "kind": kind, "metadata": meta, "spec": spec}


def deployment_pod(ns: str, name: str, *, replicas: int = 1, notebook: bool = True,
                   ) -> list[dict[str, Any]]:
    """Deployment ``name`` -> ReplicaSet ``name-7d9f`` -> pod ``name-7d9f-abcde``."""
    dep = _owned("Deployment", "apps/v1", ns, name, None, {"replicas": replicas})
    rs = _owned("ReplicaSet", "apps/v1", ns, f"{name}-7d9f", dep, {"replicas": replicas})
    labels = {"notebook-name": name} if notebook else {}
    return [dep, rs, pod(ns, f"{name}-7d9f-abcde", rs, labels=labels)]


def notebook_pod(ns: str, name: str) -> list[dict[str, Any]]:
    """Kubeflow Notebook ``name`` -> StatefulSet ``name`` -> pod ``name-0``."""
    nb = _owned("Notebook", "kubeflow.org/v1", ns, name, None, {"template": {}})
    sts = _owned("StatefulSet", "apps/v1", ns, name, nb, {"replicas": 1})
    return [nb, sts, pod(ns, f"{name}-0", sts, labels={"notebook-name": name})]


def statefulset_pod(ns: str, name: str, *, replicas: int = 2) -> list[dict[str, Any]]:
    """StatefulSet ``name`` -> pod ``name-0`` (inference: no notebook label)."""
    sts = _owned("StatefulSet", "apps/v1", ns, name, None, {"replicas": replicas})
    return [sts, pod(ns, f"{name}-0", sts)]


def pod_name(ns: str, name: str) -> tuple[str, str]:
    return (ns, f"{name}-7d9f-abcde")


def history() -> list[Gpu]:
    """Every GPU of every test (a pod the fake API does not hold is ignored)."""
    gpus = [
        gpu("node-a", 0, idle_from_nine, pod_name("ml", "jupyter-alice")),
        gpu("node-a", 1, idle_from_nine, pod_name("lab", "jupyter-bob")),
        gpu("node-a", 2, night_owl, pod_name("ml", "night-owl")),
        gpu("node-a", 3, gap, pod_name("ml", "gappy")),
        gpu("node-a", 4, busy_again, pod_name("ml", "dave")),
        gpu("node-a", 5, idle_from_nine, ("ml", "carol-0")),
        gpu("node-a", 6, idle_from_nine, ("ml", "llm-0")),
        gpu("node-a", 7, idle_from_nine, ("ml", "batch-x7k2p")),
        gpu("node-d", 0, idle_from_nine, ("ml", "scratch")),
        # one GPU, two holders: every series carries the device-wide value
        gpu("node-b", 0, lambda ts: 40, pod_name("ml", "share-idle")),
        gpu("node-b", 0, lambda ts: 40, pod_name("ml", "share-busy")),
    ]
    gpus += [gpu("node-c", i, idle_from_nine, pod_name("bulk", f"nb-{i}")) for i in range(10)]
    # a node that came up 3 hours before T0: two notebooks idle on it since
    gpus += [gpu("node-f", 0, fresh, pod_name("ml", "fresh-nb")),
             gpu("node-f", 1, fresh, ("ml", "fresh-kf-0"))]
    return gpus
