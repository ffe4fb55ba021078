"""The ``GPUSharingPolicy`` document: a versioned YAML file validated by pydantic v2.

Why a typed model: operators edit this file by hand, so every typo (``extra="forbid"``) and
every wrong type must be caught at load time with a message that names the field path, e.g.
``spec.nodePools[1].memoryMiB: expected an integer > 0, got "lots"``.

The model is built around node pools (like Volcano's resource groups); its vocabulary is the
NVIDIA device plugin / GPU Feature Discovery one (https://github.com/NVIDIA/k8s-device-plugin).
Per-policy derived data (sets, modes, pool tuples) is computed once in ``model_post_init`` and
kept in a private attribute so the hot path (``engine.evaluate``) does no pydantic work.

Units: every ``...MiB`` field is in MiB (2**20 bytes), the unit of the GFD label
``nvidia.com/gpu.memory``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)
from pydantic_core import PydanticCustomError

from gpu_admission.core.cuda import (
    ImageRule,
    check_digest,
    compile_tag_glob,
    image_lookup,
    parse_repository,
)
from gpu_admission.core.decision import Mode
from gpu_admission.core.vocab import CUDA_VERSION_LABEL

API_VERSION = "gpu-admission.io/v1alpha1"
KIND = "GPUSharingPolicy"
DEFAULT_POLICY_RESOURCE = "default-policy.yaml"

SharingMode = Literal["none", "time-slicing", "mps", "mig", "fractional"]
WorkloadClass = Literal["training", "inference", "notebook"]
#: Other GPU-sharing systems whose pods the policy recognises (spec.otherSharingSystems):
#: ``kai`` = NVIDIA KAI-Scheduler / Run:ai fractions (pod annotations ``gpu-fraction``,
#: ``gpu-memory``); ``hami`` = HAMi vGPU (``nvidia.com/gpumem``, ``gpumem-percentage``,
#: ``gpucores`` resources).
SharingSystem = Literal["kai", "hami"]

# Rule ids, in the fixed order the engine runs them (see gpu_admission.rules).
RULE_IDS: tuple[str, ...] = (
    "workload-label",
    "no-training-on-shared-gpu",
    "scheduler-name",
    "cuda-version-conflict",
    "cuda-node-selector-conflict",
    "cuda-version-unknown",
    "memory-limit",
    "memory-limit-unverifiable",
    "gpu-access-isolation",
    "gpu-visible-devices",
    "gpu-device-hostpath",
    "dra-reference-unknown",
    "dra-sharing-possible",
    "other-sharing-system",
)

_CUDA_RE = re.compile(r"^\d{1,3}\.\d{1,3}$")
# Kubernetes label value / qualified-name syntax (apimachinery validation.go).
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _got(value: Any) -> str:
    """Render the offending input the way the user wrote it (JSON-ish, short)."""
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):  # pragma: no cover - json.dumps(default=str) is total
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _positive_int(value: Any) -> int:
    # bool is an int subclass; YAML "yes"/"true" must not become 1.
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PydanticCustomError("positive_int", "expected an integer > 0, got {got}",
                                  {"got": _got(value)})
    return value


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise PydanticCustomError("fraction", "expected a number in (0, 1], got {got}",
                                  {"got": _got(value)})
    return float(value)


def _cuda_version(value: Any) -> str:
    # YAML reads 12.10 as the float 12.1: insist on a quoted string so that cannot happen.
    if not isinstance(value, str) or not _CUDA_RE.match(value):
        raise PydanticCustomError(
            "cuda_version", 'expected a quoted "<major>.<minor>" string like "12.1", got {got}',
            {"got": _got(value)})
    major, minor = value.split(".")
    return f"{int(major)}.{int(minor)}"


def _label_value(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE_RE.match(value):
        raise PydanticCustomError(
            "label_value", "expected a quoted Kubernetes label value, got {got}",
            {"got": _got(value)})
    return value


def _strict_str(value: Any) -> str:
    if not isinstance(value, str):
        raise PydanticCustomError("string", "expected a string, got {got}", {"got": _got(value)})
    return value


PositiveInt = Annotated[int, BeforeValidator(_positive_int)]
Fraction = Annotated[float, BeforeValidator(_fraction)]
CudaVersion = Annotated[str, BeforeValidator(_cuda_version)]
LabelValue = Annotated[str, BeforeValidator(_label_value)]
StrictStr = Annotated[str, BeforeValidator(_strict_str)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Metadata(_Model):
    name: StrictStr = "default"
    labels: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    annotations: dict[StrictStr, StrictStr] = Field(default_factory=dict)


class NodePool(_Model):
    """A set of GPU nodes sharing one configuration (Volcano resource-group style).

    A pod is *routed to* a pool when every ``nodeSelector`` label of the pool is in the
    pod's nodeSelector (after our CUDA routing label is added) or in every required
    node-affinity term as an ``In`` requirement.
    """

    name: StrictStr
    node_selector: dict[StrictStr, LabelValue] = Field(alias="nodeSelector", min_length=1)
    sharing: SharingMode = "none"
    # Device-plugin replicas per physical GPU (timeSlicing/mps ``resources[].replicas``).
    replicas_per_gpu: PositiveInt = Field(default=1, alias="replicasPerGPU")
    # Memory of one physical GPU (for MIG: of one slice) in MiB, as GFD's nvidia.com/gpu.memory.
    memory_mib: PositiveInt = Field(alias="memoryMiB")
    cuda_version: CudaVersion | None = Field(default=None, alias="cudaVersion")
    # How the pool's device plugin reads NVIDIA_VISIBLE_DEVICES (its deviceListStrategy):
    # "envvar" takes the GPU's UUID, "cdi-annotations"/"cdi-cri" the CDI name
    # ``k8s.device-plugin.nvidia.com/gpu=<UUID>``. Used by fractional pools only.
    device_list_strategy: Literal["envvar", "cdi-annotations", "cdi-cri"] = Field(
        default="envvar", alias="deviceListStrategy")

    @field_validator("name")
    @classmethod
    def _name_is_dns_label(cls, value: str) -> str:
        if not _DNS_LABEL_RE.match(value) or len(value) > 63:
            raise PydanticCustomError("pool_name", "expected a DNS label (a-z, 0-9, -), got {got}",
                                      {"got": _got(value)})
        return value

    @property
    def shared(self) -> bool:
        return self.sharing in ("time-slicing", "mps")

    @property
    def fractional(self) -> bool:
        """Whole GPUs advertised; the extender chooses the card and sizes shares by memory."""
        return self.sharing == "fractional"

    @property
    def memory_per_replica_mib(self) -> int:
        """MiB one pod may use: the card's memory split evenly, as the MPS daemon does."""
        return self.memory_mib // self.replicas_per_gpu


