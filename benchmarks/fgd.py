"""FGD benchmark (issue 32): ``gpu-admission simulate``'s replay of Alibaba's openb trace
under the paper's protocol, both traces, seeds 42-51, every placement, next to the paper's
rows (``shared/data/openb/published-fgd-atc23.tsv``). Also the time per decision.

    python benchmarks/fgd.py [--seeds 42-51] [--placements shipped,fgd,bestfit,random]
                             [--traces default,gpushare100] [--until 130] [--jobs 1]
                             [--trace-dir DIR] [--paper-csv FILE]

Runs ``--jobs`` replays at a time (default one; nice it on a shared machine). Prints a
markdown table: mean, min and max over the seeds at 100 % and 130 % of arrived demand, the
paper's row for the placement and the paper's FGD row beside it, and decision p50/p99 (ms).

The other openb traces of the same cluster (``gpushare20..80``, ``cpu050..300``,
``gpuspec05..33``, ``multigpu20..50``: the hold-out check that the policy is not tuned to
the two shared ones) are in the FGD simulator's repository (hkust-adsl/kubernetes-scheduler-
simulator, ``data/csv``), with the paper's figures for all of them in
``experiments/analysis/expected_results/analysis_allo_discrete.csv``: point ``--trace-dir``
and ``--paper-csv`` there."""

from __future__ import annotations

import argparse
import csv
import functools
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gpu_admission.simulate.core import at, simulate
from gpu_admission.simulate.trace import NodeSpec, PodSpec, openb_nodes, openb_pods

#: the trace beside the repository (shared/data/openb), or where GPU_ADMISSION_OPENB points
DATA = Path(os.environ.get("GPU_ADMISSION_OPENB")
            or Path(__file__).resolve().parents[1].parent / "shared" / "data" / "openb")
PAPER_NAMES = {"random": "Random", "bestfit": "BestFit", "fgd": "FGD"}


def paper(csv_path: Path | None = None) -> dict[tuple[str, str], tuple[float, float]]:
    """(trace, policy) -> the paper's mean share allocated at 100 % and 130 % arrival: from
    the shared TSV, and from the simulator's per-seed CSV where given (its other traces)."""
    out = {}
    for line in (DATA / "published-fgd-atc23.tsv").read_text().splitlines()[1:]:
        c = line.split("\t")
        out[(c[0], c[1].split("-", 1)[1])] = (float(c[3]), float(c[6]))
    if csv_path is not None:
        per: dict[tuple[str, str], list[tuple[float, float]]] = {}
        with csv_path.open() as f:
            for row in csv.DictReader(f):
                key = (row["workload"].removeprefix("openb_pod_list_"),
                       row["sc_policy"].split("-", 1)[1])
                per.setdefault(key, []).append((float(row["100"]), float(row["130"])))
        for key, rows in per.items():
            out.setdefault(key, (round(statistics.mean(r[0] for r in rows), 2),
                                 round(statistics.mean(r[1] for r in rows), 2)))
    return out


@functools.cache
def _load(path: Path) -> tuple[list[NodeSpec], list[PodSpec]]:
    """The nodes and one trace's pods, read once per worker process (every seed reuses them)."""
    return (openb_nodes((DATA / "openb_node_list_gpu_node.csv").read_text()),
            openb_pods(path.read_text()))


def replay(job: tuple[str, Path, str, int, int]) -> tuple[float, float, float, float, float]:
    """One replay: (at 100 %, at 130 %, decision p50 ms, p99 ms, seconds)."""
    trace, path, placement, seed, until = job
    nodes, pods = _load(path)
    t0 = time.perf_counter()
    r = simulate(nodes, pods, placement=placement, seed=seed, until=until,
                 clock=time.perf_counter)
    secs = time.perf_counter() - t0
    print(f"  {trace} {placement} seed {seed}: {at(r, 100)} / {at(r, 130)} ({secs:.0f} s)",
          file=sys.stderr, flush=True)
    return at(r, 100), at(r, 130), r.decision_ms["p50"], r.decision_ms["p99"], secs


