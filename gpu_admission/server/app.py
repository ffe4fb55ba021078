"""The aiohttp application: ``POST /mutate``, ``POST /validate``, probes and metrics.

One handler per webhook path, no middleware: the request path is read body -> parse ->
``evaluate`` -> encode -> one log line, one decision record, three metric updates.

Why these status codes (the API server's side is ``k8s.io/apiserver/pkg/admission/plugin/
webhook``: any non-200 reply is a *failed call*, handled by the webhook's ``failurePolicy``):

* 200 + AdmissionReview for every well-formed review, including denials (``allowed: false``,
  ``status.code: 403``, reason ``Forbidden``): the API server shows
  ``admission webhook "<name>" denied the request: <message>``.
* 400 / 413 / 415 / 405 with ``{"error": ...}`` for requests that are not an AdmissionReview
  POST: the API server never sends them, so they only reach broken or hostile callers.
* 429 when a review's body has not fully arrived and ``max_in_flight`` reviews are already
  waiting for theirs: refused at once, before reading, instead of queueing past the API
  server's timeout. Only reviews still receiving their body count: that is the one place a
  review waits inside the server (a complete body is decided at once, synchronously), and
  it bounds the memory held by bodies of up to ``max_body_bytes``. So clients that hold
  half-sent requests open can fill the bound, but never starve complete reviews, such as
  the API server's, which sends each body in one go. Being a
  failed call (not a denial), it follows the webhook's ``failurePolicy``: ``Fail`` rejects
  the pod with an error naming the webhook, ``Ignore`` admits it with the
  ``failed-open.mutation.webhook.admission.k8s.io`` audit annotation. Answering
  ``allowed: false`` instead would override the administrator's ``Ignore``. No
  ``Retry-After``: client-go would sleep and retry inside the same deadline, piling more
  load on an overloaded server; the pod's controller retries with backoff anyway.
* 408 when the body is not received before ``min(read timeout, deadline)``; the connection
  is closed (slow or half-sent request).
* 500 + AdmissionReview (uid set, ``allowed: false``, ``status.code: 500``) when the policy
  engine raises: a failed call, again subject to ``failurePolicy``; the traceback stays in
  the server log.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError
from structlog.typing import FilteringBoundLogger

from gpu_admission.admission.claims import evaluate_claim, is_claim_kind
from gpu_admission.admission.engine import evaluate
from gpu_admission.auditlog.record import audit_annotations, decision_record
from gpu_admission.auditlog.writer import DecisionLog
from gpu_admission.certs.bundle import not_after
from gpu_admission.core.decision import Decision, RequestFacts, Stage
from gpu_admission.dra.model import DraSnapshot
from gpu_admission.facts.nodepools import NodeView
from gpu_admission.policy.model import Policy, PolicyError, default_policy, load_policy
from gpu_admission.server.config import ServerConfig
from gpu_admission.server.logs import info_writer, make_logger
from gpu_admission.server.metrics import CONTENT_TYPE, Metrics
from gpu_admission.server.reload import FileWatcher, cancel_tasks
from gpu_admission.server.tls import ReloadingContext, load_context
from gpu_admission.server.wire import (
    Review,
    WireError,
    denial_status,
    encode_response,
    parse_go_duration,
    parse_review,
    sanitize_warnings,
)

if TYPE_CHECKING:
    from gpu_admission.kube.dra import DraCache
    from gpu_admission.kube.nodes import NodeCache

JSON = "application/json"
MUTATE_PATH = "/mutate"
VALIDATE_PATH = "/validate"


@dataclass(slots=True, eq=False)
class ServerState:
    """Everything mutable the handlers share; lives on the app under :data:`STATE`."""

    config: ServerConfig
    log: FilteringBoundLogger
    metrics: Metrics
    tls: ReloadingContext
    policy: Policy
    policy_digest: str
    decision_log: DecisionLog | None = None
    in_flight: int = 0  # reviews being read or decided
    receiving: int = 0  # of those, reviews whose body is still arriving (the 429 bound)
    draining: bool = False  # set on SIGTERM: not ready, Connection: close
    started: bool = False  # background tasks running, decision log open
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    watchers: list[FileWatcher] = field(default_factory=list)
    #: ``log.info`` without structlog's dispatch, for the per-review line (None: use log)
    log_info: Callable[[str, dict[str, Any]], None] | None = None
    dra: DraCache | None = None  # the DRA watch cache (docs/dra.md), when configured
    nodes: NodeCache | None = None  # the Node watch cache (docs/pools.md), when configured

    def not_ready_reasons(self) -> list[str]:
        reasons = []
        if self.draining:
            reasons.append("shutting down")
        if not self.started:
            reasons.append("not started")
        if self.dra is not None and not self.dra.synced:
            reasons.append("DRA cache not synced")
        return reasons


STATE = web.AppKey("state", ServerState)


# --- loading -------------------------------------------------------------------------------

def load_tls(cert_file: Path, key_file: Path) -> tuple[ssl.SSLContext, float]:
    """A server context for the pair plus the certificate's notAfter (Unix seconds).
    Blocking: runs at startup or in a thread."""
    pem = cert_file.read_bytes()
    ctx = load_context(cert_file, key_file)
    return ctx, not_after(pem).timestamp()


def read_policy(path: Path | None) -> tuple[Policy, str]:
    """The policy file (or the built-in default when no file is configured) and its digest.
    Computing the digest also builds the policy's compiled lookup tables, so that work
    happens here (in a thread on reload), not in the first request after a swap."""
    policy = load_policy(path) if path is not None else default_policy()
    return policy, policy.digest


#: Warn in the log when the serving certificate has less than this left (seconds).
EXPIRY_WARNING_SECONDS = 14 * 86400


def _warn_if_expiring(log: FilteringBoundLogger, cert_file: Path, expiry: float) -> None:
    left = expiry - time.time()
    if left < EXPIRY_WARNING_SECONDS:
        log.warning("certificate_expiring" if left > 0 else "certificate_expired",
                    cert=str(cert_file), days_left=round(left / 86400, 1),
                    action="renew: gpu-admission install-certs, or cert-manager")


async def reload_tls(state: ServerState) -> bool:
    """Load the certificate pair again; keep the old context if the new pair is unusable."""
    cfg = state.config
    try:
        ctx, expiry = await asyncio.to_thread(load_tls, cfg.cert_file, cfg.key_file)
    except (ssl.SSLError, OSError, ValueError) as exc:
        error = str(exc)  # expected (e.g. a half-written pair): no traceback
    else:
        error = ""
    if error:
        state.metrics.cert_reloads.labels("failure").inc()
        state.log.error("certificate_reload_failed", cert=str(cfg.cert_file),
                        key=str(cfg.key_file), error=error,
                        action="still serving the previous certificate")
        return False
    state.tls.swap(ctx)
    state.metrics.cert_reloads.labels("success").inc()
    state.metrics.cert_expiry.set(expiry)
    state.log.info("certificate_reloaded", cert=str(cfg.cert_file),
                   generation=state.tls.generation, not_after=expiry)
    _warn_if_expiring(state.log, cfg.cert_file, expiry)
    return True


async def reload_policy(state: ServerState) -> bool:
    """Validate the policy file again and swap it in; an invalid file keeps the last good."""
    path = state.config.policy_path
    try:
        policy, digest = await asyncio.to_thread(read_policy, path)
    except (PolicyError, OSError, ValueError) as exc:
        error = str(exc)  # the message names the bad field: no traceback needed
    else:
        error = ""
    if error:
        state.metrics.policy_reloads.labels("failure").inc()
        state.log.error("policy_reload_failed", policy=str(path), error=error,
                        action="still serving the previous policy",
                        digest=state.policy_digest)
        return False
    state.policy, state.policy_digest = policy, digest
    state.metrics.policy_reloads.labels("success").inc()
    state.metrics.policy_loaded.set(time.time())
    state.log.info("policy_reloaded", policy=str(path), digest=digest)
    return True


# --- responses -----------------------------------------------------------------------------

def _error(code: int, message: str, **headers: str) -> web.Response:
    return web.Response(status=code, body=orjson.dumps({"error": message}),
                        content_type=JSON, headers=headers or None)


def _review_response(body: bytes, status: int = 200) -> web.Response:
    return web.Response(status=status, body=body, content_type=JSON)


def deadline_seconds(timeout_param: str | None, config: ServerConfig) -> float:
    """How long we may take: the API server's remaining time (``?timeout=10s``, rounded up to
    whole seconds by it) minus a safety margin, but never less than half of it."""
    total = parse_go_duration(timeout_param) if timeout_param else None
    if total is None or total <= 0:
        total = config.default_deadline_seconds
    return max(total - config.deadline_margin_seconds, total / 2)


# --- the webhook handlers -------------------------------------------------------------------

async def _handle_review(request: web.Request, stage: Stage, path: str) -> web.StreamResponse:
    state = request.app[STATE]
    start = time.perf_counter()
    log_fields: dict[str, Any] | None = None
    if request.method != "POST":
        response = _error(405, f"{path} accepts POST only, got {request.method}", Allow="POST")
    else:
        state.in_flight += 1
        try:
            response, log_fields = await _review(request, state, stage)
        except Exception:  # a bug outside the decision (which has its own 500): no traceback
            state.log.exception("request_failed", path=path)  # to the client, a clear 500
            response = _error(500, "internal error in gpu-admission; see the webhook log")
        finally:
            state.in_flight -= 1
    if state.draining:
        response.force_close()  # sends Connection: close so clients reconnect elsewhere
    elapsed = time.perf_counter() - start
    state.metrics.observe_request(path, response.status, elapsed)
    if log_fields is not None:
        line = {"path": path, "code": response.status,
                "duration_ms": round(elapsed * 1000, 3), **log_fields}
        if state.log_info is not None:
            state.log_info("review", line)
        else:
            state.log.info("review", **line)
    else:
        state.log.warning("rejected_request", path=path, method=request.method,
                          code=response.status, duration_ms=round(elapsed * 1000, 3),
                          error=_error_text(response))
    return response


def _error_text(response: web.Response) -> str:
    try:
        return str(orjson.loads(response.body or b"{}").get("error", ""))  # type: ignore[arg-type]
    except (orjson.JSONDecodeError, AttributeError):
        return ""


async def _review(request: web.Request, state: ServerState,
                  stage: Stage) -> tuple[web.Response, dict[str, Any] | None]:
    """Read, parse and decide one review. Returns the response and, for a parsed review,
    the fields of its log line (None for a rejected request)."""
    cfg = state.config
    # Fast path: the exact header the API server sends; otherwise parse it (parameters
    # such as "; charset=utf-8" are fine).
    if request.headers.get("Content-Type") != JSON and request.content_type != JSON:
        got = request.headers.get("Content-Type", "none")
        return _error(415, f"Content-Type must be application/json, got {got[:100]!r}"), None
    length = request.content_length
    if length is not None and length > cfg.max_body_bytes:
        response = _error(413, f"body of {length} bytes is over the limit of "
                               f"{cfg.max_body_bytes} bytes")
        response.force_close()  # do not read the rest of a huge body
        return response, None
    complete = request.content.is_eof()  # whole body received: nothing to wait for
    if not complete and state.receiving >= cfg.max_in_flight:
        state.metrics.overload.labels("in_flight").inc()
        return _error(429, f"overloaded: {state.receiving} admission reviews are still "
                           f"sending their body (limit {cfg.max_in_flight}); retry later"), None
    try:
        if complete:
            body = await request.read()
        else:
            state.receiving += 1
            try:
                budget = deadline_seconds(request.query.get("timeout"), cfg)
                async with asyncio.timeout(min(cfg.read_timeout_seconds, budget)):
                    body = await request.read()
            finally:
                state.receiving -= 1
    except TimeoutError:
        state.metrics.overload.labels("deadline").inc()
        response = _error(408, "request body not received in time")
        response.force_close()
        return response, None
    except web.HTTPRequestEntityTooLarge:
        response = _error(413, f"body is over the limit of {cfg.max_body_bytes} bytes")
        response.force_close()
        return response, None
    except (RequestPayloadError, HttpProcessingError) as exc:  # e.g. bad gzip or chunking
        cause = exc.__cause__ or exc
        response = _error(400, f"request body could not be read: "
                               f"{str(getattr(cause, 'message', cause)).strip()[:200]}")
        response.force_close()
        return response, None
    try:
        review = parse_review(body)
    except WireError as exc:
        return _error(400, str(exc)), None
    return _decide(review, state, stage)


def _decide(review: Review, state: ServerState,
            stage: Stage) -> tuple[web.Response, dict[str, Any]]:
    """Run the policy on a parsed review and render the AdmissionReview reply."""
    pod = review.obj if review.obj is not None else review.old
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    fields: dict[str, Any] = {
        "uid": review.uid, "namespace": review.namespace,
        "pod": (meta.get("name") or meta.get("generateName", "")) if isinstance(meta, dict)
        else review.name,
        "operation": review.operation, "user": review.user, "dry_run": review.dry_run,
        "api_version": review.api_version,
    }
    claim = is_claim_kind(review.group, review.kind) and review.operation == "CREATE" and (
        review.obj is not None and not review.sub_resource)
    # kubectl debug: the ephemeral containers it adds meet the GPU-access guard (docs/guard.md).
    ephemeral = review.is_ephemeral and review.operation == "UPDATE"
    if not claim and not ephemeral and (
            not review.is_pod or review.operation not in ("CREATE", "UPDATE")):
        fields["decision"] = "skipped"  # not ours to judge: allowed untouched, no record
        fields["kind"] = review.kind
        return _review_response(encode_response(review.api_version, review.uid,
                                                allowed=True)), fields
    # UPDATE: pod specs are mostly immutable, so it is re-checked, never mutated (except the
    # ephemeral containers an ephemeralcontainers UPDATE adds).
    effective: Stage = "validate" if review.operation == "UPDATE" and not ephemeral else stage
    facts = review.facts(effective)
    assert review.obj is not None  # parse_review guarantees a Pod on CREATE/UPDATE
    policy, digest = state.policy, state.policy_digest
    dra = state.dra.snapshot() if state.dra is not None else None
    nodes = state.nodes.view(policy) if state.nodes is not None else None
    try:
        decision = (evaluate_claim(review.obj, review.kind, facts, policy, dra) if claim
                    else evaluate(review.obj, facts, policy, dra, nodes))
        said = _new_warnings(review, decision, stage, facts, policy=policy, dra=dra, nodes=nodes)
        body = _render(review, decision, effective, said)
        record = None if state.decision_log is None else decision_record(
            decision=decision, facts=facts, pod=review.obj, uid=review.uid,
            policy_digest=digest, instance=state.config.instance)
    except Exception as exc:
        state.metrics.count_decision(effective, "error", review.dry_run)
        state.log.exception("decision_failed", uid=review.uid, namespace=review.namespace,
                            pod=fields["pod"], policy_digest=digest)
        fields["decision"] = "error"
        status = denial_status(500, f"gpu-admission failed to evaluate the pod "
                                    f"({type(exc).__name__}); see the webhook log for "
                                    f"uid {review.uid}", "InternalError")
        return _review_response(encode_response(review.api_version, review.uid,
                                                allowed=False, status=status), 500), fields
    result = ("mutated" if body[1] else "allowed") if decision.allowed else "denied"
    fields["decision"] = result
    if decision.violations:
        fields["rules"] = [v.rule for v in decision.violations]
    metrics = state.metrics
    metrics.count_decision(effective, result, review.dry_run)
    for violation in decision.violations:
        metrics.count_violation(effective, violation.rule, str(violation.mode))
    if state.decision_log is not None and record is not None:
        state.decision_log.write(record)
    return _review_response(body[0]), fields


def _new_warnings(review: Review, decision: Decision, stage: Stage, facts: RequestFacts, *,
                  policy: Policy, dra: DraSnapshot | None,
                  nodes: NodeView | None = None) -> tuple[str, ...]:
    """The warnings to send: said once per decision, by the stage that decides it (issue
    34). The validating webhook re-checks what the mutating one decided and said, so it says
    nothing; an UPDATE (``kubectl label pod``) says only what the old pod did not already
    get (a pod decided at creation is not warned again for fields the webhook does not
    judge). Denials are never affected (they travel in the status)."""
    if not decision.warnings or review.is_ephemeral:
        return decision.warnings
    if stage == "validate":
        return ()
    if review.operation == "UPDATE" and isinstance(review.old, dict):
        before = evaluate(review.old, facts, policy, dra, nodes).warnings
        return tuple(w for w in decision.warnings if w not in before)
    return decision.warnings


def _render(review: Review, decision: Decision, stage: Stage,
            warnings: tuple[str, ...]) -> tuple[bytes, bool]:
    """The reply bytes and whether a patch was sent."""
    patch = decision.patch if (decision.allowed and stage == "mutate" and (
        review.operation == "CREATE" or review.is_ephemeral)) else ()
    status = None
    if not decision.allowed:
        message = decision.denial_message() or "denied by the gpu-admission policy"
        status = denial_status(403, message, "Forbidden")
    body = encode_response(review.api_version, review.uid, allowed=decision.allowed,
                           patch=patch, warnings=sanitize_warnings(warnings),
                           audit_annotations=audit_annotations(decision), status=status)
    return body, bool(patch)


async def mutate(request: web.Request) -> web.StreamResponse:
    return await _handle_review(request, "mutate", MUTATE_PATH)


async def validate(request: web.Request) -> web.StreamResponse:
    return await _handle_review(request, "validate", VALIDATE_PATH)


# --- probes and metrics -----------------------------------------------------------------

async def healthz(request: web.Request) -> web.Response:
    """Liveness: the event loop answers."""
    return web.Response(body=b'{"status":"ok"}', content_type=JSON)


async def readyz(request: web.Request) -> web.Response:
    """Readiness: certificate and policy loaded (``create_app`` fails otherwise), background
    reloaders and decision log running, the DRA cache (when configured) synced, and not
    shutting down. The body names the DRA API version watched."""
    state = request.app[STATE]
    reasons = state.not_ready_reasons()
    state.metrics.ready.set(0 if reasons else 1)
    if reasons:
        return web.Response(status=503, content_type=JSON,
                            body=orjson.dumps({"status": "not ready", "reasons": reasons}))
    body: dict[str, Any] = {"status": "ready", "policy": state.policy_digest}
    if state.dra is not None:
        # which resource.k8s.io version the DRA cache watches (v1, v1beta2 or v1beta1, by
        # discovery; "none" when the cluster serves no DRA API)
        body["dra"] = {"apiVersion": state.dra.api_version}
    if state.nodes is not None:
        # not a readiness condition: until Nodes are listed the declared pools are assumed
        view = state.nodes.view(state.policy)
        body["nodes"] = {"synced": state.nodes.synced,
                         "gpuNodes": len(view.nodes) if view is not None else 0}
    return web.Response(body=orjson.dumps(body), content_type=JSON)


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    state.metrics.ready.set(0 if state.not_ready_reasons() else 1)
    response = web.Response(body=state.metrics.render())
    response.headers["Content-Type"] = CONTENT_TYPE
    return response


PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


async def not_found(request: web.Request) -> web.Response:
    if request.path in PROBE_PATHS:  # e.g. POST /healthz: the GET route did not match
        return _error(405, f"{request.path} accepts GET only, got {request.method}",
                      Allow="GET, HEAD")
    return _error(404, f"no such endpoint {request.path[:100]!r}; "
                       "POST /mutate or /validate, GET /healthz, /readyz, /metrics")


def _add_probe_routes(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)


# --- lifecycle -------------------------------------------------------------------------------

async def _background(app: web.Application) -> AsyncIterator[None]:
    """Open the decision log and start the file watchers; undo both on cleanup (after the
    in-flight requests have finished, so no record is lost)."""
    state = app[STATE]
    cfg = state.config
    if cfg.audit_log is not None:
        state.decision_log = DecisionLog.open(cfg.audit_log, registry=state.metrics.registry)
    state.watchers.append(FileWatcher("certificate", [cfg.cert_file, cfg.key_file],
                                      cfg.reload_interval_seconds,
                                      lambda: reload_tls(state), state.log))
    if cfg.policy_path is not None:
        state.watchers.append(FileWatcher("policy", [cfg.policy_path],
                                          cfg.reload_interval_seconds,
                                          lambda: reload_policy(state), state.log))
    state.tasks = [asyncio.create_task(w.run(), name=f"watch-{w.name}")
                   for w in state.watchers]
    if state.dra is not None:
        state.dra.start()
    if state.nodes is not None:
        state.nodes.start()
    state.started = True
    state.log.info("server_started", instance=cfg.instance, policy=str(cfg.policy_path or
                   "built-in default"), policy_digest=state.policy_digest,
                   audit_log=cfg.audit_log, max_in_flight=cfg.max_in_flight,
                   max_body_bytes=cfg.max_body_bytes)
    try:
        yield
    finally:
        state.started = False
        await cancel_tasks(state.tasks)
        state.watchers.clear()
        if state.dra is not None:
            await state.dra.stop()
        if state.nodes is not None:
            await state.nodes.stop()
        if state.decision_log is not None:
            await state.decision_log.aclose()
            state.decision_log = None
        state.log.info("server_stopped")


def create_app(config: ServerConfig, *,
               logger: FilteringBoundLogger | None = None) -> web.Application:
    """The webhook application. Loads the certificate pair and the policy now (so a broken
    start fails loudly before listening: :class:`ssl.SSLError`, :class:`OSError`,
    :class:`PolicyError`); the decision log opens and the reloaders start with the app.

    Serve it with :func:`gpu_admission.server.run.start` (TLS context from
    :func:`ssl_context`), or any aiohttp runner given ``ssl_context(app)``.
    """
    log = logger if logger is not None else make_logger()
    ctx, expiry = load_tls(config.cert_file, config.key_file)
    policy, digest = read_policy(config.policy_path)
    state = ServerState(config=config, log=log, metrics=Metrics(), tls=ReloadingContext(ctx),
                        policy=policy, policy_digest=digest, log_info=info_writer(log))
    state.metrics.cert_expiry.set(expiry)
    _warn_if_expiring(log, config.cert_file, expiry)
    state.metrics.policy_loaded.set(time.time())
    state.metrics.in_flight.set_function(lambda: state.in_flight)
    if config.dra_source is not None:
        from gpu_admission.kube.dra import CacheMetrics, DraCache, api_client  # noqa: PLC0415
        # imported here: the kubernetes client takes ~0.5 s to import, only DRA needs it
        state.dra = DraCache(api_client(config.dra_source),
                             metrics=CacheMetrics(state.metrics.registry), log=log,
                             watch_timeout_seconds=config.dra_watch_timeout_seconds)
    if config.node_source is not None:
        from gpu_admission.kube.client import KubeSourceError  # noqa: PLC0415
        from gpu_admission.kube.client import api_client as kube_client  # noqa: PLC0415
        from gpu_admission.kube.nodes import NodeCache, NodeMetrics, NodeSourceError  # noqa: PLC0415
        try:
            client = kube_client(config.node_source, pool_size=3)
        except KubeSourceError as exc:
            raise NodeSourceError(str(exc)) from None
        state.nodes = NodeCache(client, metrics=NodeMetrics(state.metrics.registry), log=log,
                                watch_timeout_seconds=config.node_watch_timeout_seconds)
    state.metrics.receiving.set_function(lambda: state.receiving)
    app = web.Application(client_max_size=config.max_body_bytes)
    app[STATE] = state
    app.router.add_route("*", MUTATE_PATH, mutate)
    app.router.add_route("*", VALIDATE_PATH, validate)
    _add_probe_routes(app)
    app.router.add_route("*", "/{tail:.*}", not_found)
    app.cleanup_ctx.append(_background)
    return app


def create_probe_app(app: web.Application) -> web.Application:
    """The plain-HTTP app for the metrics port: /healthz, /readyz, /metrics only, sharing
    the webhook app's state (kubelet probes and Prometheus scrape without TLS)."""
    probe = web.Application()
    probe[STATE] = app[STATE]
    _add_probe_routes(probe)
    probe.router.add_route("*", "/{tail:.*}", not_found)
    return probe


def ssl_context(app: web.Application) -> ssl.SSLContext:
    """The context to listen with; it hands each handshake the current certificate."""
    return app[STATE].tls.base
