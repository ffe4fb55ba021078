"""Pure DRA analysis: which containers of a pod get a GPU through a ResourceClaim, which of
them share it and why, and the second rule set for ResourceClaims/ResourceClaimTemplates.

No I/O: input is the pod (or claim) dict plus a :class:`~gpu_admission.dra.model.DraSnapshot`.
The "shared" checks S1-S8 are those of ``shared/reference/dra-gpus.md`` §4:

== =========================================================================================
S1 NVIDIA sharing config on the claim: ``devices.config[].opaque`` of driver ``gpu.nvidia.com``,
   ``parameters.kind`` GpuConfig/MigDeviceConfig, ``sharing.strategy`` TimeSlicing or MPS
S2 the same on the request's DeviceClass (``spec.config[]``); claim configs come after class
   configs and the last applicable one wins (NVIDIA driver ``GetOpaqueDeviceConfigs``)
S3 a ResourceClaim named by another pod too (cache: pods naming it; ``status.reservedFor``)
S4 several containers of the pod on the same claim entry and overlapping request
S5 a MIG DeviceClass (``mig.nvidia.com``, or a class whose selector asks ``type == 'mig'``):
   **not** shared by itself (a MIG slice has its own memory and SMs, as ``nvidia.com/mig-*``
   extended resources); only a ``MigDeviceConfig`` TimeSlicing/MPS config (S1/S2) shares it.
   Containers whose every device is a MIG slice get no memory variables
S6 the extended-resource form: a limit naming a class's ``extendedResourceName`` or
   ``deviceclass.resource.kubernetes.io/<class>`` -> S2/S5 on that class
S7 consumable capacity (``exactly.capacity.requests``): a fraction of a device
S8 ``exactly.adminAccess: true``: the device may be in use by others
== =========================================================================================

Sources: NVIDIA DRA driver ``api/nvidia.com/resource/v1beta1`` (sharing config),
https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/ (claims,
templates, DeviceClasses), KEP-5004 (extended resources backed by DRA).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gpu_admission.core.quantity import quantity_mib
from gpu_admission.dra.model import CLAIM, TEMPLATE, DraSnapshot, Key

NVIDIA_DRIVER: Final = "gpu.nvidia.com"
GPU_CLASS: Final = "gpu.nvidia.com"
MIG_CLASS: Final = "mig.nvidia.com"
DEFAULT_GPU_CLASSES: Final = (GPU_CLASS, MIG_CLASS)
DEVICECLASS_RESOURCE_PREFIX: Final = "deviceclass.resource.kubernetes.io/"
SHARING_KINDS: Final = frozenset({"GpuConfig", "MigDeviceConfig"})
SHARED_STRATEGIES: Final = frozenset({"TimeSlicing", "MPS"})
EXTENDED_RESOURCE_CLAIM_ANNOTATION: Final = "resource.kubernetes.io/extended-resource-claim"

_MIG_SELECTOR = re.compile(r"""\.type\s*==\s*['"]mig['"]""")

@dataclass(frozen=True, slots=True)
class SharedReason:
    """Why a container's GPU is shared: the check (S1..S8), where, and a sentence that names
    the claim and the config."""

    check: str  # "S1".."S8"
    path: str  # field path in the pod, e.g. "spec.resourceClaims[0]"
    why: str


@dataclass(frozen=True, slots=True)
class DraContainer:
    """A container or init container that gets a GPU through DRA."""

    kind: str  # "containers" | "initContainers"
    index: int
    claims: tuple[str, ...]  # e.g. ("ResourceClaimTemplate ml/infer-gpu",)
    shared: tuple[SharedReason, ...]
    mig: bool  # every GPU device it gets is a MIG slice
    mps_limit_mib: int | None  # MPS defaultPinnedDeviceMemoryLimit in MiB, when configured
    #: consumable capacity it asks for (``exactly.capacity.requests.memory``), in MiB
    capacity_mib: int | None = None


@dataclass(frozen=True, slots=True)
class DraPod:
    """The DRA view of one pod (empty tuples: nothing DRA about it)."""

    containers: tuple[DraContainer, ...] = ()
    reasons: tuple[SharedReason, ...] = ()  # every shared reason, deduplicated
    possible: tuple[tuple[str, str], ...] = ()  # (path, why) may land on a shared device
    unresolved: tuple[tuple[str, str], ...] = ()  # (path, what is not in the cache)
    offline: bool = False  # the snapshot came from evaluate's files (messages say so)


# --- reading claim specs ----------------------------------------------------------------

