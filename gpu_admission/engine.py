"""Placeholder contract (owner: policy engine). Replaced by the real engine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_admission.decision import Decision, RequestFacts
from gpu_admission.policy.model import Policy


def evaluate(pod: Mapping[str, Any], facts: RequestFacts, policy: Policy) -> Decision:
    """Decide one Pod. Pure: no I/O, does not modify ``pod``.

    ``facts.stage == "mutate"``: the decision carries the RFC 6902 patch.
    ``facts.stage == "validate"``: re-check the final object, never a patch.
    """
    raise NotImplementedError
