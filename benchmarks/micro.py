"""In-process micro-benchmark: decision + patch per review kind, in microseconds.

What is timed, per kind of pod in the benchmark mix (``reviews.KINDS``):

- ``decide_us``: ``engine.evaluate(pod, facts, policy)`` at the mutate stage: classification,
  every rule, and the RFC 6902 operations built by ``gpu_admission.core.patch``;
- ``decide_patch_us``: the same plus rendering the reply the server sends
  (``wire.encode_response``: orjson + base64 of the patch), i.e. all per-review work except
  HTTP, TLS and JSON parsing of the request;
- ``validate_us``: ``evaluate`` at the validate stage on the mutated pod;
- the reference the issue names, measured in the same run: the *diff approach*
  (``copy.deepcopy`` the pod, apply the same changes, ``jsonpatch.make_patch(pod, copy)``):
  ``diff_us``, and ``ratio`` = ``diff_us / decide_patch_us``.

Each figure is the best of ``--repeat`` ``timeit`` rounds of ``number`` calls (the minimum is
the least disturbed by other processes on a shared machine), divided by ``number``.

Run: ``python benchmarks/micro.py [--policy FILE] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import copy
import functools
import sys
import tempfile
import threading
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonpatch
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dra_micro import measure_dra, print_dra
from reviews import BENCH_POLICY_YAML, KINDS, MIXES, TYPICAL_KIND, mix_kinds, review

from gpu_admission.admission.engine import evaluate
from gpu_admission.auditlog.record import audit_annotations, decision_record
from gpu_admission.auditlog.writer import DecisionLog
from gpu_admission.core.decision import RequestFacts, Stage
from gpu_admission.policy.model import Policy, load_policy, policy_from_yaml
from gpu_admission.server.logs import info_writer, make_logger
from gpu_admission.server.metrics import Metrics
from gpu_admission.server.wire import encode_response, parse_review, sanitize_warnings

MUTATE = RequestFacts(namespace="team-a", operation="CREATE", user="bench", stage="mutate")
VALIDATE = RequestFacts(namespace="team-a", operation="CREATE", user="bench", stage="validate")


def best_us(fn: Callable[[], object], number: int, repeat: int) -> float:
    """Best-of-``repeat`` time of one call, in microseconds (µs)."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def measure(policy: Policy, *, repeat: int = 9, target_s: float = 0.03) -> list[dict[str, Any]]:
    """One row per review kind; see the module docstring for what each column means."""
    rows = []
    for kind in KINDS:
        pod = kind.build()
        decision = evaluate(pod, MUTATE, policy)
        patch = list(decision.patch)
        mutated = jsonpatch.apply_patch(pod, patch) if patch else copy.deepcopy(pod)

        def decide(pod: dict[str, Any] = pod) -> object:
            return evaluate(pod, MUTATE, policy)

        def decide_patch(pod: dict[str, Any] = pod) -> bytes:
            d = evaluate(pod, MUTATE, policy)
            return encode_response("admission.k8s.io/v1", "uid", allowed=d.allowed,
                                   patch=d.patch, warnings=list(d.warnings))

        def validate(mutated: dict[str, Any] = mutated) -> object:
            return evaluate(mutated, VALIDATE, policy)

        def diff(pod: dict[str, Any] = pod, patch: list[dict[str, Any]] = patch) -> object:
            changed = copy.deepcopy(pod)
            jsonpatch.apply_patch(changed, patch, in_place=True)
            return jsonpatch.make_patch(pod, changed)

        # calibrate ``number`` so each round takes about ``target_s``
        once = timeit.timeit(decide_patch, number=20) / 20
        number = max(20, int(target_s / max(once, 1e-7)))
        row: dict[str, Any] = {
            "kind": kind.name, "allowed": decision.allowed, "patch_ops": len(patch),
            "pod_bytes": len(orjson.dumps(pod)),
            "decide_us": round(best_us(decide, number, repeat), 1),
            "decide_patch_us": round(best_us(decide_patch, number, repeat), 1),
            "validate_us": round(best_us(validate, number, repeat), 1),
        }
        diff_number = max(5, number // 10)
        row["diff_us"] = round(best_us(diff, diff_number, repeat), 1)
        row["ratio_diff_to_ours"] = round(row["diff_us"] / row["decide_patch_us"], 1)
        rows.append(row)
    return rows


def components(policy: Policy, work: Path, *, repeat: int = 9,
               mix: str = "webhook") -> dict[str, float]:
    """What each step of the server's request path costs, in µs per review, averaged over
    the mix (``mix``: the kinds of ``reviews.mix_kinds``, their weights, /mutate and /validate
    alike). Measured with the
    server's own building blocks so the table points at what to optimise:

    - ``parse``: ``wire.parse_review`` (orjson + type checks of the pod);
    - ``decide``: ``engine.evaluate``;
    - ``render``: ``wire.encode_response`` with warnings and audit annotations;
    - ``audit_record`` + ``audit_enqueue``: ``decision_record`` and ``DecisionLog.write``
      (a file target; the writer thread's own work is not in this figure);
    - ``log_line``: the per-request JSON line as the server writes it (the structlog
      logger's fast path :func:`~gpu_admission.server.logs.info_writer`), to a file;
    - ``metrics``: request counter + latency histogram + decision counter;
    - ``orjson_loads`` (not in ``sum``): the JSON parse alone, which the baseline pays too.
    """
    # Each kind once as /mutate sees it and once as /validate sees it (our own patch applied),
    # like the load mix; the stage decides what evaluate does (validate never patches).
    stage_of: dict[bytes, Stage] = {}
    bodies: list[tuple[bytes, int]] = []
    for kind in mix_kinds(mix):
        obj = kind.build()
        patch = evaluate(obj, MUTATE, policy).patch
        final = jsonpatch.apply_patch(obj, list(patch)) if patch else obj
        for stage, pod in ((MUTATE.stage, obj), (VALIDATE.stage, final)):
            body = orjson.dumps(review(pod, uid=f"{kind.name}-{stage}"))  # a key per stage
            stage_of[body] = stage
            bodies.append((body, kind.weight))
    total = sum(w for _, w in bodies)
    log_file = (work / "micro-log.jsonl").open("wb")
    logger = make_logger("info", log_file)
    metrics = Metrics()
    # A queue larger than the records written here: the writer drains every 50 ms, and the
    # loop below enqueues faster than any server answers.
    audit = DecisionLog.open(str(work / "micro-audit.jsonl"), registry=metrics.registry,
                             queue_size=200_000)
    out: dict[str, float] = {}

    def mix_us(step: Callable[[bytes], object]) -> float:
        acc = 0.0
        for body, weight in bodies:
            acc += best_us(functools.partial(step, body), 200, repeat) * weight
        return round(acc / total, 1)

    def parse(b: bytes) -> object:
        return parse_review(b)

    def decide(b: bytes) -> object:
        r = parse_review(b)
        assert r.obj is not None
        return evaluate(r.obj, r.facts(stage_of[b]), policy)

    decided = {}
    for body, _ in bodies:
        r = parse_review(body)
        assert r.obj is not None
        decided[body] = (r, evaluate(r.obj, r.facts(stage_of[body]), policy))

    def render(b: bytes) -> object:
        r, d = decided[b]
        return encode_response(r.api_version, r.uid, allowed=d.allowed, patch=d.patch,
                               warnings=sanitize_warnings(d.warnings),
                               audit_annotations=audit_annotations(d))

    def record(b: bytes) -> dict[str, Any]:
        r, d = decided[b]
        return decision_record(decision=d, facts=r.facts(stage_of[b]), pod=r.obj, uid=r.uid,
                               policy_digest=policy.digest, instance="bench")

    records = {b: record(b) for b, _ in bodies}

    def enqueue(b: bytes) -> None:
        audit.write(records[b])

    write_info = info_writer(logger)
    assert write_info is not None

    def log_line(b: bytes) -> None:
        r = decided[b][0]
        write_info("review", {"path": "/mutate", "code": 200, "duration_ms": 0.5, "uid": r.uid,
                              "namespace": r.namespace, "pod": r.name,
                              "operation": r.operation, "user": r.user, "dry_run": r.dry_run,
                              "api_version": r.api_version, "decision": "allowed"})

    def observe(_: bytes) -> None:
        metrics.observe_request("/mutate", 200, 0.0005)
        metrics.count_decision("mutate", "allowed", False)

    try:
        out["parse"] = mix_us(parse)
        out["decide"] = round(mix_us(decide) - out["parse"], 1)
        out["render"] = mix_us(render)
        out["audit_record"] = mix_us(record)
        out["audit_enqueue"] = mix_us(enqueue)
        out["log_line"] = mix_us(log_line)
        out["metrics"] = mix_us(observe)
        out["sum"] = round(sum(out.values()), 1)
        # Not ours: the baseline parses the same bodies with orjson too (not in ``sum``).
        out["orjson_loads"] = mix_us(orjson.loads)
    finally:
        threading.Thread(target=audit.close, daemon=True).start()
        log_file.close()
    return out


def print_components(parts: dict[str, float], mix: str = "webhook") -> None:
    print(f"request-path steps, in-process (µs per review, {mix!r} mix average): " + ", ".join(
        f"{k} {v}" for k, v in parts.items()))


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'kind':24} {'ops':>3} {'bytes':>6} {'decide':>8} {'+patch':>8} {'validate':>8} "
          f"{'make_patch':>10} {'ratio':>6}   (µs per review)")
    for r in rows:
        print(f"{r['kind']:24} {r['patch_ops']:>3} {r['pod_bytes']:>6} {r['decide_us']:>8} "
              f"{r['decide_patch_us']:>8} {r['validate_us']:>8} {r['diff_us']:>10} "
              f"{r['ratio_diff_to_ours']:>5}x")
    typical = next(r for r in rows if r["kind"] == TYPICAL_KIND)
    verdict = "met" if typical["decide_patch_us"] <= 50 else "MISSED"
    print(f"typical pod ({TYPICAL_KIND}): decision + patch {typical['decide_patch_us']} µs "
          f"(target <= 50 µs: {verdict})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", type=Path, default=None,
                        help="policy file (default: the benchmark policy with node pools)")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--mix", choices=MIXES, default="webhook",
                        help="mix for the request-path steps: webhook (what the API server "
                             "sends with the default install: no CPU pods) or all (every kind)")
    args = parser.parse_args()
    policy = load_policy(args.policy) if args.policy else policy_from_yaml(BENCH_POLICY_YAML)
    rows = measure(policy, repeat=args.repeat)
    print_table(rows)
    with tempfile.TemporaryDirectory() as tmp:
        print_components(components(policy, Path(tmp), mix=args.mix), args.mix)
    print_dra(measure_dra(policy, repeat=args.repeat))  # DRA pods, warm cache (issue 15)
    if args.json:
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