class MemoryEnv(_Model):
    """Which memory-limit environment variables the memory-limit rule writes."""

    nvidia_mem_limit_mb: bool = Field(default=True, alias="nvidiaMemLimitMB")
    gpu_memory_fraction: bool = Field(default=True, alias="gpuMemoryFraction")
    jax_mem_fraction: bool = Field(default=True, alias="jaxMemFraction")
    tf_allow_growth: bool = Field(default=True, alias="tfAllowGrowth")
    mps_pinned_mem_limit: bool = Field(default=True, alias="mpsPinnedMemLimit")


class MemoryLimits(_Model):
    # MiB per container when the pod's pool is unknown (article: NVIDIA_MEM_LIMIT_MB=16000).
    default_memory_mib: PositiveInt = Field(default=16000, alias="defaultMemoryMiB")
    # Share of the card when the pod's pool is unknown (article: fraction 0.2).
    default_fraction: Fraction = Field(default=0.2, alias="defaultFraction")
    env: MemoryEnv = Field(default_factory=MemoryEnv)


class ImageCuda(_Model):
    """One ``spec.cudaRouting.images`` entry: the CUDA of images the tag does not reveal.

    Matching rules (repository normalisation, mirrors, digests, tag globs) are
    :class:`gpu_admission.core.cuda.ImageRule`'s; ``gpu-admission images scan`` prints entries.
    """

    repository: StrictStr
    tags: StrictStr | None = None  # fnmatch glob over the tag, e.g. "v0.6.*"
    digests: list[StrictStr] = Field(default_factory=list)  # "sha256:<64 hex>"
    cuda_version: CudaVersion = Field(alias="cudaVersion")

    @field_validator("repository")
    @classmethod
    def _normalised_repository(cls, value: str) -> str:
        try:
            registry, repository = parse_repository(value)
        except ValueError as exc:
            raise PydanticCustomError("repository", "{why}, got {got}",
                                      {"why": str(exc), "got": _got(value)}) from None
        return f"{registry}/{repository}" if registry else repository

    @field_validator("tags")
    @classmethod
    def _tag_glob(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                compile_tag_glob(value)
            except ValueError as exc:
                raise PydanticCustomError("tag_glob", "{why}, got {got}",
                                          {"why": str(exc), "got": _got(value)}) from None
        return value

    @field_validator("digests")
    @classmethod
    def _digests(cls, values: list[str]) -> list[str]:
        for value in values:
            try:
                check_digest(value)
            except ValueError as exc:
                raise PydanticCustomError("digest", "{why}, got {got}",
                                          {"why": str(exc), "got": _got(value)}) from None
        return values

    def rule(self) -> ImageRule:
        registry, repository = parse_repository(self.repository)
        return ImageRule(registry, repository,
                         compile_tag_glob(self.tags) if self.tags is not None else None,
                         frozenset(self.digests), self.cuda_version)


class CudaRouting(_Model):
    node_selector: bool = Field(default=True, alias="nodeSelector")
    driver_affinity: bool = Field(default=False, alias="driverAffinity")
    # The cluster's own image -> CUDA table, consulted first (first match wins).
    images: list[ImageCuda] = Field(default_factory=list)

    @field_validator("images")
    @classmethod
    def _unique_images(cls, images: list[ImageCuda]) -> list[ImageCuda]:
        seen: dict[tuple[str, str | None, tuple[str, ...]], int] = {}
        for index, entry in enumerate(images):
            key = (entry.repository, entry.tags, tuple(sorted(entry.digests)))
            if key in seen:
                raise PydanticCustomError(
                    "duplicate_image",
                    "entry [{index}] duplicates entry [{first}] (repository {repo}, same tags "
                    "and digests): remove one", {"index": index, "first": seen[key],
                                                 "repo": _got(entry.repository)})
            seen[key] = index
        return images


class Classification(_Model):
    default_workload: WorkloadClass = Field(default="inference", alias="defaultWorkload")
    training_owner_kinds: list[StrictStr] = Field(
        default_factory=lambda: ["PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob",
                                 "JAXJob", "MXJob", "TrainJob"], alias="trainingOwnerKinds")
    training_label_prefixes: list[StrictStr] = Field(
        default_factory=lambda: ["training.kubeflow.org/", "trainer.kubeflow.org/"],
        alias="trainingLabelPrefixes")
    notebook_labels: list[StrictStr] = Field(default_factory=lambda: ["notebook-name"],
                                             alias="notebookLabels")
    # Image repositories (prefixes of the image reference) whose pods are notebooks: the
    # Jupyter Docker Stacks images, on quay.io/jupyter since 2023-10-20 and on Docker Hub
    # (jupyter/...) before (jupyter-docker-stacks.readthedocs.io, "Selecting an Image").
    notebook_images: list[StrictStr] = Field(
        default_factory=lambda: ["quay.io/jupyter/", "jupyter/", "docker.io/jupyter/"],
        alias="notebookImages")
    # The class of a GPU pod owned by a batch/v1 Job (CronJobs create Jobs) that nothing else
    # classifies; null: such pods take ``defaultWorkload``. Training by default: misclassing
    # a batch job as training only costs it a dedicated GPU, misclassing training as
    # inference slows it ~3x on a time-sliced card and caps its memory (issue 22).
    batch_job_workload: WorkloadClass | None = Field(default="training",
                                                    alias="batchJobWorkload")


def _percent(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 100:
        raise PydanticCustomError("percent", "expected an integer percentage in 1..100, got {got}",
                                  {"got": _got(value)})
    return value


def _non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PydanticCustomError("non_negative_int", "expected an integer >= 0, got {got}",
                                  {"got": _got(value)})
    return value


Percent = Annotated[int, BeforeValidator(_percent)]
NonNegativeInt = Annotated[int, BeforeValidator(_non_negative_int)]


class Placement(_Model):
    """How the ``gpu-aware-scheduler`` extender places GPU pods (``gpu-admission extender``).

    Read by the extender (filter/prioritize) and by ``gpu-admission report`` (the sharing
    estimate), so both pack to the same target.
    """

    # Shared-GPU pods are packed towards this SM utilisation of the GPU they will get, in %
    # (scheduler-plugins TargetLoadPacking's curve, applied to DCGM_FI_DEV_GPU_UTIL).
    target_utilization_percent: Percent = Field(default=70, alias="targetUtilizationPercent")
    # Free framebuffer a GPU must keep on top of the pod's memory share, in MiB.
    memory_headroom_mib: NonNegativeInt = Field(default=1024, alias="memoryHeadroomMiB")
    # A GPU under this SM utilisation, in % (strictly: 10 means < 10 %), counts as idle
    # (whole-GPU/training pods prefer nodes with idle GPUs; the report's idle threshold).
    idle_below_percent: Percent = Field(default=10, alias="idleBelowPercent")
    # Which GPU of a node must hold a shared pod's share + headroom. The NVIDIA device
    # plugin, not the scheduler, picks the GPU: the one with the fewest replicas allocated
    # (k8s-device-plugin internal/rm/allocate.go, distributed policy; ties at random).
    # "predicted": every GPU it may pick (fewest pods in dcgm-exporter's labels; exact with
    # KUBERNETES_VIRTUAL_GPUS=true; never over-commits); "any": some GPU (packs tighter,
    # can over-commit); "every": all GPUs. docs/extender.md has the measurements.
    memory_fit: Literal["any", "every", "predicted"] = Field(default="any", alias="memoryFit")
    # Fractional pools: also write HAMi-core's CUDA_DEVICE_MEMORY_LIMIT (the node preloads
    # libvgpu.so, which then enforces the share; Project-HAMi/HAMi-core README).
    hami_core: bool = Field(default=False, alias="hamiCore")


_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _device_class_name(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 253 or not _DNS_SUBDOMAIN_RE.match(value):
        raise PydanticCustomError(
            "device_class", "expected a DeviceClass name (DNS subdomain, e.g. gpu.nvidia.com), "
            "got {got}", {"got": _got(value)})
    return value


class Dra(_Model):
    """Dynamic Resource Allocation (``resource.k8s.io/v1``, docs/dra.md).

    ``gpuDeviceClasses``: a container whose claim request (or extended resource) uses one of
    these DeviceClasses is a GPU container (default: NVIDIA's DRA driver classes,
    https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu). A pod naming a template, claim
    or class the webhook's cache does not hold yet is reported as ``dra-reference-unknown``:
    training pods in that rule's mode (default enforce: denied, retry), other pods in
    ``nonTrainingUnknownReferences`` (default warn: admitted with a warning, no memory env).
    """

    gpu_device_classes: list[Annotated[str, BeforeValidator(_device_class_name)]] = Field(
        default_factory=lambda: ["gpu.nvidia.com", "mig.nvidia.com"],
        alias="gpuDeviceClasses", min_length=1)
    non_training_unknown_references: Mode = Field(default=Mode.WARN,
                                                  alias="nonTrainingUnknownReferences")

    @field_validator("gpu_device_classes")
    @classmethod
    def _unique_classes(cls, values: list[str]) -> list[str]:
        if len(set(values)) != len(values):
            dup = next(v for v in values if values.count(v) > 1)
            raise PydanticCustomError("duplicate_class", "duplicate DeviceClass {name}",
                                      {"name": _got(dup)})
        return values


class Exemptions(_Model):
    namespaces: list[StrictStr] = Field(default_factory=lambda: ["kube-system"])
    users: list[StrictStr] = Field(default_factory=list)
    groups: list[StrictStr] = Field(default_factory=list)


class RuleModes(_Model):
    """Enforcement mode per rule id: enforce (deny) | warn (allow + warning) | audit."""

    workload_label: Mode = Field(default=Mode.WARN, alias="workload-label")
    no_training_on_shared_gpu: Mode = Field(default=Mode.ENFORCE,
                                            alias="no-training-on-shared-gpu")
    scheduler_name: Mode = Field(default=Mode.WARN, alias="scheduler-name")
    cuda_version_conflict: Mode = Field(default=Mode.ENFORCE, alias="cuda-version-conflict")
    cuda_node_selector_conflict: Mode = Field(default=Mode.ENFORCE,
                                              alias="cuda-node-selector-conflict")
    cuda_version_unknown: Mode = Field(default=Mode.WARN, alias="cuda-version-unknown")
    memory_limit: Mode = Field(default=Mode.ENFORCE, alias="memory-limit")
    memory_limit_unverifiable: Mode = Field(default=Mode.WARN, alias="memory-limit-unverifiable")
    # The GPU-access guard (gpu_admission.rules.gpu_access): enforce = mutate / deny.
    gpu_access_isolation: Mode = Field(default=Mode.ENFORCE, alias="gpu-access-isolation")
    gpu_visible_devices: Mode = Field(default=Mode.ENFORCE, alias="gpu-visible-devices")
    gpu_device_hostpath: Mode = Field(default=Mode.ENFORCE, alias="gpu-device-hostpath")
    # DRA (docs/dra.md): a template/claim/class not in the cache, for training pods and
    # claim objects (other pods: spec.dra.nonTrainingUnknownReferences); a training claim
    # that may still land on a shared device.
    dra_reference_unknown: Mode = Field(default=Mode.ENFORCE, alias="dra-reference-unknown")
    dra_sharing_possible: Mode = Field(default=Mode.WARN, alias="dra-sharing-possible")
    # A pod asks KAI-Scheduler or HAMi for its GPU and the policy does not declare that
    # system in spec.otherSharingSystems (or the request is malformed).
    other_sharing_system: Mode = Field(default=Mode.ENFORCE, alias="other-sharing-system")

    def as_map(self) -> dict[str, Mode]:
        return {rule: getattr(self, rule.replace("-", "_")) for rule in RULE_IDS}


def _idle_hours(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 24:
        raise PydanticCustomError("idle_hours", "expected a number of hours in (0, 24], got "
                                  "{got}", {"got": _got(value)})
    return float(value)


def _working_hours(value: Any) -> str:
    # The report's parser (one definition of working hours); pure, no I/O.
    from gpu_admission.core.timeframe import WorkingHours  # noqa: PLC0415 - no cycle at import

    if not isinstance(value, str):
        raise PydanticCustomError("working_hours", 'expected a string like "Mon-Fri 08:00-18:00",'
                                  " got {got}", {"got": _got(value)})
    try:
        return WorkingHours.parse(value).text
    except ValueError as exc:
        raise PydanticCustomError("working_hours", "{message}", {
            "message": str(exc).removeprefix("--working-hours: ")}) from None


def _time_zone(value: Any) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # noqa: PLC0415

    try:
        ZoneInfo(value if isinstance(value, str) else "")
    except (ZoneInfoNotFoundError, ValueError):
        raise PydanticCustomError("time_zone", "expected an IANA time zone like UTC or "
                                  "Europe/Berlin, got {got}", {"got": _got(value)}) from None
    return str(value)


def _default_reclaimed() -> list[WorkloadClass]:
    return ["notebook", "inference"]


class Reclaim(_Model):
    """``gpu-admission reclaim`` (docs/reclaim.md): when an idle GPU pod gets a notice and,
    in namespaces labelled ``gpu-admission.io/reclaim: scale-down``, its owner is scaled
    down. Idle is the report's definition: SM utilisation under
    ``spec.placement.idleBelowPercent`` for a run of at least ``idleHours`` of
    ``workingHours`` in ``timeZone`` (the report's ``--working-hours``/``--tz`` syntax)."""

    # Hours (of working time) a pod's GPU must have been idle before the notice.
    idle_hours: Annotated[float, BeforeValidator(_idle_hours)] = Field(default=2.0,
                                                                       alias="idleHours")
    working_hours: Annotated[str, BeforeValidator(_working_hours)] = Field(
        default="Mon-Fri 08:00-18:00", alias="workingHours")
    time_zone: Annotated[str, BeforeValidator(_time_zone)] = Field(default="UTC",
                                                                   alias="timeZone")
    # Minutes between the notice and the scale-down.
    grace_minutes: NonNegativeInt = Field(default=60, alias="graceMinutes")
    workloads: list[WorkloadClass] = Field(default_factory=_default_reclaimed)
    # Scale-downs per controller interval, at most.
    max_actions_per_interval: NonNegativeInt = Field(default=5, alias="maxActionsPerInterval")


_SHARING_WORKLOADS: list[WorkloadClass] = ["inference", "notebook"]


class DefaultSharing(_Model):
    """Which GPU pods share a card by default where the nodes show both sharing and dedicated
    GPUs (issue 33; README "Node pools"): one-GPU inference and notebook pods are routed to a
    sharing pool and capped; the others (training, multi-GPU) are kept off sharing nodes.
    Only decides where GPU nodes are visible (the webhook's Node watch, ``evaluate``'s
    files): without them the declared pools and defaults apply."""

    workloads: list[WorkloadClass] = Field(default_factory=_SHARING_WORKLOADS.copy)
    # the most GPUs (summed over app containers; init containers: the largest) a pod that
    # shares by default may ask for
    max_gpus: PositiveInt = Field(default=1, alias="maxGPUs")


class Scheduling(_Model):
    """Which scheduler pods without a GPU get (issue 32, "CPU pods on GPU nodes"). CPU pods
    that the default scheduler spreads (LeastAllocated) over GPU nodes eat the CPU and memory
    GPUs need and strand them; the GPU-aware profile packs them (MostAllocated).

    ``cpuPods``: ``gpu-aware`` (default) gives a pod without a GPU in an opted-in namespace
    the policy's ``schedulerName`` on CREATE, under the conditions GPU pods get it (its
    ``schedulerName`` empty or ``default-scheduler``, no ``nodeName``), except DaemonSet pods
    (their node is fixed by the DaemonSet controller); ``default`` leaves their scheduler alone.
    """

    cpu_pods: Literal["gpu-aware", "default"] = Field(default="gpu-aware", alias="cpuPods")


class PolicySpec(_Model):
    scheduler_name: StrictStr | None = Field(default="gpu-aware-scheduler", alias="schedulerName")
    scheduling: Scheduling = Field(default_factory=Scheduling)
    node_pools: list[NodePool] = Field(default_factory=list, alias="nodePools")
    memory_limits: MemoryLimits = Field(default_factory=MemoryLimits, alias="memoryLimits")
    cuda_routing: CudaRouting = Field(default_factory=CudaRouting, alias="cudaRouting")
    classification: Classification = Field(default_factory=Classification)
    exemptions: Exemptions = Field(default_factory=Exemptions)
    placement: Placement = Field(default_factory=Placement)
    rules: RuleModes = Field(default_factory=RuleModes)
    dra: Dra = Field(default_factory=Dra)
    default_sharing: DefaultSharing = Field(default_factory=DefaultSharing,
                                            alias="defaultSharing")
    reclaim: Reclaim = Field(default_factory=Reclaim)
    # Other GPU-sharing systems the cluster runs (docs/policy.md, spec.otherSharingSystems):
    # their pods are GPU pods that keep the env their system writes. Off by default.
    other_sharing_systems: list[SharingSystem] = Field(default_factory=list,
                                                       alias="otherSharingSystems")

    @field_validator("other_sharing_systems")
    @classmethod
    def _unique_systems(cls, values: list[str]) -> list[str]:
        if len(set(values)) != len(values):
            dup = next(v for v in values if values.count(v) > 1)
            raise PydanticCustomError("duplicate_system", "duplicate sharing system {name}",
                                      {"name": _got(dup)})
        return values

    @field_validator("node_pools")
    @classmethod
    def _unique_pool_names(cls, pools: list[NodePool]) -> list[NodePool]:
        seen: set[str] = set()
        for pool in pools:
            if pool.name in seen:
                raise PydanticCustomError("duplicate_pool", "duplicate pool name {name}",
                                          {"name": _got(pool.name)})
            seen.add(pool.name)
        return pools


@dataclass(frozen=True, slots=True)
class Compiled:
    """Per-policy data the engine needs on every request, computed once per Policy."""

    modes: dict[str, Mode]
    exempt_namespaces: frozenset[str]
    exempt_users: frozenset[str]
    exempt_groups: frozenset[str]
    training_kinds: frozenset[str]
    training_prefixes: tuple[str, ...]
    notebook_labels: tuple[str, ...]
    notebook_images: tuple[str, ...]
    pools: tuple[NodePool, ...]
    pool_selectors: tuple[tuple[NodePool, tuple[tuple[str, str], ...]], ...]
    # pools whose selector has a label besides gpu-admission.io/cuda-version (explicit choice)
    explicit_pools: tuple[tuple[NodePool, tuple[tuple[str, str], ...]], ...]
    digest: str
    # image reference -> CUDA "<major>.<minor>": spec.cudaRouting.images, then the built-ins
    image_cuda: Callable[[str], str | None]
    # spec.dra: GPU DeviceClass names; mode of dra-reference-unknown for non-training pods
    dra_gpu_classes: frozenset[str] = frozenset()
    dra_unknown_other: Mode = Mode.WARN
    # spec.classification.batchJobWorkload (None: batch Jobs take the default class)
    batch_job_workload: str | None = "training"
    # spec.otherSharingSystems ("kai", "hami")
    other_systems: frozenset[str] = frozenset()
    # a ``sharing: fractional`` pool exists (engine.has_fractional_pools), asked per review
    fractional: bool = False
    # the scheduler pods without a GPU get (spec.scheduling.cpuPods gpu-aware: schedulerName)
    cpu_scheduler: str | None = None


class Policy(_Model):
    """The GPUSharingPolicy document (``apiVersion: gpu-admission.io/v1alpha1``)."""

    api_version: Literal["gpu-admission.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["GPUSharingPolicy"]
    metadata: Metadata = Field(default_factory=Metadata)
    spec: PolicySpec = Field(default_factory=PolicySpec)

    @functools.cached_property
    def compiled(self) -> Compiled:
        """Derived lookup data, computed once per (immutable) policy and then a dict lookup."""
        spec = self.spec
        canonical = json.dumps(self.model_dump(mode="json", by_alias=True), sort_keys=True,
                               separators=(",", ":"))
        selectors = tuple((p, tuple(sorted(p.node_selector.items()))) for p in spec.node_pools)
        return Compiled(
            modes=spec.rules.as_map(),
            exempt_namespaces=frozenset(spec.exemptions.namespaces),
            exempt_users=frozenset(spec.exemptions.users),
            exempt_groups=frozenset(spec.exemptions.groups),
            training_kinds=frozenset(spec.classification.training_owner_kinds),
            training_prefixes=tuple(spec.classification.training_label_prefixes),
            notebook_labels=tuple(spec.classification.notebook_labels),
            notebook_images=tuple(spec.classification.notebook_images),
            pools=tuple(spec.node_pools),
            pool_selectors=selectors,
            explicit_pools=tuple(s for s in selectors
                                 if any(k != CUDA_VERSION_LABEL for k, _ in s[1])),
            digest="sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16],
            image_cuda=image_lookup([entry.rule() for entry in spec.cuda_routing.images]),
            dra_gpu_classes=frozenset(spec.dra.gpu_device_classes),
            dra_unknown_other=spec.dra.non_training_unknown_references,
            batch_job_workload=spec.classification.batch_job_workload,
            other_systems=frozenset(spec.other_sharing_systems),
            fractional=any(p.sharing == "fractional" for p in spec.node_pools),
            cpu_scheduler=(spec.scheduler_name if spec.scheduling.cpu_pods == "gpu-aware"
                           else None) or None,
        )

    def model_copy(self, *, update: Mapping[str, Any] | None = None,
                   deep: bool = False) -> Policy:
        """Copy without the cached :attr:`compiled` data (``update`` may change the policy).

        Note that ``update`` is not validated (pydantic semantics); prefer
        :func:`policy_from_dict` for policies built in code.
        """
        copied = super().model_copy(update=update, deep=deep)
        copied.__dict__.pop("compiled", None)
        return copied

    @property
    def digest(self) -> str:
        """Short stable hash of the policy content, for audit records.

        ``sha256:`` + 16 hex digits of the canonical (sorted-key) JSON of the validated
        policy, so two files that differ only in comments, order or defaults-left-out hash alike.
        """
        return self.compiled.digest

    def mode(self, rule: str) -> Mode:
        return self.compiled.modes[rule]


class PolicyError(ValueError):
    """A policy file that cannot be used; the message names the field path."""


def _loc_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", item):
            parts.append(("." if parts else "") + item)
        else:  # map keys like "nvidia.com/gpu.product" or rule ids with '-'
            parts.append(f"[{json.dumps(item)}]" if parts else item)
    return "".join(parts) or "(document)"


def _error_message(err: Any) -> str:
    kind = err["type"]
    got = _got(err.get("input"))
    ctx = err.get("ctx") or {}
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown field (check the spelling; see docs/policy.md)"
    if kind == "literal_error":
        return f"expected {ctx.get('expected', 'one of the allowed values')}, got {got}"
    if kind == "enum":
        return f"expected {ctx.get('expected', 'one of the allowed values')}, got {got}"
    if kind in {"bool_type", "bool_parsing"}:
        return f"expected true or false, got {got}"
    if kind in {"dict_type", "model_type", "model_attributes_type"}:
        return f"expected a mapping, got {got}"
    if kind in {"list_type", "tuple_type"}:
        return f"expected a list, got {got}"
    if kind == "too_short":
        return f"expected at least {ctx.get('min_length', 1)} entries, got {got}"
    if kind in {"string_type", "str_type"}:
        return f"expected a string, got {got}"
    # Our own PydanticCustomError messages already say "expected ..., got ...".
    return str(err["msg"])


def format_validation_error(exc: ValidationError, source: str = "") -> str:
    """One clear message per pydantic error: ``<field path>: expected ..., got ...``."""
    lines = []
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p and "(" in p))
        lines.append(f"{_loc_path(loc)}: {_error_message(err)}")
    prefix = f"{source}: " if source else ""
    if len(lines) == 1:
        return prefix + lines[0]
    return prefix + f"{len(lines)} problems:\n  " + "\n  ".join(lines)


def policy_from_dict(data: Any, source: str = "") -> Policy:
    """Validate an already-parsed document; raise :class:`PolicyError` naming the field."""
    prefix = f"{source}: " if source else ""
    if not isinstance(data, dict):
        raise PolicyError(f"{prefix}expected a {KIND} mapping, got {_got(data)}")
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(format_validation_error(exc, source)) from None


def policy_from_yaml(text: str, source: str = "") -> Policy:
    """Parse (YAML safe loader, single document) and validate a policy."""
    prefix = f"{source}: " if source else ""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError(f"{prefix}invalid YAML: {where}{problem}") from None
    if len(docs) != 1:
        raise PolicyError(f"{prefix}expected exactly one {KIND} document, found {len(docs)}")
    return policy_from_dict(docs[0], source)


def load_policy(path: Path) -> Policy:
    """Read and validate a policy file; raise PolicyError naming the field on bad input."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read policy file: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PolicyError(f"{path}: policy file is not UTF-8 text") from None
    return policy_from_yaml(text, str(path))


def default_policy_text() -> str:
    """The YAML of the built-in default policy (package data)."""
    return (resources.files("gpu_admission") / "data" / DEFAULT_POLICY_RESOURCE).read_text(
        encoding="utf-8")


@functools.cache
def default_policy() -> Policy:
    """The built-in default policy (parsed once; Policy is frozen so sharing it is safe)."""
    return policy_from_yaml(default_policy_text(), "built-in default policy")
