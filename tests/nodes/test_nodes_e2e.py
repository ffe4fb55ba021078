"""Issue 33 proven through the faces a user touches: ``gpu-admission evaluate`` reading Node
objects from its files, and the webhook over HTTPS fed by a Node watch from the fake API
server (the real ``kubernetes`` client's list/watch, tests/kube_api_support.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import yaml

from tests.builders import make_review, patch_ops
from tests.kube_api_support import api_in_thread, running_api, write_kubeconfig
from tests.nodes_support import (
    PROTECT,
    ROUTE_T4,
    T4_POOL,
    dedicated_node,
    env_map,
    jax_pod,
    mig_node,
    t4_node,
    vllm_pod,
)
from tests.server_support import Server, free_port, poll_until, serving

THREE = [dedicated_node(), t4_node(), mig_node()]
SCHEDULER = {"op": "add", "path": "/spec/schedulerName", "value": "gpu-aware-scheduler"}
T4_ENV = [{"name": "NVIDIA_MEM_LIMIT_MB", "value": "1536"},
          {"name": "GPU_MEMORY_FRACTION", "value": "0.1"},
          {"name": "XLA_CLIENT_MEM_FRACTION", "value": "0.1"},
          {"name": "XLA_PYTHON_CLIENT_MEM_FRACTION", "value": "0.1"},
          {"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "true"}]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_admission", "evaluate", *args],
                          capture_output=True, text=True, timeout=60, check=False)


def write(path: Path, *docs: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


def rows(out: str) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in (json.loads(line) for line in out.splitlines() if line)}


def test_evaluate_reads_nodes_from_its_files(tmp_path: Path) -> None:
    nodes = write(tmp_path / "nodes.yaml", *THREE)
    pods = write(tmp_path / "pods.yaml", jax_pod(), vllm_pod())
    proc = cli("-f", nodes, "-f", pods, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    got = rows(proc.stdout)
    jax, vllm = got["jax-8"], got["vllm"]
    assert jax["patch"] == [
        SCHEDULER, {"op": "add", "path": "/spec/affinity", "value": PROTECT},
        {"op": "add", "path": "/metadata/annotations",
         "value": {"gpu-admission.io/mutated": "affinity,schedulerName"}}]
    assert jax["placement"] == (f"dedicated GPU: kept off the sharing pools ({T4_POOL}; "
                                "Node objects given)")
    assert vllm["placement"] == (f"routed to shared pool {T4_POOL} (time-slicing, 10 per "
                                 "15360 MiB card; Node objects given)")
    ops = vllm["patch"]
    assert {"op": "add", "path": "/spec/affinity", "value": ROUTE_T4} in ops
    env = next(op["value"] for op in ops if op["path"] == "/spec/containers/0/env")
    assert int(env_map({"env": env})["NVIDIA_MEM_LIMIT_MB"]) <= 1536  # 15,360 MiB / 10
    assert utilization(ops) <= 0.1  # vLLM's own setting: at most its share of the card


def utilization(ops: list[dict[str, Any]]) -> float:
    """The --gpu-memory-utilization the patch appends to the vLLM container's args."""
    (op,) = [op for op in ops if op["path"].startswith("/spec/containers/0/args")]
    assert op == {"op": "add", "path": "/spec/containers/0/args/-", "value": op["value"]}
    flag, value = op["value"].split("=")
    assert flag == "--gpu-memory-utilization"
    return float(value)


