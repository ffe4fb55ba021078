"""The extender's aiohttp app (the wire layer): ``POST <prefix>/filter``,
``POST <prefix>/prioritize``, ``GET /healthz``, ``/readyz``, ``/metrics``.

Protocol: kube-scheduler's ``extender/v1`` (``k8s.io/kube-scheduler/extender/v1/types.go``;
the types have no json tags, so keys are the Go field names: ``Pod``, ``Nodes``,
``NodeNames``, ``FailedNodes``, ``Host``, ``Score``). kube-scheduler POSTs JSON to
``urlPrefix + "/" + verb`` and treats any status but 200 as a failed call
(``pkg/scheduler/extender.go`` ``send``): a failed filter skips an ``ignorable`` extender, a
failed prioritize is always ignored. So:

* a well-formed request always gets 200, decided from the last fresh GPU snapshot, or a
  neutral answer (every node passes, equal scores) when metrics are stale or the pod needs no
  decision;
* a malformed one gets 400 ``{"error": "<field>: expected ..., got ..."}``: kube-scheduler
  never sends one, so only a broken caller sees it.

Filter replies mirror the request form (``pkg/scheduler/extender.go`` ``Filter``): with
``nodeCacheCapable: true`` the request carries ``NodeNames`` and the reply must carry
``NodeNames``; otherwise it carries the full ``Nodes`` NodeList and the reply must carry
``Nodes`` (a reply with neither filters out every node).

The filter and prioritize handlers do no I/O: they read the snapshot the background poller
(:mod:`gpu_admission.extender.gpustate`) last stored and, for fractional pods, the GPU ledger
the watch keeps (:mod:`gpu_admission.extender.binder`). ``POST <prefix>/bind`` (configured
with ``--kubeconfig``) takes ``ExtenderBindingArgs`` (``PodName``, ``PodNamespace``, ``PodUID``,
``Node``) and answers ``ExtenderBindingResult`` (``Error``: "" when bound); its API calls run
in threads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from structlog.typing import FilteringBoundLogger

from gpu_admission.extender.binder import BindConfig, Binder, BindMetrics, KubeState
from gpu_admission.extender.gpustate import (
    METRICS,
    Poller,
    PollerConfig,
    PollError,
)
from gpu_admission.kube.client import api_client
from gpu_admission.placement.fractional import (
    LedgerSource,
    Placer,
    filter_share,
    fractional_error,
    fractional_share,
    priorities,
    prioritize_pod,
    rank_share,
)
from gpu_admission.placement.frag import MILLI, Shape
from gpu_admission.placement.gpus import Snapshot
from gpu_admission.placement.requests import NodeRequests, pod_requests
from gpu_admission.placement.score import (
    FilterResult,
    filter_nodes,
    neutral_reason,
    pod_demand,
    score_nodes,
)
from gpu_admission.policy.model import Policy, PolicyError, default_policy, load_policy
from gpu_admission.server.logs import make_logger
from gpu_admission.server.reload import FileWatcher, cancel_tasks

JSON: Final = "application/json"
DEFAULT_PREFIX: Final = "/scheduler"
DEFAULT_MAX_BODY_BYTES: Final = 64 * 1024 * 1024  # bytes; a NodeList of thousands of Nodes
VERBS: Final = ("filter", "prioritize")
#: the verbs of the extender entry that sees every pod of the profile (no managedResources,
#: so CPU pods reach it too): like filter and prioritize, except that a fractional pod gets a
#: neutral answer there (every node passes, all score 0): the binding entry decides it
OTHER_SUFFIX: Final = "-nonfractional"
BIND: Final = "bind"
#: Seconds. A decision is well under a millisecond; kube-scheduler's httpTimeout is seconds.
LATENCY_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                          0.1, 0.5, 1.0)
POLL_ERROR_REASONS: Final = ("unreachable", "timeout", "http_error", "bad_response",
                             "query_error")


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    """Everything the extender needs; built by the CLI or a test (no globals, no env)."""

    prometheus_url: str
    interval_seconds: float = 15.0  # between Prometheus polls
    window: str = "1m"  # PromQL range for avg_over_time (smoothing)
    node_label: str = "Hostname"  # dcgm-exporter label holding the node name
    stale_after_intervals: int = 3
    policy_path: Path | None = None  # None: the built-in default policy
    prefix: str = DEFAULT_PREFIX  # urlPrefix path of the KubeSchedulerConfiguration
    reload_interval_seconds: float = 1.0  # policy file check period
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: kubeconfig path or "in-cluster": watch pods/ConfigMaps/nodes for the GPU ledger and
    #: serve the bind verb (fractional pools); None: filter/prioritize only
    kube_source: str | None = None
    bind: BindConfig | None = None  # with kube_source
    watch_timeout_seconds: int = 300

    def __post_init__(self) -> None:
        if not self.prefix.startswith("/") or (self.prefix.endswith("/") and self.prefix != "/"):
            raise ValueError(f"prefix must start with / and not end with /, got "
                             f"{self.prefix!r}")
        if self.interval_seconds <= 0:
            raise ValueError(f"interval must be positive, got {self.interval_seconds}")
        if self.stale_after_intervals < 1:
            raise ValueError("stale_after_intervals must be at least 1")

    def route(self, verb: str) -> str:
        return ("" if self.prefix == "/" else self.prefix) + "/" + verb


class ExtenderMetrics:
    """Prometheus metrics on a registry of their own (never the global one)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.requests = Counter("gpu_admission_extender_requests",
                                "Extender HTTP requests by verb and HTTP code.",
                                ["verb", "code"], registry=r)
        self.latency = Histogram("gpu_admission_extender_request_duration_seconds",
                                 "Time inside the handler, by verb (seconds).", ["verb"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.neutral = Counter("gpu_admission_extender_neutral_answers",
                               "Requests answered neutrally (every node passes, equal "
                               "scores), by verb and reason.", ["verb", "reason"], registry=r)
        self.filtered = Counter("gpu_admission_extender_filtered_nodes",
                                "Nodes filtered out for lack of GPU memory.", registry=r)
        self.stale = Gauge("gpu_admission_extender_metrics_stale",
                           "1 when the GPU metrics are missing or older than the stale limit "
                           "(answers are neutral).", registry=r)
        self.polls = Counter("gpu_admission_extender_polls",
                             "Prometheus polls by result (success, failure).", ["result"],
                             registry=r)
        self.poll_errors = Counter("gpu_admission_extender_poll_errors",
                                   "Failed Prometheus polls by reason.", ["reason"], registry=r)
        self.bad_values = Counter("gpu_admission_extender_bad_values",
                                  "DCGM samples dropped by metric and reason (nan, negative, "
                                  "infinite, out_of_range, unparsable, no_node_label, no_uuid, "
                                  "malformed_sample).", ["metric", "reason"], registry=r)
        self.snapshot_time = Gauge("gpu_admission_extender_snapshot_timestamp_seconds",
                                   "Unix time of the last successful poll.", registry=r)
        self.gpu_nodes = Gauge("gpu_admission_extender_gpu_nodes",
                               "Nodes with GPU metrics in the last snapshot.", registry=r)
        self.gpus = Gauge("gpu_admission_extender_gpus",
                          "GPUs with complete metrics in the last snapshot.", registry=r)
        self.policy_reloads = Counter("gpu_admission_extender_policy_reloads",
                                      "Policy file reloads by result.", ["result"], registry=r)
        for verb in (*VERBS, BIND):
            self.latency.labels(verb)
        for result in ("success", "failure"):
            self.polls.labels(result)
            self.policy_reloads.labels(result)
        for reason in POLL_ERROR_REASONS:
            self.poll_errors.labels(reason)
        for metric in METRICS:
            for reason in ("nan", "negative"):
                self.bad_values.labels(metric, reason)

    def on_poll(self, snapshot: Snapshot | None, error: PollError | None) -> None:
        if error is not None:
            self.polls.labels("failure").inc()
            self.poll_errors.labels(error.reason).inc()
            return
        assert snapshot is not None
        self.polls.labels("success").inc()
        self.snapshot_time.set(snapshot.taken_at)
        self.gpu_nodes.set(len(snapshot.nodes))
        self.gpus.set(snapshot.gpu_count)
        for (metric, reason), count in snapshot.bad_values.items():
            self.bad_values.labels(metric, reason).inc(count)


@dataclass(slots=True, eq=False)
class ExtenderState:
    config: ExtenderConfig
    log: FilteringBoundLogger
    metrics: ExtenderMetrics
    poller: Poller
    policy: Policy
    started: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    kube: KubeState | None = None  # the ledger's watch, with kube_source
    binder: Binder | None = None
    #: CPU and memory requested per node (fragmentation ranking), from its own pods watch
    requests: NodeRequests | None = None
    #: the fractional ranking's learned workload and arrays (filter, prioritize and the
    #: binder share this one object: :class:`Placer`)
    placer: Placer = field(default_factory=Placer)


STATE = web.AppKey("extender_state", ExtenderState)


# --- decoding (strict) ----------------------------------------------------------------------

class ArgsError(ValueError):
    """A request that is not an ExtenderArgs; the message names the field."""


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    pod: dict[str, Any]
    names: list[str]  # node names, in request order
    nodes: list[dict[str, Any]] | None  # the Node objects when sent as Nodes (a NodeList)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def decode_args(body: bytes) -> ExtenderArgs:
    """Parse an ``ExtenderArgs`` body; :class:`ArgsError` names the offending field.

    Unknown top-level keys are ignored, like Go's decoder does, so a newer kube-scheduler
    adding a field does not break the extender."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ArgsError(f"body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ArgsError(f"body: expected an ExtenderArgs object, got {_kind(data)}")
    pod = data.get("Pod")
    if not isinstance(pod, dict):
        raise ArgsError(f"Pod: expected a v1.Pod object, got {_kind(pod)}")
    for key in ("metadata", "spec"):
        if key in pod and not isinstance(pod[key], dict):
            raise ArgsError(f"Pod.{key}: expected an object, got {_kind(pod[key])}")
    raw_nodes, raw_names = data.get("Nodes"), data.get("NodeNames")
    if raw_nodes is None and raw_names is None:
        raise ArgsError("Nodes, NodeNames: expected one of them (a v1.NodeList or an array "
                        "of node names), got neither")
    if raw_nodes is not None:
        if not isinstance(raw_nodes, dict):
            raise ArgsError(f"Nodes: expected a v1.NodeList object, got {_kind(raw_nodes)}")
        items = raw_nodes.get("items")
        if items is None:
            items = []  # Go encodes an empty NodeList's nil slice as null
        if not isinstance(items, list):
            raise ArgsError(f"Nodes.items: expected an array, got {_kind(items)}")
        names = []
        for i, node in enumerate(items):
            meta = node.get("metadata") if isinstance(node, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(name, str) or not name:
                raise ArgsError(f"Nodes.items[{i}].metadata.name: expected a node name, got "
                                f"{_kind(name)}")
            names.append(name)
        return ExtenderArgs(pod, names, items)
    if not isinstance(raw_names, list):
        raise ArgsError(f"NodeNames: expected an array of strings, got {_kind(raw_names)}")
    for i, name in enumerate(raw_names):
        if not isinstance(name, str) or not name:
            raise ArgsError(f"NodeNames[{i}]: expected a node name, got {_kind(name)}")
    return ExtenderArgs(pod, list(raw_names), None)


@dataclass(frozen=True, slots=True)
class BindingArgs:
    """``ExtenderBindingArgs`` (extender/v1: no json tags, so the Go field names)."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def decode_binding_args(body: bytes) -> BindingArgs:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ArgsError(f"body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ArgsError(f"body: expected an ExtenderBindingArgs object, got {_kind(data)}")
    values = []
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = data.get(key)
        if not isinstance(value, str) or (not value and key != "PodUID"):
            raise ArgsError(f"{key}: expected a non-empty string, got {_kind(value)}")
        values.append(value)
    return BindingArgs(*values)


# --- encoding ---------------------------------------------------------------------------------

def encode_filter(args: ExtenderArgs, result: FilterResult) -> bytes:
    """An ``ExtenderFilterResult`` in the request's form."""
    if args.nodes is not None:
        keep = set(result.passed)
        nodes: Any = {"apiVersion": "v1", "kind": "NodeList",
                      "items": [n for n, name in zip(args.nodes, args.names, strict=True)
                                if name in keep]}
        names: Any = None
    else:
        nodes, names = None, result.passed
    return orjson.dumps({"Nodes": nodes, "NodeNames": names, "FailedNodes": result.failed,
                         "FailedAndUnresolvableNodes": {}, "Error": ""})


def encode_priorities(scores: list[tuple[str, int]]) -> bytes:
    """A ``HostPriorityList``."""
    return orjson.dumps([{"Host": host, "Score": score} for host, score in scores])


# --- handlers ---------------------------------------------------------------------------------

def _error(code: int, message: str) -> web.Response:
    return web.Response(status=code, body=orjson.dumps({"error": message}), content_type=JSON)


#: What a verb does with a request body once the frame has read it.
Answer = Callable[[ExtenderState, bytes], Awaitable[web.Response]]


async def _handle(request: web.Request, verb: str, answer: Answer) -> web.Response:
    """The frame every verb shares: content type, body size, a clear 500 for a bug, metrics
    and a log line for every refusal."""
    state = request.app[STATE]
    start = time.perf_counter()
    if request.content_type != JSON:
        response = _error(415, f"Content-Type must be {JSON}, got "
                               f"{request.headers.get('Content-Type', 'none')[:100]!r}")
    else:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            response = _error(413, f"body is over {state.config.max_body_bytes} bytes")
        else:
            try:
                response = await answer(state, body)
            except Exception:  # a bug: logged with its traceback, a clear 500 to the caller
                state.log.exception("request_failed", verb=verb)
                response = _error(500, "internal error in gpu-admission extender; see its log")
    elapsed = time.perf_counter() - start
    state.metrics.requests.labels(verb, str(response.status)).inc()
    state.metrics.latency.labels(verb).observe(elapsed)
    if response.status != 200:
        state.log.warning("rejected_request", verb=verb, code=response.status,
                          error=orjson.loads(response.body)["error"]  # type: ignore[arg-type]
                          if response.body else "")
    return response


def decide(state: ExtenderState, verb: str, body: bytes, *,
           fractional: bool = True) -> web.Response:
    """Decode, decide, encode (synchronous: pure work on in-memory data). ``fractional``
    False (the ``-nonfractional`` verbs): fractional pods get a neutral answer."""
    try:
        args = decode_args(body)
    except ArgsError as exc:
        return _error(400, str(exc))
    policy = state.policy
    placement = policy.spec.placement
    share = fractional_share(args.pod)
    bad = fractional_error(args.pod)
    if not fractional and (share is not None or bad):
        state.metrics.neutral.labels(verb, "fractional").inc()
        out = (encode_filter(args, FilterResult(list(args.names), {}, "fractional"))
               if verb == "filter" else encode_priorities([(n, 0) for n in args.names]))
        return web.Response(body=out, content_type=JSON)
    kube = state.kube
    synced = kube is not None and kube.synced
    if share is not None and synced:
        assert kube is not None
        kube.remember(args.pod)  # its bind assumes the share before any API call
        return decide_fractional(state, verb, args, share)
    if bad and verb == "filter":  # a broken fractional pod fits nowhere; the reason says why
        return web.Response(body=encode_filter(args, FilterResult(
            [], dict.fromkeys(args.names, bad))), content_type=JSON)
    demand = pod_demand(args.pod, policy)
    if synced and share is None and (demand.kind == "none"
                                     or (demand.kind == "whole" and demand.gpus > 0)):
        return decide_ranked(state, verb, args, demand.gpus if demand.kind == "whole" else 0)
    snapshot = state.poller.fresh_snapshot()
    neutral = neutral_reason(demand, snapshot)
    if neutral:
        state.metrics.neutral.labels(verb, neutral).inc()
    if verb == "filter":
        result = filter_nodes(demand, args.names, snapshot, placement)
        if result.failed:
            state.metrics.filtered.inc(len(result.failed))
            meta = args.pod.get("metadata")
            state.log.info("nodes_filtered", pod=meta.get("name") if isinstance(meta, dict)
                           else None, failed=result.failed, passed=len(result.passed))
        out = encode_filter(args, result)
    else:
        out = encode_priorities(score_nodes(demand, args.names, snapshot, placement))
    return web.Response(body=out, content_type=JSON)


def _source(state: ExtenderState) -> LedgerSource:
    kube = state.kube
    assert kube is not None
    return LedgerSource(kube.ledger, kube.nodes, state.requests)


def decide_ranked(state: ExtenderState, verb: str, args: ExtenderArgs,
                  gpus: int) -> web.Response:
    """A whole-GPU pod (``gpus`` cards) or a CPU pod, on the ledger: filter passes every
    node (kube-scheduler's NodeResourcesFit checks counts, CPU and memory on its own cache,
    which knows the pods it just assumed), prioritize ranks by the fragmentation the pod
    adds (:func:`prioritize_pod`); filter observes the pod for the learned workload."""
    cpu, mem = pod_requests(args.pod)
    shape = Shape(cpu, mem, MILLI if gpus else 0, gpus)
    placer = state.placer
    if verb == "filter":
        placer.workload.observe(shape)
        return web.Response(body=encode_filter(args, FilterResult(list(args.names), {})),
                            content_type=JSON)
    req = placer.request(args.names, _source(state), state.policy)
    return web.Response(body=encode_priorities(prioritize_pod(placer, req, shape)),
                        content_type=JSON)


def decide_fractional(state: ExtenderState, verb: str, args: ExtenderArgs,
                      share: int) -> web.Response:
    """A fractional pod: decided on the GPU ledger (exact), ranked by fragmentation."""
    source = _source(state)
    placer = state.placer
    pod = pod_requests(args.pod)
    req = placer.request(args.names, source, state.policy)
    if verb == "filter":
        # learn the workload from the pods asked about (once per scheduling attempt)
        cards = req.card[req.card > 0]
        if len(cards):
            placer.observe(share, int(cards[0]), pod)
        result = filter_share(placer, req, source, share, state.policy, pod=pod)
        if result.failed:
            state.metrics.filtered.inc(len(result.failed))
            meta = args.pod.get("metadata")
            state.log.info("nodes_filtered", pod=meta.get("name") if isinstance(meta, dict)
                           else None, failed=result.failed, passed=len(result.passed),
                           fractional_mib=share)
        out = encode_filter(args, result)
    else:
        out = encode_priorities(priorities(req, rank_share(
            placer, req, share, state.policy.spec.placement, pod)))
    return web.Response(body=out, content_type=JSON)


async def bind_handler(request: web.Request) -> web.Response:
    """``ExtenderBindingArgs`` -> ``ExtenderBindingResult``. A bind that fails answers 200
    with ``Error`` (kube-scheduler then forgets the pod's assumed placement and retries)."""
    return await _handle(request, BIND, _bind)


async def _bind(state: ExtenderState, body: bytes) -> web.Response:
    try:
        args = decode_binding_args(body)
    except ArgsError as exc:
        return _error(400, str(exc))
    if state.binder is None:
        error = ("gpu-admission extender: the bind verb needs --kubeconfig (a kubeconfig "
                 "or in-cluster) and --namespace; not bound")
    else:
        try:
            error = await state.binder.bind(args.pod_namespace, args.pod_name, args.pod_uid,
                                            args.node)
        except Exception:
            state.log.exception("bind_crashed", pod=f"{args.pod_namespace}/{args.pod_name}")
            error = "internal error in gpu-admission extender bind; see its log"
    return web.Response(body=orjson.dumps({"Error": error}), content_type=JSON)


async def _filter(state: ExtenderState, body: bytes) -> web.Response:
    return decide(state, "filter", body)


async def _prioritize(state: ExtenderState, body: bytes) -> web.Response:
    return decide(state, "prioritize", body)


async def _filter_other(state: ExtenderState, body: bytes) -> web.Response:
    return decide(state, "filter", body, fractional=False)


async def _prioritize_other(state: ExtenderState, body: bytes) -> web.Response:
    return decide(state, "prioritize", body, fractional=False)


async def filter_handler(request: web.Request) -> web.Response:
    return await _handle(request, "filter", _filter)


async def prioritize_handler(request: web.Request) -> web.Response:
    return await _handle(request, "prioritize", _prioritize)


async def filter_other_handler(request: web.Request) -> web.Response:
    return await _handle(request, "filter", _filter_other)


async def prioritize_other_handler(request: web.Request) -> web.Response:
    return await _handle(request, "prioritize", _prioritize_other)


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the event loop answers."""
    return web.Response(body=b'{"status":"ok"}', content_type=JSON)


def status(state: ExtenderState) -> dict[str, Any]:
    poller = state.poller
    snapshot = poller.snapshot
    age = (None if poller.last_success is None
           else round(poller.clock() - poller.last_success, 3))
    out: dict[str, Any] = {"metrics": "stale" if poller.stale() else "fresh",
                           "gpu_nodes": len(snapshot.nodes) if snapshot else 0,
                           "gpus": snapshot.gpu_count if snapshot else 0,
                           "snapshot_age_seconds": age, "policy": state.policy.digest}
    if state.kube is not None:
        out["ledger"] = {"synced": state.kube.synced,
                         "open_gpus": sum(len(g) for g in state.kube.ledger.usage().values())}
    return out


async def readyz(request: web.Request) -> web.Response:
    """Ready once started. Stale metrics do not make it unready: the extender still answers
    (neutrally), and readiness only gates Service endpoints, which the loopback layout does
    not use; ``metrics`` in the body and the stale gauge say how fresh the data is."""
    state = request.app[STATE]
    if not state.started:
        return web.Response(status=503, content_type=JSON,
                            body=orjson.dumps({"status": "not ready",
                                               "reasons": ["not started"]}))
    return web.Response(body=orjson.dumps({"status": "ready", **status(state)}),
                        content_type=JSON)


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    state.poller.check_stale()
    response = web.Response(body=generate_latest(state.metrics.registry))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


async def not_found(request: web.Request) -> web.Response:
    state = request.app[STATE]
    routes = ", ".join(f"POST {state.config.route(v)}" for v in (*VERBS, BIND))
    return _error(404 if request.method in ("GET", "POST", "HEAD") else 405,
                  f"no such endpoint {request.method} {request.path[:100]!r}; {routes}, "
                  f"GET /healthz, /readyz, /metrics")


# --- lifecycle --------------------------------------------------------------------------------

async def reload_policy(state: ExtenderState) -> bool:
    """Load the policy file again; an invalid file keeps the last good policy."""
    path = state.config.policy_path
    try:
        policy = await asyncio.to_thread(read_policy, path)
    except (PolicyError, OSError) as exc:
        error = str(exc)  # the message names the bad field: no traceback needed
    else:
        error = ""
    if error:
        state.metrics.policy_reloads.labels("failure").inc()
        state.log.error("policy_reload_failed", policy=str(path), error=error,
                        action="still using the previous policy")
        return False
    state.policy = policy
    state.metrics.policy_reloads.labels("success").inc()
    state.log.info("policy_reloaded", policy=str(path), digest=policy.digest)
    return True


def read_policy(path: Path | None) -> Policy:
    """The policy file or the built-in default; builds the compiled tables (and digest)."""
    policy = load_policy(path) if path is not None else default_policy()
    _ = policy.digest
    return policy


async def _background(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    cfg = state.config
    state.tasks.append(asyncio.create_task(state.poller.run(), name="poll-prometheus"))
    if state.kube is not None and state.binder is not None:
        state.kube.watcher.start()
        state.tasks.append(asyncio.create_task(state.binder.housekeeping(),
                                               name="gpu-housekeeping"))
    if cfg.policy_path is not None:
        watcher = FileWatcher("policy", [cfg.policy_path], cfg.reload_interval_seconds,
                              lambda: reload_policy(state), state.log)
        state.tasks.append(asyncio.create_task(watcher.run(), name="watch-policy"))
    state.started = True
    state.log.info("extender_started", prometheus=cfg.prometheus_url,
                   interval_seconds=cfg.interval_seconds, window=cfg.window,
                   node_label=cfg.node_label, routes=[cfg.route(v) for v in VERBS],
                   policy=str(cfg.policy_path or "built-in default"),
                   policy_digest=state.policy.digest)
    try:
        yield
    finally:
        state.started = False
        await cancel_tasks(state.tasks)
        if state.kube is not None:
            await state.kube.watcher.stop()
            await asyncio.to_thread(state.kube.client.close)
        if state.binder is not None:  # the bind's own client (issue 36)
            await state.binder.close()
        state.log.info("extender_stopped")


def create_app(config: ExtenderConfig, *,
               logger: FilteringBoundLogger | None = None) -> web.Application:
    """The extender application. Loads the policy now (a broken file fails before
    listening with :class:`PolicyError`); the poller and the policy watcher start with it."""
    log = logger if logger is not None else make_logger()
    policy = read_policy(config.policy_path)
    ext_metrics = ExtenderMetrics()
    poller = Poller(PollerConfig(config.prometheus_url, config.interval_seconds, config.window,
                                 config.node_label, config.stale_after_intervals), log,
                    on_poll=ext_metrics.on_poll)
    placer = Placer()  # this app's: filter, prioritize and bind rank with it
    state = ExtenderState(config=config, log=log, metrics=ext_metrics, poller=poller,
                          policy=policy, placer=placer)
    ext_metrics.stale.set_function(lambda: 1.0 if poller.stale() else 0.0)
    if config.kube_source is not None:
        bind_config = config.bind or BindConfig(namespace="gpu-admission", image="gpu-admission")
        kube_state = KubeState(api_client(config.kube_source, pool_size=16), bind_config,
                               BindMetrics(ext_metrics.registry), log,
                               lambda: state.policy, config.watch_timeout_seconds,
                               placer=placer)
        state.kube = kube_state
        state.binder = Binder(kube_state)
        state.requests = kube_state.requests
    app = web.Application(client_max_size=config.max_body_bytes)
    app[STATE] = state
    app.router.add_post(config.route("filter"), filter_handler)
    app.router.add_post(config.route("prioritize"), prioritize_handler)
    app.router.add_post(config.route("filter" + OTHER_SUFFIX), filter_other_handler)
    app.router.add_post(config.route("prioritize" + OTHER_SUFFIX), prioritize_other_handler)
    app.router.add_post(config.route(BIND), bind_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_route("*", "/{tail:.*}", not_found)
    app.cleanup_ctx.append(_background)
    return app


def create_probe_app(app: web.Application) -> web.Application:
    """/healthz, /readyz and /metrics alone, sharing ``app``'s state: served on all
    interfaces (``--metrics-port``) for the kubelet's probes and Prometheus, while the verbs
    stay on loopback."""
    probe = web.Application()
    probe[STATE] = app[STATE]
    probe.router.add_get("/healthz", healthz)
    probe.router.add_get("/readyz", readyz)
    probe.router.add_get("/metrics", metrics)
    probe.router.add_route("*", "/{tail:.*}", not_found)
    return probe
