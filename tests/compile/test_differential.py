"""The compiled policies decide exactly like the engine (the oracle): same allow/deny, same
violations (rule, path, message, mode), same warnings, same RFC 6902 patch and patched pod,
evaluated with cel-python through the API server's admission steps
(:func:`gpu_admission.compile.evaluator.admit`)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from gpu_admission.compile.evaluator import admit
from gpu_admission.core.decision import RequestFacts
from tests.compile_support import check, compiled, is_dra, pods, request_facts
from tests.corpus_support import corpus

CORPUS = corpus()


def test_the_corpus_is_the_suites_pods() -> None:
    assert len(CORPUS) >= 50
    sources = {ident.split(".")[0].split("[")[0].split("/")[0] for ident, _ in CORPUS}
    assert {"test_rules", "test_engine", "hostile"} <= sources


@pytest.mark.parametrize("policy", ["default", "modes"])
@pytest.mark.parametrize(("ident", "text"), CORPUS, ids=[i for i, _ in CORPUS])
def test_corpus_pod(policy: str, ident: str, text: str) -> None:
    pod: dict[str, Any] = json.loads(text)
    facts = RequestFacts(namespace="team-a")
    if is_dra(pod):  # DRA stays with the webhook: the compiled policies leave the pod alone
        outcome = admit(compiled(policy).objects, pod, facts)
        assert outcome.decision.patch == () and outcome.decision.violations == ()
        return
    check(policy, pod, facts)


SETTINGS = settings(max_examples=250, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(pod=pods(), facts=request_facts())
def test_generated_pods_default_policy(pod: dict[str, Any], facts: RequestFacts) -> None:
    check("default", pod, facts)


@SETTINGS
@given(pod=pods(), facts=request_facts())
def test_generated_pods_modes_policy(pod: dict[str, Any], facts: RequestFacts) -> None:
    check("modes", pod, facts)
