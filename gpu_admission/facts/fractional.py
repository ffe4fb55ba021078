"""Fractional GPUs (``sharing: fractional`` node pools): what a pod's share is. PURE, no I/O.

Why: on a time-sliced pool the NVIDIA device plugin picks the card and every pod costs a fixed
slice (``memoryMiB // replicasPerGPU``). On a fractional pool the nodes advertise whole GPUs,
the GPU-aware scheduler's extender chooses the card at ``bind`` and writes its UUID into a
ConfigMap of the pod's own, and the pod reads it through ``NVIDIA_VISIBLE_DEVICES``
(``valueFrom.configMapKeyRef``), the mechanism NVIDIA's KAI-Scheduler uses with the stock
device plugin (``shared/reference/exact-gpu-placement.md`` section 2; KAI v0.17.0
``pkg/admission/webhook/v1alpha2/gpusharing/gpu_sharing.go``). The pod requests no
``nvidia.com/gpu`` (the device plugin never sees it) but the extended resource
``gpu-admission.io/gpu-memory`` in MiB, which ResourceQuota and kube-scheduler's
NodeResourcesFit count (https://kubernetes.io/docs/tasks/administer-cluster/extended-resource-node/).

This module is the one place that decides, for the webhook (``gpu_admission.rules.fractional``,
the memory rule, the guard) and for the extender (which may import it: no I/O here), whether a
pod is fractional and what its share is:

* **which pods**: one the memory rule would treat as sharing a GPU (not training, not MIG, no
  DRA claim, exactly one GPU) on a fractional pool; or one that asks explicitly with the
  annotation ``gpu-admission.io/gpu-memory: "<MiB>"`` (or, without it, the extended resource
  itself). Training, more than one GPU and MIG keep whole devices; an explicit ask by such a
  pod is refused (:class:`Problem`).
* **the share**, in MiB: the annotation (else the resource) when asked explicitly; otherwise
  the pod's own lower ``NVIDIA_MEM_LIMIT_MB``, else the pool's default share
  (:func:`pool_share_mib`). It must fit one GPU with the extender's headroom:
  ``share + spec.placement.memoryHeadroomMiB <= memoryMiB`` (the extender needs that much
  free on a card to place the pod, so a larger share could never run).

Units: every ``*_mib`` value is MiB (2**20 bytes), the unit of GFD's ``nvidia.com/gpu.memory``
and of ``NVIDIA_MEM_LIMIT_MB`` as this project writes it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpu_admission.core.quantity import integer_quantity
from gpu_admission.core.vocab import (
    GPU_CONFIGMAP_ANNOTATION,
    GPU_CONFIGMAP_KEY,
    GPU_CONFIGMAP_PREFIX,
    GPU_MEMORY_ANNOTATION,
    GPU_MEMORY_RESOURCE,
)
from gpu_admission.policy.model import NodePool, Policy

VISIBLE_DEVICES_ENV: Final = "NVIDIA_VISIBLE_DEVICES"
NVIDIA_MEM_LIMIT_MB: Final = "NVIDIA_MEM_LIMIT_MB"
#: HAMi-core's per-container cap (``libvgpu.so``; Project-HAMi/HAMi-core README): bytes or a
#: binary ``k``/``m``/``g`` suffix; we write ``<MiB>m``. ``_<i>`` variants override it per device.
HAMI_MEMORY_LIMIT: Final = "CUDA_DEVICE_MEMORY_LIMIT"
#: The CDI device name the NVIDIA device plugin uses for a GPU (deviceListStrategy
#: ``cdi-annotations``/``cdi-cri``; KAI ``pkg/binder/common/gpu_access.go``).
CDI_GPU_PREFIX: Final = "k8s.device-plugin.nvidia.com/gpu="
ANNOTATION_PATH: Final = f"metadata.annotations[{GPU_MEMORY_ANNOTATION}]"

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_MIB_TEXT = re.compile(r"^[0-9]{1,12}$")  # an integer count of MiB (12 digits: ~1 ZiB)
_HAMI_VALUE = re.compile(r"^\s*([0-9]{1,20})\s*([kKmMgG]?)\s*$")
_HAMI_FACTOR: Final = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}


# --- names and env entries the webhook writes and the extender reads ------------------------
def is_configmap_name(name: Any) -> bool:
    """A name the webhook may have recorded: the prefix plus a DNS-subdomain tail, <= 253."""
    return (isinstance(name, str) and name.startswith(GPU_CONFIGMAP_PREFIX)
            and len(name) <= 253 and _DNS_SUBDOMAIN.match(name) is not None)


def configmap_name(uid: str, fallback: str = "") -> str:
    """The pod's ConfigMap name: prefix + the admission request's UID, lowercased (pods made
    by controllers have only ``generateName`` at admission; the API server's request UID is a
    UUID). A UID that would not make a valid name (or none, e.g. offline) is replaced by a
    UUIDv5 of itself or of ``fallback``, so the result is always a valid, stable name."""
    name = GPU_CONFIGMAP_PREFIX + uid.lower()
    if uid and is_configmap_name(name):
        return name
    return GPU_CONFIGMAP_PREFIX + str(uuid.uuid5(uuid.NAMESPACE_URL, uid or fallback))


def visible_devices_env(name: str) -> dict[str, Any]:
    """The ``env`` entry a fractional container gets: its GPU comes from ConfigMap ``name``.
    ``optional: false``: the kubelet does not start the container before bind has written
    the GPU (``CreateContainerConfigError`` meanwhile), the safe failure."""
    return {"name": VISIBLE_DEVICES_ENV, "valueFrom": {"configMapKeyRef": {
        "name": name, "key": GPU_CONFIGMAP_KEY, "optional": False}}}


def is_visible_devices_ref(entry: Any, name: str) -> bool:
    """Exactly :func:`visible_devices_env` of ``name`` (no literal value, nothing else)."""
    return bool(entry == visible_devices_env(name))


def visible_devices_value(gpu_uuid: str, device_list_strategy: str) -> str:
    """What bind writes under :data:`~gpu_admission.core.vocab.GPU_CONFIGMAP_KEY` for a GPU:
    the UUID (``envvar``) or its CDI name (``cdi-annotations``, ``cdi-cri``)."""
    return gpu_uuid if device_list_strategy == "envvar" else CDI_GPU_PREFIX + gpu_uuid


# --- parsing ------------------------------------------------------------------------------
def parse_share_mib(value: Any) -> int:
    """The annotation's value: a positive integer count of MiB as a string (``"4096"``).
    Raises ValueError saying what was expected."""
    text = value.strip() if isinstance(value, str) else None
    if text is None or not _MIB_TEXT.match(text):
        shown = repr(value[:20]) if isinstance(value, str) else type(value).__name__
        raise ValueError(f'expected a positive integer count of MiB as a string, e.g. "4096", '
                         f"got {shown}")
    mib = int(text)
    if mib <= 0:
        raise ValueError(f"expected a positive integer count of MiB, got {text!r}")
    return mib


def hami_limit_bytes(value: str) -> int | None:
    """A ``CUDA_DEVICE_MEMORY_LIMIT`` value in bytes (HAMi-core: bytes, or ``k``/``m``/``g``
    binary suffix); None when HAMi-core would not read it as a limit (0 = no limit)."""
    match = _HAMI_VALUE.match(value)
    if match is None:
        return None
    number = int(match.group(1)) * _HAMI_FACTOR[match.group(2).lower()]
    return number or None


def hami_limit_text(mib: int) -> str:
    """``CUDA_DEVICE_MEMORY_LIMIT`` for ``mib`` MiB, e.g. ``4096m``."""
    return f"{mib}m"


# --- what the pod is ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Fraction:
    """A fractional pod's share of one GPU."""

    share_mib: int  # the pod's share, MiB (annotation, resource, env vars)
    card_mib: int  # memory of the GPU it is a share of, MiB (pool memoryMiB; see plan())
    source: str  # where the share comes from, for messages
    configmap: str  # the ConfigMap that will hold its GPU (recorded name, or from the UID)
    explicit: bool  # asked with the annotation / the extended resource

    @property
    def fraction(self) -> float:
        """The share as a fraction of the card (GPU_MEMORY_FRACTION and the JAX variables)."""
        return self.share_mib / self.card_mib


