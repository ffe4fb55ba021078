"""Burst benchmark for fractional pools (issue 36): many fractional pods at once through the
extender's HTTP verbs, in kube-scheduler's order, against the fake API server. Prints
figures; asserts nothing.

Three processes, as in a cluster: the fake API server (``tests/kube_api_support.py``) with
a kubelet + device plugin + ``gpu-admission reserve`` stand-in that publishes each
reservation pod's UUID ``--uuid-delay`` seconds after its creation; the real extender,
started by its CLI (``python -m gpu_admission extender --kube KUBECONFIG``: its list/watch,
its bind and its thread pool, exactly as deployed); and this process, a model of
kube-scheduler:

* the scheduling cycle is serial: for one pod, ``filter`` (``NodeNames``, the shipped
  ``nodeCacheCapable: true``) over every node, ``prioritize`` over those that pass, the
  highest score wins (ties at random, as ``selectHost``), the pod is assumed, and the next
  cycle starts at once;
* the binding cycle is asynchronous (``pkg/scheduler/schedule_one.go`` runs it in a
  goroutine): ``bind`` is sent without waiting, so the next pod's filter and prioritize run
  while earlier binds are in flight;
* a refused bind (``Error`` set) sends the pod back after kube-scheduler's initial back-off
  (1 s, ``podInitialBackoffSeconds``); a pod no node passes waits as unschedulable and is
  tried again after a bind fails (memory came free) or at the end of the burst; still
  unplaced then, it stays Pending.

``--one-by-one`` waits for each bind before the next cycle (the packing a burst should
match). Figures, per mix: pods bound and Pending; cards opened (distinct GPUs the bound pods'
ConfigMaps name) against the shares' largest-first packing with ``memoryHeadroomMiB`` (the
fewest cards first-fit-decreasing needs); cards past their memory (> card) or past the
headroom (> card - headroom); binds refused; bind latency (from sending the bind to its
answer, which comes after the stored binding) p50/p95, split into binds onto a card whose
UUID was already published and binds that waited for one (for those, also the time from the
publication to the answer: the part that is the extender's own).

Mixes: ``--pods 300`` shares of 5-40 GiB (uniform whole GiB) on 16 nodes x 8 A100 80 GB, and
the issue's second mix, 40 pods of 48 GiB on 4 x 8 (one per card at most).

Run: ``python benchmarks/burst.py [--pods 300] [--seed 36] [--uuid-delay 0.5]
[--one-by-one]``. The extender's tree is the one on ``PYTHONPATH``, so the same file
measures another checkout (``PYTHONPATH=/path/to/main python benchmarks/burst.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import copy
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import orjson
import yaml

from gpu_admission.core.vocab import (
    GPU_CONFIGMAP_ANNOTATION,
    GPU_CONFIGMAP_KEY,
    GPU_MEMORY_ANNOTATION,
    GPU_UUID_ANNOTATION,
    RESERVATION_LABEL,
)

CARD_MIB = 81920  # A100 80 GB
HEADROOM_MIB = 1024
PUBLISHED_AT = "bench.gpu-admission.io/published-at"  # CLOCK_MONOTONIC of the publication
BACKOFF_S = 1.0  # kube-scheduler's podInitialBackoffSeconds
JSON = {"Content-Type": "application/json"}


# --- the fake API server, in its own process ----------------------------------------------

def serve_api(tmp: str, nodes: int, gpus: int, delay: float, latency: float,
              conn: Connection) -> None:
    """Child process: the fake API server holding the nodes, and a device plugin that
    publishes each reservation pod's UUID ``delay`` s after its creation (stamped with the
    monotonic time of publication, comparable across processes)."""
    asyncio.run(_serve_api(Path(tmp), nodes, gpus, delay, latency, conn))


async def _serve_api(tmp: Path, nodes: int, gpus: int, delay: float, latency: float,
                     conn: Connection) -> None:
    from tests.extender.fractional_support import DevicePlugin, frac_node  # noqa: PLC0415
    from tests.kube_api_support import running_api  # noqa: PLC0415

    class StampingPlugin(DevicePlugin):
        def _publish(self, name: str) -> None:
            super()._publish(name)
            stored = self.fake.get("pods", "gpu-admission", name)
            if stored is not None and stored["metadata"]["annotations"].get(
                    GPU_UUID_ANNOTATION):
                pod = copy.deepcopy(stored)
                pod["metadata"]["annotations"][PUBLISHED_AT] = repr(time.monotonic())
                self.fake.apply(pod)

    async with running_api(tmp) as (fake, kubeconfig):
        fake.latency = latency
        fake.apply(*(frac_node(f"node-{i:02d}", gpus=gpus) for i in range(nodes)))
        fake.on_write.append(StampingPlugin(fake, delay=delay))
        conn.send(str(kubeconfig))
        await asyncio.to_thread(conn.recv)  # until the parent says stop


# --- the model of kube-scheduler --------------------------------------------------------------

@dataclass
class Bind:
    pod: str
    start: float  # CLOCK_MONOTONIC
    end: float = 0.0
    error: str = ""


@dataclass
class Scheduler:
    session: aiohttp.ClientSession
    base: str  # http://127.0.0.1:PORT/scheduler
    nodes: list[str]
    rng: random.Random
    one_by_one: bool
    binds: list[Bind] = field(default_factory=list)
    queue: collections.deque[dict[str, Any]] = field(default_factory=collections.deque)
    unschedulable: list[dict[str, Any]] = field(default_factory=list)
    inflight: set[asyncio.Task[None]] = field(default_factory=set)
    bound: set[str] = field(default_factory=set)
    cycles: int = 0

    async def post(self, verb: str, body: Any) -> Any:
        async with self.session.post(f"{self.base}/{verb}", data=orjson.dumps(body),
                                     headers=JSON) as resp:
            return orjson.loads(await resp.read())

    async def cycle(self, pod: dict[str, Any]) -> None:
        self.cycles += 1
        result = await self.post("filter", {"Pod": pod, "NodeNames": self.nodes})
        names = result.get("NodeNames") or []
        if not names:
            self.unschedulable.append(pod)
            return
        scores = await self.post("prioritize", {"Pod": pod, "NodeNames": names})
        best = max(h["Score"] for h in scores)
        host = self.rng.choice([h["Host"] for h in scores if h["Score"] == best])
        task = asyncio.create_task(self.bind(pod, host))
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)
        if self.one_by_one:
            await task

    async def bind(self, pod: dict[str, Any], host: str) -> None:
        meta = pod["metadata"]
        record = Bind(meta["name"], time.monotonic())
        answer = await self.post("bind", {"PodName": meta["name"],
                                          "PodNamespace": meta["namespace"],
                                          "PodUID": meta["uid"], "Node": host})
        record.end, record.error = time.monotonic(), answer.get("Error", "")
        self.binds.append(record)
        if not record.error:
            self.bound.add(meta["name"])
            return
        self.queue.extend(self.unschedulable)  # memory came free: try them again
        self.unschedulable.clear()
        await asyncio.sleep(BACKOFF_S)
        self.queue.append(pod)

    async def run(self, pods: list[dict[str, Any]]) -> float:
        self.queue.extend(pods)
        start = time.monotonic()
        final_round = False
        while True:
            while self.queue:
                await self.cycle(self.queue.popleft())
            if self.inflight:
                await asyncio.wait(set(self.inflight), return_when=asyncio.FIRST_COMPLETED)
                continue
            if self.unschedulable and not final_round:  # one last try for the rest
                final_round = True
                self.queue.extend(self.unschedulable)
                self.unschedulable.clear()
                continue
            return time.monotonic() - start


# --- figures ----------------------------------------------------------------------------------

def largest_first(shares: list[int], card: int = CARD_MIB, headroom: int = HEADROOM_MIB,
                  cards: int | None = None) -> tuple[int, int]:
    """First-fit decreasing with headroom: (cards used, pods that fit at all when at most
    ``cards`` exist)."""
    free: list[int] = []
    placed = 0
    for share in sorted(shares, reverse=True):
        for i, left in enumerate(free):
            if left >= share + headroom:
                free[i] -= share
                placed += 1
                break
        else:
            if (cards is None or len(free) < cards) and card >= share + headroom:
                free.append(card - share)
                placed += 1
    return len(free), placed


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def ms(values: list[float]) -> str:
    if not values:
        return "-"
    return (f"p50 {pct(values, 50) * 1000:.0f} ms, p95 {pct(values, 95) * 1000:.0f} ms "
            f"(n={len(values)})")


async def api_list(session: aiohttp.ClientSession, server: str,
                   path: str) -> list[dict[str, Any]]:
    async with session.get(server + path) as resp:
        items: list[dict[str, Any]] = (await resp.json())["items"]
        return items


@dataclass
class Processes:
    """The fake API server's process and the extender's, started for one mix."""

    api: Any  # multiprocessing.Process
    pipe: Connection
    extender: subprocess.Popen[bytes]
    server: str  # the fake API's URL
    port: int  # the extender's verbs
    metrics_port: int  # its /readyz, /metrics

    def stop(self) -> None:
        self.extender.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.extender.wait(10)
        self.pipe.send("stop")
        self.api.join(10)


def start(tmp: str, nodes: int, gpus: int, args: Any) -> Processes:
    """Blocking (before the burst): the fake API server in a child process, then the
    extender through its CLI against it."""
    from tests.extender.fractional_support import frac_policy  # noqa: PLC0415
    from tests.server_support import free_port  # noqa: PLC0415

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    api = ctx.Process(target=serve_api, daemon=True,
                      args=(tmp, nodes, gpus, args.uuid_delay, args.api_latency, child))
    api.start()
    kubeconfig = parent.recv()
    server = yaml.safe_load(Path(kubeconfig).read_text())["clusters"][0]["cluster"]["server"]
    policy = Path(tmp) / "policy.yaml"
    policy.write_text(yaml.safe_dump(frac_policy()))
    port, metrics_port = free_port(), free_port()
    extender = subprocess.Popen(
        [sys.executable, "-m", "gpu_admission", "extender", "--policy", str(policy),
         "--prometheus", "http://127.0.0.1:9", "--port", str(port), "--metrics-port",
         str(metrics_port), "--kube", kubeconfig, "--namespace", "gpu-admission",
         "--reservation-image", "gpu-admission:bench", "--reservation-timeout", "60s",
         "--log-level", "error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ})
    return Processes(api, parent, extender, server, port, metrics_port)


async def run_mix(label: str, nodes: int, gpus: int, shares: list[int], args: Any) -> None:
    from tests.extender.fractional_support import TENANT, frac_pod  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        procs = await asyncio.to_thread(start, tmp, nodes, gpus, args)
        try:
            async with aiohttp.ClientSession() as session:
                await ready(session, f"http://127.0.0.1:{procs.metrics_port}/readyz")
                pods = []
                for i, share in enumerate(shares):
                    body = frac_pod(f"burst-{i:03d}", share)
                    async with session.post(
                            f"{procs.server}/api/v1/namespaces/{TENANT}/pods",
                            data=orjson.dumps(body), headers=JSON) as resp:
                        pods.append(await resp.json())
                await asyncio.sleep(0.5)  # the extender's watch sees them
                names = [f"node-{i:02d}" for i in range(nodes)]
                sched = Scheduler(session, f"http://127.0.0.1:{procs.port}/scheduler", names,
                                  random.Random(args.seed), args.one_by_one)
                wall = await sched.run(pods)
                await report(label, session, procs.server, sched, shares, nodes * gpus, wall)
        finally:
            await asyncio.to_thread(procs.stop)


async def ready(session: aiohttp.ClientSession, url: str) -> None:
    for _ in range(300):
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(url) as resp:
                body = await resp.json()
                if (body.get("ledger") or {}).get("synced"):
                    return
        await asyncio.sleep(0.1)
    raise SystemExit(f"the extender never became ready ({url})")


async def report(label: str, session: aiohttp.ClientSession, server: str, sched: Scheduler,
                 shares: list[int], cards: int, wall: float) -> None:
    pods = await api_list(session, server, "/api/v1/pods")
    cms = {(c["metadata"]["namespace"], c["metadata"]["name"]): c
           for c in await api_list(session, server, "/api/v1/configmaps")}
    published = {}
    for p in pods:
        ann = p["metadata"].get("annotations") or {}
        if (p["metadata"].get("labels") or {}).get(RESERVATION_LABEL) == "true" and \
                PUBLISHED_AT in ann:
            published[ann[GPU_UUID_ANNOTATION]] = float(ann[PUBLISHED_AT])
    used: dict[str, int] = {}
    card_of: dict[str, str] = {}
    for p in pods:
        ann = p["metadata"].get("annotations") or {}
        if GPU_MEMORY_ANNOTATION not in ann or not p["spec"].get("nodeName"):
            continue
        cm = cms.get((p["metadata"]["namespace"], ann[GPU_CONFIGMAP_ANNOTATION]))
        uuid = cm["data"][GPU_CONFIGMAP_KEY] if cm else "?"
        used[uuid] = used.get(uuid, 0) + int(ann[GPU_MEMORY_ANNOTATION])
        card_of[p["metadata"]["name"]] = uuid
    ok = [b for b in sched.binds if not b.error]
    onto_open = [b.end - b.start for b in ok
                 if published.get(card_of.get(b.pod, ""), float("inf")) <= b.start]
    waited = [b for b in ok if published.get(card_of.get(b.pod, ""), 0.0) > b.start]
    ffd, fit = largest_first(shares)
    _, fit_cluster = largest_first(shares, cards=cards)
    print(f"\n== {label}: {len(shares)} pods, {cards} cards, uuid delay "
          f"{ARGS.uuid_delay:g} s, API call {ARGS.api_latency * 1000:g} ms, "
          f"{'one by one' if sched.one_by_one else 'burst'} ==")
    print(f"bound {len(sched.bound)}, Pending {len(shares) - len(sched.bound)} "
          f"(largest-first fits {fit_cluster} on {cards} cards); wall {wall:.1f} s, "
          f"{sched.cycles} scheduling cycles")
    print(f"cards opened {len(used)}; largest-first packing of all {len(shares)} shares: "
          f"{ffd} cards ({fit} fit); of the {len(sched.bound)} bound: "
          f"{largest_first([int(s) for s in bound_shares(pods, sched.bound)])[0]} cards")
    print(f"cards past their memory (> {CARD_MIB} MiB): "
          f"{sum(1 for v in used.values() if v > CARD_MIB)}; past the headroom "
          f"(> {CARD_MIB - HEADROOM_MIB} MiB): "
          f"{sum(1 for v in used.values() if v > CARD_MIB - HEADROOM_MIB)}; "
          f"max {max(used.values(), default=0)} MiB")
    refused = [b for b in sched.binds if b.error]
    print(f"binds {len(sched.binds)}, refused {len(refused)} "
          f"({100 * len(refused) / max(1, len(sched.binds)):.1f} %)"
          + (f", e.g. {refused[0].error[:120]!r}" if refused else ""))
    print(f"bind latency, all bound: {ms([b.end - b.start for b in ok])}")
    print(f"  onto a card already published: {ms(onto_open)}")
    print(f"  waited for a card's UUID: {ms([b.end - b.start for b in waited])}; after the "
          f"publication: {ms([b.end - published[card_of[b.pod]] for b in waited])}")
    if ok:
        print(f"  mean {statistics.mean(b.end - b.start for b in ok) * 1000:.0f} ms")


def bound_shares(pods: list[dict[str, Any]], bound: set[str]) -> list[str]:
    return [p["metadata"]["annotations"][GPU_MEMORY_ANNOTATION] for p in pods
            if p["metadata"]["name"] in bound]


ARGS: Any = None


async def main_async(args: Any) -> None:
    rng = random.Random(args.seed)
    mixed = [rng.randint(5, 40) * 1024 for _ in range(args.pods)]
    if args.mix in ("all", "1"):
        await run_mix("mix 1: shares 5-40 GiB", 16, 8, mixed, args)
    if args.mix in ("all", "2"):
        await run_mix("mix 2: 48 GiB pods", 4, 8, [48 * 1024] * 40, args)


def main() -> None:
    global ARGS  # noqa: PLW0603 (the figures name the run's settings)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--seed", type=int, default=36)
    parser.add_argument("--uuid-delay", type=float, default=0.5,
                        help="seconds from a reservation pod's creation to its UUID")
    parser.add_argument("--api-latency", type=float, default=0.02,
                        help="seconds the fake API server takes per object call (a real "
                             "API server's round trip with its etcd write)")
    parser.add_argument("--mix", choices=["all", "1", "2"], default="all")
    parser.add_argument("--one-by-one", action="store_true",
                        help="wait for each bind before the next scheduling cycle")
    ARGS = parser.parse_args()
    asyncio.run(main_async(ARGS))


if __name__ == "__main__":
    main()