def test_evaluate_jax_untouched_where_no_pool_shares(tmp_path: Path) -> None:
    nodes = write(tmp_path / "nodes.yaml", dedicated_node(), mig_node())
    pods = write(tmp_path / "pods.yaml", jax_pod())
    proc = cli("-f", nodes, "-f", pods, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    assert rows(proc.stdout)["jax-8"]["patch"] == [
        SCHEDULER, {"op": "add", "path": "/metadata/annotations",
                    "value": {"gpu-admission.io/mutated": "schedulerName"}}]


def test_evaluate_mutated_output_is_a_fixed_point(tmp_path: Path) -> None:
    nodes = write(tmp_path / "nodes.yaml", *THREE)
    pods = write(tmp_path / "pods.yaml", jax_pod(), vllm_pod())
    first = cli("-f", nodes, "-f", pods, "-o", "yaml")
    assert first.returncode == 0, first.stderr
    mutated = [doc["mutated"] for doc in yaml.safe_load_all(first.stdout)]
    again = cli("-f", nodes, "-f", write(tmp_path / "mutated.yaml", *mutated), "-o", "json")
    assert again.returncode == 0, again.stderr
    assert [r["patch"] for r in rows(again.stdout).values()] == [[], []]


def test_evaluate_without_nodes_says_what_it_assumed(tmp_path: Path) -> None:
    proc = cli("-f", write(tmp_path / "pods.yaml", vllm_pod()))
    assert proc.returncode == 0, proc.stderr
    assert ("  placement: no GPU nodes visible: assumed the policy's declared pools and "
            "defaults (spec.nodePools, spec.memoryLimits); no declared pool selected: "
            "spec.memoryLimits defaults") in proc.stdout.splitlines()


def gpu_node_names(server: Server) -> set[str]:
    cache = server.state.nodes
    view = cache.view(server.state.policy) if cache is not None else None
    return {n.name for n in view.nodes} if view is not None else set()


async def decide(server: Server, pod: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    status, body, _ = await server.post("/mutate", make_review(pod))
    assert status == 200
    return body["response"], patch_ops(body["response"])



async def test_webhook_decides_from_a_node_watch(tmp_path: Path) -> None:
    async with running_api(tmp_path) as (api, kubeconfig):
        api.apply(*THREE)
        async with serving(tmp_path, node_source=str(kubeconfig)) as server:
            await poll_until(lambda: server.state.nodes is not None
                             and server.state.nodes.synced)
            # the 8-GPU JAX pod: no caps, kept off the time-sliced nodes
            response, ops = await decide(server, jax_pod())
            assert response["allowed"] is True
            assert ops == [SCHEDULER, {"op": "add", "path": "/spec/affinity", "value": PROTECT},
                           {"op": "add", "path": "/metadata/annotations",
                            "value": {"gpu-admission.io/mutated": "affinity,schedulerName"}}]
            # the one-GPU vLLM pod: routed to the T4 pool, capped at its share
            response, ops = await decide(server, vllm_pod())
            assert response["allowed"] is True
            by_path = {op["path"]: op["value"] for op in ops}
            assert by_path["/spec/affinity"] == ROUTE_T4
            assert by_path["/spec/containers/0/env"] == T4_ENV
            assert by_path["/spec/containers/0/args/-"] == "--gpu-memory-utilization=0.1"
            assert utilization(ops) <= 0.1
            after = jsonpatch.apply_patch(vllm_pod(), ops)
            response, ops = await decide(server, after)
            assert (response["allowed"], ops) == (True, [])
            # the T4 nodes go away (a watch event): nothing shares, the vLLM pod is dedicated
            api.delete(t4_node())
            await poll_until(lambda: gpu_node_names(server) == {"a100-1", "a100-mig-1"})
            response, ops = await decide(server, vllm_pod())
            assert ops == [SCHEDULER, {"op": "add", "path": "/metadata/annotations",
                                       "value": {"gpu-admission.io/mutated": "schedulerName"}}]



async def test_webhook_t4_pool_caps_and_jax_untouched_when_all_dedicated(tmp_path: Path) -> None:
    async with running_api(tmp_path) as (api, kubeconfig):
        api.apply(t4_node())
        async with serving(tmp_path, node_source=str(kubeconfig)) as server:
            await poll_until(lambda: server.state.nodes is not None
                             and server.state.nodes.synced)
            _, ops = await decide(server, vllm_pod())
            env = next(op["value"] for op in ops if op["path"] == "/spec/containers/0/env")
            assert int(env_map({"env": env})["NVIDIA_MEM_LIMIT_MB"]) <= 1536
            assert not any(op["path"] == "/spec/affinity" for op in ops)  # only T4 nodes
            api.delete(t4_node())
            api.apply(dedicated_node(), mig_node())
            await poll_until(lambda: gpu_node_names(server) == {"a100-1", "a100-mig-1"})
            response, ops = await decide(server, jax_pod())
            assert response["allowed"] is True
            assert ops == [SCHEDULER, {"op": "add", "path": "/metadata/annotations",
                                       "value": {"gpu-admission.io/mutated": "schedulerName"}}]



async def test_webhook_without_a_node_watch_assumes_the_policy(tmp_path: Path) -> None:
    async with serving(tmp_path) as server:
        response, _ = await decide(server, jax_pod())
        assert response["allowed"] is False  # as today: the default cap 0.2 < 0.9
        assert "select a dedicated GPU" in response["status"]["message"]


async def test_decision_log_says_which_pool_or_what_was_assumed(tmp_path: Path) -> None:
    """The webhook's decision record carries ``placement``: the pool read from the watch, or,
    while the Node watch cannot list (nothing listens at its API server), the assumption."""
    audit = tmp_path / "audit.log"
    dead = write_kubeconfig(tmp_path / "dead-kubeconfig", free_port())  # nothing listens
    async with serving(tmp_path / "first", node_source=str(dead),
                       audit_log=str(audit)) as server:
        response, _ = await decide(server, jax_pod())
        assert response["allowed"] is False  # as before issue 33: default caps, 0.9 > 0.2
        assert server.state.nodes is not None and not server.state.nodes.synced
    async with running_api(tmp_path) as (api, kubeconfig):
        api.apply(*THREE)
        async with serving(tmp_path / "second", node_source=str(kubeconfig),
                           audit_log=str(audit)) as server:
            await poll_until(lambda: server.state.nodes is not None
                             and server.state.nodes.synced)
            await decide(server, vllm_pod())
    assumed, routed = (orjson.loads(line)["placement"]
                       for line in audit.read_bytes().splitlines())
    assert assumed.startswith("no GPU nodes visible: assumed the policy's declared pools")
    assert routed == (f"routed to shared pool {T4_POOL} (time-slicing, 10 per 15360 MiB card; "
                      "nodes from the watch)")


def test_evaluate_lists_nodes_with_kubeconfig(tmp_path: Path) -> None:
    """``--kubeconfig``: the cluster's Nodes, listed by the real client from the fake API."""
    pods = write(tmp_path / "pods.yaml", jax_pod(), vllm_pod())
    with api_in_thread(tmp_path, *THREE) as kubeconfig:
        proc = cli("-f", pods, "--kubeconfig", str(kubeconfig), "-o", "json")
    assert proc.returncode == 0, proc.stderr
    got = rows(proc.stdout)
    assert got["vllm"]["placement"] == (f"routed to shared pool {T4_POOL} (time-slicing, 10 "
                                        "per 15360 MiB card; Node objects given)")
    assert {"op": "add", "path": "/spec/affinity", "value": PROTECT} in got["jax-8"]["patch"]


def test_evaluate_kubeconfig_that_cannot_list_is_a_clear_error(tmp_path: Path) -> None:
    dead = write_kubeconfig(tmp_path / "dead", free_port())
    proc = cli("-f", write(tmp_path / "pods.yaml", vllm_pod()), "--kubeconfig", str(dead))
    assert proc.returncode == 2
    # one --kubeconfig feeds the DRA snapshot and the Node view: the first list that fails
    # is named, with no traceback
    assert re.match(r"Error: --kubeconfig: listing (deviceclasses|nodes) failed: ", proc.stderr)
    assert "Traceback" not in proc.stderr


async def test_node_status_updates_do_not_rebuild_the_view(tmp_path: Path) -> None:
    """A MODIFIED event that changes nothing the policy reads (a kubelet status update) keeps
    the view; a label change replaces it."""
    async with running_api(tmp_path) as (api, kubeconfig):
        api.apply(t4_node())
        async with serving(tmp_path, node_source=str(kubeconfig)) as server:
            cache = server.state.nodes
            assert cache is not None
            await poll_until(lambda: cache.synced)
            first = cache.view(server.state.policy)
            modified = cache.metrics.events.labels("nodes", "MODIFIED")
            heartbeat = t4_node()
            heartbeat["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
            api.apply(heartbeat)
            await poll_until(lambda: modified._value.get() == 1)
            assert cache.view(server.state.policy) is first
            relabelled = t4_node()
            relabelled["metadata"]["labels"]["nvidia.com/gpu.replicas"] = "4"
            api.apply(relabelled)
            await poll_until(lambda: modified._value.get() == 2)
            view = cache.view(server.state.policy)
            assert view is not first and view is not None
            assert [p.replicas_per_gpu for p in view.pools] == [4]
