"""GPU state from NVIDIA dcgm-exporter through Prometheus: parsing (pure) and the background
poller (I/O), kept apart so the scheduling path only ever reads a frozen :class:`Snapshot`.

Per poll, three instant queries (Prometheus HTTP API ``GET /api/v1/query``,
https://prometheus.io/docs/prometheus/latest/querying/api/#instant-queries), smoothed over
``window`` because dcgm-exporter collects every 30 s while it is scraped every 15 s
(https://github.com/NVIDIA/dcgm-exporter, ``DCGM_EXPORTER_INTERVAL``; chart
``serviceMonitor.interval``), so a raw instant value repeats or jumps:

* ``avg_over_time(DCGM_FI_DEV_GPU_UTIL[window])``: SM utilisation, **%** (0..100);
* ``avg_over_time(DCGM_FI_DEV_FB_USED[window])`` / ``..._FB_FREE``: framebuffer, **MiB**
  (dcgm-exporter ``etc/default-counters.csv``).

Series are joined to Kubernetes nodes by the exporter's ``Hostname`` label (renamed
``hostname`` on dcgm-exporter main, #655; both accepted): the chart and the GPU Operator set
it from ``NODE_NAME`` = ``spec.nodeName`` (dcgm-exporter ``internal/pkg/hostname``). A GPU is
identified by ``UUID`` (``uuid`` with ``--use-old-namespace``) and shown by its ``gpu`` index.

With ``KUBERNETES_VIRTUAL_GPUS=true`` the exporter prints one copy of each series per pod
sharing the GPU, and since 4.5.3-4.8.2 per-process values labelled ``pod_uid`` next to the
device-level series (dcgm-exporter PR #432, #594). We keep one value per GPU: the series
without ``pod_uid`` when there is one (the device-level value), else the largest copy (the
copies carry the same device-wide value in the older mode).

Pods holding each GPU (``memoryFit: predicted``): the exporter labels a GPU's series with the
pod whose container holds it (``pod``/``namespace``; ``exported_pod``/``exported_namespace``
when scraped through a ServiceMonitor with ``honor_labels: false``, where ``pod`` then names
the exporter's own pod). We count the distinct pods over all series of a GPU in a poll
(:attr:`Gpu.pods`). With ``KUBERNETES_VIRTUAL_GPUS=true`` there is one copy per pod holding a
replica, so the count is the replicas the device plugin has allocated on that GPU; in the
default mode the exporter keeps one pod per GPU (the last listed wins, dcgm-exporter #307), so
the count is 0 (exact: no pod holds it) or 1 (meaning "at least one"). If any series of the
poll carries ``exported_pod``, only ``exported_*`` labels name workload pods. Facts sheet
``shared/reference/scheduling-and-dcgm.md`` 2.4, 2.5.

Values that are not finite, negative, or (utilisation) above 100 are dropped and counted; a
GPU missing any of the three values is left out of the snapshot, so its node is "no data"
(neutral), never wrongly filled or emptied.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

import aiohttp
import orjson
from structlog.typing import FilteringBoundLogger

from gpu_admission.placement.gpus import Gpu, Snapshot

UTIL: Final = "DCGM_FI_DEV_GPU_UTIL"  # SM utilisation, %
FB_USED: Final = "DCGM_FI_DEV_FB_USED"  # framebuffer used, MiB
FB_FREE: Final = "DCGM_FI_DEV_FB_FREE"  # framebuffer free, MiB
METRICS: Final = (UTIL, FB_USED, FB_FREE)
DEFAULT_NODE_LABEL: Final = "Hostname"
POD_UID_LABEL: Final = "pod_uid"
#: (namespace label, pod label): the workload pod as the exporter prints it, and as it arrives
#: through a ServiceMonitor (``honor_labels: false`` renames clashing labels ``exported_*``)
POD_LABELS: Final = ("namespace", "pod")
EXPORTED_POD_LABELS: Final = ("exported_namespace", "exported_pod")


class PollError(Exception):
    """A poll that produced no snapshot; ``reason`` is the metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def node_labels(label: str) -> tuple[str, ...]:
    """The label names to read the node name from: the configured one, then its other case
    (``Hostname`` on released dcgm-exporter, ``hostname`` on main)."""
    other = label.lower() if label != label.lower() else label.capitalize()
    return (label, other) if other != label else (label,)


def queries(window: str) -> dict[str, str]:
    """metric -> PromQL instant query (``window`` is a PromQL duration such as ``1m``)."""
    return {metric: f"avg_over_time({metric}[{window}])" for metric in METRICS}


@dataclass(frozen=True, slots=True)
class _Reading:
    index: str
    model: str
    value: float
    device_level: bool  # no pod_uid label: the device-wide series


