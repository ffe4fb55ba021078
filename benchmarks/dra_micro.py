"""In-process micro-benchmark of DRA decisions (issue 15), in microseconds.

With a warm DRA snapshot the size of a busy cluster (NVIDIA's DeviceClasses with
``extendedResourceName: nvidia.com/gpu``, 500 templates, 500 claims, 2000 pods naming
claims, as the server's cache holds them), per review kind: ``engine.evaluate`` + rendering
the reply (``decide_patch_us``, as in micro.py). The baseline, measured in the same run, is the
typical non-DRA pod (``reviews.TYPICAL_KIND``) decided without a DRA snapshot; ``ratio`` is each
row's time over it. The first two rows show what DRA support costs pods that do not use it:
the typical pod without a snapshot and with the warm one (a ``nvidia.com/gpu`` limit is then
checked against the DeviceClasses' extended resources).

Run: ``python benchmarks/dra_micro.py`` (also printed by ``benchmarks/micro.py``).
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reviews import BENCH_POLICY_YAML, KINDS, TYPICAL_KIND

from gpu_admission.admission.engine import evaluate
from gpu_admission.core.decision import RequestFacts
from gpu_admission.dra.model import DraSnapshot
from gpu_admission.policy.model import Policy, policy_from_yaml
from gpu_admission.server.wire import encode_response
from tests.dra.objects import (
    INFERENCE,
    TRAINING,
    claim,
    dra_pod,
    gpu_config,
    nvidia_gpu_class,
    nvidia_mig_class,
    template,
)

MUTATE = RequestFacts(namespace="ml", operation="CREATE", user="bench", stage="mutate")
TARGET_US = 50.0  # issue 15: a typical DRA pod with a warm cache


def warm_snapshot(templates: int = 500, claims: int = 500, pods: int = 2000) -> DraSnapshot:
    """A snapshot as the cache builds it for a busy cluster."""
    tpls = [template("dedicated"), template("mps", config=[gpu_config(
        "MPS", requests=["gpu"], pinned="10Gi")]), template("timesliced", config=[
            gpu_config("TimeSlicing", requests=["gpu"])])]
    tpls += [template(f"t{i}", config=[gpu_config("TimeSlicing")] if i % 2 else None)
             for i in range(templates)]
    cls = [claim("shared-claim")] + [claim(f"c{i}") for i in range(claims)]
    users: dict[tuple[str, str], set[str]] = {("ml", "shared-claim"): {"ml/other"}}
    for i in range(pods):
        users.setdefault(("ml", f"c{i % claims}"), set()).add(f"ml/p{i}")
    return DraSnapshot.build(classes=[nvidia_gpu_class(), nvidia_mig_class()], templates=tpls,
                             claims=cls, claim_users=users)


def best_us(fn: Callable[[], object], repeat: int, target_s: float = 0.03) -> float:
    once = timeit.timeit(fn, number=20) / 20
    number = max(20, int(target_s / max(once, 1e-7)))
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def measure_dra(policy: Policy, *, repeat: int = 9) -> list[dict[str, Any]]:
    snap = warm_snapshot()
    typical = next(k for k in KINDS if k.name == TYPICAL_KIND).build()
    cases: list[tuple[str, dict[str, Any], DraSnapshot | None]] = [
        (f"{TYPICAL_KIND} (no DRA snapshot)", typical, None),
        (f"{TYPICAL_KIND} (warm DRA snapshot)", typical, snap),
        ("dra-mps-inference", dra_pod("i", INFERENCE, template_name="mps"), snap),
        ("dra-dedicated-training", dra_pod("t", TRAINING, template_name="dedicated"), snap),
        ("dra-timeslicing-training", dra_pod("t", TRAINING, template_name="timesliced"), snap),
        ("dra-shared-claim-inference", dra_pod("i", INFERENCE, claim_name="shared-claim"), snap),
    ]
    rows: list[dict[str, Any]] = []
    for name, pod, dra in cases:
        def decide_patch(pod: dict[str, Any] = pod, dra: DraSnapshot | None = dra) -> bytes:
            d = evaluate(pod, MUTATE, policy, dra)
            return encode_response("admission.k8s.io/v1", "uid", allowed=d.allowed,
                                   patch=d.patch, warnings=list(d.warnings))

        decision = evaluate(pod, MUTATE, policy, dra)
        rows.append({"kind": name, "allowed": decision.allowed,
                     "patch_ops": len(decision.patch),
                     "decide_patch_us": round(best_us(decide_patch, repeat), 1)})
    base = rows[0]["decide_patch_us"]
    for row in rows:
        row["ratio"] = round(row["decide_patch_us"] / base, 2)
    return rows


def print_dra(rows: list[dict[str, Any]]) -> None:
    print(f"{'DRA kind':34} {'allowed':>7} {'ops':>3} {'+patch':>8} {'ratio':>6}"
          "   (µs per review; ratio vs the first row)")
    for r in rows:
        print(f"{r['kind']:34} {r['allowed']!s:>7} {r['patch_ops']:>3} "
              f"{r['decide_patch_us']:>8} {r['ratio']:>5}x")
    typical = next(r for r in rows if r["kind"] == "dra-mps-inference")
    verdict = "met" if typical["decide_patch_us"] <= TARGET_US else "MISSED"
    print(f"typical DRA pod (dra-mps-inference, warm cache): decision + patch "
          f"{typical['decide_patch_us']} µs (target <= {TARGET_US:g} µs: {verdict})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    print_dra(measure_dra(policy_from_yaml(BENCH_POLICY_YAML), repeat=args.repeat))


if __name__ == "__main__":
    main()
