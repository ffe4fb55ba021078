"""The annotations, labels, reasons and kinds ``gpu-admission reclaim`` reads and writes.

Kubeflow's notebook controller stops a Notebook (scales its StatefulSet to 0) while the
Notebook carries the annotation ``kubeflow-resource-stopped`` (kubeflow/kubeflow
``components/notebook-controller/controllers/notebook_controller.go``, ``STOP_ANNOTATION``;
the culler and the dashboards write an RFC 3339 time as its value).
"""

from typing import Final

# --- on the namespace: opt in to stage 2 --------------------------------------------------
RECLAIM_LABEL: Final = "gpu-admission.io/reclaim"
RECLAIM_SCALE_DOWN: Final = "scale-down"

# --- on the pod: stage 1 ------------------------------------------------------------------
IDLE_SINCE_ANNOTATION: Final = "gpu-admission.io/idle-since"  # RFC 3339: start of the idle run
NOTICE_AT_ANNOTATION: Final = "gpu-admission.io/idle-notice-at"  # RFC 3339: when noticed

# --- on the owner: stage 2 ----------------------------------------------------------------
RECLAIMED_REPLICAS_ANNOTATION: Final = "gpu-admission.io/reclaimed-replicas"  # integer string
RECLAIMED_AT_ANNOTATION: Final = "gpu-admission.io/reclaimed-at"  # RFC 3339
NOTEBOOK_STOP_ANNOTATION: Final = "kubeflow-resource-stopped"

# --- Events (core/v1 Event reason, CamelCase as the API conventions ask) -----------------
REASON_IDLE: Final = "GPUIdle"
REASON_RECLAIMED: Final = "GPUReclaimed"
REASON_RESTORED: Final = "GPURestored"
EVENT_COMPONENT: Final = "gpu-admission-reclaim"

# --- owners -----------------------------------------------------------------------------
DEPLOYMENT: Final = "Deployment"
STATEFULSET: Final = "StatefulSet"
NOTEBOOK: Final = "Notebook"
NOTEBOOK_GROUP: Final = "kubeflow.org"
SCALABLE_KINDS: Final = (DEPLOYMENT, STATEFULSET)
ACTIONABLE_KINDS: Final = (DEPLOYMENT, STATEFULSET, NOTEBOOK)
