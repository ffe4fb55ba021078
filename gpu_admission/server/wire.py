"""AdmissionReview on the wire: decode the API server's request, encode our response.

Shapes follow ``k8s.io/api/admission/v1`` (``types.go``) and the rules the API server
applies to a webhook's reply (``k8s.io/apiserver/pkg/admission/plugin/webhook/request/
admissionreview.go`` ``VerifyAdmissionResponse``): the reply has the same ``apiVersion``,
``kind: AdmissionReview`` and ``response.uid == request.uid``; ``patch``/``patchType`` come
together and only with ``patchType: JSONPatch`` (base64 of an RFC 6902 array).
Docs: https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/

Everything here is pure (no I/O) and raises :class:`WireError` with the field path on a
malformed request, which the server turns into HTTP 400.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from gpu_admission.core.decision import RequestFacts, Stage
from gpu_admission.rules.gpu_access import EPHEMERAL_KIND, EPHEMERAL_SUBRESOURCE

V1: Final = "admission.k8s.io/v1"
V1BETA1: Final = "admission.k8s.io/v1beta1"
API_VERSIONS: Final = (V1, V1BETA1)
OPERATIONS: Final = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})

#: Kubernetes asks for warnings of at most 120 characters and the API server cuts every
#: warning to 256 runes once their total passes 4 KiB (``endpoints/filters/warning.go``);
#: we cut at 256 ourselves so what the user sees is what we chose to send.
WARNING_MAX_CHARS: Final = 256
#: The ``Warning`` header encoder drops texts with control characters (newline, tab, ...).
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]+")
_WARNING_PREFIX: Final = re.compile(r"^\s*warning:\s*", re.IGNORECASE)

#: A Go ``time.Duration`` string as the API server writes ``?timeout=`` (e.g. ``10s``,
#: ``1m30s``, ``500ms``): client-go ``rest/request.go`` ``URL()``.
_GO_DURATION_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_GO_UNITS: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0,
                    "m": 60.0, "h": 3600.0}


class WireError(ValueError):
    """A request body that is not a usable AdmissionReview; the message names the field."""


@dataclass(slots=True)  # not frozen: frozen dataclasses pay a __setattr__ call per field
class Review:
    """The parts of ``AdmissionReview.request`` the server uses, type-checked."""

    api_version: str  # admission.k8s.io/v1 or v1beta1: the reply uses the same
    uid: str
    group: str  # request.kind.group ("" for core)
    kind: str  # request.kind.kind, e.g. "Pod"
    sub_resource: str  # e.g. "status", "ephemeralcontainers"; "" for the object itself
    operation: str  # CREATE | UPDATE | DELETE | CONNECT
    namespace: str
    name: str  # empty on CREATE with generateName
    obj: dict[str, Any] | None  # request.object (None on DELETE)
    old: dict[str, Any] | None  # request.oldObject (UPDATE, DELETE)
    dry_run: bool
    user: str
    groups: tuple[str, ...]

    @property
    def is_pod(self) -> bool:
        """A core/v1 Pod itself (not a subresource such as ``pods/status``)."""
        return self.kind == "Pod" and self.group == "" and not self.sub_resource

    @property
    def is_ephemeral(self) -> bool:
        """``pods/ephemeralcontainers`` (``kubectl debug``): the whole Pod, ``kind: Pod``."""
        return (self.kind == "Pod" and self.group == ""
                and self.sub_resource == EPHEMERAL_SUBRESOURCE)

    def facts(self, stage: Stage) -> RequestFacts:
        namespace = self.namespace
        if not namespace and self.obj is not None:
            meta = self.obj.get("metadata")
            if isinstance(meta, dict) and isinstance(meta.get("namespace"), str):
                namespace = meta["namespace"]
        existing: frozenset[str] = frozenset()
        if self.is_ephemeral and self.old is not None:
            spec = self.old.get("spec")
            items = spec.get(EPHEMERAL_KIND) if isinstance(spec, dict) else None
            if isinstance(items, list):
                existing = frozenset(c["name"] for c in items
                                     if isinstance(c, dict) and isinstance(c.get("name"), str))
        return RequestFacts(namespace=namespace, operation=self.operation, user=self.user,
                            groups=self.groups, dry_run=self.dry_run, stage=stage,
                            uid=self.uid, sub_resource=self.sub_resource,
                            existing_ephemeral=existing)


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
            float: "number"}.get(type(value), type(value).__name__)


def _fail(path: str, expected: str, value: object) -> WireError:
    if len(path) > 200:  # a path may hold a hostile map key: keep error bodies short
        path = path[:199] + "…"
    return WireError(f"{path} must be {expected}, got {_type_name(value)}")


def _opt_str(mapping: Mapping[str, Any], key: str, path: str) -> str:
    value = mapping.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _fail(f"{path}.{key}", "a string", value)
    return value


# The checks below run on every review, so they test first and build the field path only
# when raising (an f-string per field would cost more than the checks themselves).

def _check_string_map(value: object, path: str) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise _fail(path, "an object of strings", value)
    for key, item in value.items():
        if not isinstance(item, str):
            raise _fail(f"{path}[{key!r}]", "a string", item)


_CONTAINER_LISTS: Final = ("envFrom", "args", "command", "ports", "volumeMounts")
_ENV_VALUE_TYPES: Final = (str, type(None))


def _env_error(env: list[Any], path: str) -> None:
    """Raise for the first bad entry of ``env`` (the slow path of the env check)."""
    for j, var in enumerate(env):
        if not isinstance(var, dict):
            raise _fail(f"{path}[{j}]", "an object", var)
        if not isinstance(var.get("name"), str):
            raise _fail(f"{path}[{j}].name", "a string", var.get("name"))
        value = var.get("value")
        if value is not None and not isinstance(value, str):
            raise _fail(f"{path}[{j}].value", "a string", value)


def _check_container(container: object, where: str, index: int) -> None:
    if not isinstance(container, dict):
        raise _fail(f"{where}[{index}]", "an object", container)
    name = container.get("name")
    if not isinstance(name, str):
        raise _fail(f"{where}[{index}].name", "a string", name)
    image = container.get("image")
    if image is not None and not isinstance(image, str):
        raise _fail(f"{where}[{index}].image", "a string", image)
    env = container.get("env")
    if env is not None:
        if not isinstance(env, list):
            raise _fail(f"{where}[{index}].env", "an array", env)
        for var in env:  # hot loop (long env lists): index only computed on failure
            if (type(var) is not dict or type(var.get("name")) is not str
                    or type(var.get("value", "")) not in _ENV_VALUE_TYPES):
                _env_error(env, f"{where}[{index}].env")
    for key in _CONTAINER_LISTS:
        item = container.get(key)
        if item is not None and not isinstance(item, list):
            raise _fail(f"{where}[{index}].{key}", "an array", item)
    resources = container.get("resources")
    if resources is None:
        return
    if not isinstance(resources, dict):
        raise _fail(f"{where}[{index}].resources", "an object", resources)
    for key in ("limits", "requests"):
        quantities = resources.get(key)
        if quantities is None:
            continue
        if not isinstance(quantities, dict):
            raise _fail(f"{where}[{index}].resources.{key}", "an object", quantities)
        for name, qty in quantities.items():
            if not isinstance(qty, (str, int, float)) or isinstance(qty, bool):
                raise _fail(f"{where}[{index}].resources.{key}[{name!r}]",
                            "a quantity (string or number)", qty)


def check_pod(pod: object, path: str) -> None:
    """Reject a Pod whose fields the policy reads have the wrong JSON types.

    The API server only sends schema-valid Pods, so this guards against hostile or broken
    callers; it checks types, not Kubernetes validation rules (that is the API server's job).
    Pod schema: https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/
    """
    if not isinstance(pod, dict):
        raise _fail(path, "a Pod object", pod)
    meta = pod.get("metadata")
    if meta is not None:
        if not isinstance(meta, dict):
            raise _fail(f"{path}.metadata", "an object", meta)
        for key in ("name", "namespace", "generateName"):
            value = meta.get(key)
            if value is not None and not isinstance(value, str):
                raise _fail(f"{path}.metadata.{key}", "a string", value)
        _check_string_map(meta.get("labels"), f"{path}.metadata.labels")
        _check_string_map(meta.get("annotations"), f"{path}.metadata.annotations")
        owners = meta.get("ownerReferences")
        if owners is not None:
            if not isinstance(owners, list):
                raise _fail(f"{path}.metadata.ownerReferences", "an array", owners)
            for i, ref in enumerate(owners):
                if not isinstance(ref, dict):
                    raise _fail(f"{path}.metadata.ownerReferences[{i}]", "an object", ref)
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise _fail(f"{path}.spec", "an object", spec)
    if not isinstance(spec.get("containers"), list):
        raise _fail(f"{path}.spec.containers", "an array", spec.get("containers"))
    for key in ("containers", "initContainers", "ephemeralContainers"):
        items = spec.get(key)
        if items is None:
            continue
        if not isinstance(items, list):
            raise _fail(f"{path}.spec.{key}", "an array", items)
        for i, container in enumerate(items):
            _check_container(container, f"{path}.spec.{key}", i)
    _check_string_map(spec.get("nodeSelector"), f"{path}.spec.nodeSelector")
    for key in ("schedulerName", "runtimeClassName", "priorityClassName", "nodeName"):
        value = spec.get(key)
        if value is not None and not isinstance(value, str):
            raise _fail(f"{path}.spec.{key}", "a string", value)
    for key in ("affinity", "securityContext"):
        item = spec.get(key)
        if item is not None and not isinstance(item, dict):
            raise _fail(f"{path}.spec.{key}", "an object", item)
    tolerations = spec.get("tolerations")
    if tolerations is not None and not isinstance(tolerations, list):
        raise _fail(f"{path}.spec.tolerations", "an array", tolerations)


def parse_review(body: bytes) -> Review:
    """Decode and type-check an AdmissionReview request (v1 or v1beta1)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"body is not valid JSON: {exc}") from None
    # Conditions are tested inline (no helper call per field): this runs on every review.
    if doc.__class__ is not dict:
        raise _fail("body", "a JSON object (an AdmissionReview)", doc)
    kind = doc.get("kind")
    if kind != "AdmissionReview":
        raise WireError(f"kind must be \"AdmissionReview\", got {kind!r}"[:200])
    api_version = doc.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise WireError(f"apiVersion must be {V1} or {V1BETA1}, got {api_version!r}"[:200])
    req = doc.get("request")
    if req.__class__ is not dict:
        raise _fail("request", "an object", req)
    uid = req.get("uid")
    if uid.__class__ is not str:
        raise _fail("request.uid", "a non-empty string", uid)
    if not uid:
        raise WireError("request.uid must be a non-empty string, got an empty string")
    gvk = req.get("kind")
    if gvk.__class__ is not dict:
        raise _fail("request.kind", "an object {group, version, kind}", gvk)
    kind_name = gvk.get("kind")
    if kind_name.__class__ is not str:
        raise _fail("request.kind.kind", "a string", kind_name)
    group = _opt_str(gvk, "group", "request.kind")
    operation = req.get("operation")
    if operation.__class__ is not str:
        raise _fail("request.operation", "a string", operation)
    if operation not in OPERATIONS:
        raise WireError(f"request.operation must be one of CREATE, UPDATE, DELETE, CONNECT, "
                        f"got {operation!r}"[:200])
    obj = req.get("object")
    old = req.get("oldObject")
    if obj is not None and obj.__class__ is not dict:
        raise _fail("request.object", "an object or null", obj)
    if old is not None and old.__class__ is not dict:
        raise _fail("request.oldObject", "an object or null", old)
    dry_run = req.get("dryRun")
    if dry_run is not None and dry_run.__class__ is not bool:
        raise _fail("request.dryRun", "a boolean", dry_run)
    user_info = req.get("userInfo")
    user = ""
    groups: tuple[str, ...] = ()
    if user_info is not None:
        if user_info.__class__ is not dict:
            raise _fail("request.userInfo", "an object", user_info)
        user = _opt_str(user_info, "username", "request.userInfo")
        raw_groups = user_info.get("groups")
        if raw_groups is not None:
            if raw_groups.__class__ is not list:
                raise _fail("request.userInfo.groups", "an array of strings", raw_groups)
            for g in raw_groups:
                if g.__class__ is not str:
                    raise _fail("request.userInfo.groups", "an array of strings", raw_groups)
            groups = tuple(raw_groups)
    review = Review(
        api_version=api_version, uid=uid, group=group, kind=kind_name,
        sub_resource=_opt_str(req, "subResource", "request"), operation=operation,
        namespace=_opt_str(req, "namespace", "request"), name=_opt_str(req, "name", "request"),
        obj=obj, old=old, dry_run=bool(dry_run), user=user, groups=groups,
    )
    if (review.is_pod and operation in ("CREATE", "UPDATE")) or (
            review.is_ephemeral and operation == "UPDATE"):
        if obj is None:
            raise WireError(f"request.object must be a Pod on {operation}, got null")
        check_pod(obj, "request.object")
    return review


