"""FGD benchmark (issue 32): ``gpu-admission simulate``'s replay of Alibaba's openb trace
under the paper's protocol, both traces, seeds 42-51, every placement, next to the paper's
rows (``shared/data/openb/published-fgd-atc23.tsv``). Also the time per decision.

    python benchmarks/fgd.py [--seeds 42-51] [--placements shipped,fgd,bestfit,random]
                             [--traces default,gpushare100] [--until 130]

Runs one replay at a time (nice it on a shared machine). Prints a markdown table: mean, min
and max over the seeds at 100 % and 130 % of arrived demand, and decision p50/p99 (ms)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from gpu_admission.simulate.core import at, simulate
from gpu_admission.simulate.trace import openb_nodes, openb_pods

DATA = Path("/work/shared/data/openb")
PAPER_NAMES = {"random": "Random", "bestfit": "BestFit", "fgd": "FGD"}


def paper() -> dict[tuple[str, str], tuple[float, float]]:
    out = {}
    for line in (DATA / "published-fgd-atc23.tsv").read_text().splitlines()[1:]:
        c = line.split("\t")
        out[(c[0], c[1].split("-", 1)[1])] = (float(c[3]), float(c[6]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--placements", default="shipped,fgd,bestfit,random")
    ap.add_argument("--traces", default="default,gpushare100")
    ap.add_argument("--until", type=int, default=130)
    a = ap.parse_args()
    lo, _, hi = a.seeds.partition("-")
    seeds = list(range(int(lo), int(hi or lo) + 1))
    nodes = openb_nodes((DATA / "openb_node_list_gpu_node.csv").read_text())
    ref = paper()
    print("| trace | placement | seeds | at 100 % mean (min-max) | at 130 % mean | paper at 100 "
          "| paper at 130 | decision p50 / p99 ms | replay s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for trace in a.traces.split(","):
        pods = openb_pods((DATA / f"openb_pod_list_{trace}.csv").read_text())
        for placement in a.placements.split(","):
            r100, r130, p50, p99, secs = [], [], [], [], []
            for seed in seeds:
                t0 = time.perf_counter()
                r = simulate(nodes, pods, placement=placement, seed=seed, until=a.until,
                             clock=time.perf_counter)
                secs.append(time.perf_counter() - t0)
                r100.append(at(r, 100))
                r130.append(at(r, 130))
                p50.append(r.decision_ms["p50"])
                p99.append(r.decision_ms["p99"])
                print(f"  {trace} {placement} seed {seed}: {r100[-1]} / {r130[-1]} "
                      f"({secs[-1]:.0f} s)", file=sys.stderr)
            pr = ref.get((trace, PAPER_NAMES.get(placement, "")), (float("nan"),) * 2)
            print(f"| {trace} | {placement} | {len(seeds)} | {statistics.mean(r100):.2f} "
                  f"({min(r100):.2f}-{max(r100):.2f}) | {statistics.mean(r130):.2f} | "
                  f"{pr[0]} | {pr[1]} | {statistics.median(p50):.2f} / "
                  f"{max(p99):.2f} | {statistics.mean(secs):.0f} |", flush=True)


if __name__ == "__main__":
    main()
