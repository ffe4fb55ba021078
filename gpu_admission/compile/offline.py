"""``gpu-admission evaluate --compiled``: decide pods with the compiled admission policies.

Runs :func:`gpu_admission.compile.evaluator.admit` on the objects ``gpu-admission compile
--partial`` writes. A pod those objects leave to the webhook (one the rules that stay with the
webhook concern, e.g. a pod with DRA claims) is decided by the engine, exactly as the webhook
scoped to it would; a CEL run-time error is a denial, as ``failurePolicy: Fail`` makes it.
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from typing import Any

from gpu_admission.admission.engine import evaluate as evaluate_pod
from gpu_admission.core.decision import Decision, Mode, RequestFacts, Violation
from gpu_admission.dra.model import DraSnapshot
from gpu_admission.policy.model import Policy

from .compiler import compile_policy
from .evaluator import CelError, activation_of, admit, namespace_labels, run
from .objects import Compiled

ERROR_RULE = "compiled-policy-error"


def canonical_quantity(value: Any) -> Any:
    """A quantity as the API server hands it to admission: ``resource.Quantity.String()``
    (YAML ``1`` -> ``"1"``, ``0.5`` -> ``"500m"``; other forms are kept as written)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return value
    try:
        number = Decimal(str(value).strip())
    except InvalidOperation:
        return str(value)
    if number == number.to_integral_value() and abs(number) < 1000:
        return str(int(number))
    milli = number * 1000
    if milli == milli.to_integral_value() and abs(number) < 1:
        return f"{int(milli)}m"
    return str(value)


def as_admitted(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the API server passes it to admission: quantities as strings, map keys
    in sorted order (Go's encoding/json sorts them)."""
    out: dict[str, Any] = json.loads(json.dumps(pod))
    spec = out.get("spec")
    for kind in ("containers", "initContainers"):
        items = spec.get(kind) if isinstance(spec, dict) else None
        for container in items if isinstance(items, list) else []:
            resources = container.get("resources") if isinstance(container, dict) else None
            if not isinstance(resources, dict):
                continue
            for key in ("limits", "requests"):
                if isinstance(resources.get(key), dict):
                    resources[key] = {k: canonical_quantity(v)
                                      for k, v in resources[key].items()}
    sorted_pod: dict[str, Any] = json.loads(json.dumps(out, sort_keys=True))
    return sorted_pod


class CompiledEvaluator:
    """The compiled form of one policy, ready to decide pods offline."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.result: Compiled = compile_policy(policy, partial=True)
        self._webhook = [c["expression"] for o in self.result.objects[:1]
                         for c in o["spec"].get("matchConditions", [])
                         if c["name"].startswith("not-for-the-webhook")]

    @property
    def stays(self) -> list[str]:
        return list(self.result.stays)

    def for_webhook(self, pod: dict[str, Any], facts: RequestFacts) -> bool:
        """Is this a pod the compiled policies leave to the webhook?"""
        act = activation_of(pod, facts, namespace_labels(facts.namespace))
        return any(not bool(run(expr, act)) for expr in self._webhook)

    def decide(self, pod: dict[str, Any], facts: RequestFacts,
               dra: DraSnapshot | None = None) -> Decision:
        pod = as_admitted(pod)
        try:
            if self.for_webhook(pod, facts):
                return evaluate_pod(pod, facts, self.policy, dra)
            return admit(self.result.objects, pod, facts).decision
        except CelError as exc:
            message = f"policy evaluation failed (failurePolicy Fail): {exc}"
            return Decision(allowed=False, violations=(
                Violation(ERROR_RULE, "", message, Mode.ENFORCE),))