def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def request_classes(request: Mapping[str, Any]) -> tuple[list[str], bool]:
    """DeviceClass names a claim request may use, and whether it is a ``firstAvailable`` list."""
    exactly = request.get("exactly")
    if isinstance(exactly, dict):
        name = exactly.get("deviceClassName")
        return ([name] if isinstance(name, str) else []), False
    subs = [s.get("deviceClassName") for s in _list(request.get("firstAvailable"))
            if isinstance(s, dict)]
    return [s for s in subs if isinstance(s, str)], True


def is_mig_class(name: str, device_class: Mapping[str, Any] | None) -> bool:
    """S5: NVIDIA's MIG class, or a class whose CEL selector asks for ``type == 'mig'``."""
    if name == MIG_CLASS:
        return True
    for selector in _list(_dict(_dict(device_class).get("spec")).get("selectors")):
        expression = _dict(_dict(selector).get("cel")).get("expression")
        if isinstance(expression, str) and _MIG_SELECTOR.search(expression):
            return True
    return False


def _config_applies(config: Mapping[str, Any], request: str) -> bool:
    """Empty ``requests`` = every request; ``main`` also covers ``main/<sub>``."""
    names = _list(config.get("requests"))
    return not names or request in names or any(
        isinstance(n, str) and n.split("/", 1)[0] == request for n in names)


def _nvidia_sharing(config: Mapping[str, Any],
                    kinds: frozenset[str] = SHARING_KINDS) -> Mapping[str, Any] | None:
    """The NVIDIA config parameters of an opaque config whose kind is one of ``kinds``
    (GpuConfig/MigDeviceConfig), else None."""
    opaque = _dict(config.get("opaque"))
    params = _dict(opaque.get("parameters"))
    if opaque.get("driver") == NVIDIA_DRIVER and params.get("kind") in kinds:
        return params
    return None


@dataclass(slots=True)
class _Effective:
    """The config that wins for one request: where it is and what it says."""

    where: str  # e.g. "DeviceClass gpu.nvidia.com spec.config[0]"
    strategy: str | None
    mps_mib: int | None


def effective_config(request: str, classes: Iterable[tuple[str, Mapping[str, Any] | None]],
                     claim_configs: list[Any], config_path: str,
                     kinds: frozenset[str] = SHARING_KINDS) -> _Effective | None:
    """S1/S2: the last NVIDIA sharing-capable config that applies to ``request``; class
    configs first, then the claim's (so a claim config overrides its class's). ``kinds``:
    the config kinds that apply to the device type (a MIG slice: ``MigDeviceConfig`` only;
    the NVIDIA driver refuses a ``GpuConfig`` on a MIG device at prepare time)."""
    found: _Effective | None = None
    for class_name, device_class in classes:
        for i, config in enumerate(_list(_dict(_dict(device_class).get("spec")).get("config"))):
            if (isinstance(config, dict)
                    and (params := _nvidia_sharing(config, kinds)) is not None):
                found = _read_sharing(params, f"DeviceClass {class_name} spec.config[{i}]")
    for i, config in enumerate(claim_configs):
        if (isinstance(config, dict) and _config_applies(config, request)
                and (params := _nvidia_sharing(config, kinds)) is not None):
            found = _read_sharing(params, f"{config_path}[{i}]")
    return found


#: The config kind that applies to a MIG slice (NVIDIA driver ``MigDeviceConfig``).
MIG_KINDS: Final = frozenset({"MigDeviceConfig"})


def _read_sharing(params: Mapping[str, Any], where: str) -> _Effective:
    sharing = _dict(params.get("sharing"))
    strategy = sharing.get("strategy")
    mps_mib = None
    if strategy == "MPS":
        mps_mib = quantity_mib(_dict(sharing.get("mpsConfig")).get(
            "defaultPinnedDeviceMemoryLimit"))
    return _Effective(f"{where} ({params.get('kind')})",
                      strategy if isinstance(strategy, str) else None, mps_mib)


def _sharing_text(eff: _Effective) -> str:
    text = f"sharing.strategy {eff.strategy} in {eff.where}"
    if eff.mps_mib is not None:
        text += f", pinned memory {eff.mps_mib} MiB"
    return text


# --- the pod ---------------------------------------------------------------------------------

