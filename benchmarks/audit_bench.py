"""Benchmark ``gpu-admission audit`` on a large generated decision log.

Generates N decision records (default 1,000,000) into a temporary directory, then runs the
real CLI as a subprocess and reports lines/s and peak RSS (``os.wait4`` rusage of that one
child; ``ru_maxrss`` is KiB on Linux). Baselines measured in the same run: a bare Python
loop that only counts lines, and one that only ``orjson.loads`` each line, so the ratio
shows what the CLI adds on top of reading and parsing. A 10x smaller input is run too: peak
memory must not grow with the input (streaming).

    python benchmarks/audit_bench.py [--lines N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson

from gpu_admission.auditlog.record import decision_record
from gpu_admission.core.decision import Decision, Mode, RequestFacts, Violation

NAMESPACES = [f"team-{i:02d}" for i in range(40)]
USERS = [f"user{i}@example.com" for i in range(200)]


def templates() -> list[Decision]:
    training = Violation("no-training-on-shared-gpu", "spec.containers[0].resources.limits",
                         "training pods need a whole GPU")
    memory = Violation("gpu-memory-limit", "spec.containers[0].env", "added a limit", Mode.WARN)
    patch = ({"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"},
             {"op": "add", "path": "/spec/containers/0/env", "value": []})
    return [
        Decision(allowed=True, gpu=True, patch=patch, violations=(memory,),
                 warnings=("added GPU memory limit 8192 MiB",), workload="inference",
                 workload_reason="owner Deployment", cuda_version="12.2",
                 cuda_source="image nvcr.io/nvidia/tritonserver:23.10-py3",
                 changes=("schedulerName=hami-scheduler", "env GPU memory limit")),
        Decision(allowed=False, gpu=True, violations=(training,), workload="training",
                 workload_reason="owner PyTorchJob", cuda_version="12.1"),
        Decision(allowed=True, gpu=False),
        Decision(allowed=True, gpu=True, workload="notebook", workload_reason="label"),
    ]


def generate(path: Path, lines: int) -> None:
    """Write ``lines`` decision records; real ``decision_record`` output per template,
    with uid, time, namespace, user and pod varied per line."""
    start = datetime(2026, 11, 1, tzinfo=UTC)
    pod = {"metadata": {"name": "p", "namespace": "x"}}
    bases = [decision_record(decision=d, facts=RequestFacts("x", user="u"), pod=pod, uid="u",
                             policy_digest="sha256:ab", instance="gpu-admission-0")
             for d in templates()]
    with path.open("wb") as out:
        batch = []
        for n in range(lines):
            record = dict(bases[n % len(bases)])
            record.update(
                uid=f"{n:08x}-0000-4000-8000-{n:012x}", namespace=NAMESPACES[n % 40],
                user=USERS[n % len(USERS)], pod=f"pod-{n}", dryRun=n % 50 == 0,
                time=(start + timedelta(seconds=n * 2.5)).isoformat(timespec="milliseconds")
                .replace("+00:00", "Z"))
            batch.append(orjson.dumps(record))
            if len(batch) == 10_000:
                out.write(b"\n".join(batch) + b"\n")
                batch.clear()
        if batch:
            out.write(b"\n".join(batch) + b"\n")


def run_child(args: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of one child process."""
    began = time.perf_counter()
    child = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - began
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{args} failed: {child.stderr.read().decode() if child.stderr else ''}")
    return elapsed, usage.ru_maxrss


BASELINE_COUNT = "import sys\nn=0\nfor _ in open(sys.argv[1],'rb'): n+=1\n"
BASELINE_PARSE = ("import sys, orjson\nn=0\nfor line in open(sys.argv[1],'rb'):\n"
                  "    orjson.loads(line); n+=1\n")


def generate_main(big: str, lines: str, small: str, small_gz: str) -> None:
    generate(Path(big), int(lines))
    generate(Path(small), int(lines) // 10)
    with Path(small).open("rb") as src, gzip.open(small_gz, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)


def main() -> None:
    if sys.argv[1:2] == ["--generate"]:
        generate_main(*sys.argv[2:6])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, help="generate into DIR and keep it")
    opts = parser.parse_args()
    workdir = opts.keep or Path(tempfile.mkdtemp(prefix="audit-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        big, small = workdir / "big.log", workdir / "small.log"
        small_gz = workdir / "small.log.gz"
        began = time.perf_counter()
        # Generate in a child so this process stays small: a child's ru_maxrss starts from
        # the parent's RSS at fork time on Linux, which would hide the CLI's own peak.
        subprocess.run([sys.executable, __file__, "--generate", str(big), str(opts.lines),
                        str(small), str(small_gz)], check=True)
        size_mib = big.stat().st_size / 2**20  # MiB
        print(f"generated {opts.lines:,} lines ({size_mib:,.0f} MiB) + {opts.lines // 10:,} "
              f"in {time.perf_counter() - began:.1f} s")
        parent = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB → MiB
        print(f"benchmark process RSS: {parent:.0f} MiB (children's figures include it)")

        cli = [sys.executable, "-m", "gpu_admission", "audit", "--no-progress"]
        cases = [
            ("baseline: count lines", [sys.executable, "-c", BASELINE_COUNT, str(big)],
             opts.lines),
            ("baseline: orjson.loads", [sys.executable, "-c", BASELINE_PARSE, str(big)],
             opts.lines),
            ("audit summary", [*cli, "summary", "-o", "json", str(big)], opts.lines),
            ("audit summary --rule --since", [*cli, "summary", "--rule",
                                              "no-training-on-shared-gpu", "--since",
                                              "2026-11-15", str(big)], opts.lines),
            ("audit list (limit 50)", [*cli, "list", str(big)], opts.lines),
            ("audit report --html", [*cli, "report", "--html", str(workdir / "r.html"),
                                     str(big)], opts.lines),
            ("audit summary, 1/10 input", [*cli, "summary", str(small)], opts.lines // 10),
            ("audit summary, 1/10 gzipped", [*cli, "summary", str(small_gz)],
             opts.lines // 10),
        ]
        print(f"{'case':34} {'seconds':>8} {'lines/s':>11} {'peak RSS MiB':>13} {'vs parse':>9}")
        parse_rate = 0.0
        for name, args, lines in cases:
            seconds, rss_kib = run_child(args)
            rate = lines / seconds
            if name == "baseline: orjson.loads":
                parse_rate = rate
            ratio = f"{rate / parse_rate:.2f}x" if parse_rate else "-"
            print(f"{name:34} {seconds:8.2f} {rate:11,.0f} {rss_kib / 1024:13.1f} {ratio:>9}")
    finally:
        if opts.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
