"""Benchmark ``gpu-admission report``: 30 days x 64 GPUs at a 5-minute step.

Generates the history (seeded; 16 notebooks, 32 inference GPUs whose pods restart every 3
days, 8 training GPUs, 8 unallocated; ~553k samples per metric, 2 metrics), backfills it with
``promtool tsdb create-blocks-from openmetrics``, starts Debian's ``prometheus`` on it and runs
the real CLI as a subprocess pinned to one core (``-o json --out /dev/null``): wall time, peak
RSS of that child (``os.wait4`` rusage; ``ru_maxrss`` is KiB on Linux) and the number of
Prometheus API requests it sent (Prometheus' own ``prometheus_http_requests_total``, read
before and after). Baseline in the same run: one raw ``query_range`` of the whole range for
each metric, fetched and JSON-decoded only, i.e. the cost of getting the data out of
Prometheus at all. The in-process split (query, compute, render) follows.

    python benchmarks/report_bench.py [--days 30] [--gpus 64] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson
import urllib3

from gpu_admission.core.timeframe import Range, WorkingHours, parse_zone
from gpu_admission.policy.model import default_policy
from gpu_admission.report.render import render_json
from gpu_admission.usage.compute import Options, build_report, to_json
from gpu_admission.usage.prom import PrometheusClient
from gpu_admission.usage.query import FB_USED_METRIC, UTIL_METRIC, fetch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.dcgm_history_support import Gpu, Reading, uuid_for, write_file
from tests.prometheus_support import create_blocks, running_prometheus

STEP = 300


def fleet(start: int, end: int, gpus: int) -> list[Gpu]:
    out = []
    for i in range(gpus):
        node, index = f"gpu-node-{i // 8:02d}", i % 8
        rnd = random.Random(f"bench/{i}")
        kind = ("notebook", "inference", "inference", "training", "inference", "notebook",
                "inference", "free")[index]

        def behave(ts: int, kind: str = kind, rnd: random.Random = rnd,
                   i: int = i) -> Reading:
            day = (ts - start) // 86400
            if kind == "notebook":
                busy = 9 <= (ts // 3600) % 24 < 17 and rnd.random() < 0.3
                return (rnd.randint(30, 80) if busy else rnd.randint(0, 3), 9000,
                        (f"team-{i % 6}", f"jupyter-{i}-0"))
            if kind == "inference":
                return (rnd.randint(15, 30), 14000,
                        ("serving", f"model-{i}-{day // 3}"))  # a new pod every 3 days
            if kind == "training":
                return (rnd.randint(92, 98), 70000, ("training", f"job-{i}-worker-0"))
            return (0, 0, None)

        gpu = Gpu(node, index, uuid_for(1, node, index), "NVIDIA A100-SXM4-80GB", behave)
        gpu.sample(range(start, end + 1, STEP))
        out.append(gpu)
    return out


def api_requests(url: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(
        r'^prometheus_http_requests_total\{[^}]*handler="/api/v1/(?:query_range|series)"'
        r'[^}]*\} (\S+)$', text, re.MULTILINE))


def pinned() -> None:
    os.sched_setaffinity(0, {0})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--keep", type=Path, help="work directory to keep (default: temp)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="report-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    end = int(time.time() // 3600 * 3600) - 3600
    start = end - args.days * 86400
    try:
        t0 = time.perf_counter()
        gpus = fleet(start, end, args.gpus)
        samples = write_file(gpus, work / "history.om")
        del gpus
        t1 = time.perf_counter()
        create_blocks(work / "history.om", work / "tsdb", max_block_duration="240h")
        t2 = time.perf_counter()
        print(f"history: {args.days} d x {args.gpus} GPUs at {STEP}s = {samples:,} samples "
              f"(generate {t1 - t0:.1f} s, promtool backfill {t2 - t1:.1f} s)")
        with running_prometheus(work / "prom", None, work / "tsdb") as prom:
            cmd = [sys.executable, "-m", "gpu_admission", "report", "--prometheus", prom.url,
                   "--start", str(start), "--end", str(end), "-o", "json", "--out", os.devnull]
            subprocess.run(cmd, check=False, capture_output=True)  # warm Prometheus' caches
            before = api_requests(prom.url)
            t = time.perf_counter()
            child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     preexec_fn=pinned)  # noqa: PLW1509 - affinity only
            _, status, usage = os.wait4(child.pid, 0)
            wall = time.perf_counter() - t
            child.returncode = os.waitstatus_to_exitcode(status)
            queries = api_requests(prom.url) - before
            assert child.returncode in (0, 1), child.stderr.read() if child.stderr else ""
            print(f"report CLI (1 core): {wall:.2f} s wall, {usage.ru_utime:.2f} s user, "
                  f"peak RSS {usage.ru_maxrss / 1024:.0f} MiB, {queries:.0f} Prometheus API "
                  f"requests, exit {child.returncode}")

            pool = urllib3.PoolManager()
            t = time.perf_counter()
            points = 0
            for metric in (UTIL_METRIC, FB_USED_METRIC):
                body = pool.request("POST", prom.url + "/api/v1/query_range", fields={
                    "query": metric, "start": str(start), "end": str(end),
                    "step": str(STEP)}, encode_multipart=False).data
                points += sum(len(s["values"]) for s in orjson.loads(body)["data"]["result"])
            base = time.perf_counter() - t
            print(f"baseline (raw query_range of both metrics, fetch + JSON decode only, "
                  f"{points:,} points): {base:.2f} s; report / baseline = {wall / base:.1f}x")

            rng = Range(start, end, STEP)
            client = PrometheusClient(prom.url)
            t = time.perf_counter()
            fetched = fetch(client, rng)
            t_q = time.perf_counter()
            result = build_report(fetched, Options(
                10.0, WorkingHours.parse("Mon-Fri 08:00-18:00"), parse_zone("UTC"),
                default_policy()))
            t_c = time.perf_counter()
            render_json(to_json(result))
            t_r = time.perf_counter()
            print(f"in-process split: query+decode {t_q - t:.2f} s ({client.queries} "
                  f"requests), compute {t_c - t_q:.2f} s, render {t_r - t_c:.3f} s")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