def needs_analysis(spec: Mapping[str, Any], snapshot: DraSnapshot | None) -> bool:
    """Does the pod need the DRA analysis: does it name a claim, or a limit that DRA may serve
    in a way that matters (a class with a sharing config, a MIG class:
    :func:`notable_extended`)? A plain ``nvidia.com/gpu`` limit served by a dedicated class
    needs none. The definition: the engine answers it per review from its one scan of the
    resources (``admission.pod._scan``, property-tested against this).

    Only ``limits`` are scanned: an extended resource must have a limit (a request without
    one is rejected by the API server, "Limit must be set for non overcommitable resources").
    """
    if spec.get("resourceClaims"):
        return True
    extended = notable_extended(snapshot) if snapshot is not None else None
    prefix = DEVICECLASS_RESOURCE_PREFIX
    for kind in ("containers", "initContainers"):
        items = spec.get(kind)
        if items.__class__ is not list:
            continue
        for container in items:
            resources = container.get("resources") if container.__class__ is dict else None
            limits = resources.get("limits") if resources.__class__ is dict else None
            if limits.__class__ is dict:
                for name in limits:
                    if name.__class__ is str and (name.startswith(prefix)
                                                  or (extended and name in extended)):
                        return True
    return False


@dataclass(slots=True)
class _Entry:
    """One ``spec.resourceClaims[j]`` entry, resolved against the snapshot."""

    index: int
    label: str  # "ResourceClaimTemplate ml/x" or "ResourceClaim ml/x"
    key: Key | None  # set for resourceClaimName entries
    spec: Mapping[str, Any] | None  # the claim spec, None when not in the snapshot
    config_path: str  # where the configs live in the object, for messages
    obj: Mapping[str, Any] | None = None


@dataclass(slots=True)
class _Acc:
    """Per-container accumulator."""

    claims: list[str] = field(default_factory=list)
    shared: list[SharedReason] = field(default_factory=list)
    gpu: bool = False
    mig_only: bool = True
    mps: list[int] = field(default_factory=list)
    capacity: list[int] = field(default_factory=list)  # consumable memory asked for, MiB


def _resolve(entries: list[Any], namespace: str, snap: DraSnapshot) -> dict[str, _Entry]:
    out: dict[str, _Entry] = {}
    for j, raw in enumerate(entries):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            continue
        template, claim = raw.get("resourceClaimTemplateName"), raw.get("resourceClaimName")
        if isinstance(template, str) and template:
            obj = snap.templates.get((namespace, template))
            spec = _dict(obj.get("spec")).get("spec") if obj is not None else None
            out[raw["name"]] = _Entry(j, f"{TEMPLATE} {namespace}/{template}", None,
                                      _dict(spec) if obj is not None else None,
                                      "spec.spec.devices.config", obj)
        elif isinstance(claim, str) and claim:
            obj = snap.claims.get((namespace, claim))
            out[raw["name"]] = _Entry(j, f"{CLAIM} {namespace}/{claim}", (namespace, claim),
                                      _dict(obj.get("spec")) if obj is not None else None,
                                      "spec.devices.config", obj)
    return out