@dataclass(frozen=True, slots=True)
class Problem:
    """Why an explicit ask for a fraction cannot be served (rule ``memory-limit``)."""

    path: str
    message: str


@dataclass(frozen=True, slots=True)
class Plan:
    """The outcome of :func:`plan`: a fraction, or the problems with an explicit ask."""

    fraction: Fraction | None = None
    problems: tuple[Problem, ...] = ()
    explicit: bool = False  # the pod asked (annotation or resource), usable or not


NOT_FRACTIONAL: Final = Plan()


def annotations_of(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return annotations if isinstance(annotations, dict) else {}


def recorded_share_mib(pod: Mapping[str, Any]) -> int | None:
    """The share recorded on a pod (annotation ``gpu-admission.io/gpu-memory``), MiB, or None
    when absent or invalid. For the extender's ledger: read it only from pods that request
    :data:`~gpu_admission.core.vocab.GPU_MEMORY_RESOURCE` (see :func:`requested_share_mib`)."""
    try:
        return parse_share_mib(annotations_of(pod)[GPU_MEMORY_ANNOTATION])
    except (KeyError, ValueError):
        return None


def recorded_configmap(pod: Mapping[str, Any]) -> str | None:
    """The ConfigMap name recorded on a pod, when it is a valid one."""
    name = annotations_of(pod).get(GPU_CONFIGMAP_ANNOTATION)
    return name if is_configmap_name(name) else None


def requested_share_mib(pod: Mapping[str, Any]) -> int | None:
    """The MiB of :data:`~gpu_admission.core.vocab.GPU_MEMORY_RESOURCE` the pod requests, as
    Kubernetes counts a pod's effective request (max(sum over app containers, max over init
    containers); https://kubernetes.io/docs/concepts/workloads/pods/init-containers/); None
    when it requests none. What ResourceQuota and NodeResourcesFit count."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return None
    app = init = 0
    seen = False
    for kind in ("containers", "initContainers"):
        items = spec.get(kind)
        for container in items if isinstance(items, list) else ():
            amount = _resource(container, GPU_MEMORY_RESOURCE)
            if amount is None:
                continue
            seen = True
            if kind == "containers":
                app += amount
            else:
                init = max(init, amount)
    return max(app, init) if seen else None


def _resource(container: Any, name: str) -> int | None:
    """A container's quantity of ``name`` (limits win over requests, as for GPUs)."""
    resources = container.get("resources") if isinstance(container, dict) else None
    if not isinstance(resources, dict):
        return None
    for section in ("limits", "requests"):
        values = resources.get(section)
        if isinstance(values, dict) and name in values:
            return integer_quantity(values[name])
    return None


def _names_resource(container: Mapping[str, Any]) -> bool:
    """The container names :data:`~gpu_admission.core.vocab.GPU_MEMORY_RESOURCE` at all."""
    resources = container.get("resources")
    return isinstance(resources, dict) and any(
        isinstance(resources.get(section), dict) and GPU_MEMORY_RESOURCE in resources[section]
        for section in ("limits", "requests"))


def _own_limit(container: Mapping[str, Any]) -> int | None:
    """The container's own literal ``NVIDIA_MEM_LIMIT_MB`` (last entry), when a positive int."""
    env = container.get("env")
    found: int | None = None
    for entry in env if isinstance(env, list) else ():
        if isinstance(entry, dict) and entry.get("name") == NVIDIA_MEM_LIMIT_MB:
            value = entry.get("value")
            text = value.strip() if isinstance(value, str) else ""
            found = int(text) if _MIB_TEXT.match(text) and int(text) > 0 else None
    return found


def fractional_pools(policy: Policy) -> tuple[NodePool, ...]:
    return tuple(p for p in policy.compiled.pools if p.fractional)


def pool_share_mib(pool: NodePool, policy: Policy) -> int:
    """The default share of a pod on fractional ``pool`` that does not say its own, MiB.

    A fractional pool's device plugin advertises whole GPUs, so ``replicasPerGPU`` has no
    device-plugin meaning there; set above 1 it is the default split of the card
    (``memoryMiB // replicasPerGPU``, as on a time-sliced pool). Left at 1 the default is
    ``spec.memoryLimits.defaultMemoryMiB``. Either is capped at what one card can hold with
    the extender's ``memoryHeadroomMiB`` (:func:`usable_mib`)."""
    if pool.replicas_per_gpu > 1:
        wanted = pool.memory_per_replica_mib
    else:
        wanted = policy.spec.memory_limits.default_memory_mib
    return max(1, min(wanted, usable_mib(pool.memory_mib, policy)))


def usable_mib(card_mib: int, policy: Policy) -> int:
    """The largest share one card can ever take: the extender places a pod only on a GPU
    with share + ``spec.placement.memoryHeadroomMiB`` free."""
    return card_mib - policy.spec.placement.memory_headroom_mib


def plan(pod: Mapping[str, Any], containers: Sequence[tuple[str, Mapping[str, Any]]], *,
         gpus: int,
         workload: str, mig: bool, dra: bool, pool: NodePool | None, policy: Policy,
         uid: str = "") -> Plan:
    """Whether ``pod`` is fractional and its share (see the module docstring).

    ``containers``: the pod's GPU containers as (field path, dict), e.g.
    ``("spec.containers[0]", {...})``; ``gpus``: the whole GPUs they ask
    for (the pod's effective count, not counting ``gpu-admission.io/gpu-memory``); ``mig``:
    a MIG resource or pool; ``dra``: a GPU given through a DRA claim; ``pool``: the pool the
    engine routes the pod to; ``uid``: the admission request's UID (the ConfigMap name when
    the pod carries none of ours yet)."""
    annotations = annotations_of(pod)
    raw = annotations.get(GPU_MEMORY_ANNOTATION)
    resource = requested_share_mib(pod)
    has_resource = any(_names_resource(c) for _, c in containers)
    explicit = raw is not None or resource is not None or has_resource
    if not explicit and (workload == "training" or mig or dra or gpus != 1 or pool is None
                         or not pool.fractional):
        return NOT_FRACTIONAL
    problems: list[Problem] = []
    asked: int | None = None
    source = ""
    if raw is not None:
        try:
            asked = parse_share_mib(raw)
            source = f"annotation {GPU_MEMORY_ANNOTATION}"
        except ValueError as exc:
            problems.append(Problem(ANNOTATION_PATH, str(exc)))
    elif resource is not None or has_resource:
        if resource is not None and resource > 0:
            asked, source = resource, f"resource {GPU_MEMORY_RESOURCE}"
        else:
            problems.append(Problem(_resource_path(containers),
                                    f"{GPU_MEMORY_RESOURCE} must be a positive integer count "
                                    "of MiB"))
    if explicit and workload == "training":
        # no-training-on-shared-gpu reports it (a fraction is a shared GPU); keep it whole
        return Plan(explicit=True)
    if explicit:
        problems.extend(_explicit_problems(workload=workload, mig=mig, dra=dra, gpus=gpus,
                                           pool=pool, policy=policy))
    card = pool.memory_mib if pool is not None and pool.fractional else max(
        (p.memory_mib for p in fractional_pools(policy)), default=0)
    if problems or card <= 0:
        return Plan(problems=tuple(problems), explicit=explicit)
    usable = usable_mib(card, policy)
    where = f"pool {pool.name}" if pool is not None else "the largest fractional pool"
    if asked is None:
        assert pool is not None  # implicit asks are on a fractional pool (above)
        default = pool_share_mib(pool, policy)
        own = [_own_limit(c) for _, c in containers]
        share = max(o if o is not None and o < default else default for o in own)
        source = (f"env {NVIDIA_MEM_LIMIT_MB}" if share < default else
                  f"pool {pool.name} default share")
    else:
        share = asked
    if share > usable:
        path = ANNOTATION_PATH if raw is not None else _resource_path(containers)
        return Plan(problems=(Problem(path, (
            f"a share of {share} MiB does not fit one GPU of {where}: at most memoryMiB "
            f"{card} - spec.placement.memoryHeadroomMiB "
            f"{policy.spec.placement.memory_headroom_mib} = {usable} MiB")),), explicit=explicit)
    recorded = recorded_configmap(pod)
    name = recorded if recorded is not None and _env_refers(containers, recorded) else (
        configmap_name(uid, _pod_key(pod)))
    return Plan(Fraction(share, card, source, name, explicit), explicit=explicit)


def _explicit_problems(*, workload: str, mig: bool, dra: bool, gpus: int,
                       pool: NodePool | None, policy: Policy) -> list[Problem]:
    """Why an explicit ask cannot be a fraction (training is the training rule's)."""
    out: list[Problem] = []
    if mig:
        out.append(Problem(ANNOTATION_PATH, "a GPU fraction cannot be combined with MIG; "
                           "remove the annotation or the MIG resource"))
    if dra:
        out.append(Problem(ANNOTATION_PATH, "a GPU fraction cannot be combined with a DRA "
                           "claim; remove the annotation or the claim"))
    if gpus > 1:
        out.append(Problem(ANNOTATION_PATH, f"a GPU fraction is a share of one GPU, but the "
                           f"pod asks for {gpus} GPUs; ask for one GPU or remove the annotation"))
    if pool is not None and not pool.fractional:
        out.append(Problem(ANNOTATION_PATH, f"pool {pool.name} is sharing {pool.sharing}; a "
                           "GPU fraction needs a pool with sharing: fractional"))
    elif pool is None and not fractional_pools(policy):
        out.append(Problem(ANNOTATION_PATH, "the policy has no pool with sharing: fractional, "
                           "so no node can give a GPU fraction"))
    return out


def _resource_path(containers: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    for path, container in containers:
        if _resource(container, GPU_MEMORY_RESOURCE) is not None:
            return f"{path}.resources"
    return "spec.containers"


def _env_refers(containers: Sequence[tuple[str, Mapping[str, Any]]], name: str) -> bool:
    """Every GPU container's last NVIDIA_VISIBLE_DEVICES entry is our ref to ``name``: the
    pod is our own earlier output, so its recorded name is kept (idempotence)."""
    if not containers:
        return False
    for _, container in containers:
        env = container.get("env")
        last = None
        for entry in env if isinstance(env, list) else ():
            if isinstance(entry, dict) and entry.get("name") == VISIBLE_DEVICES_ENV:
                last = entry
        if not is_visible_devices_ref(last, name):
            return False
    return True


def _pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return (f"gpu-admission:{meta.get('namespace', '')}/"
            f"{meta.get('name') or meta.get('generateName') or ''}")
