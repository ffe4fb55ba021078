"""The real ``kubernetes`` client, used by path: JSON dicts in, JSON dicts out.

Why by path and not the generated ``CoreV1Api`` methods: those validate bodies against
pydantic models (a plain pod dict is refused), deserialise answers into models (slow, and
``pods/binding`` answers with a ``Status`` the ``V1Binding`` model rejects), and exist for one
API version each (``resource.k8s.io`` is served as v1, v1beta2 or v1beta1 depending on the
cluster). The client's own configuration, authentication, TLS and connection pool are used
unchanged (``ApiClient.param_serialize`` + ``call_api``). All calls block: run them in a
thread (``asyncio.to_thread``) from the event loop.

API conventions: https://kubernetes.io/docs/reference/using-api/api-concepts/.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import orjson
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

from gpu_admission.core.vocab import IN_CLUSTER

HTTP_NOT_FOUND: Final = 404
HTTP_CONFLICT: Final = 409
HTTP_GONE: Final = 410
#: Seconds: (connect, read) for ordinary calls; watches pass their own.
DEFAULT_TIMEOUT: Final = (10.0, 30.0)
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"


class KubeSourceError(RuntimeError):
    """The kubeconfig or ServiceAccount cannot be loaded."""


class KubeError(RuntimeError):
    """A non-2xx answer of the API server: the status, its reason and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def api_client(source: str, *, pool_size: int = 8) -> k8s.ApiClient:
    """A client for ``source``: ``in-cluster`` (the pod's ServiceAccount) or a kubeconfig
    path. Blocking (reads files): call it at startup. ``pool_size``: concurrent connections
    (one per watch thread plus the calls made meanwhile)."""
    configuration = k8s.Configuration()
    try:
        if source == IN_CLUSTER:
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration)
        else:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=source, client_configuration=configuration)
    except (ConfigException, OSError, ValueError, TypeError) as exc:
        where = "in-cluster ServiceAccount" if source == IN_CLUSTER else f"kubeconfig {source}"
        raise KubeSourceError(f"cannot load the {where}: {exc}") from None
    configuration.connection_pool_maxsize = pool_size
    return k8s.ApiClient(configuration)


def _query(params: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    out = []
    for key, value in (params or {}).items():
        if value is None or value == "":
            continue
        out.append((key, ("true" if value else "false") if isinstance(value, bool)
                    else str(value)))
    return out


def raw_request(api: k8s.ApiClient, method: str, path: str, *,
                query: Mapping[str, Any] | None = None, body: Any = None,
                content_type: str = "application/json",
                timeout: float | tuple[float, float] = DEFAULT_TIMEOUT) -> Any:
    """Send one request; the ``RESTResponse`` (status, headers, body unread). Blocking."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    serialized = api.param_serialize(method, path, query_params=_query(query),
                                     header_params=headers, body=body,
                                     auth_settings=["BearerToken"])
    return api.call_api(*serialized, _request_timeout=timeout)


def request(api: k8s.ApiClient, method: str, path: str, *,
            query: Mapping[str, Any] | None = None, body: Any = None,
            content_type: str = "application/json",
            timeout: float | tuple[float, float] = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """One API call; the decoded JSON answer, or :class:`KubeError` for a non-2xx status
    (message from the ``Status`` body when there is one). Blocking."""
    response = raw_request(api, method, path, query=query, body=body,
                           content_type=content_type, timeout=timeout)
    data = response.read()
    if not 200 <= response.status <= 299:
        raise error_from(response.status, str(response.reason or ""), data)
    if not data:
        return {}
    decoded = orjson.loads(data)
    return decoded if isinstance(decoded, dict) else {"items": decoded}


def error_from(status: int, reason: str, data: bytes | None) -> KubeError:
    message = ""
    if data:
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError:
            message = data[:300].decode("utf-8", "replace")
        else:
            if isinstance(body, dict):
                message = str(body.get("message") or body.get("reason") or "")
                reason = str(body.get("reason") or reason)
    return KubeError(status, reason, message)


def collection_caller(api: k8s.ApiClient, path: str, *, label_selector: str = "",
                      field_selector: str = "") -> Callable[..., Any]:
    """A list function of a collection ``path`` with the calling convention of the
    generated list methods, so ``kubernetes.watch.Watch.stream`` can drive it: keyword
    arguments ``watch``, ``resource_version``, ``allow_watch_bookmarks``,
    ``timeout_seconds``, ``_request_timeout``; ``_preload_content=False`` returns the raw
    urllib3 response (streamed), otherwise the decoded list. Non-2xx raises
    ``kubernetes.client.ApiException`` (what ``Watch`` and callers expect)."""

    def call(*, watch: bool = False, resource_version: str | None = None,
             allow_watch_bookmarks: bool | None = None, timeout_seconds: int | None = None,
             _request_timeout: Any = DEFAULT_TIMEOUT, _preload_content: bool = True) -> Any:
        query = {"labelSelector": label_selector, "fieldSelector": field_selector,
                 "watch": watch or None, "resourceVersion": resource_version,
                 "allowWatchBookmarks": allow_watch_bookmarks,
                 "timeoutSeconds": timeout_seconds}
        response = raw_request(api, "GET", path, query=query, timeout=_request_timeout)
        if not 200 <= response.status <= 299:
            data = response.read()
            err = error_from(response.status, str(response.reason or ""), data)
            raise k8s.ApiException(status=response.status, reason=f"{err.reason}: "
                                   f"{err.message}")
        if not _preload_content:
            return response.response
        return orjson.loads(response.read())

    return call


def served_version(api: k8s.ApiClient, group: str, preferred: tuple[str, ...]) -> str | None:
    """The first of ``preferred`` (e.g. v1, v1beta2, v1beta1) the API server serves for
    ``group``, read from discovery (``GET /apis/<group>``, an ``APIGroup``); None when the
    group or none of the versions is served. Blocking.
    https://kubernetes.io/docs/concepts/overview/kubernetes-api/#discovery-api"""
    try:
        body = request(api, "GET", f"/apis/{group}")
    except KubeError as exc:
        if exc.status == HTTP_NOT_FOUND:
            return None
        raise
    served = {str(v.get("version")) for v in body.get("versions") or []
              if isinstance(v, dict)}
    return next((v for v in preferred if v in served), None)
