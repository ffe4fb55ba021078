"""The seeded fleet the report tests own (no tests here): a week of dcgm-exporter history.

``node-a`` (4 x A100 40GB, exporter labels ``Hostname``/``pod``/``namespace``):

* GPU 0: ``ml-research/jupyter-alice-0``, a notebook held all week, busy a few office hours;
* GPU 1: ``ml-research/jupyter-bob-0`` for three days, then ``vision/jupyter-carol-0``;
* GPU 2: ``serving/llm-api-0``, steady inference at 15-30 %, with a 3-hour gap (no samples);
* GPU 3: nobody's (no pod labels), idle.

``node-b`` (2 x A100 80GB, exporter main's lowercase ``hostname``):

* GPU 0: ``training/bert-worker-0``, a training job at 92-98 %;
* GPU 1: ``serving/embed-0``, inference at 15-30 %, vanishes after 4.5 days.

A second, one-day history, three days before the week, comes through a ServiceMonitor
(``exported_pod``/``exported_namespace``; ``pod`` is the exporter's): ``node-c`` GPU 0 held by
``team-x/infer-0`` at 15-30 %, GPU 1 idle.
"""

from __future__ import annotations

import time

from tests.dcgm_history_support import (
    Behaviour,
    Gpu,
    notebook,
    steady,
    unallocated,
    until,
    uuid_for,
    with_gap,
)

SEED = 10
STEP = 300  # s: the report's --step and the sample spacing
DAY = 86400
A100_40 = "NVIDIA A100-SXM4-40GB"
A100_80 = "NVIDIA A100-SXM4-80GB"


def week_bounds(now: float | None = None) -> tuple[int, int]:
    """[start, end] of the week: ends on the last whole hour before now minus one, so every
    timestamp is within Prometheus' reach and a multiple of STEP."""
    end = int((now if now is not None else time.time()) // 3600 * 3600) - 3600
    return end - 7 * DAY, end


def week_fleet(start: int, end: int) -> list[Gpu]:
    switch = start + 3 * DAY
    gap = (start + 3 * DAY + 2 * 3600, start + 3 * DAY + 5 * 3600)
    vanish = start + 4 * DAY + 12 * 3600

    def bob_then_carol(ts: int) -> tuple[str, str]:
        return ("ml-research", "jupyter-bob-0") if ts < switch else ("vision", "jupyter-carol-0")

    def gpu(node: str, index: int, model: str, behaviour: Behaviour, style: str = "pod") -> Gpu:
        return Gpu(node, index, uuid_for(SEED, node, index), model, behaviour, style)

    gpus = [
        gpu("node-a", 0, A100_40, notebook("alice", lambda ts: ("ml-research",
                                                                "jupyter-alice-0"))),
        gpu("node-a", 1, A100_40, notebook("bob", bob_then_carol)),
        gpu("node-a", 2, A100_40, with_gap(steady("llm", ("serving", "llm-api-0"), 15, 30,
                                                  (14000, 15000)), *gap)),
        gpu("node-a", 3, A100_40, unallocated),
        gpu("node-b", 0, A100_80, steady("bert", ("training", "bert-worker-0"), 92, 98,
                                         (70000, 72000)), "hostname"),
        gpu("node-b", 1, A100_80, until(steady("embed", ("serving", "embed-0"), 15, 30,
                                               (6000, 7000)), vanish), "hostname"),
    ]
    for g in gpus:
        g.sample(range(start, end + 1, STEP))
    return gpus


def servicemonitor_bounds(week_start: int) -> tuple[int, int]:
    return week_start - 3 * DAY, week_start - 2 * DAY


def servicemonitor_fleet(start: int, end: int) -> list[Gpu]:
    gpus = [
        Gpu("node-c", 0, uuid_for(SEED, "node-c", 0), A100_80,
            steady("x", ("team-x", "infer-0"), 15, 30, (5000, 6000)), "exported"),
        Gpu("node-c", 1, uuid_for(SEED, "node-c", 1), A100_80, unallocated, "exported"),
    ]
    for g in gpus:
        g.sample(range(start, end + 1, STEP))
    return gpus