def _value(metric: str, raw: Any) -> tuple[float | None, str]:
    """(value, "") or (None, reason) for one sample value string."""
    if not isinstance(raw, str):
        return None, "unparsable"
    try:
        value = float(raw)
    except ValueError:
        return None, "unparsable"
    if math.isnan(value):
        return None, "nan"
    if math.isinf(value):
        return None, "infinite"
    if value < 0:
        return None, "negative"
    if metric == UTIL and value > 100:
        return None, "out_of_range"
    return value, ""


#: (node, GPU UUID) -> {(exported?, namespace, pod)}: the pods the series of a GPU name
Holders = dict[tuple[str, str], set[tuple[bool, str, str]]]


def _holders_of(series: Mapping[str, Any]) -> list[tuple[bool, str, str]]:
    """The workload pods one series names: (True, ns, pod) from ``exported_*``, (False, ns,
    pod) from the plain labels (which :func:`build_snapshot` ignores when the poll has any
    ``exported_pod``, since they then name the exporter's own pod)."""
    out = []
    for exported, (ns_label, pod_label) in ((True, EXPORTED_POD_LABELS), (False, POD_LABELS)):
        pod = series.get(pod_label)
        if isinstance(pod, str) and pod:
            ns = series.get(ns_label)
            out.append((exported, ns if isinstance(ns, str) else "", pod))
    return out


def parse_vector(payload: Any, metric: str, labels: tuple[str, ...],
                 bad: Counter[tuple[str, str]],
                 holders: Holders | None = None) -> dict[tuple[str, str], _Reading]:
    """(node, GPU UUID) -> reading from one ``/api/v1/query`` reply. Raises
    :class:`PollError` when the reply is not a Prometheus success envelope holding a vector;
    counts dropped samples in ``bad`` under ``(metric, reason)``; adds the pods each GPU's
    series name to ``holders`` (also for samples whose value is dropped: the labels hold)."""
    if not isinstance(payload, dict):
        raise PollError("bad_response", f"{metric}: reply is not a JSON object")
    if payload.get("status") != "success":
        raise PollError("query_error", f"{metric}: Prometheus answered "
                        f"{str(payload.get('errorType'))[:40]}: "
                        f"{str(payload.get('error'))[:200]}")
    data = payload.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector" \
            or not isinstance(data.get("result"), list):
        raise PollError("bad_response", f"{metric}: data.result is not an instant vector")
    out: dict[tuple[str, str], _Reading] = {}
    for item in data["result"]:
        series = item.get("metric") if isinstance(item, dict) else None
        sample = item.get("value") if isinstance(item, dict) else None
        if not isinstance(series, dict) or not isinstance(sample, list) or len(sample) != 2:
            bad[(metric, "malformed_sample")] += 1
            continue
        node = next((series[k] for k in labels if isinstance(series.get(k), str)
                     and series[k]), None)
        uuid = series.get("UUID") or series.get("uuid")
        if node is None:
            bad[(metric, "no_node_label")] += 1
            continue
        if not isinstance(uuid, str) or not uuid:
            bad[(metric, "no_uuid")] += 1
            continue
        key = (node, uuid)
        if holders is not None:
            holders.setdefault(key, set()).update(_holders_of(series))
        value, reason = _value(metric, sample[1])
        if value is None:
            bad[(metric, reason)] += 1
            continue
        reading = _Reading(str(series.get("gpu", "")), str(series.get("modelName", "")),
                           value, POD_UID_LABEL not in series)
        old = out.get(key)
        # device-level series first, then the largest copy
        if old is None or (reading.device_level, reading.value) > (old.device_level,
                                                                   old.value):
            out[key] = reading
    return out


def pod_counts(holders: Holders) -> dict[tuple[str, str], int]:
    """(node, UUID) -> distinct workload pods: ``exported_*`` labels if any series of the
    poll has them (the plain ones then name the exporter's pod), else the plain labels."""
    exported = any(e for pods in holders.values() for e, _, _ in pods)
    return {key: len({(ns, pod) for e, ns, pod in pods if e == exported})
            for key, pods in holders.items()}


def build_snapshot(readings: Mapping[str, Mapping[tuple[str, str], _Reading]],
                   taken_at: float, bad: Mapping[tuple[str, str], int],
                   holders: Holders | None = None) -> Snapshot:
    """Join the three metrics per GPU; a GPU lacking one of them is left out."""
    util, used, free = (readings[m] for m in METRICS)
    pods = pod_counts(holders or {})
    nodes: dict[str, list[Gpu]] = {}
    for key, u in util.items():
        if key not in used or key not in free:
            continue
        node, uuid = key
        nodes.setdefault(node, []).append(
            Gpu(u.index, uuid, u.model, u.value, used[key].value, free[key].value,
                pods.get(key, 0)))
    frozen = {name: tuple(sorted(gpus, key=lambda g: (len(g.index), g.index, g.uuid)))
              for name, gpus in nodes.items()}
    return Snapshot(MappingProxyType(frozen), taken_at, MappingProxyType(dict(bad)))


