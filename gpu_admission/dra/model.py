"""The read-only DRA snapshot a decision reads: DeviceClasses, ResourceClaimTemplates,
ResourceClaims and which pods name each ResourceClaim, as plain dicts (``resource.k8s.io/v1``
JSON as the API server serves it; ``v1beta1``/``v1beta2`` objects are brought to that shape
by :func:`normalize` when the snapshot is built).

Why a snapshot: at Pod CREATE the webhook sees only the pod spec; whether its GPU is shared
lives in the template or claim it names and in the DeviceClass of each request
(``shared/reference/dra-gpus.md`` §1.2). The server keeps these objects in a watch-backed cache
(:mod:`gpu_admission.kube.dra`) and hands the engine an immutable snapshot, so the admission
path makes no API call; ``gpu-admission evaluate`` builds the same snapshot from files.
API: https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/resource-claim-v1/
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

GROUP: Final = "resource.k8s.io"
VERSION: Final = "v1"
DEVICE_CLASS: Final = "DeviceClass"
CLAIM: Final = "ResourceClaim"
TEMPLATE: Final = "ResourceClaimTemplate"
KINDS: Final = (DEVICE_CLASS, CLAIM, TEMPLATE)

Key = tuple[str, str]  # (namespace, name)

_EMPTY: Mapping[Any, Any] = MappingProxyType({})


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else _EMPTY


def object_key(obj: Mapping[str, Any]) -> Key:
    """(namespace, name) of an object ("" namespace for cluster-scoped DeviceClasses)."""
    meta = _meta(obj)
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def pod_claim_names(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The ResourceClaims a pod names directly (``spec.resourceClaims[].resourceClaimName``).

    Template entries are not listed: each pod gets its own generated claim (§1.1).
    """
    spec = pod.get("spec")
    entries = spec.get("resourceClaims") if isinstance(spec, dict) else None
    if not isinstance(entries, list):
        return ()
    return tuple(e["resourceClaimName"] for e in entries
                 if isinstance(e, dict) and isinstance(e.get("resourceClaimName"), str))


#: Fields of a ``v1beta1`` DeviceRequest that ``v1``/``v1beta2`` keep under ``exactly``
#: (k8s.io/api/resource/v1beta1 ``DeviceRequest`` vs v1beta2/v1 ``ExactDeviceRequest``).
_EXACT_FIELDS: Final = ("deviceClassName", "selectors", "allocationMode", "count",
                        "adminAccess", "tolerations", "capacity")


def normalize_request(request: Any) -> Any:
    """One claim request in the ``v1`` shape. ``resource.k8s.io/v1beta1`` (Kubernetes
    1.32-1.33, and NVIDIA's demo specs) writes ``requests[].deviceClassName`` and the other
    exact-request fields directly on the request; ``v1beta2`` and ``v1`` nest them under
    ``exactly``. ``firstAvailable`` subrequests have the same fields in every version."""
    if (not isinstance(request, dict) or "exactly" in request
            or "firstAvailable" in request or "deviceClassName" not in request):
        return request
    exactly = {k: request[k] for k in _EXACT_FIELDS if k in request}
    out = {k: v for k, v in request.items() if k not in _EXACT_FIELDS}
    out["exactly"] = exactly
    return out


def normalize_claim_spec(spec: Any) -> Any:
    """A ResourceClaimSpec with every request in the ``v1`` shape (a copy when one changes)."""
    devices = spec.get("devices") if isinstance(spec, dict) else None
    if not isinstance(devices, dict):
        return spec
    requests = devices.get("requests")
    if not isinstance(requests, list):
        return spec
    normal = [normalize_request(r) for r in requests]
    if all(a is b for a, b in zip(normal, requests, strict=True)):
        return spec
    return {**spec, "devices": {**devices, "requests": normal}}


