"""The GPU-access guard: no GPU without a GPU request. Rules ``gpu-access-isolation``,
``gpu-visible-devices`` and ``gpu-device-hostpath``.

Why: NVIDIA's CUDA and NGC images bake ``NVIDIA_VISIBLE_DEVICES=all`` into their environment.
On a node whose runtime is the NVIDIA container runtime (the GPU Operator's default), a
container that requests no GPU but runs such an image, or sets the variable itself, is given
*every* GPU of the node, outside the device plugin's accounting: no memory limit, no scheduler,
no training protection (NVIDIA/k8s-device-plugin issue 61; the toolkit's variable semantics:
https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/docker-specialized.html
-- ``void``, empty or unset: plain runc; ``none``: driver libraries but no device; ``all``, a
list of indexes or UUIDs: those GPUs; an image with ``CUDA_VERSION`` and no variable counts as
``all``). A ``hostPath`` volume on ``/dev/nvidia*`` or ``/dev/dri`` hands over device nodes the
same way.

The rule, for a Pod CREATE in an opted-in namespace (exemptions apply first), for every
container and init container (ephemeral containers cannot be set on CREATE), and for every
ephemeral container a ``pods/ephemeralcontainers`` UPDATE adds (``kubectl debug``; they never
have a GPU request). "GPU container" is
one the engine counts as such (:func:`~gpu_admission.admission.pod.gpu_containers`: a non-zero
``nvidia.com/gpu``, ``nvidia.com/gpu.shared`` or ``nvidia.com/mig-*`` request or limit; plus
containers that get a GPU through DRA, docs/dra.md). The variable's value is that of its *last*
``env`` entry (the one the kubelet applies):

=========================== ================================== ==============================
container                   ``NVIDIA_VISIBLE_DEVICES`` in env  outcome
=========================== ================================== ==============================
no GPU                      absent, or ``value`` empty          ``gpu-access-isolation``:
                                                                upsert ``value: void``
no GPU                      ``void`` or ``none`` (exact)        nothing
no GPU                      any other value, or ``valueFrom``   ``gpu-visible-devices``
GPU                         present at all                      ``gpu-visible-devices`` (the
                                                                device plugin picks the GPU)
GPU, fractional pod         exactly the webhook's               nothing (the extender's bind
                            ``configMapKeyRef`` to the pod's    writes that ConfigMap)
                            recorded ConfigMap
any (pod level)             ``hostPath.path`` matches           ``gpu-device-hostpath``
                            :data:`DEVICE_PATH_PATTERN`
=========================== ================================== ==============================

:data:`DEVICE_PATH_PATTERN` (RE2 and Python syntax alike; the whole path must match, i.e.
``'^(?:' + pattern + ')$'`` for CEL's unanchored ``matches``) is ``/dev/nvidia*`` and
``/dev/dri`` with anything below, and their ancestors ``/dev`` and ``/``, which contain them;
``//`` and ``/./`` are tolerated (Kubernetes already rejects ``..`` in a hostPath). Paths longer
than Linux ``PATH_MAX`` (4096) cannot be mounted and are not matched.

Modes: ``gpu-access-isolation`` in ``enforce`` *mutates* (at the mutate stage; the validate
stage never asks for it, as with every mutation); in ``warn``/``audit`` nothing is changed and
the container is reported instead. The two denial rules deny in ``enforce``. Pod UPDATEs are
not checked: a Pod's containers, env and volumes are immutable after creation, so an UPDATE of
the Pod cannot add GPU access (only the ``ephemeralcontainers`` subresource adds containers),
and re-judging pods created before the namespace opted in would block harmless
updates such as finalizer removal.

Not covered (documented in docs/guard.md): privileged containers (all devices; use Pod Security
``baseline``), ``envFrom`` (a ``void`` env entry overrides it), CDI device annotations.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any, Final

from gpu_admission.core.decision import Mode, Violation
from gpu_admission.core.patch import PatchBuilder, last_indexes
from gpu_admission.facts.fractional import is_visible_devices_ref
from gpu_admission.facts.other_systems import KAI
from gpu_admission.rules.base import Context

ISOLATION: Final = "gpu-access-isolation"
VISIBLE_DEVICES: Final = "gpu-visible-devices"
DEVICE_HOSTPATH: Final = "gpu-device-hostpath"

ENV: Final = "NVIDIA_VISIBLE_DEVICES"
VOID: Final = "void"
#: Values a container without a GPU request may keep (exact strings, as the toolkit compares).
NO_DEVICE_VALUES: Final = frozenset({"void", "none"})

#: hostPath paths that expose GPU device nodes (full match). Written without ``$`` and ``.``,
#: whose newline handling differs between RE2 and Python, so CEL and the engine agree.
DEVICE_PATH_PATTERN: Final = (r"(?:/\.?)*(?:/dev(?:/\.?)*"
                              r"(?:/(?:nvidia[\s\S]*|dri(?:/[\s\S]*)?))?)?")


#: Linux ``PATH_MAX``: a longer hostPath cannot be mounted at all (ENAMETOOLONG), so it
#: exposes nothing; the bound also keeps the match cheap on hostile input.
PATH_MAX: Final = 4096
_DEVICE_PATH = re.compile(DEVICE_PATH_PATTERN)


def is_device_path(path: str) -> bool:
    """True for a hostPath that exposes ``/dev/nvidia*`` or ``/dev/dri`` (or contains them):
    :data:`DEVICE_PATH_PATTERN` matches the whole path, which is 1..PATH_MAX characters (in
    CEL: ``size(p) > 0 && size(p) <= 4096 && p.matches('^(?:' + pattern + ')$')``)."""
    return 0 < len(path) <= PATH_MAX and _DEVICE_PATH.fullmatch(path) is not None


_ENV_ONLY: Final = frozenset({ENV})


def last_entry(env: Any) -> tuple[int, Mapping[str, Any]] | None:
    """The last ``NVIDIA_VISIBLE_DEVICES`` entry of an env list and its index."""
    if env.__class__ is not list or not env:
        return None
    at = last_indexes(env, _ENV_ONLY).get(ENV)
    return None if at is None else (at, env[at])


#: Where containers are on Pod CREATE (ephemeral containers cannot be set on CREATE).
POD_KINDS: Final = ("containers", "initContainers")
#: ``kubectl debug`` adds ephemeral containers through the ``pods/ephemeralcontainers``
#: subresource (an UPDATE carrying the whole Pod): the only way a container enters a running
#: pod. They cannot have ``resources`` (so never a GPU request) and, once added, cannot change.
EPHEMERAL_KIND: Final = "ephemeralContainers"
EPHEMERAL_SUBRESOURCE: Final = "ephemeralcontainers"


def guard(spec: Mapping[str, Any], gpu: AbstractSet[tuple[str, int]], modes: Mapping[str, Mode],
          patch: PatchBuilder | None, out: list[Violation], *,
          kinds: tuple[str, ...] = POD_KINDS, existing: AbstractSet[str] = frozenset(),
          volumes: bool = True, others: AbstractSet[tuple[str, int]] = frozenset(),
          fractional_configmap: str | None = None) -> None:
    """Apply the guard to one pod spec: append violations to ``out``, declare the ``void``
    upserts on ``patch`` (None: validate stage). ``gpu`` holds ``(kind, index)`` of the GPU
    containers. The engine calls this for every Pod CREATE that is not exempt, and with
    ``kinds=(EPHEMERAL_KIND,)``, ``existing`` (names already in the pod, left alone: they are
    immutable) and ``volumes=False`` for a ``pods/ephemeralcontainers`` UPDATE.

    ``others``: GPU containers whose ``NVIDIA_VISIBLE_DEVICES`` a declared other sharing
    system writes (KAI), judged by rule ``other-sharing-system`` instead.

    ``fractional_configmap``: the pod is fractional (:mod:`gpu_admission.facts.fractional`) and
    its GPU comes from this ConfigMap; a GPU container whose variable is exactly the
    webhook's own reference to it (:func:`~gpu_admission.facts.fractional.is_visible_devices_ref`)
    passes, so that the webhook run on its own output changes and refuses nothing. Any other
    value or ``valueFrom`` (another ConfigMap or key, ``optional: true``, a Secret, a
    fieldRef) stays refused."""
    isolation = modes[ISOLATION]
    for kind in kinds:
        items = spec.get(kind)
        if items.__class__ is not list:
            continue
        for index, container in enumerate(items):
            if container.__class__ is not dict:
                continue
            if existing:
                name = container.get("name")
                if name.__class__ is str and name in existing:
                    continue
            found = last_entry(container.get("env"))
            if (kind, index) in gpu:
                if found is not None and (kind, index) not in others and not (
                        fractional_configmap is not None
                        and is_visible_devices_ref(found[1], fractional_configmap)):
                    out.append(Violation(
                        VISIBLE_DEVICES, f"spec.{kind}[{index}].env[{found[0]}]",
                        f"{ENV} is set in a container that requests a GPU; the device plugin "
                        f"chooses its GPU: remove {ENV} from env", modes[VISIBLE_DEVICES]))
                continue
            shown = ""
            if found is not None:
                at, entry = found
                value = entry.get("value")
                if entry.get("valueFrom") is not None:
                    shown = "valueFrom"
                elif isinstance(value, str) and value.strip():
                    if value in NO_DEVICE_VALUES:
                        continue
                    shown = repr(value[:40])
                if shown:
                    out.append(Violation(
                        VISIBLE_DEVICES, f"spec.{kind}[{index}].env[{at}]",
                        f"{ENV}={shown} without a GPU request gives this container GPUs "
                        f"outside the scheduler's accounting; request nvidia.com/gpu, or set "
                        f"{ENV}=void", modes[VISIBLE_DEVICES]))
                    continue
            if isolation is Mode.ENFORCE:
                if patch is not None:
                    patch.upsert_env(kind, index, ENV, VOID)
            else:
                out.append(Violation(
                    ISOLATION, f"spec.{kind}[{index}]",
                    f"no GPU request and no {ENV}=void: a CUDA image (which sets {ENV}=all) "
                    "would see every GPU of the node", isolation))
    pod_volumes = spec.get("volumes") if volumes else None
    if pod_volumes.__class__ is list:
        for index, volume in enumerate(pod_volumes):
            host = volume.get("hostPath") if volume.__class__ is dict else None
            path = host.get("path") if isinstance(host, dict) else None
            if isinstance(path, str) and is_device_path(path):
                out.append(Violation(
                    DEVICE_HOSTPATH, f"spec.volumes[{index}].hostPath.path",
                    f"hostPath {path[:40]!r} exposes GPU device nodes (/dev/nvidia*, /dev/dri) "
                    "outside the device plugin; request nvidia.com/gpu instead",
                    modes[DEVICE_HOSTPATH]))


class GpuAccess:
    """The guard inside a GPU pod's rule run (non-GPU pods: the engine calls :func:`guard`)."""

    ids: tuple[str, ...] = (ISOLATION, VISIBLE_DEVICES, DEVICE_HOSTPATH)

    def check(self, ctx: Context) -> None:
        if ctx.facts.operation != "CREATE":
            return
        gpu = {(gc.kind, gc.index) for gc in ctx.gpu_containers}
        others = (ctx.other.places if ctx.other is not None and ctx.other.declared
                  and ctx.other.system == KAI else frozenset())
        fraction = ctx.fraction
        guard(ctx.spec, gpu, ctx.compiled.modes, ctx.patch, ctx.violations, others=others,
              fractional_configmap=fraction.configmap if fraction is not None else None)