# --- the poller (I/O) -------------------------------------------------------------------------

@dataclass(slots=True)
class PollerConfig:
    prometheus_url: str  # e.g. http://prometheus-operated.monitoring.svc:9090
    interval_seconds: float  # time between polls
    window: str  # PromQL range for avg_over_time, e.g. "1m"
    node_label: str = DEFAULT_NODE_LABEL
    stale_after_intervals: int = 3  # stale = no successful poll for this many intervals


class Poller:
    """Polls Prometheus every interval in the background and keeps the last good snapshot.

    Callbacks (``on_poll``, ``on_stale_change``) let the app count metrics and log without
    this module knowing about either.
    """

    def __init__(self, config: PollerConfig, log: FilteringBoundLogger, *,
                 on_poll: Callable[[Snapshot | None, PollError | None], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.log = log
        self.on_poll = on_poll
        self.clock = clock
        self.snapshot: Snapshot | None = None
        self.last_success: float | None = None  # clock() of the last good poll
        self.started = clock()
        self.was_stale: bool | None = None
        self._labels = node_labels(config.node_label)
        self._queries = queries(config.window)

    @property
    def stale_after_seconds(self) -> float:
        return self.config.interval_seconds * self.config.stale_after_intervals

    def stale(self) -> bool:
        """True when there is no snapshot or the last good poll is too old."""
        if self.last_success is None:
            return True
        return self.clock() - self.last_success > self.stale_after_seconds

    def fresh_snapshot(self) -> Snapshot | None:
        """The snapshot to decide with, or None (neutral answers) when stale."""
        return None if self.stale() else self.snapshot

    async def _query(self, session: aiohttp.ClientSession, metric: str) -> Any:
        url = self.config.prometheus_url.rstrip("/") + "/api/v1/query"
        timeout = max(self.config.interval_seconds * 0.8, 0.5)
        try:
            async with session.get(url, params={"query": self._queries[metric],
                                                "timeout": f"{timeout:.3f}"},
                                   timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                body = await resp.read()
                status = resp.status
        except TimeoutError:
            raise PollError("timeout", f"{metric}: no answer from {url} within "
                            f"{timeout:.1f} s") from None
        except aiohttp.ClientError as exc:
            raise PollError("unreachable", f"{metric}: {url}: {exc}") from None
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise PollError("bad_response", f"{metric}: HTTP {status}, body is not JSON: "
                            f"{body[:80]!r}") from None
        if status != 200 and not (isinstance(payload, dict) and "errorType" in payload):
            raise PollError("http_error", f"{metric}: HTTP {status} from {url}")
        return payload

    async def poll_once(self, session: aiohttp.ClientSession) -> Snapshot | None:
        """One poll; the new snapshot, or None after a failed poll (the old one is kept)."""
        bad: Counter[tuple[str, str]] = Counter()
        error: PollError | None = None
        snapshot: Snapshot | None = None
        try:
            payloads = await asyncio.gather(*(self._query(session, m) for m in METRICS))
            holders: Holders = {}
            readings = {m: parse_vector(p, m, self._labels, bad, holders)
                        for m, p in zip(METRICS, payloads, strict=True)}
            snapshot = build_snapshot(readings, time.time(), bad, holders)
        except PollError as exc:
            error = exc
            self.log.warning("metrics_poll_failed", reason=exc.reason, error=str(exc))
        else:
            self.snapshot = snapshot
            self.last_success = self.clock()
        if self.on_poll is not None:
            self.on_poll(snapshot, error)
        self.check_stale()
        return snapshot

    def check_stale(self) -> bool:
        """Log once on each transition between fresh and stale; return stale."""
        stale = self.stale()
        if stale != self.was_stale:
            if stale:
                age = (None if self.last_success is None
                       else round(self.clock() - self.last_success, 1))
                self.log.warning("metrics_stale", last_success_age_seconds=age,
                                 stale_after_seconds=self.stale_after_seconds,
                                 action="answering neutrally: every node passes, equal scores")
            elif self.was_stale is not None or self.snapshot is not None:
                self.log.info("metrics_fresh", gpu_nodes=len(self.snapshot.nodes)
                              if self.snapshot else 0)
            self.was_stale = stale
        return stale

    async def run(self) -> None:
        """Poll forever (cancel to stop); never raises for a bad poll."""
        async with aiohttp.ClientSession() as session:
            while True:
                started = self.clock()
                try:
                    await self.poll_once(session)
                except Exception:  # a bug must not stop polling; stale detection takes over
                    self.log.exception("metrics_poll_crashed")
                wait = self.config.interval_seconds - (self.clock() - started)
                await asyncio.sleep(max(wait, 0.0))
