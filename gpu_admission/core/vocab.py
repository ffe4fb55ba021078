"""The fixed vocabulary users and tests rely on: labels, annotations, resource names.

Sources: NVIDIA k8s-device-plugin README and ``internal/lm/resource.go`` (GFD labels,
``.shared`` resources, ``-SHARED`` product suffix); Kubeflow training-operator
``pkg/controller.v1/common/pod.go`` (training labels, owner kinds). See
``shared/reference/gpu-facts.md`` sections 5 and 6.
"""

from typing import Final

# --- our own labels / annotations -------------------------------------------------
NAMESPACE_OPT_IN_LABEL: Final = "gpu-admission.io/enabled"  # value "true"
WORKLOAD_LABEL: Final = "gpu-admission.io/workload"  # training | inference | notebook
CUDA_VERSION_LABEL: Final = "gpu-admission.io/cuda-version"  # pod label and node-pool label
MUTATED_ANNOTATION: Final = "gpu-admission.io/mutated"

# --- fractional GPUs (``sharing: fractional`` pools; docs/extender.md) ---------------
# The pod's GPU-memory share in MiB (integer string). Set by the webhook; a user may set it
# to ask for a fraction explicitly. The ledger's truth together with the pod's ConfigMap.
GPU_MEMORY_ANNOTATION: Final = "gpu-admission.io/gpu-memory"
# The name of the pod's own ConfigMap that holds its GPU (recorded by the webhook).
GPU_CONFIGMAP_ANNOTATION: Final = "gpu-admission.io/gpu-configmap"
# ConfigMap name = prefix + the admission request's UID (pods from controllers have only
# generateName at admission). 24 + 36 characters: a valid DNS subdomain.
GPU_CONFIGMAP_PREFIX: Final = "gpu-admission-gpu-"
GPU_CONFIGMAP_KEY: Final = "NVIDIA_VISIBLE_DEVICES"  # the ConfigMap's data key
# Label (value "true") on the ConfigMaps bind writes: the ledger lists only these, and a
# ConfigMap without it (or owned by another pod) is never used.
CONFIGMAP_LABEL: Final = "gpu-admission.io/gpu-configmap"
# The extended resource a fractional pod requests instead of nvidia.com/gpu, in MiB; the
# install advertises it on the pool's nodes (GPUs x memoryMiB), so kube-scheduler's
# NodeResourcesFit and ResourceQuota (requests.gpu-admission.io/gpu-memory) count it.
GPU_MEMORY_RESOURCE: Final = "gpu-admission.io/gpu-memory"
# Reservation pods (one whole nvidia.com/gpu per opened GPU): label, and the annotation on
# which ``gpu-admission reserve`` publishes the UUID of the GPU it was given (NVML).
RESERVATION_LABEL: Final = "gpu-admission.io/reservation"  # value "true"
GPU_UUID_ANNOTATION: Final = "gpu-admission.io/gpu-uuid"

WORKLOAD_CLASSES: Final = ("training", "inference", "notebook")

# --- GPU resources (NVIDIA device plugin) ------------------------------------------
GPU_RESOURCE: Final = "nvidia.com/gpu"
SHARED_SUFFIX: Final = ".shared"  # time-slicing/MPS with renameByDefault: true
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"  # nvidia.com/mig-<g>g.<N>gb[.shared]

# --- GPU Feature Discovery node labels ---------------------------------------------
GFD_SHARING_STRATEGY: Final = "nvidia.com/gpu.sharing-strategy"  # none|time-slicing|mps
GFD_REPLICAS: Final = "nvidia.com/gpu.replicas"
GFD_MEMORY: Final = "nvidia.com/gpu.memory"  # MiB
GFD_PRODUCT: Final = "nvidia.com/gpu.product"  # "-SHARED" suffix when shared, not renamed
GFD_CUDA_RUNTIME_MAJOR: Final = "nvidia.com/cuda.runtime-version.major"
GFD_CUDA_RUNTIME_MINOR: Final = "nvidia.com/cuda.runtime-version.minor"
SHARED_PRODUCT_SUFFIX: Final = "-SHARED"
SHARED_STRATEGIES: Final = ("time-slicing", "mps")

DEFAULT_SCHEDULER: Final = "default-scheduler"

#: ``--kubeconfig in-cluster``: the pod's ServiceAccount instead of a kubeconfig file (one
#: spelling for the CLI, which must not import ``kubernetes`` to parse it, and the client)
IN_CLUSTER: Final = "in-cluster"
