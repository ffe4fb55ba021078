"""A fake dcgm-exporter for tests (no tests here): ``/metrics`` in the exporter's exact text
format, with values the test sets, for a real Prometheus to scrape.

NOTE: reconstructed by the report engineer after accidentally overwriting the extender
engineer's original file (same names and call signatures as used by
tests/extender/test_extender_e2e.py); the extender engineer should review it.

Format (facts sheet ``shared/reference/scheduling-and-dcgm.md`` sections 2.2 and 2.4): labels
in the exporter's order ``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``,
``Hostname`` (``hostname`` on exporter main), ``DCGM_FI_DRIVER_VERSION``; no timestamps.
With ``KUBERNETES_VIRTUAL_GPUS`` (exporter 4.5.3+), ``DCGM_FI_DEV_GPU_UTIL`` and
``DCGM_FI_DEV_FB_USED`` keep the device-level series and add one per pod with ``pod``,
``namespace`` and ``pod_uid`` holding per-process values (``pod_copies``).
"""

from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

METRICS = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
)


@dataclass
class FakeGpu:
    node: str
    index: int
    util: float | str  # %, or a raw string such as "NaN"
    fb_used: float | str  # MiB
    fb_free: float | str  # MiB
    model: str = "NVIDIA A100-SXM4-80GB"
    node_label: str = "Hostname"  # "hostname" on dcgm-exporter main
    # KUBERNETES_VIRTUAL_GPUS per-pod copies: (pod, pod_uid, util %, fb used MiB)
    pod_copies: list[tuple[str, str, float, float]] = field(default_factory=list)
    namespace: str = "default"
    # pods holding the GPU, as the exporter labels them (facts sheet 2.4): with
    # ``virtual_copies`` (KUBERNETES_VIRTUAL_GPUS, 4.1.1+) every series is printed once per
    # pod with ``vgpu`` = the copy's index, all with the device-wide value; without it (the
    # default mode) one series labelled with the last pod only
    holders: list[str] = field(default_factory=list)
    virtual_copies: bool = False

    @property
    def uuid(self) -> str:
        digest = f"{zlib.crc32(f'{self.node}/{self.index}'.encode()):012x}"
        return f"GPU-{self.index:08x}-0000-0000-0000-{digest}"

    def labels(self, extra: str = "") -> str:
        parts = [f'gpu="{self.index}"', f'UUID="{self.uuid}"',
                 f'pci_bus_id="00000000:{0x3B + self.index:02X}:00.0"',
                 f'device="nvidia{self.index}"', f'modelName="{self.model}"',
                 f'{self.node_label}="{self.node}"', 'DCGM_FI_DRIVER_VERSION="550.54.15"']
        return "{" + ",".join(parts) + extra + "}"


def _number(value: float | str) -> str:
    if isinstance(value, str):
        return value
    return f"{value:g}" if float(value).is_integer() else f"{value:f}"


def render(gpus: list[FakeGpu]) -> str:
    """The exporter's ``/metrics`` text (Prometheus text format 0.0.4, no timestamps)."""
    lines: list[str] = []
    for metric, help_text in METRICS:
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        for gpu in gpus:
            value = {"DCGM_FI_DEV_GPU_UTIL": gpu.util, "DCGM_FI_DEV_FB_USED": gpu.fb_used,
                     "DCGM_FI_DEV_FB_FREE": gpu.fb_free}[metric]
            pods = (gpu.holders if gpu.virtual_copies else gpu.holders[-1:])
            for k, pod in enumerate(pods):  # Attributes map, sorted keys
                vgpu = f',vgpu="{k}"' if gpu.virtual_copies else ""
                extra = f',container="main",namespace="{gpu.namespace}",pod="{pod}"{vgpu}'
                lines.append(f"{metric}{gpu.labels(extra)} {_number(value)}")
            if not pods:
                lines.append(f"{metric}{gpu.labels()} {_number(value)}")
            if metric == "DCGM_FI_DEV_FB_FREE":
                continue
            for pod, uid, util, used in gpu.pod_copies:
                copy = util if metric == "DCGM_FI_DEV_GPU_UTIL" else used
                extra = (f',container="main",namespace="{gpu.namespace}",pod="{pod}",'
                         f'pod_uid="{uid}"')
                lines.append(f"{metric}{gpu.labels(extra)} {_number(copy)}")
    return "\n".join(lines) + "\n"


class FakeDcgmExporter:
    """``GET /metrics`` on 127.0.0.1:<free port> in a background thread; ``set`` swaps the
    GPUs atomically between scrapes."""

    def __init__(self) -> None:
        self._body = b""
        self._lock = threading.Lock()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404)
                    return
                with exporter._lock:
                    body = exporter._body
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def target(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> FakeDcgmExporter:
        self._thread.start()
        return self

    def set(self, gpus: list[FakeGpu]) -> None:
        body = render(gpus).encode()
        with self._lock:
            self._body = body

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
