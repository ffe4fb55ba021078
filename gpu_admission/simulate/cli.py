"""``gpu-admission simulate``: replay a trace through the placement the install ships (or a
baseline) under FGD's protocol and print the allocation curve. The face: reads the files,
draws the progress bar, prints; the replay itself is :mod:`gpu_admission.simulate.core`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, TextIO

import click
import orjson

from gpu_admission.policy.model import PolicyError, default_policy, load_policy
from gpu_admission.simulate.core import MAX_PERCENT, PLACEMENTS, Result, simulate
from gpu_admission.simulate.trace import (
    NodeSpec,
    PodSpec,
    TraceError,
    k8s_objects,
    openb_nodes,
    openb_pods,
)
from gpu_admission.workloads.files import InputError, read_documents

OPENB_NOTE = ("openb pods carry no labels: a share (gpu_milli < 1000) is a fractional pod "
              "asking its share of one card (as with gpu-admission.io/gpu-memory), 1000 asks "
              "num_gpu whole cards, as the built-in policy classifies them; each GPU "
              "model's nodes form one fractional pool; shares are milli-GPU of the card "
              "they land on, no memoryHeadroomMiB (the trace's shares are the pods' own)")


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None


class Progress:
    """A one-line bar on stderr, only when stderr is a terminal."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.last = -1

    def __call__(self, done: int, total: int) -> None:
        pct = 100 * done // max(total, 1)
        if pct != self.last:
            self.last = pct
            bar = "#" * (pct // 4)
            self.stream.write(f"\r[{bar:<25}] {pct:3d} % ({done}/{total} pods)")
            self.stream.flush()

    def close(self) -> None:
        if self.last >= 0:
            self.stream.write("\n")


def load(nodes: str, pods: str, fmt: str, policy_path: str | None
         ) -> tuple[list[NodeSpec], list[PodSpec], str]:
    if fmt == "openb":
        return (openb_nodes(_read(nodes), nodes), openb_pods(_read(pods), pods),
                OPENB_NOTE + ("" if policy_path is None else
                              "; --policy is not used for openb input"))
    try:
        policy = load_policy(Path(policy_path)) if policy_path else default_policy()
    except PolicyError as exc:
        raise InputError(f"{policy_path}: {exc}") from None
    cards = {p.name: p.memory_mib for p in policy.spec.node_pools if p.fractional}
    docs: list[Any] = read_documents(nodes)
    if pods != nodes:
        docs += read_documents(pods)
    selectors = {p.name: p.node_selector for p in policy.spec.node_pools if p.fractional}
    n, p = k8s_objects(docs, cards, selectors)
    return n, p, ("k8s objects: shares from gpu-admission.io/gpu-memory (MiB) over the "
                  "policy's fractional pool card size, whole GPUs from nvidia.com/gpu")


def table(r: Result) -> str:
    lines = [f"placement {r.placement}, seed {r.seed}, tune {r.tune}: {r.pods} pods over "
             f"{r.gpus} GPUs", f"note: {r.note}", "",
             "arrived % of GPU capacity -> allocated % of GPU capacity"]
    keys = [k for k in r.curve if int(k) % 10 == 0 or k in ("100", "130")]
    lines += [f"  {k:>3} %  {r.curve[k]:6.2f} %" for k in keys]
    lines += ["", "failed pods: " + ", ".join(f"{k} {v}" for k, v in r.failed.items()),
              "arrived pods: " + ", ".join(f"{k} {v}" for k, v in r.arrived.items())]
    u = r.unallocated
    lines += [f"unallocated GPUs at the end: {u['total_gpus']} ({u['whole']} whole, "
              f"{u['partial_gpus']} on {u['partial_cards']} partly used cards); why: "
              + ", ".join(f"{k} {v}" for k, v in u["why"].items()),
              f"time per decision: p50 {r.decision_ms['p50']} ms, p99 "
              f"{r.decision_ms['p99']} ms, max {r.decision_ms['max']} ms"]
    return "\n".join(lines)


@click.command("simulate", short_help="Replay a fleet's pods through the placement.")
@click.option("--nodes", "nodes", required=True, metavar="FILE",
              help="openb node CSV, or Node objects (kubectl get nodes -o yaml)")
@click.option("--pods", "pods", required=True, metavar="FILE",
              help="openb pod CSV, or Pod objects (kubectl get pods -A -o yaml)")
@click.option("--format", "fmt", type=click.Choice(["openb", "k8s"]), default=None,
              help="input format (default: openb for .csv files, else k8s)")
@click.option("--policy", "policy_path", metavar="FILE", default=None,
              help="GPUSharingPolicy (k8s input: the fractional pools' card size)")
@click.option("--seed", type=int, default=42, show_default=True)
@click.option("--tune", type=float, default=1.3, show_default=True,
              help="top the pods up with random copies to this x GPU capacity")
@click.option("--placement", type=click.Choice(PLACEMENTS), default="shipped",
              show_default=True, help="shipped, or a baseline of the FGD paper")
@click.option("--until", type=click.IntRange(0, MAX_PERCENT), default=MAX_PERCENT,
              show_default=True, help="stop once arrived demand passes this % of capacity")
@click.option("-o", "output", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def simulate_command(  # noqa: PLR0917 (click passes every option)
        nodes: str, pods: str, fmt: str | None, policy_path: str | None,
                     seed: int, tune: float, placement: str, until: int,
                     output: str) -> None:
    """What-if: replay PODS on NODES under FGD's protocol (pods sorted by name, shuffled
    with SEED, topped up to TUNE x capacity, placed one by one, unfittable pods dropped)
    and print the share of GPU capacity allocated at each percent of arrived demand."""
    if fmt is None:
        fmt = "openb" if nodes.endswith(".csv") else "k8s"
    try:
        node_specs, pod_specs, note = load(nodes, pods, fmt, policy_path)
    except TraceError as exc:
        raise InputError(str(exc)) from None
    progress = Progress(sys.stderr) if sys.stderr.isatty() else None
    try:
        result = simulate(node_specs, pod_specs, placement=placement, seed=seed, tune=tune,
                          until=until, clock=time.perf_counter, progress=progress,
                          note=note)
    finally:
        if progress is not None:
            progress.close()
    if output == "json":
        click.echo(orjson.dumps(result.to_json()).decode())
    else:
        click.echo(table(result))
