"""Helpers for the fractional-GPU tests (no tests here): a fractional policy, Node and Pod
objects in the shape the API server serves and the webhook writes, the extender app on a
free port next to the fake API server (``tests/kube_api_support.py``), and a stand-in for
the kubelet + device plugin + ``gpu-admission reserve`` that gives each reservation pod a
free GPU of its node and publishes the UUID on it.
"""

from __future__ import annotations

import asyncio
import copy
import random
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from aiohttp import web

from gpu_admission.core.vocab import (
    GPU_CONFIGMAP_ANNOTATION,
    GPU_CONFIGMAP_KEY,
    GPU_CONFIGMAP_PREFIX,
    GPU_MEMORY_ANNOTATION,
    GPU_MEMORY_RESOURCE,
    GPU_UUID_ANNOTATION,
    RESERVATION_LABEL,
)
from gpu_admission.extender.app import STATE, ExtenderConfig, ExtenderState, create_app
from gpu_admission.extender.binder import BindConfig, Binder, KubeState
from gpu_admission.server.logs import make_logger
from tests.extender_support import make_node
from tests.kube_api_support import FakeApiServer, running_api
from tests.server_support import free_port

CARD_MIB = 81920  # A100 80GB, MiB
HEADROOM_MIB = 1024
POOL_LABEL = "gpu-admission.io/pool"
NAMESPACE = "gpu-admission"  # install namespace
TENANT = "team-a"


def frac_policy(*, strategy: str = "envvar", headroom: int = HEADROOM_MIB) -> dict[str, Any]:
    return {"apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUSharingPolicy",
            "metadata": {"name": "frac"},
            "spec": {"nodePools": [
                {"name": "frac", "nodeSelector": {POOL_LABEL: "frac"}, "sharing": "fractional",
                 "memoryMiB": CARD_MIB, "deviceListStrategy": strategy},
                {"name": "sliced", "nodeSelector": {POOL_LABEL: "sliced"},
                 "sharing": "time-slicing", "replicasPerGPU": 4, "memoryMiB": CARD_MIB}],
                "placement": {"memoryHeadroomMiB": headroom}}}


def frac_node(name: str, gpus: int = 2, pool: str = "frac") -> dict[str, Any]:
    """A node of a fractional pool: whole GPUs advertised (no time-slicing)."""
    node = make_node(name, gpus=gpus, replicas=1)
    node["metadata"]["labels"][POOL_LABEL] = pool
    node["kind"], node["apiVersion"] = "Node", "v1"
    return node


def frac_pod(name: str, share_mib: int, *, namespace: str = TENANT,
             request_uid: str = "") -> dict[str, Any]:
    """A pod as the webhook leaves a fractional pod: the two annotations, the
    ConfigMap-backed NVIDIA_VISIBLE_DEVICES (optional: false), the gpu-memory request and no
    nvidia.com/gpu."""
    uid = request_uid or f"00000000-0000-4000-8000-{zlib.crc32(name.encode()):012d}"
    cm = GPU_CONFIGMAP_PREFIX + uid
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"gpu-admission.io/workload": "inference"},
                         "annotations": {GPU_MEMORY_ANNOTATION: str(share_mib),
                                         GPU_CONFIGMAP_ANNOTATION: cm}},
            "spec": {"schedulerName": "gpu-aware-scheduler",
                     "nodeSelector": {POOL_LABEL: "frac"},
                     "containers": [{
                         "name": "vllm", "image": "vllm/vllm-openai:v0.6.3",
                         "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {
                             "configMapKeyRef": {"name": cm, "key": GPU_CONFIGMAP_KEY,
                                                 "optional": False}}}],
                         "resources": {"requests": {GPU_MEMORY_RESOURCE: str(share_mib)},
                                       "limits": {GPU_MEMORY_RESOURCE: str(share_mib)}}}]},
            "status": {"phase": "Pending"}}