def extender_latency(pods: int = 2000, *, mode: str = "ledger", mix: bool = True) -> None:
    """filter + prioritize of one pod over the 1,213 openb nodes, as the extender runs them,
    with the ledger and the requests filled by binds between requests (each bind changes one
    node; the ledger then gets what its watch shows of a bound pod: the reservation pod with
    its UUID, the pod's ConfigMap, the pod). One core, this process; ms. Pods (``mix``): 60 %
    fractional (share, CPU, memory), 20 % whole-GPU (1, 2, 4 or 8 cards), 20 % CPU; else
    fractional only. ``mode``:

    * ``ledger``: what the extender does now (``app.decide_fractional`` / ``decide_ranked``):
      the placer reads the nodes from the watch (:class:`LedgerSource`), re-reading only the
      rows the ledger and the requests say changed; timed from the node names to the
      answer's (node, score) list;
    * ``dicts``: the previous handler's shape for fractional pods: per request a dict of
      views, of labels and of each node's free CPU/memory over every name, then
      :func:`filter_fractional` / :func:`score_fractional` (their rows re-checked per name);
      timed from after the views (as the figures of the previous round)."""
    import numpy as np  # noqa: PLC0415 (only this mode)

    from gpu_admission.core.vocab import (  # noqa: PLC0415
        GPU_CONFIGMAP_ANNOTATION,
        GPU_MEMORY_ANNOTATION,
        GPU_UUID_ANNOTATION,
    )
    from gpu_admission.extender.binder import (  # noqa: PLC0415
        BindConfig,
        configmap,
        reservation_pod,
    )
    from gpu_admission.placement.fractional import (  # noqa: PLC0415
        NEW_GPU,
        LedgerSource,
        Placer,
        choose,
        filter_fractional,
        filter_share,
        priorities,
        prioritize_pod,
        rank_share,
        score_fractional,
    )
    from gpu_admission.placement.frag import MILLI, Shape  # noqa: PLC0415
    from gpu_admission.placement.ledger import Ledger  # noqa: PLC0415
    from gpu_admission.placement.requests import NodeRequests  # noqa: PLC0415
    from gpu_admission.policy.model import policy_from_dict  # noqa: PLC0415

    card = 81920  # MiB
    policy = policy_from_dict({"apiVersion": "gpu-admission.io/v1alpha1",
                               "kind": "GPUSharingPolicy", "spec": {"nodePools": [{
                                   "name": "frac", "nodeSelector": {"pool": "frac"},
                                   "sharing": "fractional", "memoryMiB": card}]}})
    specs = openb_nodes((DATA / "openb_node_list_gpu_node.csv").read_text())
    ledger = Ledger("gpu-admission")
    labels = {}
    node_objs = {}
    requests = NodeRequests()
    for n in specs:
        labels[n.name] = {"pool": "frac"}  # one object per node, as the watch keeps it
        node_objs[n.name] = {"metadata": {"name": n.name, "labels": labels[n.name]},
                             "status": {"allocatable": {"nvidia.com/gpu": str(n.gpus),
                                                        "cpu": f"{n.cpu_milli}m",
                                                        "memory": f"{n.mem_mib}Mi"}}}
        ledger.set_node(node_objs[n.name])
    names = [n.name for n in specs]
    source = LedgerSource(ledger, node_objs, requests)
    rng = np.random.default_rng(42)
    shares = [4096, 8192, 12288, 16384, 24576, 40960]
    times: dict[str, list[float]] = {"fractional": [], "whole": [], "cpu": []}
    placer = Placer()  # the extender's (create_app makes one per app)
    for i in range(pods):
        kind = str(rng.choice(["fractional"] * 3 + ["whole", "cpu"])) if mix else "fractional"
        if mode == "dicts" and kind != "fractional":
            continue
        share = int(rng.choice(shares))
        gpus = int(rng.choice([1, 1, 2, 4, 8]))
        pod = (int(rng.choice([2000, 4000, 8000])), int(rng.choice([8192, 16384, 32768])))
        best = ""
        if mode == "dicts":
            views = {name: ledger.view(name) for name in names}
            t0 = time.perf_counter()
            resources = {name: requests.free(node_objs[name]) for name in names}
            placer.observe(share, card, pod)
            passed = filter_fractional(share, names, views, labels, policy, placer=placer,
                                       resources=resources, pod=pod).passed
            scores = score_fractional(share, passed, views, labels, policy, placer=placer,
                                      snapshot=None, resources=resources, pod=pod)
        else:
            t0 = time.perf_counter()
            if kind == "fractional":  # app.decide_fractional, filter then prioritize
                req = placer.request(names, source, policy)
                placer.observe(share, int(req.card[req.card > 0][0]), pod)
                passed = filter_share(placer, req, source, share, policy, pod=pod).passed
                req = placer.request(passed, source, policy)
                scores = priorities(req, rank_share(placer, req, share, policy.spec.placement,
                                                    pod))
            else:  # app.decide_ranked: filter passes all and observes; prioritize ranks
                shape = Shape(pod[0], pod[1], MILLI if kind == "whole" else 0,
                              gpus if kind == "whole" else 0)
                placer.workload.observe(shape)
                passed = list(names)
                req = placer.request(passed, source, policy)
                scores = prioritize_pod(placer, req, shape)
        times[kind].append(time.perf_counter() - t0)
        if not passed:
            continue
        best = max(scores, key=lambda hs: hs[1])[0]
        if max(s for _, s in scores) == 0:
            continue  # fits nowhere
        spec: dict[str, object] = {"nodeName": best, "containers": [{"resources": {
            "requests": {"cpu": f"{pod[0]}m", "memory": f"{pod[1]}Mi"}}}]}
        annotations: dict[str, str] = {}
        if kind == "fractional":  # bind's choice, then what the watch shows once bound
            choice = choose(ledger.view(best), card, share, policy.spec.placement,
                            placer=placer)
            assert choice is not None
            uuid = choice.gpu_id
            if uuid == NEW_GPU:
                ledger.open_gpu(f"r{i}", best)
                uuid = f"GPU-{i}"
                res = reservation_pod(f"r{i}", best, BindConfig("gpu-admission", "img"), "x")
                res["metadata"].update({"uid": f"ru{i}", "annotations": {
                    **res["metadata"].get("annotations", {}), GPU_UUID_ANNOTATION: uuid}})
                ledger.set_pod(res)
            ledger.set_configmap(configmap("t", f"cm{i}", f"p{i}", f"u{i}", uuid))
            annotations = {GPU_MEMORY_ANNOTATION: str(share), GPU_CONFIGMAP_ANNOTATION: f"cm{i}"}
        elif kind == "whole":
            spec["containers"] = [{"resources": {
                "requests": {"cpu": f"{pod[0]}m", "memory": f"{pod[1]}Mi"},
                "limits": {"nvidia.com/gpu": str(gpus)}}}]
        obj = {"metadata": {"name": f"p{i}", "namespace": "t", "uid": f"u{i}",
                            "annotations": annotations},
               "spec": spec, "status": {"phase": "Running"}}
        ledger.set_pod(obj)
        requests.set_pod(obj)
    for kind, ts in times.items():
        if not ts:
            continue
        ms = np.array(ts) * 1000
        print(f"extender filter+prioritize over {len(names)} nodes, {mode}, {kind} pods "
              f"({len(ts)}): p50 {np.percentile(ms, 50):.2f} ms, p99 "
              f"{np.percentile(ms, 99):.2f} ms, max {ms.max():.2f} ms", flush=True)


