"""The shipped webhook configuration for the claim rule set: its matchConditions, compiled and
evaluated with cel-python as the API server does (tests/install/test_manifests.py has the rest)."""

from __future__ import annotations

from typing import Any

import celpy
import celpy.adapter
import pytest

from tests.dra.objects import TRAINING, gpu_config, template
from tests.install.test_manifests import cel_program, render, webhooks

SCHEDULER_CLAIM = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"generateName": "p-extended-resources-", "namespace": "ml",
                                "annotations": {
                                    "resource.kubernetes.io/extended-resource-claim": "true"}},
                   "spec": {"devices": {"requests": []}}}


@pytest.mark.parametrize(("obj", "sent"), [
    (template("t", config=[gpu_config("TimeSlicing")], labels=TRAINING), True),
    ({**template("t"), "metadata": {"name": "t", "namespace": "ml",
                                    "annotations": {"team": "a"}}}, True),
    (SCHEDULER_CLAIM, False),
], ids=["training-template", "other-annotations", "scheduler-made-claim"])
def test_claims_webhook_match_conditions(obj: dict[str, Any], sent: bool) -> None:
    (hook,) = [h for _, h in webhooks(render("base"))
               if h["name"] == "validate-claims.gpu-admission.io"]
    activation = celpy.adapter.json_to_cel({
        "object": obj, "oldObject": None,
        "request": {"operation": "CREATE", "kind": {
            "group": "resource.k8s.io", "version": "v1", "kind": obj["kind"]}}})
    results = [cel_program(c["expression"]).evaluate(activation)
               for c in hook["matchConditions"]]
    assert all(isinstance(r, celpy.celtypes.BoolType) for r in results)
    assert all(results) is sent