def normalize(obj: Mapping[str, Any], kind: str | None = None) -> Mapping[str, Any]:
    """A DRA object of any served version (``resource.k8s.io/v1beta1``, ``v1beta2``, ``v1``)
    in the ``v1`` shape the analysis reads; the object itself when nothing changes. The one
    place versions are reconciled: snapshots (files, the watch cache) and the claim rules
    call it. DeviceClasses have the same shape in every version. ``kind``: when the object
    does not say (list items)."""
    kind = kind or obj.get("kind")
    spec = obj.get("spec")
    if not isinstance(spec, dict) or kind not in (CLAIM, TEMPLATE):
        return obj
    if kind == CLAIM:
        normal = normalize_claim_spec(spec)
        return obj if normal is spec else {**obj, "spec": normal}
    inner = spec.get("spec")
    normal = normalize_claim_spec(inner)
    return obj if normal is inner else {**obj, "spec": {**spec, "spec": normal}}


def extended_resource_map(classes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """``spec.extendedResourceName`` -> DeviceClass name. When several classes name the same
    resource the latest created wins, ties go to the lexicographically first name (API
    comment on ``DeviceClassSpec.ExtendedResourceName``, KEP-5004)."""
    best: dict[str, tuple[str, str]] = {}  # resource -> (creationTimestamp, name)
    for obj in classes:
        spec = obj.get("spec")
        resource = spec.get("extendedResourceName") if isinstance(spec, dict) else None
        if not isinstance(resource, str) or not resource:
            continue
        meta = _meta(obj)
        created, name = str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")
        current = best.get(resource)
        # RFC 3339 UTC timestamps as the API server writes them compare as strings.
        if current is None or created > current[0] or (created == current[0]
                                                         and name < current[1]):
            best[resource] = (created, name)
    return {resource: name for resource, (_, name) in best.items()}


@dataclass(frozen=True, slots=True)
class DraSnapshot:
    """Everything the DRA analysis may read. Immutable: the cache builds a new one on change.

    ``claim_users`` maps a ResourceClaim to the pods (``namespace/name`` keys, or any stable
    id offline) that name it, for the "claim shared across pods" check (S3).
    ``synced`` is False until the cache's first list has completed.
    """

    classes: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: _EMPTY)
    templates: Mapping[Key, Mapping[str, Any]] = field(default_factory=lambda: _EMPTY)
    claims: Mapping[Key, Mapping[str, Any]] = field(default_factory=lambda: _EMPTY)
    claim_users: Mapping[Key, frozenset[str]] = field(default_factory=lambda: _EMPTY)
    extended: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    synced: bool = True
    #: Built from ``evaluate``'s files (and ``--kubeconfig``), not the webhook's watch cache: a
    #: missing object is missing from the input, not "not synced yet" (messages say so).
    offline: bool = False
    #: Derived per-request/per-class results of the pure analysis, filled on first use
    #: (valid for this snapshot's objects only, so it lives and dies with the snapshot).
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, *, classes: Iterable[Mapping[str, Any]] = (),
              templates: Iterable[Mapping[str, Any]] = (),
              claims: Iterable[Mapping[str, Any]] = (),
              claim_users: Mapping[Key, Iterable[str]] | None = None,
              synced: bool = True, offline: bool = False) -> DraSnapshot:
        """A snapshot from lists of objects (offline evaluation, tests, the cache)."""
        class_list = list(classes)
        return cls(
            classes=MappingProxyType({object_key(c)[1]: c for c in class_list}),
            templates=MappingProxyType({object_key(t): normalize(t, TEMPLATE) for t in templates}),
            claims=MappingProxyType({object_key(c): normalize(c, CLAIM) for c in claims}),
            claim_users=MappingProxyType({k: frozenset(v)
                                          for k, v in (claim_users or {}).items()}),
            extended=MappingProxyType(extended_resource_map(class_list)),
            synced=synced, offline=offline)


class DraSourceError(ValueError):
    """The DRA cache's cluster credentials cannot be loaded; the message says which."""


#: The snapshot of a webhook that keeps no DRA cache: every reference is unknown.
EMPTY_SNAPSHOT: Final = DraSnapshot()
