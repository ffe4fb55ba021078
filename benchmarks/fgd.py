"""FGD benchmark (issue 32): ``gpu-admission simulate``'s replay of Alibaba's openb trace
under the paper's protocol, both traces, seeds 42-51, every placement, next to the paper's
rows (``shared/data/openb/published-fgd-atc23.tsv``). Also the time per decision.

    python benchmarks/fgd.py [--seeds 42-51] [--placements shipped,fgd,bestfit,random]
                             [--traces default,gpushare100] [--until 130]

Runs one replay at a time (nice it on a shared machine). Prints a markdown table: mean, min
and max over the seeds at 100 % and 130 % of arrived demand, and decision p50/p99 (ms)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from gpu_admission.simulate.core import at, simulate
from gpu_admission.simulate.trace import openb_nodes, openb_pods

#: the trace beside the repository (shared/data/openb), or where GPU_ADMISSION_OPENB points
DATA = Path(os.environ.get("GPU_ADMISSION_OPENB")
            or Path(__file__).resolve().parents[1].parent / "shared" / "data" / "openb")
PAPER_NAMES = {"random": "Random", "bestfit": "BestFit", "fgd": "FGD"}


def paper() -> dict[tuple[str, str], tuple[float, float]]:
    out = {}
    for line in (DATA / "published-fgd-atc23.tsv").read_text().splitlines()[1:]:
        c = line.split("\t")
        out[(c[0], c[1].split("-", 1)[1])] = (float(c[3]), float(c[6]))
    return out


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