def main() -> None:
    if "--extender" in sys.argv:
        for mode in ("dicts", "ledger"):  # before / after, same process and load
            extender_latency(mode=mode, mix=False)
        extender_latency(mode="ledger")  # fractional, whole-GPU and CPU pods
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--placements", default="shipped,fgd,bestfit,random")
    ap.add_argument("--traces", default="default,gpushare100")
    ap.add_argument("--until", type=int, default=130)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--trace-dir", type=Path, default=None)
    ap.add_argument("--paper-csv", type=Path, default=None)
    a = ap.parse_args()
    lo, _, hi = a.seeds.partition("-")
    seeds = list(range(int(lo), int(hi or lo) + 1))
    ref = paper(a.paper_csv)
    print("| trace | placement | seeds | at 100 % mean (min-max) | at 130 % mean | paper at 100 "
          "| paper at 130 | FGD (paper) at 100 | decision p50 / p99 ms | replay s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with ProcessPoolExecutor(a.jobs) as pool:
        for trace in a.traces.split(","):
            name = f"openb_pod_list_{trace}.csv"
            path = DATA / name if (DATA / name).exists() or a.trace_dir is None \
                else a.trace_dir / name
            for placement in a.placements.split(","):
                runs = list(pool.map(replay, [(trace, path, placement, seed, a.until)
                                              for seed in seeds]))
                r100 = [r[0] for r in runs]
                pr = ref.get((trace, PAPER_NAMES.get(placement, "")), (float("nan"),) * 2)
                fgd = ref.get((trace, "FGD"), (float("nan"),))[0]
                print(f"| {trace} | {placement} | {len(seeds)} | {statistics.mean(r100):.2f} "
                      f"({min(r100):.2f}-{max(r100):.2f}) | "
                      f"{statistics.mean(r[1] for r in runs):.2f} | {pr[0]} | {pr[1]} | {fgd} | "
                      f"{statistics.median(r[2] for r in runs):.2f} / "
                      f"{max(r[3] for r in runs):.2f} | "
                      f"{statistics.mean(r[4] for r in runs):.0f} |", flush=True)


if __name__ == "__main__":
    main()
