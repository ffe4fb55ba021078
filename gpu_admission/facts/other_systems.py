"""Pods whose GPU another GPU-sharing system hands out (``spec.otherSharingSystems``). Pure.

Why (issue 22): clusters often run a second GPU-sharing system next to the NVIDIA device
plugin, and its pods do not look like ours:

* **KAI-Scheduler / Run:ai** (``kai``): a pod asks for a fraction with the annotation
  ``gpu-fraction`` (a number in (0, 1)) or ``gpu-memory`` (MiB, a positive integer) and **no**
  GPU resource. KAI's webhook then gives the fraction container (annotation
  ``gpu-fraction-container-name``, else ``spec.containers[0]``) ``NVIDIA_VISIBLE_DEVICES``
  from a per-pod ConfigMap: ``valueFrom.configMapKeyRef {name: <prefix>-<index>, key:
  NVIDIA_VISIBLE_DEVICES}`` (init containers ``<prefix>-i<index>``), where ``<prefix>`` is the
  pod annotation ``runai/shared-gpu-configmap`` (``<base>-<7 random>-shared-gpu``); KAI's
  binder writes the GPU's UUID into that ConfigMap. KAI enforces no memory limit itself.
  Sources: kai-scheduler/KAI-Scheduler ``pkg/common/resources/gpu_sharing.go``
  (``RequestsGPUFraction``, ``parseGpuFractionalPortion``, ``parseGpuFractionalMemory``),
  ``gpu_sharing_container_ref.go`` (``GetFractionContainerRef``),
  ``pkg/admission/webhook/v1alpha2/gpusharing/{gpu_sharing,pod_mutation}.go``,
  ``pkg/binder/common/gpusharingconfigmap/config_map.go`` (``SetGpuCapabilitiesConfigMapName``).
* **HAMi** (``hami``): containers ask with extended resources ``nvidia.com/gpumem`` (MiB),
  ``nvidia.com/gpumem-percentage`` (% of the card) and ``nvidia.com/gpucores`` (% of the
  SMs), usually next to ``nvidia.com/gpu`` (the number of vGPUs); HAMi-core enforces the
  memory limit in the container (``shared/reference/scheduling-and-dcgm.md`` §5).

With the system declared, its pods are GPU pods: the containers it serves keep the env it
writes (KAI's ``NVIDIA_VISIBLE_DEVICES`` reference, in exactly KAI's shape), and our memory
variables never exceed what the system grants (:attr:`OtherContainer.memory_mib`,
:attr:`OtherContainer.fraction`; None = unknown, that variable is not written). Not declared,
such a pod is reported by rule ``other-sharing-system`` naming what to declare, never
silently voided; and another system's annotations never unlock a GPU the cluster does not
hand out (the GPU-access guard still refuses the ConfigMap reference).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpu_admission.core.quantity import quantity_value

KAI: Final = "kai"
HAMI: Final = "hami"
SYSTEM_NAMES: Final = {KAI: "KAI-Scheduler", HAMI: "HAMi"}

# --- KAI-Scheduler -------------------------------------------------------------------
KAI_FRACTION: Final = "gpu-fraction"  # pod annotation, a number in (0, 1)
KAI_MEMORY: Final = "gpu-memory"  # pod annotation, MiB
KAI_CONTAINER: Final = "gpu-fraction-container-name"  # pod annotation
KAI_CONFIGMAP: Final = "runai/shared-gpu-configmap"  # pod annotation, the ConfigMap prefix
KAI_CONFIGMAP_SUFFIX: Final = "-shared-gpu"
KAI_ANNOTATIONS: Final = (KAI_FRACTION, KAI_MEMORY)
VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"

# --- HAMi ----------------------------------------------------------------------------
HAMI_MEMORY: Final = "nvidia.com/gpumem"  # MiB
HAMI_MEMORY_PERCENT: Final = "nvidia.com/gpumem-percentage"  # % of the card's memory
HAMI_CORES: Final = "nvidia.com/gpucores"  # % of the card's SMs
HAMI_RESOURCES: Final = (HAMI_MEMORY, HAMI_MEMORY_PERCENT, HAMI_CORES)

# --- found in the cluster, not declared (issue 33) ------------------------------------
#: Node annotations HAMi's device plugin writes on every node it serves: its device registry
#: and handshake (Project-HAMi/HAMi ``pkg/device/nvidia/device.go``: ``RegisterAnnos``,
#: ``HandshakeAnnos``). A visible node carrying one means HAMi runs in this cluster.
HAMI_NODE_ANNOTATIONS: Final = ("hami.io/node-nvidia-register", "hami.io/node-handshake")
#: The scheduler name KAI-Scheduler pods opt in with (``spec.schedulerName: kai-scheduler``,
#: KAI-Scheduler README / docs quickstart): a pod handed to KAI's scheduler is KAI's.
KAI_SCHEDULER_NAME: Final = "kai-scheduler"


def found_systems(cluster: frozenset[str], spec: Mapping[str, Any]) -> frozenset[str]:
    """The other sharing systems found for one pod where the cluster can be seen: those the
    nodes show (:attr:`gpu_admission.facts.nodepools.NodeView.systems`: HAMi's node annotations)
    plus KAI when the pod names KAI's scheduler."""
    if spec.get("schedulerName") == KAI_SCHEDULER_NAME:
        return cluster | {KAI}
    return cluster



@dataclass(frozen=True, slots=True)
class OtherContainer:
    """A container another system gives a GPU share."""

    kind: str  # "containers" | "initContainers"
    index: int
    why: str  # e.g. "KAI-Scheduler annotation gpu-fraction=0.5"
    path: str  # the field that asks, for messages
    memory_mib: int | None  # the memory the system grants, MiB (None: not known)
    fraction: float | None  # the share of the card it grants (None: not known)
    shared: bool  # the card is shared with other pods (time-sliced by the system)


@dataclass(frozen=True, slots=True)
class OtherGpu:
    """The other-system view of one pod."""

    system: str  # KAI | HAMI
    declared: bool
    asked: tuple[str, str]  # (path, why) of what asks the system first, for messages
    containers: tuple[OtherContainer, ...]
    #: (kind, index) -> KAI's ConfigMap name that container's NVIDIA_VISIBLE_DEVICES may name
    kai_configmaps: Mapping[tuple[str, int], str]
    problems: tuple[tuple[str, str], ...]  # (path, message): malformed requests

    @property
    def places(self) -> frozenset[tuple[str, int]]:
        return frozenset((c.kind, c.index) for c in self.containers)


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return annotations if isinstance(annotations, dict) else {}


def is_kai_pod(annotations: Mapping[str, Any]) -> bool:
    """KAI's ``RequestsGPUFraction``: either fraction annotation is present."""
    return KAI_FRACTION in annotations or KAI_MEMORY in annotations


def hami_resources(container: Mapping[str, Any]) -> dict[str, Any]:
    """HAMi resources of a container (limits win over requests), non-zero only."""
    resources = container.get("resources")
    found: dict[str, Any] = {}
    if not isinstance(resources, dict):
        return found
    for key in ("requests", "limits"):
        values = resources.get(key)
        if isinstance(values, dict):
            for name in HAMI_RESOURCES:
                if name in values and str(values[name]).strip() not in ("0", ""):
                    found[name] = values[name]
    return found


def _int(value: Any) -> int | None:
    """A positive whole quantity (``3000``, or ``3k`` as the API server writes it)."""
    number = quantity_value(value)
    if number is None or number != number.to_integral_value() or not 0 < number < 10**12:
        return None
    return int(number)


def _fraction(value: Any) -> float | None:
    try:
        number = float(str(value).strip())
    except ValueError:
        return None
    return number if 0 < number < 1 and not math.isnan(number) else None


def analyse(pod: Mapping[str, Any], spec: Mapping[str, Any], declared: frozenset[str],
            pool_memory_mib: int | None = None) -> OtherGpu | None:
    """The other-system view of ``pod``, or None when no other system is asked. KAI wins
    when a pod has both (KAI places the pod; HAMi resources then are noise).
    ``pool_memory_mib``: the memory of one card of the pod's node pool, when known (MiB)."""
    annotations = _annotations(pod)
    if is_kai_pod(annotations):
        return _kai(annotations, spec, KAI in declared, pool_memory_mib)
    found: list[OtherContainer] = []
    problems: list[tuple[str, str]] = []
    for kind in ("containers", "initContainers"):
        items = spec.get(kind)
        if not isinstance(items, list):
            continue
        for index, container in enumerate(items):
            if not isinstance(container, dict):
                continue
            hami = hami_resources(container)
            if not hami:
                continue
            path = f"spec.{kind}[{index}].resources"
            mib: int | None = None
            fraction: float | None = None
            parts = []
            if HAMI_MEMORY in hami:
                mib = _int(hami[HAMI_MEMORY])
                parts.append(f"{HAMI_MEMORY}={hami[HAMI_MEMORY]}")
                if mib is None:
                    problems.append((path, f"{HAMI_MEMORY}={str(hami[HAMI_MEMORY])[:20]!r} is "
                                           "not a whole number of MiB"))
                elif pool_memory_mib:
                    fraction = min(1.0, mib / pool_memory_mib)
            elif HAMI_MEMORY_PERCENT in hami:
                percent = _int(hami[HAMI_MEMORY_PERCENT])
                parts.append(f"{HAMI_MEMORY_PERCENT}={hami[HAMI_MEMORY_PERCENT]}")
                if percent is None or percent > 100:
                    problems.append((path, f"{HAMI_MEMORY_PERCENT}="
                                           f"{str(hami[HAMI_MEMORY_PERCENT])[:20]!r} is not a "
                                           "percentage in 1..100"))
                else:
                    fraction = percent / 100
                    if pool_memory_mib:
                        mib = pool_memory_mib * percent // 100
            if HAMI_CORES in hami:
                parts.append(f"{HAMI_CORES}={hami[HAMI_CORES]}")
            # gpucores 100 = the whole card, no other pod on it (HAMi device Fit)
            shared = _int(hami.get(HAMI_CORES, 0)) != 100
            found.append(OtherContainer(kind, index, "HAMi vGPU " + ", ".join(parts), path,
                                        mib, fraction, shared))
    if not found:
        return None
    return OtherGpu(HAMI, HAMI in declared, (found[0].path, found[0].why), tuple(found), {},
                    tuple(problems))


def _kai(annotations: Mapping[str, Any], spec: Mapping[str, Any], declared: bool,
         pool_memory_mib: int | None) -> OtherGpu:
    problems: list[tuple[str, str]] = []
    mib: int | None = None
    fraction: float | None = None
    if KAI_FRACTION in annotations:
        at = f"metadata.annotations[{KAI_FRACTION}]"
        raw = annotations[KAI_FRACTION]
        fraction = _fraction(raw)
        why = f"KAI-Scheduler annotation {KAI_FRACTION}={str(raw)[:20]}"
        if fraction is None:
            problems.append((at, f"{KAI_FRACTION}={str(raw)[:20]!r}: KAI expects a number "
                                 "greater than 0 and smaller than 1"))
        elif pool_memory_mib:
            mib = int(pool_memory_mib * fraction)
    else:
        at = f"metadata.annotations[{KAI_MEMORY}]"
        raw = annotations[KAI_MEMORY]
        mib = _int(raw)
        why = f"KAI-Scheduler annotation {KAI_MEMORY}={str(raw)[:20]}"
        if mib is None:
            problems.append((at, f"{KAI_MEMORY}={str(raw)[:20]!r}: KAI expects a whole "
                                 "number of MiB greater than 0"))
        elif pool_memory_mib:
            fraction = min(1.0, mib / pool_memory_mib)
    place = _kai_container(annotations, spec)
    containers: tuple[OtherContainer, ...] = ()
    configmaps: dict[tuple[str, int], str] = {}
    if place is None:
        problems.append((f"metadata.annotations[{KAI_CONTAINER}]",
                         f"{KAI_CONTAINER}={str(annotations.get(KAI_CONTAINER))[:40]!r} names no "
                         "container of this pod"))
    else:
        kind, index = place
        containers = (OtherContainer(kind, index, why, at, mib, fraction, True),)
        prefix = annotations.get(KAI_CONFIGMAP)
        if isinstance(prefix, str) and prefix.endswith(KAI_CONFIGMAP_SUFFIX):
            configmaps[place] = f"{prefix}-{'i' if kind == 'initContainers' else ''}{index}"
    return OtherGpu(KAI, declared, (at, why), containers, configmaps, tuple(problems))


def _kai_container(annotations: Mapping[str, Any],
                   spec: Mapping[str, Any]) -> tuple[str, int] | None:
    """KAI's ``GetFractionContainerRef``: the container the annotation names (init
    containers first), else ``spec.containers[0]``."""
    name = annotations.get(KAI_CONTAINER)
    if name is None:
        items = spec.get("containers")
        return ("containers", 0) if isinstance(items, list) and items else None
    for kind in ("initContainers", "containers"):
        items = spec.get(kind)
        if isinstance(items, list):
            for index, container in enumerate(items):
                if isinstance(container, dict) and container.get("name") == name:
                    return kind, index
    return None


def kai_env_ok(entry: Mapping[str, Any], configmap: str | None) -> bool:
    """Whether an ``NVIDIA_VISIBLE_DEVICES`` env entry is exactly what KAI's webhook writes:
    ``valueFrom.configMapKeyRef`` to the pod's own KAI ConfigMap, key
    ``NVIDIA_VISIBLE_DEVICES``, nothing else."""
    if configmap is None or entry.get("value") not in (None, ""):
        return False
    source = entry.get("valueFrom")
    if not isinstance(source, dict) or set(source) != {"configMapKeyRef"}:
        return False
    ref = source["configMapKeyRef"]
    return (isinstance(ref, dict) and ref.get("name") == configmap
            and ref.get("key") == VISIBLE_DEVICES and not ref.get("optional"))