def whole_pod(name: str, node: str, gpus: int = 1) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": TENANT},
            "spec": {"nodeName": node, "containers": [{
                "name": "train", "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Running"}}


def binding_args(pod: dict[str, Any], node: str) -> dict[str, Any]:
    """ExtenderBindingArgs exactly as kube-scheduler sends them (extender/v1: Go field
    names, no json tags)."""
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"], "Node": node}


@dataclass
class DevicePlugin:
    """Plays the kubelet, the device plugin and ``gpu-admission reserve``: a reservation pod
    created on a node gets a GPU no other reservation/whole pod holds, and its UUID appears
    on the pod after ``delay`` seconds (never when ``stall``)."""

    fake: FakeApiServer
    delay: float = 0.02
    stall: bool = False
    published: list[tuple[str, str]] = field(default_factory=list)  # (reservation, uuid)
    #: publication after delay + uniform(0, jitter) seconds (UUIDs at random moments)
    jitter: float = 0.0
    rng: random.Random = field(default_factory=lambda: random.Random(7))

    def __call__(self, method: str, path: str, obj: dict[str, Any]) -> None:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if (method == "POST" and path.endswith("/pods") and obj.get("kind") == "Pod"
                and labels.get(RESERVATION_LABEL) == "true" and not self.stall):
            delay = self.delay + (self.rng.uniform(0, self.jitter) if self.jitter else 0.0)
            asyncio.get_running_loop().call_later(delay, self._publish,
                                                  obj["metadata"]["name"])

    def _publish(self, name: str) -> None:
        stored = self.fake.get("pods", NAMESPACE, name)
        if stored is None:
            return
        node = stored["spec"]["nodeName"]
        node_obj = self.fake.get("nodes", "", node)
        assert node_obj is not None
        held = {((p["metadata"].get("annotations") or {}).get(GPU_UUID_ANNOTATION))
                for p in self.fake.objects["pods"].values()
                if p["spec"].get("nodeName") == node}
        count = int(node_obj["status"]["allocatable"]["nvidia.com/gpu"])
        free = [f"GPU-{node}-{i}" for i in range(count) if f"GPU-{node}-{i}" not in held]
        assert free, f"device plugin: no free GPU on {node} for {name}"
        pod = copy.deepcopy(stored)
        pod["metadata"].setdefault("annotations", {})[GPU_UUID_ANNOTATION] = free[0]
        pod["status"] = {"phase": "Running"}
        self.fake.apply(pod)
        self.published.append((name, free[0]))


@dataclass(frozen=True)
class Running:
    """A started extender's ledger watch and binder (both present: started with --kube)."""

    kube: KubeState
    binder: Binder


def running(state: ExtenderState) -> Running:
    assert state.kube is not None and state.binder is not None
    return Running(state.kube, state.binder)


@dataclass
class Stack:
    fake: FakeApiServer
    kubeconfig: Path
    plugin: DevicePlugin
    session: aiohttp.ClientSession
    tmp: Path
    extenders: list[tuple[web.AppRunner, int]] = field(default_factory=list)

    def state(self, i: int = -1) -> Running:
        return running(self.extenders[i][0].app[STATE])

    def obj(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        """A stored object that must exist."""
        found = self.fake.get(resource, namespace, name)
        assert found is not None, f"{resource} {namespace}/{name} not found"
        return found

    def url(self, verb: str, i: int = -1) -> str:
        return f"http://127.0.0.1:{self.extenders[i][1]}/scheduler/{verb}"

    async def start_extender(self, *, reservation_timeout: float = 5.0) -> Running:
        policy = self.tmp / "policy.yaml"
        if not policy.exists():
            policy.write_text(yaml.safe_dump(frac_policy()))
        config = ExtenderConfig(prometheus_url="http://127.0.0.1:9", policy_path=policy,
                                kube_source=str(self.kubeconfig),
                                bind=BindConfig(namespace=NAMESPACE, image="gpu-admission:test",
                                                reservation_timeout_seconds=reservation_timeout,
                                                housekeeping_seconds=3600))
        app = create_app(config, logger=make_logger("warning"))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        self.extenders.append((runner, port))
        state = app[STATE]
        await until(lambda: state.kube is not None and state.kube.synced, "ledger synced")
        return running(state)

    async def stop_extender(self, i: int = -1) -> None:
        runner, _ = self.extenders.pop(i)
        await runner.cleanup()

    async def post(self, verb: str, body: Any) -> Any:
        async with self.session.post(self.url(verb), data=orjson.dumps(body),
                                     headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 200, await resp.text()
            return orjson.loads(await resp.read())

    def create(self, *objs: dict[str, Any]) -> list[dict[str, Any]]:
        """Objects created as a user would (stored with a UID); returns the stored copies."""
        out = []
        for obj in objs:
            self.fake.apply(obj)
            meta = obj["metadata"]
            resource = {"Pod": "pods", "Node": "nodes", "ConfigMap": "configmaps",
                        "Lease": "leases"}[obj["kind"]]
            out.append(self.obj(resource, meta.get("namespace", ""), meta["name"]))
        return out


async def until(cond: Any, what: str, within: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@asynccontextmanager
async def stack(tmp: Path, *nodes: dict[str, Any]) -> AsyncIterator[Stack]:
    async with running_api(tmp) as (fake, kubeconfig):
        fake.apply(*nodes)
        plugin = DevicePlugin(fake)
        fake.on_write.append(plugin)
        async with aiohttp.ClientSession() as session:
            s = Stack(fake, kubeconfig, plugin, session, tmp)
            try:
                yield s
            finally:
                while s.extenders:
                    await s.stop_extender()


def gpu_of(fake: FakeApiServer, pod: dict[str, Any]) -> str | None:
    """The GPU the pod's ConfigMap names (None: no ConfigMap)."""
    meta = pod["metadata"]
    cm = fake.get("configmaps", meta["namespace"], meta["annotations"][GPU_CONFIGMAP_ANNOTATION])
    return None if cm is None else cm["data"][GPU_CONFIGMAP_KEY]


def memory_by_gpu(fake: FakeApiServer) -> dict[str, int]:
    """MiB given out per GPU, from the API alone (bound fractional pods + their ConfigMaps)."""
    out: dict[str, int] = {}
    for pod in fake.objects["pods"].values():
        ann = pod["metadata"].get("annotations") or {}
        if GPU_MEMORY_ANNOTATION in ann and pod["spec"].get("nodeName"):
            gpu = gpu_of(fake, pod)
            assert gpu is not None, f"bound pod {pod['metadata']['name']} without ConfigMap"
            out[gpu] = out.get(gpu, 0) + int(ann[GPU_MEMORY_ANNOTATION])
    return out


def reservations(fake: FakeApiServer) -> list[dict[str, Any]]:
    return [p for p in fake.objects["pods"].values()
            if (p["metadata"].get("labels") or {}).get(RESERVATION_LABEL) == "true"]
