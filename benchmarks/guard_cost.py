"""What the GPU-access guard costs GPU pods: the engine with and without its rule, in one run.

For each GPU kind of the benchmark mix (``reviews.KINDS``), ``engine.evaluate`` at the mutate
stage is timed with the rule list as shipped and with ``GpuAccess`` taken out, the two variants
interleaved round by round (order alternating) so both see the same machine; each figure is the
best of ``--rounds`` rounds (best of 3 ``timeit`` repeats of ``--number`` calls each), in µs per
decision. The ratio ``with / without`` is the guard's share. Non-GPU kinds are left out: without
the guard they are not decided at all (``micro.py`` shows their cost with it).

Run: ``python benchmarks/guard_cost.py [--rounds 7] [--number 300]``.
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reviews import BENCH_POLICY_YAML, KINDS

import gpu_admission.admission.engine as engine
from gpu_admission.admission.pod import gpu_containers
from gpu_admission.core.decision import RequestFacts
from gpu_admission.policy.model import Policy, policy_from_yaml
from gpu_admission.rules import RULES, Rule
from gpu_admission.rules.gpu_access import GpuAccess

MUTATE = RequestFacts(namespace="team-a", operation="CREATE", user="bench", stage="mutate")


def best_us(pod: dict[str, Any], policy: Policy, number: int) -> float:
    """Best of 3 ``timeit`` repeats of ``number`` decisions, in µs per decision."""
    def decide() -> object:
        return engine.evaluate(pod, MUTATE, policy)
    return min(timeit.repeat(decide, number=number, repeat=3)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=300)
    args = parser.parse_args()
    policy = policy_from_yaml(BENCH_POLICY_YAML)
    shipped: tuple[Rule, ...] = RULES
    variants = {"with": shipped,
                "without": tuple(r for r in shipped if not isinstance(r, GpuAccess))}
    kinds = [k for k in KINDS if gpu_containers(k.build()["spec"])]
    best: dict[tuple[str, str], float] = {}
    try:
        for round_ in range(args.rounds):
            order = ["with", "without"] if round_ % 2 == 0 else ["without", "with"]
            for label in order:
                vars(engine)["RULES"] = variants[label]  # the tuple evaluate() iterates
                for kind in kinds:
                    micros = best_us(kind.build(), policy, args.number)
                    key = (kind.name, label)
                    best[key] = min(best.get(key, float("inf")), micros)
    finally:
        vars(engine)["RULES"] = shipped
    print(f"{'kind':24s} {'without':>8s} {'with':>8s} {'added':>7s} {'ratio':>6s}"
          "  (µs per decision)")
    for kind in kinds:
        without, with_ = best[(kind.name, "without")], best[(kind.name, "with")]
        print(f"{kind.name:24s} {without:8.1f} {with_:8.1f} {with_ - without:+7.1f} "
              f"{with_ / without:5.2f}x")


if __name__ == "__main__":
    main()