def _claim_uses(container: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    resources = _dict(container.get("resources"))
    out: list[tuple[str, str | None]] = []
    for item in _list(resources.get("claims")):
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            request = item.get("request")
            out.append((item["name"], request if isinstance(request, str) and request else None))
    return out


def _other_users(entry: _Entry, snap: DraSnapshot, pod_key: str) -> list[str]:
    """S3: pods other than this one that name the claim (cache) or hold it (reservedFor)."""
    assert entry.key is not None
    users = set(snap.claim_users.get(entry.key, frozenset()))
    status = _dict(_dict(entry.obj).get("status"))
    for ref in _list(status.get("reservedFor")):
        if isinstance(ref, dict) and ref.get("resource") == "pods" and isinstance(
                ref.get("name"), str):
            users.add(f"{entry.key[0]}/{ref['name']}")
    users.discard(pod_key)
    return sorted(users)


def _check_request(acc: _Acc, request: Mapping[str, Any], entry: _Entry, *, snap: DraSnapshot,
                   gpu_classes: frozenset[str], path: str,
                   unresolved: dict[str, str], possible: list[tuple[str, str]]) -> None:
    """S1/S2/S5/S7/S8 for one request of a claim entry, memoised in the snapshot (the claim
    and class objects of a snapshot never change)."""
    key = ("request", entry.label, path, request.get("name"), gpu_classes)
    found: tuple[_Acc, dict[str, str], list[tuple[str, str]]] | None = snap.memo.get(key)
    if found is None:
        found = (_Acc(), {}, [])
        _check_request_once(found[0], request, entry, snap=snap, gpu_classes=gpu_classes,
                            path=path, unresolved=found[1], possible=found[2])
        snap.memo[key] = found
    one = found[0]
    if not one.gpu:
        return
    acc.gpu = True
    acc.shared.extend(one.shared)
    acc.mps.extend(one.mps)
    acc.capacity.extend(one.capacity)
    acc.mig_only = acc.mig_only and one.mig_only
    for k, what in found[1].items():
        unresolved.setdefault(k, what)
    possible.extend(found[2])


def _check_request_once(acc: _Acc, request: Mapping[str, Any], entry: _Entry, *,
                        snap: DraSnapshot, gpu_classes: frozenset[str], path: str,
                        unresolved: dict[str, str], possible: list[tuple[str, str]]) -> None:
    name = str(request.get("name", ""))
    classes, _ = request_classes(request)
    gpu = [c for c in classes if c in gpu_classes]
    if not gpu:
        return
    acc.gpu = True
    where = f"{entry.label} request {name}"
    for c in gpu:
        if c not in snap.classes:
            unresolved.setdefault(f"{path}:{c}", f"DeviceClass {c} (used by {where})")
    # S5: a MIG slice has its own memory and compute: dedicated, unless a MigDeviceConfig
    # sharing config applies (below). A request that may get a full GPU is not MIG-only.
    migs = [is_mig_class(c, snap.classes.get(c)) for c in gpu]
    mig = all(migs)
    if not mig:
        acc.mig_only = False
    exactly = _dict(request.get("exactly"))
    capacity = _dict(_dict(exactly.get("capacity")).get("requests"))
    if capacity:
        memory = quantity_mib(capacity.get("memory"))
        acc.shared.append(SharedReason("S7", path, f"{where} asks for a share of a device's "
                                                   "capacity (capacity.requests" + (
                                                       f", memory {memory} MiB)" if memory
                                                       else ")")))
        if memory is not None:
            acc.capacity.append(memory)
    if exactly.get("adminAccess") is True:
        acc.shared.append(SharedReason("S8", path, f"{where} uses adminAccess (the device "
                                                   "may be in use by other claims)"))
    devices = _dict(_dict(entry.spec).get("devices"))
    eff = effective_config(name, [(c, snap.classes.get(c)) for c in gpu],
                           _list(devices.get("config")), entry.config_path,
                           MIG_KINDS if mig else SHARING_KINDS)
    if eff is not None and eff.strategy in SHARED_STRATEGIES:
        check = "S2" if eff.where.startswith("DeviceClass ") else "S1"
        slice_text = " (shared MIG slice)" if mig else ""
        acc.shared.append(SharedReason(check, path,
                                       f"{where}{slice_text}: {_sharing_text(eff)}"))
        if eff.mps_mib is not None:
            acc.mps.append(eff.mps_mib)


def _check_extended(acc: _Acc, container: Mapping[str, Any], path: str, *, snap: DraSnapshot,
                    gpu_classes: frozenset[str], unresolved: dict[str, str]) -> None:
    """S6: limits/requests served by a DeviceClass (KEP-5004)."""
    resources = _dict(container.get("resources"))
    seen: set[str] = set()
    for key in ("limits", "requests"):
        for name, quantity in _dict(resources.get(key)).items():
            if name in seen or quantity in (0, "0"):
                continue
            seen.add(name)
            if name.startswith(DEVICECLASS_RESOURCE_PREFIX):
                class_name = name[len(DEVICECLASS_RESOURCE_PREFIX):]
            elif name in snap.extended:
                class_name = snap.extended[name]
            else:
                continue
            if class_name not in gpu_classes:
                continue
            acc.gpu = True
            where = f"{path}.resources.{key}[{name}]"
            device_class = snap.classes.get(class_name)
            if device_class is None:
                unresolved.setdefault(f"{where}:{class_name}",
                                      f"DeviceClass {class_name} (named by {name})")
                continue
            acc.claims.append(f"DeviceClass {class_name} via {name}")
            mig, eff = _class_facts(snap, class_name, device_class)
            if not mig:  # S5: a MIG slice is dedicated unless its MigDeviceConfig shares it
                acc.mig_only = False
            if eff is not None and eff.strategy in SHARED_STRATEGIES:
                acc.shared.append(SharedReason("S2", where, f"{name} is served by DRA: "
                                                            f"{_sharing_text(eff)}"))
                if eff.mps_mib is not None:
                    acc.mps.append(eff.mps_mib)


def notable_extended(snap: DraSnapshot) -> frozenset[str]:
    """Extended resources whose DeviceClass is MIG, has a sharing config or is missing: a
    limit on one of them makes the pod need the DRA analysis (:func:`needs_analysis`)."""
    found: frozenset[str] | None = snap.memo.get("notable-extended")
    if found is None:
        notable = set()
        for resource, name in snap.extended.items():
            device_class = snap.classes.get(name)
            if device_class is None:
                notable.add(resource)
                continue
            mig, eff = _class_facts(snap, name, device_class)
            if mig or (eff is not None and eff.strategy in SHARED_STRATEGIES):
                notable.add(resource)  # MIG: its containers are MIG-only (no memory env)
        found = snap.memo["notable-extended"] = frozenset(notable)
    return found


def _class_facts(snap: DraSnapshot, name: str,
                 device_class: Mapping[str, Any]) -> tuple[bool, _Effective | None]:
    """(MIG class?, its sharing config) for S6, memoised in the snapshot."""
    key = ("class", name)
    found: tuple[bool, _Effective | None] | None = snap.memo.get(key)
    if found is None:
        mig = is_mig_class(name, device_class)
        found = snap.memo[key] = (mig, effective_config("", [(name, device_class)], [], "",
                                                        MIG_KINDS if mig else SHARING_KINDS))
    return found


def analyze_pod(pod: Mapping[str, Any], namespace: str, snapshot: DraSnapshot | None,
                gpu_classes: frozenset[str], pod_key: str | None = None) -> DraPod:
    """The DRA view of ``pod`` in ``namespace``. ``pod_key`` identifies the pod in
    ``snapshot.claim_users`` (default ``namespace/metadata.name``), so the pod itself is not
    counted as another user of its claim on UPDATE."""
    snap = snapshot if snapshot is not None else DraSnapshot(synced=False)
    spec = _dict(pod.get("spec"))
    if pod_key is None:
        pod_key = f"{namespace}/{_dict(pod.get('metadata')).get('name') or ''}"
    entries = _resolve(_list(spec.get("resourceClaims")), namespace, snap)
    unresolved: dict[str, str] = {}
    possible: list[tuple[str, str]] = []
    for entry in entries.values():
        if entry.spec is None:
            unresolved[f"spec.resourceClaims[{entry.index}]"] = entry.label
    # S4: who uses each entry (and which request)
    users: dict[str, list[tuple[str, str | None]]] = {}
    containers: list[tuple[str, int, Mapping[str, Any], list[tuple[str, str | None]]]] = []
    for kind in ("containers", "initContainers"):
        for index, container in enumerate(_list(spec.get(kind))):
            if not isinstance(container, dict):
                continue
            uses = _claim_uses(container)
            containers.append((kind, index, container, uses))
            for entry_name, request in uses:
                users.setdefault(entry_name, []).append((f"{kind}[{index}]", request))
    out: list[DraContainer] = []
    all_reasons: dict[tuple[str, str], SharedReason] = {}
    s3_done: dict[str, SharedReason | None] = {}
    for kind, index, container, uses in containers:
        acc = _Acc()
        cpath = f"spec.{kind}[{index}]"
        for entry_name, request_name in uses:
            found = entries.get(entry_name)
            if found is None or found.spec is None:
                continue
            entry = found
            path = f"spec.resourceClaims[{entry.index}]"
            before = acc.gpu
            acc.gpu = False
            for request in _list(_dict(found.spec.get("devices")).get("requests")):
                if isinstance(request, dict) and (request_name is None
                                                  or request.get("name") == request_name):
                    _check_request(acc, request, entry, snap=snap, gpu_classes=gpu_classes,
                                   path=path, unresolved=unresolved, possible=possible)
            uses_gpu, acc.gpu = acc.gpu, before or acc.gpu
            if not uses_gpu:
                continue
            acc.claims.append(entry.label)
            others = [c for c, r in users.get(entry_name, ())
                      if c != f"{kind}[{index}]"
                      and (r is None or request_name is None or r == request_name)]
            if others:
                acc.shared.append(SharedReason(
                    "S4", f"{cpath}.resources.claims",
                    f"{entry.label} is also used by spec.{', spec.'.join(others)} of this pod"))
            if entry.key is not None:
                if entry_name not in s3_done:
                    other_pods = _other_users(entry, snap, pod_key)
                    s3_done[entry_name] = SharedReason(
                        "S3", path, f"{entry.label} is also named by pod "
                                    f"{', '.join(other_pods[:3])}"
                                    + (f" and {len(other_pods) - 3} more"
                                       if len(other_pods) > 3 else "")) if other_pods else None
                    if not other_pods:
                        possible.append((path, f"{entry.label}: no other pod names it yet"))
                reason = s3_done[entry_name]
                if reason is not None:
                    acc.shared.append(reason)
        _check_extended(acc, container, cpath, snap=snap, gpu_classes=gpu_classes,
                        unresolved=unresolved)
        if not acc.gpu:
            continue
        reasons = tuple(dict.fromkeys(acc.shared))
        for r in reasons:
            all_reasons.setdefault((r.path, r.why), r)
        out.append(DraContainer(kind, index, tuple(dict.fromkeys(acc.claims)), reasons,
                                acc.mig_only, min(acc.mps) if acc.mps else None,
                                sum(acc.capacity) if acc.capacity else None))
    group = _dict(spec.get("schedulingGroup")).get("podGroupName")
    if group and any(e.key is None for e in entries.values()):
        possible.append(("spec.schedulingGroup", f"pod group {group}: template claims may be "
                                                 "shared by the group (DRAWorkloadResourceClaims)"))
    return DraPod(tuple(out), tuple(all_reasons.values()), tuple(dict.fromkeys(possible)),
                  tuple((p.split(":", 1)[0], what) for p, what in unresolved.items()),
                  offline=snap.offline)


# --- the second rule set: ResourceClaims and ResourceClaimTemplates themselves ------------

@dataclass(frozen=True, slots=True)
class ClaimFinding:
    """A sharing config on a training claim/template: where it is and what it says."""

    path: str  # field path in the object, e.g. "spec.spec.devices.config[0]"
    why: str


def claim_object_spec(obj: Mapping[str, Any], kind: str) -> tuple[Mapping[str, Any], str]:
    """The claim spec of a ResourceClaim (``spec``) or template (``spec.spec``) and its path."""
    spec = _dict(obj.get("spec"))
    if kind == TEMPLATE:
        return _dict(spec.get("spec")), "spec.spec"
    return spec, "spec"


def claim_object_labels(obj: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The labels that classify a claim: its own, plus (templates) ``spec.metadata.labels``,
    which the resource-claim controller copies into each generated claim."""
    labels = dict(_dict(_dict(obj.get("metadata")).get("labels")))
    if kind == TEMPLATE:
        labels.update(_dict(_dict(_dict(obj.get("spec")).get("metadata")).get("labels")))
    return labels


def sharing_findings(obj: Mapping[str, Any], kind: str, snapshot: DraSnapshot | None,
                     gpu_classes: frozenset[str]) -> tuple[list[ClaimFinding], list[str]]:
    """S1/S2 (and S7/S8) for each GPU request of a claim or template; also the DeviceClasses
    not in the snapshot (their config cannot be checked)."""
    snap = snapshot if snapshot is not None else DraSnapshot(synced=False)
    spec, base = claim_object_spec(obj, kind)
    devices = _dict(spec.get("devices"))
    configs = _list(devices.get("config"))
    findings: list[ClaimFinding] = []
    unknown: list[str] = []
    for i, request in enumerate(_list(devices.get("requests"))):
        if not isinstance(request, dict):
            continue
        name = str(request.get("name", ""))
        classes, _ = request_classes(request)
        gpu = [c for c in classes if c in gpu_classes]
        if not gpu:
            continue
        unknown.extend(c for c in gpu if c not in snap.classes)
        mig = all(is_mig_class(c, snap.classes.get(c)) for c in gpu)
        eff = effective_config(name, [(c, snap.classes.get(c)) for c in gpu], configs,
                               f"{base}.devices.config", MIG_KINDS if mig else SHARING_KINDS)
        if eff is not None and eff.strategy in SHARED_STRATEGIES:
            path = (eff.where.split(" ")[0] if not eff.where.startswith("DeviceClass ")
                    else f"{base}.devices.requests[{i}]")
            findings.append(ClaimFinding(path, f"request {name}: {_sharing_text(eff)}"))
        exactly = _dict(request.get("exactly"))
        if _dict(exactly.get("capacity")).get("requests"):
            findings.append(ClaimFinding(f"{base}.devices.requests[{i}].exactly.capacity",
                                         f"request {name} asks for a share of a device"))
        if exactly.get("adminAccess") is True:
            findings.append(ClaimFinding(f"{base}.devices.requests[{i}].exactly.adminAccess",
                                         f"request {name} uses adminAccess"))
    return findings, sorted(set(unknown))
