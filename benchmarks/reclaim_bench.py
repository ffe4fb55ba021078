"""Benchmark ``gpu-admission reclaim``: one interval over 1,000 GPUs and 3,000 pods.

The cluster: 125 nodes x 8 GPUs; 700 GPUs held by one pod, 300 shared by two (1,300 GPU
pods: Deployments through ReplicaSets), and 1,700 pods without GPUs, in 50 namespaces (half
labelled ``gpu-admission.io/reclaim: scale-down``). A third of the GPU pods are notebooks idle
since 09:00 on a Wednesday; the rest are busy. The dcgm-exporter history (26 h at 5 m, both
metrics) is backfilled with ``promtool`` and served by Debian's ``prometheus``; the API is the
reclaim tests' fake (tests/reclaim/fake_api.py) on its own thread.

The real CLI runs as a subprocess pinned to one core (``reclaim --once --now T -o json``):
wall time, peak RSS (``os.wait4``; ``ru_maxrss`` is KiB), Prometheus API requests
(``prometheus_http_requests_total`` before/after) and API server requests (the fake's log).
Two intervals: the first gives the notices (a write burst), the second, after the grace, is
the steady state (scale-downs up to the limit; every other pod only measured).

    python benchmarks/reclaim_bench.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.report_bench import api_requests, pinned
from tests.dcgm_history_support import Gpu, Reading, uuid_for, write_file
from tests.prometheus_support import create_blocks, running_prometheus
from tests.reclaim.fake_api import fake_kube
from tests.reclaim.scenario import T0, T1, deployment_pod, namespace

STEP = 300
NODES, PER_NODE, SHARED = 125, 8, 300
NAMESPACES = 50
START, END = T0 - 26 * 3600, T1 + 600


def world() -> tuple[list[Gpu], list[dict[str, Any]]]:
    gpus: list[Gpu] = []
    objs: list[dict[str, Any]] = [namespace(f"team-{n:02d}", scale_down=n % 2 == 0)
                                  for n in range(NAMESPACES)]
    pods = 0
    for i in range(NODES * PER_NODE):
        node, index = f"gpu-node-{i // PER_NODE:03d}", i % PER_NODE
        holders = 2 if i < SHARED else 1
        idle = i % 3 == 0 and holders == 1
        for _ in range(holders):
            ns = f"team-{pods % NAMESPACES:02d}"
            name = f"w{pods:04d}"
            pods += 1
            objs += deployment_pod(ns, name, notebook=idle)

            def behave(ts: int, idle: bool = idle, who: tuple[str, str] = (
                    ns, f"{name}-7d9f-abcde")) -> Reading:
                busy = not idle or ts <= T0 - 130 * 60
                return (45 if busy else 1, 12000, who)
            g = Gpu(node, index, uuid_for(7, node, index), "NVIDIA H100 80GB HBM3", behave)
            g.sample(range(START, END + 1, STEP))
            gpus.append(g)
    for j in range(3000 - pods):  # pods without GPUs
        pod = deployment_pod(f"team-{j % NAMESPACES:02d}", f"cpu{j:04d}", notebook=False)
        pod[2]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
        objs += pod
    return gpus, objs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="work directory to keep (default: temp)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="reclaim-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    gpus, objs = world()
    samples = write_file(gpus, work / "history.om")
    del gpus
    create_blocks(work / "history.om", work / "tsdb", max_block_duration="240h")
    pods = sum(1 for o in objs if o["kind"] == "Pod")
    print(f"world: {NODES * PER_NODE} GPUs, {pods} pods, {samples:,} samples "
          f"({time.perf_counter() - t:.1f} s to build and backfill)")
    with running_prometheus(work / "prom", None, work / "tsdb") as prom, \
            fake_kube(work, *objs) as (fake, kubeconfig):
        for label, now in (("first interval (notices)", T0), ("steady interval", T1),
                           ("steady interval, again", T1 + 300)):
            cmd = [sys.executable, "-m", "gpu_admission", "reclaim", "--prometheus",
                   prom.url, "--kubeconfig", str(kubeconfig), "--once", "--now", str(now),
                   "-o", "json", "--audit-log", str(work / "decisions.log")]
            before_prom = api_requests(prom.url)
            before_api = len(fake.requests)
            with (work / "plan.json").open("wb") as sink:
                start = time.perf_counter()
                child = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.DEVNULL,
                                         preexec_fn=pinned)  # noqa: PLW1509 - affinity only
                _, status, usage = os.wait4(child.pid, 0)
                wall = time.perf_counter() - start
            assert os.waitstatus_to_exitcode(status) == 0, label
            sent = fake.requests[before_api:]
            writes = sum(1 for r in sent if r.method != "GET")
            counts = orjson.loads((work / "plan.json").read_bytes())["counts"]
            print(f"{label}: {wall:.2f} s wall, {usage.ru_utime + usage.ru_stime:.2f} s CPU, "
                  f"peak RSS {usage.ru_maxrss / 1024:.0f} MiB, "
                  f"{api_requests(prom.url) - before_prom:.0f} Prometheus requests, "
                  f"{len(sent)} API requests ({writes} writes); plan "
                  f"{ {k: v for k, v in counts.items() if v} }")

if __name__ == "__main__":
    main()
