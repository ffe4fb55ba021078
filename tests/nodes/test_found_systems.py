"""Issue 33, "other sharing systems found, not declared": HAMi recognised from the node
annotations its device plugin writes, KAI from a pod handed to ``kai-scheduler``; their pods
are then handled as if declared in ``spec.otherSharingSystems``, which still overrides.
Through the engine, ``evaluate`` (Node objects in its files) and the webhook (Node watch)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from gpu_admission.admission.engine import evaluate
from gpu_admission.core.decision import Decision, RequestFacts
from gpu_admission.facts.nodepools import node_view
from gpu_admission.policy.model import Policy, default_policy, policy_from_dict
from tests.builders import make_review, patch_ops
from tests.kube_api_support import running_api
from tests.nodes_support import env_map, no_gfd_node, t4_node
from tests.server_support import poll_until, serving

FACTS = RequestFacts(namespace="ml")
HAMI_ANNOTATIONS = {"hami.io/node-nvidia-register":
                    '[{"id":"GPU-0","count":10,"devmem":15360,"devcore":100,"type":"Tesla T4",'
                    '"health":true}]',
                    "hami.io/node-handshake": "Reported 2026-12-06 20:00:00"}


def hami_node(base: dict[str, Any] | None = None) -> dict[str, Any]:
    node = copy.deepcopy(base or no_gfd_node("hami-1"))
    node["metadata"]["annotations"] = dict(HAMI_ANNOTATIONS)
    return node


def hami_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hami", "namespace": "ml"},
            "spec": {"containers": [{
                "name": "infer", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "resources": {"limits": {"nvidia.com/gpu": "1",
                                         "nvidia.com/gpumem": "3000"}}}]}}


def kai_pod(scheduler: str | None = "kai-scheduler") -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "kai", "namespace": "ml", "annotations": {"gpu-fraction": "0.5"}},
        "spec": {"containers": [{"name": "infer", "image": "nvcr.io/nvidia/pytorch:24.05-py3"}]}}
    if scheduler:
        pod["spec"]["schedulerName"] = scheduler
    return pod


def decide(pod: dict[str, Any], nodes: list[dict[str, Any]] | None,
           policy: Policy | None = None) -> tuple[Decision, dict[str, Any]]:
    policy = policy or default_policy()
    view = node_view(nodes, policy) if nodes is not None else None
    decision = evaluate(pod, FACTS, policy, nodes=view)
    after = jsonpatch.apply_patch(pod, list(decision.patch), in_place=False)
    if decision.allowed:
        assert evaluate(after, FACTS, policy, nodes=view).patch == ()
    return decision, after


def rules(decision: Decision) -> list[str]:
    return [v.rule for v in decision.violations]


KAI_ONLY = policy_from_dict({"apiVersion": "gpu-admission.io/v1alpha1",
                             "kind": "GPUSharingPolicy", "spec": {"otherSharingSystems": ["kai"]}})
HAMI_ONLY = policy_from_dict({"apiVersion": "gpu-admission.io/v1alpha1",
                              "kind": "GPUSharingPolicy",
                              "spec": {"otherSharingSystems": ["hami"]}})


@pytest.mark.parametrize(("pod", "nodes", "policy", "allowed"), [
    pytest.param(hami_pod(), [hami_node()], None, True, id="hami-found-on-a-node"),
    pytest.param(hami_pod(), [hami_node(t4_node())], None, True, id="hami-node-with-gfd"),
    pytest.param(hami_pod(), [t4_node()], None, False, id="hami-not-found"),
    pytest.param(hami_pod(), None, None, False, id="no-nodes-as-today"),
    pytest.param(hami_pod(), [hami_node()], KAI_ONLY, False, id="declared-list-overrides"),
    pytest.param(kai_pod(), [t4_node()], None, True, id="kai-scheduler-pod"),
    pytest.param(kai_pod(None), [t4_node()], None, False, id="kai-annotation-alone"),
    pytest.param(kai_pod(), None, None, False, id="kai-no-nodes-as-today"),
    pytest.param(kai_pod(), [t4_node()], HAMI_ONLY, False, id="kai-declared-list-overrides"),
])
def test_found_systems_are_handled_as_declared(pod: dict[str, Any],
                                               nodes: list[dict[str, Any]] | None,
                                               policy: Policy | None, allowed: bool) -> None:
    decision, _ = decide(pod, nodes, policy)
    assert decision.allowed is allowed, decision.violations
    if not allowed:
        assert rules(decision) == ["other-sharing-system"]


def test_hami_pod_keeps_hamis_share() -> None:
    _, after = decide(hami_pod(), [hami_node()])
    env = env_map(after["spec"]["containers"][0])
    assert env["NVIDIA_MEM_LIMIT_MB"] == "3000"  # HAMi's nvidia.com/gpumem, MiB
    assert after["spec"].get("schedulerName") is None  # the scheduler is HAMi's


def test_kai_pod_gets_kais_fraction_of_the_t4() -> None:
    _, after = decide(kai_pod(), [t4_node()])
    assert after["spec"]["schedulerName"] == "kai-scheduler"
    env = env_map(after["spec"]["containers"][0])
    assert env["GPU_MEMORY_FRACTION"] == "0.5"


def test_evaluate_finds_hami_in_its_node_files(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump(hami_node()))
    pods = tmp_path / "pod.yaml"
    pods.write_text(yaml.safe_dump(hami_pod()))
    found = subprocess.run([sys.executable, "-m", "gpu_admission", "evaluate", "-f", str(nodes),
                            "-f", str(pods), "-o", "json"], capture_output=True, text=True,
                           timeout=60, check=False)
    assert found.returncode == 0, found.stderr
    row = json.loads(found.stdout)
    assert (row["allowed"], row["violations"]) == (True, [])
    alone = subprocess.run([sys.executable, "-m", "gpu_admission", "evaluate", "-f", str(pods),
                            "-o", "json"], capture_output=True, text=True, timeout=60,
                           check=False)
    assert alone.returncode == 1
    assert [v["rule"] for v in json.loads(alone.stdout)["violations"]] == [
        "other-sharing-system"]


async def test_webhook_finds_hami_through_the_node_watch(tmp_path: Path) -> None:
    async with running_api(tmp_path) as (api, kubeconfig):
        api.apply(no_gfd_node("cpu-1"))
        async with serving(tmp_path, node_source=str(kubeconfig)) as server:
            await poll_until(lambda: server.state.nodes is not None
                             and server.state.nodes.synced)
            _, body, _ = await server.post("/mutate", make_review(hami_pod()))
            assert body["response"]["allowed"] is False  # HAMi not seen yet
            api.apply(hami_node())  # HAMi's device plugin registers a node
            await poll_until(lambda: server.state.nodes is not None and (
                view := server.state.nodes.view(server.state.policy)) is not None
                and "hami" in view.systems)
            _, body, _ = await server.post("/mutate", make_review(hami_pod()))
            response = body["response"]
            assert response["allowed"] is True
            env = next(op["value"] for op in patch_ops(response)
                       if op["path"] == "/spec/containers/0/env")
            assert env_map({"env": env})["NVIDIA_MEM_LIMIT_MB"] == "3000"