def sanitize_warnings(warnings: Iterable[str]) -> list[str]:
    """Warnings as the API server will show them: no ``Warning:`` prefix (kubectl adds its
    own), no control characters (the header encoder would drop the warning), at most
    ``WARNING_MAX_CHARS`` characters, no duplicates (the API server drops them anyway)."""
    out: list[str] = []
    for text in warnings:
        clean = _CONTROL.sub(" ", _WARNING_PREFIX.sub("", str(text))).strip()
        if len(clean) > WARNING_MAX_CHARS:
            clean = clean[:WARNING_MAX_CHARS - 1] + "…"
        if clean and clean not in out:
            out.append(clean)
    return out


def encode_response(api_version: str, uid: str, *, allowed: bool,
                    patch: list[dict[str, Any]] | tuple[dict[str, Any], ...] = (),
                    warnings: list[str] | None = None,
                    audit_annotations: Mapping[str, str] | None = None,
                    status: Mapping[str, Any] | None = None) -> bytes:
    """The AdmissionReview reply, as JSON bytes.

    ``patch`` (RFC 6902 operations) is sent as ``patchType: JSONPatch`` + base64 only when
    non-empty; ``status`` only when given (the API server ignores it when allowed).
    """
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(patch)).decode("ascii")
    if status is not None:
        response["status"] = status
    if warnings:
        response["warnings"] = warnings
    if audit_annotations:
        response["auditAnnotations"] = audit_annotations
    return orjson.dumps({"apiVersion": api_version, "kind": "AdmissionReview",
                         "response": response})


def denial_status(code: int, message: str, reason: str) -> dict[str, Any]:
    """A ``metav1.Status`` for ``response.status``. The API server turns it into the error
    ``admission webhook "<name>" denied the request: <message>`` with our code
    (``webhook/errors/statuserror.go`` ``ToStatusErr``; codes below 400 become 400)."""
    return {"status": "Failure", "code": code, "reason": reason, "message": message}


def parse_go_duration(text: str) -> float | None:
    """Seconds in a Go ``time.Duration`` string (``10s``, ``1m30s``, ``1.5s``), or None when
    it is not one (then the server uses its configured default deadline)."""
    if not text or len(text) > 64:
        return None
    pos = 0
    total = 0.0
    for match in _GO_DURATION_PART.finditer(text):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * _GO_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or pos == 0:
        return None
    return total
