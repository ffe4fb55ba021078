"""Fractional GPUs, the scheduler side (issue 20, proof 2): the extender over HTTP with
``ExtenderArgs`` / ``ExtenderBindingArgs`` exactly as kube-scheduler sends them, against the
fake API server through the real ``kubernetes`` client: the ledger (list/watch), filter and
prioritize on it, and bind (reservation pods, the pod's own ConfigMap before
``pods/binding``, failures that leave nothing holding memory)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import yaml

from gpu_admission.core.vocab import (
    CONFIGMAP_LABEL,
    GPU_CONFIGMAP_ANNOTATION,
    GPU_CONFIGMAP_KEY,
    GPU_MEMORY_RESOURCE,
    GPU_UUID_ANNOTATION,
)
from gpu_admission.extender.app import STATE
from gpu_admission.placement.frag import Nodes, Shape, rank
from tests.extender.fractional_support import (
    CARD_MIB,
    NAMESPACE,
    TENANT,
    binding_args,
    frac_node,
    frac_pod,
    frac_policy,
    gpu_of,
    memory_by_gpu,
    reservations,
    stack,
    until,
    whole_pod,
)
from tests.extender_support import args_with_names

pytestmark = pytest.mark.asyncio


async def test_bind_writes_the_configmap_before_the_binding(tmp_path: Path) -> None:
    async with stack(tmp_path, frac_node("n1")) as s:
        await s.start_extender()
        pod, = s.create(frac_pod("llm-a", 20000))
        seen_at_binding: list[Any] = []

        def at_binding(method: str, path: str, obj: dict[str, Any]) -> None:
            if path.endswith("/pods/llm-a/binding"):
                cm = s.fake.get("configmaps", TENANT,
                                pod["metadata"]["annotations"][GPU_CONFIGMAP_ANNOTATION])
                seen_at_binding.append(cm and cm["data"][GPU_CONFIGMAP_KEY])
        s.fake.on_write.append(at_binding)

        assert await s.post("bind", binding_args(pod, "n1")) == {"Error": ""}

        uuid = s.plugin.published[0][1]
        assert seen_at_binding == [uuid]  # the ConfigMap held the GPU when the binding came
        order = [(m, p.rsplit("/", 2)[-2] if p.endswith("binding") else p.rsplit("/", 1)[-1])
                 for m, p, _ in s.fake.writes]
        assert order == [("POST", "pods"), ("POST", "configmaps"), ("POST", "llm-a")]
        reservation, = reservations(s.fake)
        assert reservation["spec"]["nodeName"] == "n1"
        assert reservation["metadata"]["namespace"] == NAMESPACE
        assert reservation["metadata"]["annotations"][GPU_UUID_ANNOTATION] == uuid
        bound = s.obj("pods", TENANT, "llm-a")
        assert bound["spec"]["nodeName"] == "n1"
        cm = s.obj("configmaps", TENANT, pod["metadata"]["annotations"][
            GPU_CONFIGMAP_ANNOTATION])
        assert cm["metadata"]["labels"][CONFIGMAP_LABEL] == "true"
        assert cm["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Pod", "name": "llm-a", "uid": pod["metadata"]["uid"],
             "controller": False, "blockOwnerDeletion": False}]
        state = s.state()
        await until(lambda: state.kube.ledger.usage() == {"n1": {uuid: 20000}}, "ledger")


async def test_cdi_strategy_writes_the_cdi_device_name(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(frac_policy(strategy="cdi-cri")))
    async with stack(tmp_path, frac_node("n1")) as s:
        await s.start_extender()
        pod, = s.create(frac_pod("llm-a", 20000))
        assert await s.post("bind", binding_args(pod, "n1")) == {"Error": ""}
        assert gpu_of(s.fake, pod) == f"k8s.device-plugin.nvidia.com/gpu={s.plugin.published[0][1]}"


async def test_a_gpu_opens_once_and_its_reservation_goes_with_its_last_pod(
        tmp_path: Path) -> None:
    async with stack(tmp_path, frac_node("n1")) as s:
        state = await s.start_extender()
        a, b = s.create(frac_pod("a", 30000), frac_pod("b", 30000))
        assert await s.post("bind", binding_args(a, "n1")) == {"Error": ""}
        assert await s.post("bind", binding_args(b, "n1")) == {"Error": ""}
        assert len(reservations(s.fake)) == 1  # b packed onto a's GPU
        assert gpu_of(s.fake, a) == gpu_of(s.fake, b)
        # a finishes (Succeeded frees its memory), b is deleted: the GPU is empty
        done = s.obj("pods", TENANT, "a")
        s.fake.apply({**done, "status": {"phase": "Succeeded"}})
        s.fake.delete(s.obj("pods", TENANT, "b"))
        await until(lambda: state.kube.ledger.usage() == {"n1": {gpu_of(s.fake, a) or "": 0}},
                    "memory freed")
        binder = state.binder
        assert await binder.release_empty(now=time.time()) == []  # within the grace period
        deleted = await binder.release_empty(now=time.time() + 3600)
        assert len(deleted) == 1
        assert reservations(s.fake) == []
        await until(lambda: state.kube.ledger.usage() == {}, "reservation gone")


async def test_fifty_parallel_binds_never_overcommit_a_card(tmp_path: Path) -> None:
    """2 nodes x 2 GPUs of 81920 MiB; 16384 MiB shares need 16384 + 1024 headroom free, so
    4 fit a card (65536 MiB; 16384 free < 17408): 16 of 50 bind, 34 get an Error."""
    async with stack(tmp_path, frac_node("n1"), frac_node("n2")) as s:
        await s.start_extender()
        pods = s.create(*(frac_pod(f"p{i:02d}", 16384) for i in range(50)))
        results = await asyncio.gather(*(s.post("bind", binding_args(p, f"n{1 + i % 2}"))
                                         for i, p in enumerate(pods)))
        errors = [r["Error"] for r in results if r["Error"]]
        assert len(results) - len(errors) == 16
        assert all("no GPU with 17408 MiB free" in e for e in errors), errors[:3]
        usage = memory_by_gpu(s.fake)
        assert sorted(usage.values()) == [65536] * 4
        assert all(v <= CARD_MIB for v in usage.values())
        assert len(reservations(s.fake)) == 4
        bound = [p for p in s.fake.objects["pods"].values()
                 if p["metadata"]["namespace"] == TENANT and p["spec"].get("nodeName")]
        assert len(bound) == 16
        # every failed bind left nothing: only the bound pods have ConfigMaps
        assert len(s.fake.objects["configmaps"]) == 16
        state = s.state()
        await until(lambda: {g: m for n in state.kube.ledger.usage().values()
                             for g, m in n.items()} == usage, "ledger = API")


async def test_a_restart_in_the_middle_rebuilds_the_same_ledger(tmp_path: Path) -> None:
    async with stack(tmp_path, frac_node("n1"), frac_node("n2")) as s:
        first = await s.start_extender()
        pods = s.create(*(frac_pod(f"p{i:02d}", 12288 + 4096 * (i % 3)) for i in range(20)))
        for i, pod in enumerate(pods[:9]):
            assert (await s.post("bind", binding_args(pod, f"n{1 + i % 2}")))["Error"] == ""
        await until(lambda: first.kube.ledger.usage() and
                    sum(m for n in first.kube.ledger.usage().values() for m in n.values())
                    == sum(memory_by_gpu(s.fake).values()), "first ledger caught up")
        before = first.kube.ledger.usage()
        await s.stop_extender()
        second = await s.start_extender()
        assert second.kube.ledger.usage() == before
        results = await asyncio.gather(*(s.post("bind", binding_args(p, f"n{1 + i % 2}"))
                                         for i, p in enumerate(pods[9:])))
        assert sum(1 for r in results if not r["Error"]) >= 1
        usage = memory_by_gpu(s.fake)
        assert all(v + 1024 <= CARD_MIB for v in usage.values()), usage
        assert len(reservations(s.fake)) == len(usage)


async def test_a_reservation_that_never_reports_fails_the_bind_and_is_removed(
        tmp_path: Path) -> None:
    async with stack(tmp_path, frac_node("n1")) as s:
        state = await s.start_extender(reservation_timeout=0.5)
        s.plugin.stall = True
        pod, = s.create(frac_pod("llm-a", 20000))
        error = (await s.post("bind", binding_args(pod, "n1")))["Error"]
        assert "did not publish its GPU UUID (annotation gpu-admission.io/gpu-uuid) within " \
               "0.5 s" in error
        assert f"reservation pod {NAMESPACE}/gpu-admission-reserve-" in error
        assert reservations(s.fake) == []  # deleted
        assert s.fake.objects["configmaps"] == {}
        assert not s.obj("pods", TENANT, "llm-a")["spec"].get("nodeName")
        await until(lambda: state.kube.ledger.usage() == {}, "nothing held")
        # the retry works once the node publishes again
        s.plugin.stall = False
        assert await s.post("bind", binding_args(pod, "n1")) == {"Error": ""}


async def test_a_foreign_configmap_under_the_pods_name_is_not_used(tmp_path: Path) -> None:
    async with stack(tmp_path, frac_node("n1")) as s:
        state = await s.start_extender()
        pod, = s.create(frac_pod("llm-a", 20000))
        name = pod["metadata"]["annotations"][GPU_CONFIGMAP_ANNOTATION]
        foreign = {"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": name, "namespace": TENANT},
                   "data": {GPU_CONFIGMAP_KEY: "GPU-someone-elses"}}
        s.create(foreign)
        error = (await s.post("bind", binding_args(pod, "n1")))["Error"]
        assert error == (f"ConfigMap {TENANT}/{name} already exists and was not created by "
                         f"gpu-admission for pod llm-a (UID {pod['metadata']['uid']}): not "
                         f"trusted, not used; delete it or recreate the pod")
        assert s.obj("configmaps", TENANT, name)["data"] == {
            GPU_CONFIGMAP_KEY: "GPU-someone-elses"}  # untouched
        assert not s.obj("pods", TENANT, "llm-a")["spec"].get("nodeName")
        assert reservations(s.fake) == []  # the GPU this bind opened is closed again
        await until(lambda: state.kube.ledger.usage() == {}, "nothing held")


async def test_filter_and_prioritize_read_the_ledger(tmp_path: Path) -> None:
    async with stack(tmp_path, frac_node("n1", gpus=1), frac_node("n2", gpus=1),
                     frac_node("n3", gpus=1), frac_node("s1", pool="sliced")) as s:
        s.create(whole_pod("trainer", "n3"))
        state = await s.start_extender()
        a, = s.create(frac_pod("a", 40000))
        assert await s.post("bind", binding_args(a, "n1")) == {"Error": ""}
        await until(lambda: bool(state.kube.ledger.usage()), "ledger")
        uuid = s.plugin.published[0][1]
        small, big = frac_pod("small", 20000), frac_pod("big", 50000)
        names = ["n1", "n2", "n3", "s1"]
        result = await s.post("filter", args_with_names(small, names))
        assert result == {
            "Nodes": None, "NodeNames": ["n1", "n2"], "Error": "",
            "FailedAndUnresolvableNodes": {},
            "FailedNodes": {
                "n3": "no GPU with 21024 MiB free (20000 MiB share + 1024 MiB headroom, card "
                      "81920 MiB): no open GPU; 0 whole GPUs free to open (1 allocatable, 1 "
                      "held by whole-GPU pods, 0 by reservations)",
                "s1": "not in a fractional node pool (no spec.nodePools[] with sharing: "
                      "fractional whose nodeSelector matches the node's labels)"}}
        result = await s.post("filter", args_with_names(big, names))
        assert result["NodeNames"] == ["n2"]
        assert result["FailedNodes"]["n1"] == (
            f"no GPU with 51024 MiB free (50000 MiB share + 1024 MiB headroom, card 81920 "
            f"MiB): best open GPU {uuid} has 41920 MiB free of 1 open; 0 whole GPUs free to "
            f"open (1 allocatable, 0 held by whole-GPU pods, 1 by reservations)")
        # packing: the open GPU (tighter fit) beats a new one; no fit scores 0
        scores = {h["Host"]: h["Score"] for h in
                      await s.post("prioritize", args_with_names(small, names))}
        assert scores["n1"] > scores["n2"] > 0
        assert scores["n3"] == scores["s1"] == 0


async def test_other_pods_are_bound_as_the_default_binder_does(tmp_path: Path) -> None:
    async with stack(tmp_path, frac_node("n1")) as s:
        await s.start_extender()
        plain = whole_pod("trainer", "")
        plain["spec"].pop("nodeName")
        stored, = s.create(plain)
        assert await s.post("bind", binding_args(stored, "n1")) == {"Error": ""}
        assert s.fake.writes == [("POST", f"/api/v1/namespaces/{TENANT}/pods/trainer/binding",
                                  {"apiVersion": "v1", "kind": "Binding",
                                   "metadata": {"name": "trainer", "namespace": TENANT,
                                                "uid": stored["metadata"]["uid"]},
                                   "target": {"apiVersion": "v1", "kind": "Node",
                                              "name": "n1"}})]
        # a replaced pod (other UID) is not bound
        args = {**binding_args(stored, "n1"), "PodUID": "another-uid"}
        error = (await s.post("bind", args))["Error"]
        assert error.startswith(f"pod {TENANT}/trainer has UID ")


async def test_fractional_nodes_advertise_gpu_memory(tmp_path: Path) -> None:
    async with stack(tmp_path, frac_node("n1", gpus=4), frac_node("s1", pool="sliced")) as s:
        state = await s.start_extender()
        assert await state.binder.advertise() == ["n1"]
        node = s.obj("nodes", "", "n1")
        assert node["status"]["capacity"][GPU_MEMORY_RESOURCE] == str(4 * CARD_MIB)
        assert s.fake.writes[-1] == ("PATCH", "/api/v1/nodes/n1/status", {
            "status": {"capacity": {GPU_MEMORY_RESOURCE: "327680"}}})
        assert GPU_MEMORY_RESOURCE not in s.obj("nodes", "", "s1")["status"]["capacity"]
        await until(lambda: state.kube.nodes["n1"]["status"]["capacity"].get(
            GPU_MEMORY_RESOURCE) == "327680", "watch saw it")
        assert await state.binder.advertise() == []  # idempotent


@pytest.mark.parametrize("body, error", [
    ({"PodName": "a", "PodNamespace": "x", "PodUID": "u"}, "Node: expected a non-empty "
     "string, got null"),
    ({"PodName": 3, "PodNamespace": "x", "PodUID": "u", "Node": "n"}, "PodName: expected a "
     "non-empty string, got a number"),
    ([], "body: expected an ExtenderBindingArgs object, got an array"),
], ids=["no-node", "name-not-string", "not-object"])
async def test_malformed_binding_args_get_400(tmp_path: Path, body: Any, error: str) -> None:
    async with stack(tmp_path, frac_node("n1")) as s:
        await s.start_extender()
        async with s.session.post(s.url("bind"), data=orjson.dumps(body),
                                  headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 400
            assert await resp.json() == {"error": error}


async def test_housekeeping_runs_on_the_lease_holder_only(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    async with stack(tmp_path, frac_node("n1")) as s:
        state = await s.start_extender()
        binder = state.binder
        object.__setattr__(binder.state, "config", replace(
            binder.state.config, leader_lease=f"{NAMESPACE}/gpu-aware-scheduler"))
        monkeypatch.setenv("POD_NAME", "gpu-aware-scheduler-7d9f-abcde")
        assert await binder.is_leader() is False  # no Lease yet
        def lease(holder: str) -> dict[str, Any]:
            return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": "gpu-aware-scheduler", "namespace": NAMESPACE},
                    "spec": {"holderIdentity": holder}}
        s.create(lease("gpu-aware-scheduler-7d9f-zzzzz_1234"))
        assert await binder.is_leader() is False  # the other replica holds it
        s.create(lease("gpu-aware-scheduler-7d9f-abcde_5678"))
        assert await binder.is_leader() is True


async def test_an_empty_reservation_being_deleted_takes_no_new_pod(tmp_path: Path) -> None:
    async with stack(tmp_path, frac_node("n1", gpus=2)) as s:
        state = await s.start_extender()
        a, b = s.create(frac_pod("a", 30000), frac_pod("b", 30000))
        assert await s.post("bind", binding_args(a, "n1")) == {"Error": ""}
        first = gpu_of(s.fake, a)
        s.fake.delete(s.obj("pods", TENANT, "a"))
        await until(lambda: state.kube.ledger.usage() == {"n1": {first or "": 0}}, "freed")
        s.fake.failures[("DELETE", "/pods/gpu-admission-reserve-")] = 500  # deletion stalls
        assert len(await state.binder.release_empty(now=time.time() + 3600)) == 1
        assert len(reservations(s.fake)) == 1  # still there (the delete failed) ...
        assert await s.post("bind", binding_args(b, "n1")) == {"Error": ""}
        assert gpu_of(s.fake, b) != first  # ... but closed: b opened the other GPU


async def test_readyz_and_metrics_report_the_ledger_and_binds(tmp_path: Path) -> None:
    async with stack(tmp_path, frac_node("n1")) as s:
        await s.start_extender(reservation_timeout=0.3)
        pod, other = s.create(frac_pod("a", 20000), frac_pod("b", 20000))
        assert await s.post("bind", binding_args(pod, "n1")) == {"Error": ""}
        s.fake.failures[("POST", "/pods/b/binding")] = 500  # b packs onto a's GPU, then fails
        assert (await s.post("bind", binding_args(other, "n1")))["Error"].startswith(
            f"binding {TENANT}/b to n1: HTTP 500")
        # the failed bind removed its ConfigMap: only a's is left
        assert [k[1] for k in s.fake.objects["configmaps"]] == [
            pod["metadata"]["annotations"][GPU_CONFIGMAP_ANNOTATION]]
        base = s.url("bind").rsplit("/scheduler/", 1)[0]
        async with s.session.get(f"{base}/readyz") as resp:
            body = await resp.json()
        assert body["ledger"] == {"synced": True, "open_gpus": 1}
        async with s.session.get(f"{base}/metrics") as resp:
            text = await resp.text()
        assert 'gpu_admission_extender_binds_total{kind="fractional",result="bound"} 1.0' in text
        assert 'gpu_admission_extender_binds_total{kind="fractional",result="error"} 1.0' in text
        assert 'gpu_admission_extender_reservations_total{action="created"} 1.0' in text
        assert "gpu_admission_extender_ledger_synced 1.0" in text


@pytest.mark.parametrize("value", ["12Gi", "0", "-5", ""], ids=["unit", "zero", "negative",
                                                               "empty"])
async def test_a_bad_share_annotation_is_refused_naming_it(tmp_path: Path, value: str) -> None:
    async with stack(tmp_path, frac_node("n1")) as s:
        await s.start_extender()
        pod = frac_pod("bad", 1000)
        pod["metadata"]["annotations"]["gpu-admission.io/gpu-memory"] = value
        stored, = s.create(pod)
        reason = (f"annotation gpu-admission.io/gpu-memory: expected a positive integer (MiB), "
                  f"got {value!r}")
        result = await s.post("filter", args_with_names(stored, ["n1"]))
        assert (result["NodeNames"], result["FailedNodes"]) == ([], {"n1": reason})
        assert await s.post("bind", binding_args(stored, "n1")) == {
            "Error": f"pod {TENANT}/bad: {reason}; not bound"}
        assert s.fake.writes == []


async def test_a_failed_opener_leaves_the_gpu_to_the_pods_that_joined_it(
        tmp_path: Path) -> None:
    """a opens a GPU, b joins it while it opens; a's binding fails: the reservation stays
    (b uses the GPU), and a's ConfigMap is gone."""
    async with stack(tmp_path, frac_node("n1", gpus=1)) as s:
        state = await s.start_extender()
        s.plugin.delay = 0.3  # b arrives while the GPU is opening
        a, b = s.create(frac_pod("a", 20000), frac_pod("b", 20000))
        s.fake.failures[("POST", "/pods/a/binding")] = 500
        first = asyncio.create_task(s.post("bind", binding_args(a, "n1")))
        await until(lambda: bool(reservations(s.fake)), "reservation created")
        second = await s.post("bind", binding_args(b, "n1"))
        assert second == {"Error": ""}
        assert (await first)["Error"].startswith(f"binding {TENANT}/a to n1: HTTP 500")
        reservation, = reservations(s.fake)
        uuid = reservation["metadata"]["annotations"][GPU_UUID_ANNOTATION]
        assert gpu_of(s.fake, b) == uuid
        assert gpu_of(s.fake, a) is None
        await until(lambda: state.kube.ledger.usage() == {"n1": {uuid: 20000}}, "b only")


