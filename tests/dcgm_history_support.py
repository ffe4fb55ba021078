"""Seeded dcgm-exporter history for tests and benchmarks (no tests here).

A *fleet* is a list of GPUs, each with a behaviour: a function from an instant (unix seconds)
to ``(util %, framebuffer MiB, holder)`` or ``None`` (no sample: the GPU vanished, or a gap).
:func:`write_openmetrics` writes what dcgm-exporter would have exposed at every instant as
OpenMetrics text for ``promtool tsdb create-blocks-from openmetrics``: timestamps in
**seconds**, each series' samples in time order, ``# EOF`` at the end (facts sheet
``shared/reference/scheduling-and-dcgm.md`` sections 2.2, 2.5 and 3.2). Labels follow the
exporter's order (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``,
``DCGM_FI_DRIVER_VERSION``, ``container``, ``namespace``, ``pod``). With
``style="exported"`` the GPUs look scraped through a ServiceMonitor: the workload's labels
are ``exported_*`` and ``pod``/``namespace`` name the exporter pod on every series.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

Holder = tuple[str, str]  # (namespace, pod)
Reading = tuple[int, int, Holder | None]  # util %, framebuffer used MiB, holder
Behaviour = Callable[[int], Reading | None]
EXPORTER_POD = ("gpu-operator", "nvidia-dcgm-exporter-x7k2p")


@dataclass
class Gpu:
    node: str
    index: int
    uuid: str
    model: str
    behaviour: Behaviour
    style: str = "pod"  # "pod" | "exported" | "hostname" (exporter main: lowercase label)
    samples: dict[int, Reading] = field(default_factory=dict)

    def sample(self, timestamps: Iterable[int]) -> None:
        for ts in timestamps:
            reading = self.behaviour(ts)
            if reading is not None:
                self.samples[ts] = reading


def uuid_for(seed: int, node: str, index: int) -> str:
    rnd = random.Random(f"{seed}/{node}/{index}")
    h = f"{rnd.getrandbits(128):032x}"
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _labels(gpu: Gpu, holder: Holder | None) -> str:
    node_label = "hostname" if gpu.style == "hostname" else "Hostname"
    parts = [f'gpu="{gpu.index}"', f'UUID="{gpu.uuid}"',
             f'pci_bus_id="00000000:{0x3B + gpu.index:02X}:00.0"',
             f'device="nvidia{gpu.index}"', f'modelName="{gpu.model}"',
             f'{node_label}="{gpu.node}"', 'DCGM_FI_DRIVER_VERSION="550.54.15"']
    if gpu.style == "exported":
        parts += ['container="nvidia-dcgm-exporter"', f'namespace="{EXPORTER_POD[0]}"',
                  f'pod="{EXPORTER_POD[1]}"', 'endpoint="gpu-metrics"', 'service="dcgm-exporter"']
        if holder is not None:
            parts += ['exported_container="main"', f'exported_namespace="{holder[0]}"',
                      f'exported_pod="{holder[1]}"']
    elif holder is not None:
        parts += ['container="main"', f'namespace="{holder[0]}"', f'pod="{holder[1]}"']
    return "{" + ",".join(parts) + "}"


def write_openmetrics(gpus: Iterable[Gpu], out: TextIO) -> int:
    """Write both metric families; returns the number of samples written."""
    gpus = list(gpus)
    written = 0
    for metric, column, help_text in (
            ("DCGM_FI_DEV_GPU_UTIL", 0, "GPU utilization (in %)."),
            ("DCGM_FI_DEV_FB_USED", 1, "Framebuffer memory used (in MiB).")):
        out.write(f"# HELP {metric} {help_text}\n# TYPE {metric} gauge\n")
        for gpu in gpus:
            series: dict[Holder | None, list[str]] = {}
            for ts in sorted(gpu.samples):
                reading = gpu.samples[ts]
                series.setdefault(reading[2], []).append(f" {reading[column]} {ts}\n")
            for holder, lines in series.items():
                prefix = metric + _labels(gpu, holder)
                out.write("".join(prefix + line for line in lines))
                written += len(lines)
    out.write("# EOF\n")
    return written


def write_file(gpus: Iterable[Gpu], path: Path) -> int:
    with path.open("w", encoding="utf-8") as out:
        return write_openmetrics(gpus, out)


# --- behaviours ---------------------------------------------------------------------------

def office_hours(ts: int) -> bool:
    """Mon-Fri 09:00-17:00 UTC: when the model's people work (not the report's setting)."""
    when = datetime.fromtimestamp(ts, UTC)
    return when.weekday() < 5 and 9 <= when.hour < 17


def notebook(seed: str, holder: Callable[[int], Holder | None]) -> Behaviour:
    """A notebook server: held all the time, busy in a few office hours, idle otherwise."""
    def behave(ts: int) -> Reading:
        rnd = random.Random(f"{seed}/{ts}")
        hour = random.Random(f"{seed}/hour/{ts // 3600}")
        who = holder(ts)
        if who is None:
            return (0, 0, None)
        if office_hours(ts) and hour.random() < 0.25:
            return (rnd.randint(35, 80), rnd.randint(9000, 12000), who)
        return (rnd.randint(0, 4) if office_hours(ts) else rnd.randint(0, 2),
                rnd.randint(9000, 9500), who)
    return behave


def steady(seed: str, holder: Holder, low: int, high: int, fb: tuple[int, int]) -> Behaviour:
    """Inference (15-30 %) or training (92-98 %): a steady load, all the time."""
    def behave(ts: int) -> Reading:
        rnd = random.Random(f"{seed}/{ts}")
        return (rnd.randint(low, high), rnd.randint(*fb), holder)
    return behave


def unallocated(ts: int) -> Reading:
    return (0, 0, None)


def until(behaviour: Behaviour, end: int) -> Behaviour:
    """The GPU vanishes at ``end`` (node drained, exporter gone)."""
    return lambda ts: behaviour(ts) if ts < end else None


def with_gap(behaviour: Behaviour, start: int, end: int) -> Behaviour:
    """No samples in [start, end) (exporter restart, scrape failures)."""
    return lambda ts: None if start <= ts < end else behaviour(ts)
