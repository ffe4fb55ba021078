"""The read-only DRA snapshot a decision reads: DeviceClasses, ResourceClaimTemplates,
ResourceClaims and which pods name each ResourceClaim, as plain dicts (``resource.k8s.io/v1``
JSON as the API server serves it).

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
    #: Derived per-request/per-class results of the pure analysis, filled on first use
    #: (valid for this snapshot's objects only, so it lives and dies with the snapshot).
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, *, classes: Iterable[Mapping[str, Any]] = (),
              templates: Iterable[Mapping[str, Any]] = (),
              claims: Iterable[Mapping[str, Any]] = (),
              claim_users: Mapping[Key, Iterable[str]] | None = None,
              synced: bool = True) -> DraSnapshot:
        """A snapshot from lists of objects (offline evaluation, tests, the cache)."""
        class_list = list(classes)
        return cls(
            classes=MappingProxyType({object_key(c)[1]: c for c in class_list}),
            templates=MappingProxyType({object_key(t): t for t in templates}),
            claims=MappingProxyType({object_key(c): c for c in claims}),
            claim_users=MappingProxyType({k: frozenset(v)
                                          for k, v in (claim_users or {}).items()}),
            extended=MappingProxyType(extended_resource_map(class_list)),
            synced=synced)


class DraSourceError(ValueError):
    """The DRA cache's cluster credentials cannot be loaded; the message says which."""


#: The snapshot of a webhook that keeps no DRA cache: every reference is unknown.
EMPTY_SNAPSHOT: Final = DraSnapshot()