async def test_filter_prioritize_bind_agree_with_simulate(tmp_path: Path) -> None:
    """Issue 32: one rule. The extender's ranking over HTTP (prioritize's 10 and the card
    bind takes) is the simulator's on the same state: the ledger after three binds rebuilt
    as ``simulate``'s arrays (milli-GPU per card; 81920 MiB cards, 1024 MiB headroom)."""
    card = 81920  # MiB, the fractional pool's memoryMiB in the test policy
    nodes_ = [frac_node("n1", gpus=2), frac_node("n2", gpus=2), frac_node("n3", gpus=1)]
    for n in nodes_:
        n["status"]["allocatable"].update({"cpu": "64", "memory": "256Gi"})
    async with stack(tmp_path, *nodes_) as s:
        # a CPU pod takes 62 of n2's 64 CPUs: n2 can no longer host the typical shapes
        # (4-64 CPUs), so its free GPU counts as fragmented
        cpu_hog = whole_pod("cpu-hog", "n2", gpus=0)
        cpu_hog["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "62",
                                                                      "memory": "8Gi"}}
        s.create(cpu_hog)
        state = await s.start_extender()
        requests = s.extenders[-1][0].app[STATE].requests
        assert requests is not None
        await until(lambda: requests.used.get("n2") == [62000, 8192], "requests seen")
        for name, mib, node in (("a", 60000, "n1"), ("b", 20000, "n2"), ("c", 40000, "n3")):
            pod, = s.create(frac_pod(name, mib))
            assert await s.post("bind", binding_args(pod, node)) == {"Error": ""}
        await until(lambda: len(state.kube.ledger.usage()) == 3, "three GPUs open")
        small, = s.create(frac_pod("small", 16000))
        names = ["n1", "n2", "n3"]
        assert (await s.post("filter", args_with_names(small, names)))["NodeNames"] == names
        scores = {h["Host"]: h["Score"] for h in
                  await s.post("prioritize", args_with_names(small, names))}
        # the shapes the extender measured against (its own placer)
        typical = s.extenders[-1][0].app[STATE].placer.typical()
        # the simulator's state: cards in milli-GPU, open GPUs first, then GPUs to open
        used = {"n1": [60000], "n2": [20000], "n3": [40000]}
        free_whole = {"n1": 1, "n2": 1, "n3": 0}
        nodes = Nodes.build(names, [""] * 3, [64000, 2000, 64000],
                            [262144, 262144 - 8192, 262144],
                            [[(card - u) * 1000 // card for u in used[n]]
                             + [1000] * free_whole[n] for n in names])
        share = -(-16000 * 1000 // card)
        ranking = rank(nodes, Shape(0, 0, share, 1), typical,
                       headroom_milli=-(-(16000 + 1024) * 1000 // card) - share)
        best = {names[int(ranking.rows[i])] for i in ranking.best()}
        assert {n for n, v in scores.items() if v == 10} == best
        assert all(scores[n] < 10 for n in names if n not in best)
        target = sorted(best)[0]
        row = names.index(target)
        card_index = int(ranking.card[list(ranking.rows).index(row)])
        assert await s.post("bind", binding_args(small, target)) == {"Error": ""}
        await until(lambda: sum(len(g) for g in state.kube.ledger.usage().values()) >= 3,
                    "bound")
        gpus = state.kube.ledger.usage()[target]
        if card_index < len(used[target]):  # an open GPU: the share is added to it
            assert sorted(gpus.values()) == sorted(
                [u + (16000 if i == card_index else 0) for i, u in enumerate(used[target])])
        else:  # a GPU to open: a second GPU appears on the node holding the share
            assert sorted(gpus.values()) == sorted([*used[target], 16000])


def _unbound(name: str, *, gpus: int, cpu: str, memory: str) -> dict[str, Any]:
    """A pending pod of the gpu-aware profile: a training pod asking ``gpus`` whole cards, or
    a CPU pod (``gpus`` 0)."""
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": TENANT, "uid": f"uid-{name}",
                         "labels": {"gpu-admission.io/workload": "training"} if gpus else {}},
            "spec": {"schedulerName": "gpu-aware-scheduler", "containers": [{
                "name": "main", "image": "busybox", "resources": resources}]},
            "status": {"phase": "Pending"}}


async def test_whole_gpu_and_cpu_pods_agree_with_simulate(tmp_path: Path) -> None:
    """Issue 32, one rule for whole-GPU and CPU pods too: on the entry every pod of the
    profile reaches (``-nonfractional`` verbs), filter passes every node, prioritize's 10s
    are the simulator's best (``rank`` on the same state: whole cards the ledger holds free,
    CPU and memory left by the pods bound), and a fractional pod gets a neutral answer there
    (the binding entry decides it)."""
    card = 81920
    nodes_ = [frac_node("n1", gpus=2), frac_node("n2", gpus=2), frac_node("n3", gpus=1),
              frac_node("cpu1", gpus=0, pool="none")]
    for n in nodes_:
        n["status"]["allocatable"].update({"cpu": "64", "memory": "256Gi"})
    async with stack(tmp_path, *nodes_) as s:
        hog = whole_pod("cpu-hog", "n2", gpus=0)
        hog["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "52",
                                                                  "memory": "8Gi"}}
        trainer = whole_pod("trainer", "n3", gpus=1)
        s.create(hog, trainer)
        state = await s.start_extender()
        app_state = s.extenders[-1][0].app[STATE]
        requests = app_state.requests
        assert requests is not None
        await until(lambda: requests.used.get("n2") == [52000, 8192]
                    and state.kube.ledger.view("n3").whole_pod_gpus == 1, "pods seen")
        pod, = s.create(frac_pod("a", 60000))
        assert await s.post("bind", binding_args(pod, "n1")) == {"Error": ""}
        await until(lambda: len(state.kube.ledger.usage()) == 1, "a GPU open")
        names = ["n1", "n2", "n3", "cpu1"]
        # the simulator's state: n1 one card 60000 MiB used + one free, n2 two free cards
        # but 12 CPUs left, n3 its only card held by the trainer, cpu1 no GPU
        nodes = Nodes.build(names, [""] * 4, [64000, 12000, 64000, 64000],
                            [262144, 262144 - 8192, 262144, 262144],
                            [[(card - 60000) * 1000 // card, 1000], [1000, 1000], [], []])
        small = frac_pod("small", 8000)
        assert await s.post("filter-nonfractional", args_with_names(small, names)) == {
            "Nodes": None, "NodeNames": names, "FailedNodes": {},
            "FailedAndUnresolvableNodes": {}, "Error": ""}
        assert {h["Score"] for h in await s.post(
            "prioritize-nonfractional", args_with_names(small, names))} == {0}
        for pod_, shape in ((_unbound("train", gpus=1, cpu="8", memory="32Gi"),
                             Shape(8000, 32768, 1000, 1)),
                            (_unbound("web", gpus=0, cpu="2", memory="4Gi"),
                             Shape(2000, 4096, 0, 0))):
            filtered = await s.post("filter-nonfractional", args_with_names(pod_, names))
            assert filtered["NodeNames"] == names
            scores = {h["Host"]: h["Score"] for h in await s.post(
                "prioritize-nonfractional", args_with_names(pod_, names))}
            ranking = rank(nodes, shape, app_state.placer.typical())
            by_name = np.argsort(np.argsort(names))  # the last tie: node name
            ranking = replace(ranking, tie=by_name[ranking.rows])
            best = {names[int(ranking.rows[i])] for i in ranking.best()}
            assert {n for n, v in scores.items() if v == 10} == best, (shape, scores)
            fits = {names[int(r)] for r in ranking.rows}
            assert all(0 < scores[n] < 10 for n in fits - best)
            assert all(scores[n] == 0 for n in set(names) - fits)
            assert len(fits) > len(best)  # the ranking told nodes apart
