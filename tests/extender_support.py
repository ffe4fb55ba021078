"""Helpers for the scheduler-extender tests (no tests here): Node objects as the API server
serves them (GPU Feature Discovery labels, ``nvidia.com/gpu`` capacity), ExtenderArgs exactly
as kube-scheduler sends them (``k8s.io/kube-scheduler/extender/v1``: PascalCase keys, unused
fields ``null``), and the real ``gpu-admission extender`` command as a subprocess.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson

from tests.server_support import free_port

PREFIX = "/scheduler"
T = TypeVar("T")


def make_node(name: str, *, gpus: int = 4, replicas: int = 4,
              product: str = "NVIDIA-A100-SXM4-80GB", memory_mib: int = 81920) -> dict[str, Any]:
    """A v1.Node with GFD labels; time-sliced x``replicas`` when replicas > 1
    (device plugin ``renameByDefault: false``: capacity ``nvidia.com/gpu`` = gpus x replicas,
    product gets ``-SHARED``)."""
    shared = replicas > 1
    labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.product": product + ("-SHARED" if shared else ""),
        "nvidia.com/gpu.memory": str(memory_mib),
        "nvidia.com/gpu.replicas": str(replicas),
        "nvidia.com/gpu.sharing-strategy": "time-slicing" if shared else "none",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "4",
    }
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110",
                "nvidia.com/gpu": str(gpus * replicas)}
    return {"metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                         "labels": labels},
            "spec": {},
            "status": {"capacity": capacity, "allocatable": dict(capacity),
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def args_with_nodes(pod: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """ExtenderArgs of an extender with ``nodeCacheCapable: false``."""
    return {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}


def args_with_names(pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """ExtenderArgs of an extender with ``nodeCacheCapable: true``."""
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


def post(url: str, body: Any, *, raw: bytes | None = None,
         content_type: str = "application/json") -> tuple[int, Any]:
    """POST like kube-scheduler's extender client; (status, decoded JSON body)."""
    data = raw if raw is not None else orjson.dumps(body)
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, orjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_for(check: Callable[[], T | None], timeout: float = 30.0, what: str = "") -> T:
    """Call ``check`` until it returns something other than None/False."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")


def metric_value(text: str, name: str, labels: str = "") -> float | None:
    """The value of one sample in Prometheus text, e.g. ``metric_value(t, "x", 'a="b"')``."""
    want = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


@dataclass
class ExtenderProcess:
    process: subprocess.Popen[str]
    port: int
    log: Path
    args: list[str]

    def option(self, name: str) -> str:
        """The value the command was started with for option ``name``."""
        return self.args[self.args.index(name) + 1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def verb(self, verb: str) -> str:
        return self.url(f"{PREFIX}/{verb}")

    def metrics(self) -> str:
        return get(self.url("/metrics"))[1].decode()

    def status(self) -> dict[str, Any]:
        code, body = get(self.url("/readyz"))
        return orjson.loads(body) if code == 200 else {}

    def log_lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                out.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
        return out


@contextmanager
def running_extender(workdir: Path, prometheus_url: str, *extra: str,
                     interval: str = "1s") -> Iterator[ExtenderProcess]:
    """``python -m gpu_admission extender`` on a free loopback port until ready; SIGTERM at
    the end (it must exit 0)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = workdir / "extender.log"
    with log.open("w") as sink:
        args = ["extender", "--prometheus", prometheus_url, "--interval", interval,
                "--window", "5s", "--host", "127.0.0.1", "--port", str(port),
                "--prefix", PREFIX, "--reload-interval", "0.2", *extra]
        process = subprocess.Popen([sys.executable, "-m", "gpu_admission", *args],
                                   stdout=sink, stderr=subprocess.STDOUT, text=True)
    running = ExtenderProcess(process, port, log, args)
    try:
        def ready() -> bool:
            assert process.poll() is None, log.read_text()
            try:
                return get(running.url("/readyz"))[0] == 200
            except OSError:
                return False
        wait_for(ready, 30, "the extender's /readyz")
        yield running
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
    assert process.returncode == 0, log.read_text()[-2000:]
