"""Pods out of workload objects, for offline evaluation (``gpu-admission evaluate``).

The webhook only ever sees Pods, but people review Deployments and training jobs. Like
``kyverno apply`` does with its auto-gen rules, we evaluate each pod template as the Pod its
controller would create: the template's metadata and spec, the workload's namespace, and (for
training jobs) the owner reference the controller sets, so the classification matches what the
webhook sees at admission time (Kubeflow training-operator ``pkg/controller.v1/common/pod.go``
puts a controller ownerReference to the job into each pod).

Supported (the apiVersion's group is checked before the kind: a Volcano ``Job`` is not a
``batch/v1`` Job):

* Pod; Deployment, StatefulSet, DaemonSet, ReplicaSet, ReplicationController (``apps``/core,
  ``spec.template``);
* ``batch/v1`` Job (``spec.template``) and CronJob (``spec.jobTemplate.spec.template``): the
  pod is given the controller ownerReference ``batch/v1`` Job the Job controller sets, so the
  classification (``spec.classification.batchJobWorkload``) matches admission;
* Kubeflow training jobs (``spec.<x>ReplicaSpecs.<type>.template``: PyTorchJob, TFJob, MPIJob,
  XGBoostJob, PaddleJob, JAXJob), the job as controller owner;
* Volcano ``batch.volcano.sh`` Job (``spec.tasks[i].template``);
* JobSet (``spec.replicatedJobs[i].template.spec.template``) and Kubeflow Trainer's
  TrainingRuntime/ClusterTrainingRuntime (the same under ``spec.template``), pods owned by a
  ``batch/v1`` Job;
* KubeRay (``ray.io``) RayCluster (``spec.headGroupSpec.template``,
  ``spec.workerGroupSpecs[i].template``), RayJob (the same under ``spec.rayClusterSpec``, plus
  ``spec.submitterPodTemplate``), RayService (under ``spec.rayClusterConfig``);
* LeaderWorkerSet (``leaderworkerset.x-k8s.io``: ``spec.leaderWorkerTemplate.leaderTemplate``
  and ``.workerTemplate``);
* Kubeflow Notebook (``kubeflow.org``: ``spec.template``; the pod carries the
  ``notebook-name`` label the notebook controller sets, so it is classed ``notebook``);
* ``List`` (its ``items``);
* issue 34, pods built from fields (:class:`Places` says where each part is written back):
  KServe InferenceService (predictor/transformer/explainer; a ``model`` runs the runtime
  KServe selects, :class:`RuntimeCatalog`) and LLMInferenceService, Argo
  Workflow/WorkflowTemplate/ClusterWorkflowTemplate/CronWorkflow (container and script
  templates, ``podSpecPatch``), Katib Experiment (its ``trialSpec``), Spark operator
  SparkApplication, NVIDIA NIMService; and Knative Service/Configuration, AIBrix
  RayClusterFleet, Kubeflow MXJob. The facts each operator puts on its pods are one table,
  :data:`POD_IDENTITY`; the kinds and their sources are listed in docs/workloads.md.

Other kinds have no pod template and are skipped with a note (:func:`skip_reason`); a Kubeflow
``TrainJob`` (``trainer.kubeflow.org/v1alpha1``) embeds none: its pods come from the runtime
its ``spec.runtimeRef`` names.
Shapes: KubeRay ``ray-operator/apis/ray/v1`` (raycluster_types.go, rayjob_types.go,
rayservice_types.go); LWS ``api/leaderworkerset/v1``; Kubeflow notebook-controller
``api/v1/notebook_types.go`` and ``controllers/notebook_controller.go`` (label
``notebook-name``); Kubeflow Trainer ``pkg/apis/trainer/v1alpha1``.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from gpu_admission.core.patch import escape
from gpu_admission.core.vocab import WORKLOAD_LABEL

TEMPLATE_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet",
                            "ReplicationController"})
#: The owner the Job controller puts on every pod of a ``batch/v1`` Job.
BATCH_JOB_OWNER = ("batch/v1", "Job")
#: The label the Kubeflow notebook controller puts on a Notebook's pod.
NOTEBOOK_NAME_LABEL = "notebook-name"
#: Kubeflow training-operator v1 job kinds (``kubeflow.org``, ``spec.<x>ReplicaSpecs``).
KUBEFLOW_TRAINING_KINDS = frozenset({"PyTorchJob", "TFJob", "MPIJob", "XGBoostJob",
                                     "PaddleJob", "JAXJob", "MXJob"})


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """What an operator's controller puts on each pod it creates, so a pod evaluated offline
    carries what the webhook sees online: its controller ownerReference (``True``: the object
    itself; an (apiVersion, kind) pair: an intermediate controller named after the object, e.g.
    the batch/v1 Job a CronJob creates; ``False``: a ReplicaSet/StatefulSet, which classifies
    nothing) and the labels the operator adds (``{name}``: the object's name, ``{replica}``:
    the replica type in lower case, ``{kind}``: the kind in lower case)."""

    owner: bool | tuple[str, str]
    labels: tuple[tuple[str, str], ...] = ()
    source: str = ""

    def pod_labels(self, name: str, kind: str, replica: str = "") -> dict[str, str]:
        return {key: value.format(name=name, kind=kind.lower(), replica=replica.lower())
                for key, value in self.labels}


_TRAINING_LABELS = (("training.kubeflow.org/job-name", "{name}"),
                    ("training.kubeflow.org/operator-name", "{kind}-controller"),
                    ("training.kubeflow.org/replica-type", "{replica}"))

#: One row per operator kind, in one place: (API group, kind) -> the pods' identity. The
#: policy's ``classification`` (trainingOwnerKinds, trainingLabelPrefixes, notebookLabels,
#: batchJobWorkload) then decides these pods offline exactly as online.
POD_IDENTITY: dict[tuple[str, str], PodIdentity] = {
    **{("kubeflow.org", kind): PodIdentity(
        True, _TRAINING_LABELS,
        "kubeflow/training-operator pkg/apis/kubeflow.org/v1 common_types.go (JobNameLabel, "
        "OperatorNameLabel, ReplicaTypeLabel), pkg/controller.v1/common/pod.go (controller "
        "ownerReference)") for kind in KUBEFLOW_TRAINING_KINDS},
    ("kubeflow.org", "Notebook"): PodIdentity(
        True, ((NOTEBOOK_NAME_LABEL, "{name}"),),
        "kubeflow/notebook-controller controllers/notebook_controller.go"),
    ("batch.volcano.sh", "Job"): PodIdentity(
        True, (("volcano.sh/job-name", "{name}"),),
        "volcano pkg/controllers/job/job_controller_util.go (createJobPod)"),
    ("serving.kserve.io", "InferenceService"): PodIdentity(
        False, (("serving.kserve.io/inferenceservice", "{name}"),),
        "kserve pkg/constants/constants.go (InferenceServicePodLabelKey, component label)"),
    ("serving.knative.dev", "Service"): PodIdentity(
        False, (("serving.knative.dev/service", "{name}"),
                ("serving.knative.dev/configuration", "{name}")),
        "knative/serving pkg/apis/serving/register.go (ServiceLabelKey, "
        "ConfigurationLabelKey)"),
    ("argoproj.io", "Workflow"): PodIdentity(
        ("argoproj.io/v1alpha1", "Workflow"), (("workflows.argoproj.io/workflow", "{name}"),),
        "argo-workflows workflow/common/common.go (LabelKeyWorkflow); the controller owns "
        "its pods"),
    ("sparkoperator.k8s.io", "SparkApplication"): PodIdentity(
        False, (("sparkoperator.k8s.io/app-name", "{name}"),),
        "kubeflow/spark-operator pkg/common/spark.go (LabelSparkAppName)"),
}


class WorkloadError(ValueError):
    """An object that cannot be evaluated; the message names the field."""


@dataclass(frozen=True, slots=True)
class PodTemplate:
    """One pod to evaluate: the synthesized Pod and where its template lives in the object."""

    pod: dict[str, Any]
    pointer: str  # RFC 6901 pointer of the template in the object ("" when the object is a Pod)
    field: str  # the same as a dotted field path, for messages ("" for a Pod)
    label: str  # e.g. "PyTorchJob team-a/mnist Worker"
    #: where the pod's parts live when the object embeds no PodTemplateSpec (None: it does)
    places: Places | None = None
    #: what could not be read into the pod (e.g. an Argo podSpecPatch that does not parse)
    notes: tuple[str, ...] = ()
    #: the serving runtime the pod runs, when a platform builds it from one (KServe)
    runtime: str = ""
    #: advice about facts the pod cannot carry (e.g. a RayJob that runs Ray Train)
    hints: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Places:
    """Where an embedded pod's parts live in an object that has no PodTemplateSpec (a KServe
    predictor, an Argo template, a Spark driver/executor, a NIMService), as RFC 6901 pointers,
    so a patched pod can be written back (``evaluate -o yaml``/``-o manifest``). A change to a
    key the place does not have (``spec_keys``/``container_keys``) is not written back."""

    spec: str  # the mapping that holds the pod-level fields (nodeSelector, affinity, ...)
    containers: tuple[str, ...]  # one per pod container, in order ("": nowhere to write)
    init: tuple[str, ...] = ()
    meta: str | None = None  # the mapping that holds the pod's labels/annotations
    spec_keys: frozenset[str] | None = None  # None: any pod-level key
    container_keys: frozenset[str] | None = None  # None: any container key


def _require_dict(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise WorkloadError(f"{field}: expected a mapping, got {type(value).__name__}")
    return value


def check_pod_shape(pod: Any, field: str) -> None:
    """Reject shapes the API server would reject too, naming the field (exit 2 in the CLI)."""
    spec = _require_dict(pod.get("spec") if isinstance(pod, dict) else pod,
                         f"{field}spec" if field else "spec")
    prefix = f"{field}spec" if field else "spec"
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise WorkloadError(f"{prefix}.containers: expected a non-empty list of containers")
    for kind in ("containers", "initContainers"):
        items = spec.get(kind)
        if items is None:
            continue
        if not isinstance(items, list):
            raise WorkloadError(f"{prefix}.{kind}: expected a list")
        for i, container in enumerate(items):
            where = f"{prefix}.{kind}[{i}]"
            _require_dict(container, where)
            resources = container.get("resources")
            if resources is not None:
                _require_dict(resources, f"{where}.resources")
                for key in ("limits", "requests"):
                    if resources.get(key) is not None:
                        _require_dict(resources[key], f"{where}.resources.{key}")
            env = container.get("env")
            if env is not None and not isinstance(env, list):
                raise WorkloadError(f"{where}.env: expected a list")
            if isinstance(env, list):
                for j, entry in enumerate(env):
                    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                        raise WorkloadError(f"{where}.env[{j}]: expected a mapping with a name")
    for key in ("nodeSelector", "affinity"):
        if spec.get(key) is not None:
            _require_dict(spec[key], f"{prefix}.{key}")


def _pod_from_template(obj: dict[str, Any], template: Any, *, pointer: str, field: str,
                       suffix: str, namespace: str, owner: bool | tuple[str, str],
                       labels: dict[str, str] | None = None,
                       scheduler: str | None = None) -> PodTemplate:
    """``owner``: True = the object itself is the pod's controller; an (apiVersion, kind)
    pair = a controller of that kind named after the object (a Job a CronJob creates).
    ``scheduler``: a job-level scheduler the controller writes into a pod whose template names
    none (Volcano's ``spec.schedulerName``, KubeRay's batch scheduler), so the pod evaluated is
    the pod the webhook sees and the template is never given another scheduler."""
    template = _require_dict(template, field)
    meta_in = template.get("metadata") or {}
    meta_in = _require_dict(meta_in, f"{field}.metadata")
    obj_meta = obj.get("metadata") or {}
    name = str(obj_meta.get("name", "")) if isinstance(obj_meta, dict) else ""
    meta: dict[str, Any] = {**meta_in, "namespace": namespace}
    if labels:
        template_labels = meta_in.get("labels")
        meta["labels"] = {**(template_labels if isinstance(template_labels, dict) else {}),
                          **labels}
    meta.setdefault("generateName", f"{name}-{suffix}-" if suffix else f"{name}-")
    if owner:
        api_version, kind = owner if isinstance(owner, tuple) else (
            obj.get("apiVersion", ""), obj.get("kind", ""))
        meta["ownerReferences"] = [{
            "apiVersion": api_version, "kind": kind, "name": name,
            "uid": "", "controller": True, "blockOwnerDeletion": True}]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template.get("spec")}
    check_pod_shape(pod, field + ".")
    if scheduler and not pod["spec"].get("schedulerName"):
        pod["spec"] = {**pod["spec"], "schedulerName": scheduler}
    label = f"{obj.get('kind')} {namespace}/{name}" + (f" {suffix}" if suffix else "")
    return PodTemplate(pod=pod, pointer=pointer, field=field, label=label)


def pod_templates(obj: Any, namespace: str | None = None,
                  catalog: RuntimeCatalog | None = None) -> list[PodTemplate]:
    """Every pod ``obj`` would create, as Pods; ``[]`` for kinds without a pod template.

    ``namespace`` overrides the object's own (``--namespace``); default ``"default"``.
    ``catalog``: the KServe ServingRuntimes/ClusterServingRuntimes read with the object (an
    InferenceService's ``model`` runs one of them, else one of KServe's defaults).
    """
    if not isinstance(obj, dict):
        raise WorkloadError(f"expected a Kubernetes object (a mapping), got "
                            f"{type(obj).__name__}")
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        raise WorkloadError("kind: required field is missing")
    meta = obj.get("metadata") or {}
    meta = _require_dict(meta, "metadata")
    ns = namespace or str(meta.get("namespace") or "default")
    spec = obj.get("spec")
    if kind == "Pod":
        check_pod_shape(obj, "")
        pod = obj
        if pod.get("metadata", {}).get("namespace") != ns:
            pod = {**obj, "metadata": {**meta, "namespace": ns}}
        return [PodTemplate(pod=pod, pointer="", field="",
                            label=f"Pod {ns}/{meta.get('name') or meta.get('generateName', '')}")]
    group = api_group(obj)
    if group == "batch.volcano.sh":
        return _volcano(obj, spec, ns)
    embedded = _EMBEDDED.get((group, kind))
    if embedded is not None:
        return embedded(obj, _require_dict(spec, "spec"), ns, catalog or RuntimeCatalog())
    if kind in TEMPLATE_KINDS and group in ("", "apps", "extensions"):
        spec = _require_dict(spec, "spec")
        # A DaemonSet owns its pods itself (the webhook sees that owner: its pods keep the
        # default scheduler, rules/scheduler.cpu_pod_scheduler); the others' owner is another
        # object (a Deployment's pods belong to a ReplicaSet) and decides nothing.
        return [_pod_from_template(obj, spec.get("template"), pointer="/spec/template",
                                   field="spec.template", suffix="", namespace=ns,
                                   owner=kind == "DaemonSet")]
    if kind == "Job" and group in ("batch", ""):  # "": no apiVersion written
        spec = _require_dict(spec, "spec")
        return [_pod_from_template(obj, spec.get("template"), pointer="/spec/template",
                                   field="spec.template", suffix="", namespace=ns,
                                   owner=BATCH_JOB_OWNER)]
    if kind == "CronJob" and group in ("batch", ""):
        spec = _require_dict(spec, "spec")
        job = _require_dict(spec.get("jobTemplate"), "spec.jobTemplate")
        job_spec = _require_dict(job.get("spec"), "spec.jobTemplate.spec")
        return [_pod_from_template(obj, job_spec.get("template"),
                                   pointer="/spec/jobTemplate/spec/template",
                                   field="spec.jobTemplate.spec.template", suffix="",
                                   namespace=ns, owner=BATCH_JOB_OWNER)]
    if group == "ray.io" and kind in _RAY_CLUSTER_SPEC:
        return _ray(obj, _require_dict(spec, "spec"), ns)
    if group == "orchestration.aibrix.ai" and kind == "RayClusterFleet":
        spec = _require_dict(spec, "spec")
        tpl = _require_dict(spec.get("template"), "spec.template")
        return _ray_cluster(obj, _require_dict(tpl.get("spec"), "spec.template.spec"), ns,
                            "spec.template.spec", "/spec/template/spec",
                            scheduler=_ray_scheduler(tpl.get("metadata")))
    if group == "serving.knative.dev" and kind in ("Service", "Configuration"):
        spec = _require_dict(spec, "spec")
        knative = _pod_from_template(obj, spec.get("template"), pointer="/spec/template",
                                 field="spec.template", suffix="", namespace=ns, owner=False,
                                 labels=POD_IDENTITY[group, "Service"].pod_labels(
                                     str(meta.get("name", "")), kind))
        knative.pod["spec"] = {**knative.pod["spec"], "containers": _knative_names(
            knative.pod["spec"]["containers"], knative.pod["spec"].get("initContainers"))}
        return [knative]
    if group == "leaderworkerset.x-k8s.io" and kind == "LeaderWorkerSet":
        return _lws(obj, _require_dict(spec, "spec"), ns)
    if group == "kubeflow.org" and kind == "Notebook":
        spec = _require_dict(spec, "spec")
        return [_pod_from_template(obj, spec.get("template"), pointer="/spec/template",
                                   field="spec.template", suffix="", namespace=ns, owner=True,
                                   labels={NOTEBOOK_NAME_LABEL: str(meta.get("name", ""))})]
    if group == "trainer.kubeflow.org" and kind in ("TrainingRuntime",
                                                     "ClusterTrainingRuntime"):
        spec = _require_dict(spec, "spec")
        tpl = _require_dict(spec.get("template"), "spec.template")
        return _jobset(obj, _require_dict(tpl.get("spec"), "spec.template.spec"), ns,
                       "/spec/template/spec", "spec.template.spec")
    if not isinstance(spec, dict):
        return []
    if kind == "JobSet":
        return _jobset(obj, spec, ns, "/spec", "spec")
    out: list[PodTemplate] = []
    identity = POD_IDENTITY.get((group, kind))
    for key, value in spec.items():
        if isinstance(key, str) and key.endswith("ReplicaSpecs"):  # Kubeflow training jobs
            replicas = _require_dict(value, f"spec.{key}")
            for rtype, raw in replicas.items():
                field = f"spec.{key}.{rtype}"
                rspec = _require_dict(raw, field)
                out.append(_pod_from_template(
                    obj, rspec.get("template"),
                    pointer=f"/spec/{escape(key)}/{escape(str(rtype))}/template",
                    field=f"{field}.template", suffix=str(rtype), namespace=ns, owner=True,
                    labels=identity.pod_labels(str(meta.get("name", "")), kind, str(rtype))
                    if identity is not None else None))
    return out


def _knative_names(containers: list[Any], init: Any) -> list[Any]:
    """Knative's defaulting of unnamed containers (knative/serving pkg/apis/serving/v1
    revision_defaults.go ``applyDefaultContainerNames``): ``user-container`` when it is the
    only one, else ``user-container-<n>`` with n counting up from 0 past names in use."""
    used = {c.get("name") for c in [*containers, *(init if isinstance(init, list) else ())]
            if isinstance(c, dict)}
    out, suffix = [], 0
    for c in containers:
        if not isinstance(c, dict) or c.get("name"):
            out.append(c)
            continue
        name = "user-container"
        if len(containers) > 1 or name in used:
            while True:
                name = f"user-container-{suffix}"
                suffix += 1
                if name not in used:
                    break
        out.append({**c, "name": name})
    return out


def api_group(obj: dict[str, Any]) -> str:
    """The API group of ``obj`` ("" for the core group: ``apiVersion: v1``)."""
    api_version = obj.get("apiVersion")
    if not isinstance(api_version, str) or "/" not in api_version:
        return ""
    return api_version.split("/", 1)[0]


def skip_reason(obj: Any) -> str:
    """Why ``obj`` has no pod to evaluate, beyond "no pod template" ("" when nothing more is
    known), for the per-object note on stderr."""
    if not isinstance(obj, dict):
        return ""
    if obj.get("kind") == "TrainJob" and api_group(obj) == "trainer.kubeflow.org":
        return ("TrainJob embeds no pod template (trainer.kubeflow.org/v1alpha1): its pods "
                "come from the TrainingRuntime/ClusterTrainingRuntime named in "
                "spec.runtimeRef; evaluate that runtime's file")
    return ""


VOLCANO_SCHEDULER = "volcano"


def _volcano(obj: dict[str, Any], spec: Any, ns: str) -> list[PodTemplate]:
    """Volcano ``batch.volcano.sh`` Job: ``spec.tasks[i].template`` (the job owns its pods)."""
    if obj.get("kind") != "Job":
        return []
    spec = _require_dict(spec, "spec")
    tasks = spec.get("tasks")
    if not isinstance(tasks, list):
        raise WorkloadError("spec.tasks: expected a list of tasks")
    out: list[PodTemplate] = []
    # The job's scheduler goes into every pod whose template names none (createJobPod); the
    # job's own defaults to "volcano" (Volcano's job admission webhook, --scheduler-name).
    scheduler = spec.get("schedulerName") or VOLCANO_SCHEDULER
    name = str((obj.get("metadata") or {}).get("name", ""))
    for i, raw in enumerate(tasks):
        task = _require_dict(raw, f"spec.tasks[{i}]")
        out.append(_pod_from_template(obj, task.get("template"),
                                      pointer=f"/spec/tasks/{i}/template",
                                      field=f"spec.tasks[{i}].template",
                                      suffix=str(task.get("name", i)), namespace=ns,
                                      owner=True, scheduler=str(scheduler),
                                      labels=POD_IDENTITY["batch.volcano.sh", "Job"]
                                      .pod_labels(name, "Job")))
    return out


def _jobset(obj: dict[str, Any], spec: dict[str, Any], ns: str, pointer: str,
            field: str) -> list[PodTemplate]:
    """``<spec>.replicatedJobs[i].template.spec.template``: pods owned by a batch/v1 Job."""
    out: list[PodTemplate] = []
    jobs = spec.get("replicatedJobs")
    if not isinstance(jobs, list):
        raise WorkloadError(f"{field}.replicatedJobs: expected a list")
    for i, raw in enumerate(jobs):
        at = f"{field}.replicatedJobs[{i}].template"
        rjob = _require_dict(raw, f"{field}.replicatedJobs[{i}]")
        job = _require_dict(rjob.get("template"), at)
        job_spec = _require_dict(job.get("spec"), f"{at}.spec")
        out.append(_pod_from_template(
            obj, job_spec.get("template"),
            pointer=f"{pointer}/replicatedJobs/{i}/template/spec/template",
            field=f"{at}.spec.template", suffix=str(rjob.get("name", i)), namespace=ns,
            owner=BATCH_JOB_OWNER))
    return out


#: Where a KubeRay kind keeps its RayClusterSpec (RayCluster: the spec itself).
_RAY_CLUSTER_SPEC = {"RayCluster": "", "RayJob": "rayClusterSpec",
                     "RayService": "rayClusterConfig"}


def _ray(obj: dict[str, Any], spec: dict[str, Any], ns: str) -> list[PodTemplate]:
    """KubeRay: the head group and every worker group of the RayClusterSpec (pods owned by the
    RayCluster the operator creates), and a RayJob's submitter pod template."""
    key = _RAY_CLUSTER_SPEC[str(obj["kind"])]
    base, pointer = (f"spec.{key}", f"/spec/{key}") if key else ("spec", "/spec")
    cluster = spec.get(key) if key else spec
    out: list[PodTemplate] = []
    if cluster is not None:  # a RayJob may use an existing cluster (clusterSelector)
        out = _ray_cluster(obj, _require_dict(cluster, base), ns, base, pointer,
                           scheduler=_ray_scheduler(obj.get("metadata")))
    if obj["kind"] == "RayJob" and _RAY_TRAIN.search(str(spec.get("entrypoint", ""))):
        out = [_ray_train_hint(t) for t in out]
    if obj["kind"] == "RayJob" and spec.get("submitterPodTemplate") is not None:
        out.append(_pod_from_template(obj, spec["submitterPodTemplate"],
                                      pointer="/spec/submitterPodTemplate",
                                      field="spec.submitterPodTemplate", suffix="submitter",
                                      namespace=ns, owner=BATCH_JOB_OWNER))
    return out


#: A RayJob entrypoint that runs Ray Train (``ray.train`` trainers, a ``*train*.py`` script).
_RAY_TRAIN = re.compile(r"ray[._]train|\b(?:Torch|TensorFlow|Tensorflow|XGBoost|LightGBM|"
                        r"Horovod|Lightning|Transformers)Trainer\b|[\w/-]*train[\w-]*\.py\b")


def _ray_train_hint(tpl: PodTemplate) -> PodTemplate:
    """A RayJob that trains: its GPU templates should say so, because KubeRay puts the
    RayJob's labels on the RayCluster, never on pods (``common/pod.go`` ``labelPod``)."""
    labels = tpl.pod.get("metadata", {}).get("labels") or {}
    containers = tpl.pod["spec"].get("containers") or []
    gpu = any(str(name).startswith("nvidia.com/") for c in containers if isinstance(c, dict)
              for name in ((c.get("resources") or {}).get("limits") or {}))
    if labels.get(WORKLOAD_LABEL) is not None or not gpu:
        return tpl
    hint = (f"the RayJob's entrypoint runs Ray Train, but {tpl.field} has no "
            f"{WORKLOAD_LABEL} label: KubeRay never puts the RayJob's labels on pods, so "
            f"the webhook cannot tell; label the template {WORKLOAD_LABEL}: training")
    return dataclasses.replace(tpl, hints=(*tpl.hints, hint))


#: KubeRay's batch-scheduler label on a RayCluster/RayJob and the ``schedulerName`` its
#: scheduler plugins write into every pod (ray-operator/controllers/ray/batchscheduler:
#: volcano, yunikorn, kai-scheduler ``AddMetadataToChildResource``).
RAY_SCHEDULER_LABEL = "ray.io/scheduler-name"
_RAY_SCHEDULERS = frozenset({"volcano", "yunikorn", "kai-scheduler"})


def _ray_scheduler(meta: Any) -> str | None:
    labels = meta.get("labels") if isinstance(meta, dict) else None
    value = labels.get(RAY_SCHEDULER_LABEL) if isinstance(labels, dict) else None
    return value if value in _RAY_SCHEDULERS else None


def _ray_cluster(obj: dict[str, Any], cluster: dict[str, Any], ns: str, base: str,
                 pointer: str, *, scheduler: str | None) -> list[PodTemplate]:
    """The head group and every worker group of a RayClusterSpec at ``base``."""
    out: list[PodTemplate] = []
    owner = ("ray.io/v1", "RayCluster")
    head = cluster.get("headGroupSpec")
    if head is not None:
        head = _require_dict(head, f"{base}.headGroupSpec")
        out.append(_pod_from_template(obj, head.get("template"),
                                      pointer=f"{pointer}/headGroupSpec/template",
                                      field=f"{base}.headGroupSpec.template",
                                      suffix="head", namespace=ns, owner=owner,
                                      scheduler=scheduler))
    groups = cluster.get("workerGroupSpecs") or []
    if not isinstance(groups, list):
        raise WorkloadError(f"{base}.workerGroupSpecs: expected a list")
    for i, raw in enumerate(groups):
        group = _require_dict(raw, f"{base}.workerGroupSpecs[{i}]")
        out.append(_pod_from_template(
            obj, group.get("template"), pointer=f"{pointer}/workerGroupSpecs/{i}/template",
            field=f"{base}.workerGroupSpecs[{i}].template",
            suffix=str(group.get("groupName", i)), namespace=ns, owner=owner,
            scheduler=scheduler))
    return out


def _lws(obj: dict[str, Any], spec: dict[str, Any], ns: str) -> list[PodTemplate]:
    """LeaderWorkerSet: the leader template (optional: the worker template is used for the
    leader when absent) and the worker template, pods owned by StatefulSets."""
    lwt = _require_dict(spec.get("leaderWorkerTemplate"), "spec.leaderWorkerTemplate")
    out: list[PodTemplate] = []
    for key, suffix in (("leaderTemplate", "leader"), ("workerTemplate", "worker")):
        if key == "leaderTemplate" and lwt.get(key) is None:
            continue
        out.append(_pod_from_template(obj, lwt.get(key),
                                      pointer=f"/spec/leaderWorkerTemplate/{key}",
                                      field=f"spec.leaderWorkerTemplate.{key}", suffix=suffix,
                                      namespace=ns, owner=False))
    return out


def expand_lists(doc: Any) -> Iterator[Any]:
    """``kind: List`` (``kubectl get -o yaml``) -> its items; anything else -> itself."""
    if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
        yield from doc["items"]
    else:
        yield doc


def _node(root: Any, pointer: str, create: bool = False) -> Any:
    """The value at an RFC 6901 ``pointer`` in ``root``; missing mappings made on the way
    when ``create``."""
    node = root
    for token in pointer.split("/")[1:]:
        key = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list):
            node = node[int(key)]
        else:
            if create and node.get(key) is None:
                node[key] = {}
            node = node[key]
    return node


def with_mutated_template(obj: dict[str, Any], template: PodTemplate,
                          mutated_pod: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` whose pod template carries what the patch changed in
    ``mutated_pod``: the pod fields that differ from the evaluated pod (so what the evaluation
    only assumed, such as a Volcano job's scheduler, is never written into the template) and
    our annotations. Objects without a PodTemplateSpec get each change at its place
    (:class:`Places`); a change with no place there is left out."""
    if not template.pointer and template.places is None:
        return mutated_pod
    out = copy.deepcopy(obj)
    old_spec = template.pod.get("spec") or {}
    new_spec = mutated_pod.get("spec") or {}
    annotations = mutated_pod.get("metadata", {}).get("annotations")
    places = template.places
    if places is None:
        node = _node(out, template.pointer)
        for key, value in new_spec.items():
            if old_spec.get(key) != value:
                node["spec"][key] = value
        if annotations:
            node.setdefault("metadata", {})["annotations"] = annotations
        return out
    for kind, where in (("containers", places.containers), ("initContainers", places.init)):
        old_items, new_items = old_spec.get(kind) or [], new_spec.get(kind) or []
        for i, ptr in enumerate(where):
            if not ptr or i >= len(new_items) or i >= len(old_items):
                continue
            target = _node(out, ptr)
            for key, value in new_items[i].items():
                if old_items[i].get(key) == value or (
                        places.container_keys is not None and key not in places.container_keys):
                    continue
                if key == "env" and isinstance(value, list):
                    # only the variables the patch set, upserted by name: the place may hold
                    # part of the container's env (a KServe model over its runtime's)
                    before = {e.get("name"): e for e in old_items[i].get("env") or ()
                              if isinstance(e, dict)}
                    changed = [e for e in value if isinstance(e, dict)
                               and before.get(e.get("name")) != e]
                    target["env"] = _merge_env(list(target.get("env") or []), changed)
                else:
                    target[key] = value
    target = _node(out, places.spec)
    for key, value in new_spec.items():
        if key not in ("containers", "initContainers") and old_spec.get(key) != value and (
                places.spec_keys is None or key in places.spec_keys):
            target[key] = value
    if annotations and places.meta is not None:
        old = template.pod.get("metadata", {}).get("annotations") or {}
        added = {k: v for k, v in annotations.items() if old.get(k) != v}
        if added:
            meta = _node(out, places.meta, create=True)
            meta["annotations"] = {**(meta.get("annotations") or {}), **added}
    return out


# --- pods embedded without a PodTemplateSpec ------------------------------------------------

def _embedded_pod(obj: dict[str, Any], ns: str, *, spec: dict[str, Any], field: str,
                  suffix: str, places: Places, labels: dict[str, str] | None = None,
                  annotations: Any = None, owner: bool | tuple[str, str] = False,
                  notes: tuple[str, ...] = (), runtime: str = "") -> PodTemplate:
    """A pod built from an object's fields (``spec`` already the pod spec), with its places."""
    obj_meta = obj.get("metadata") or {}
    name = str(obj_meta.get("name", "")) if isinstance(obj_meta, dict) else ""
    meta: dict[str, Any] = {"namespace": ns,
                            "generateName": f"{name}-{suffix}-" if suffix else f"{name}-"}
    if labels:
        meta["labels"] = dict(labels)
    if isinstance(annotations, dict) and annotations:
        meta["annotations"] = dict(annotations)
    if owner:
        api_version, kind = owner if isinstance(owner, tuple) else (
            obj.get("apiVersion", ""), obj.get("kind", ""))
        meta["ownerReferences"] = [{"apiVersion": api_version, "kind": kind, "name": name,
                                    "uid": "", "controller": True, "blockOwnerDeletion": True}]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    check_pod_shape(pod, field + ".")
    label = f"{obj.get('kind')} {ns}/{name}" + (f" {suffix}" if suffix else "")
    return PodTemplate(pod=pod, pointer="", field=field, label=label, places=places,
                       notes=notes, runtime=runtime)


def _str_labels(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _list_at(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise WorkloadError(f"{field}: expected a list")
    return value


#: Pod-level fields (corev1.PodSpec) a platform object may carry inline beside its own.
POD_FIELDS = frozenset({
    "activeDeadlineSeconds", "affinity", "automountServiceAccountToken", "dnsConfig",
    "dnsPolicy", "enableServiceLinks", "ephemeralContainers", "hostAliases", "hostIPC",
    "hostNetwork", "hostPID", "hostUsers", "hostname", "imagePullSecrets", "initContainers",
    "nodeName", "nodeSelector", "os", "overhead", "preemptionPolicy", "priority",
    "priorityClassName", "readinessGates", "resourceClaims", "resources", "restartPolicy",
    "runtimeClassName", "schedulerName", "schedulingGates", "securityContext",
    "serviceAccount", "serviceAccountName", "setHostnameAsFQDN", "shareProcessNamespace",
    "subdomain", "terminationGracePeriodSeconds", "tolerations", "topologySpreadConstraints",
    "volumes", "containers"})


# --- KServe ------------------------------------------------------------------------------------

KSERVE_CONTAINER = "kserve-container"
#: KServe's predictor framework fields (PredictorSpec, v1beta1/predictor.go): each is a model
#: of that format (``pytorch`` = modelFormat pytorch ...).
KSERVE_FRAMEWORKS = ("sklearn", "xgboost", "tensorflow", "pytorch", "triton", "onnx",
                     "huggingface", "pmml", "lightgbm", "paddle")
_KSERVE_COMPONENTS = ("predictor", "transformer", "explainer")
#: ModelSpec keys that are not container fields (v1beta1/predictor_model.go, predictor.go).
_MODEL_ONLY = frozenset({"modelFormat", "runtime", "storageUri", "storage",
                         "protocolVersion", "runtimeVersion"})
_PROTOCOL_RANK = {"v1": 1, "v2": 2, "grpc-v1": 3, "grpc-v2": 4}


@dataclass(frozen=True, slots=True)
class Runtime:
    """A KServe ServingRuntime/ClusterServingRuntime: what an InferenceService model runs."""

    name: str
    kind: str  # "ServingRuntime" | "ClusterServingRuntime" | "built-in"
    namespace: str  # "" for cluster-scoped
    spec: dict[str, Any]

    def formats(self) -> list[dict[str, Any]]:
        found = self.spec.get("supportedModelFormats")
        return [f for f in found if isinstance(f, dict)] if isinstance(found, list) else []

    def supports(self, name: str, version: str | None, named: bool) -> bool:
        """KServe ``RuntimeSupportsModel``: the format (and version, when the model gives one)
        among the runtime's formats that auto-select (any format when the model names it)."""
        for f in self.formats():
            if not named and f.get("autoSelect") is not True:
                continue
            if f.get("name") == name and (version is None or str(f.get("version")) == version):
                return True
        return False

    def priority(self, name: str) -> int | None:
        for f in self.formats():
            if f.get("name") == name and isinstance(f.get("priority"), int):
                return int(f["priority"])
        return None

    def protocol_ok(self, protocol: str) -> bool:
        found = self.spec.get("protocolVersions")
        return not found or protocol in found

    def protocol_rank(self) -> int:
        found = self.spec.get("protocolVersions")
        ranks = [_PROTOCOL_RANK.get(str(p), 0) for p in found] if found else []
        return min(ranks) if ranks else 0

    def describe(self) -> str:
        where = ("KServe's default ClusterServingRuntime" if self.kind == "built-in"
                 else f"{self.kind} " + (f"{self.namespace}/" if self.namespace else ""))
        image = next((c.get("image") for c in self.spec.get("containers") or ()
                      if isinstance(c, dict)), None)
        name = self.name if self.kind == "built-in" else ""
        return (f"{where} {name}".rstrip() if self.kind == "built-in" else where + self.name) + (
            f" (image {image})" if image else "")


def _builtin_runtimes() -> tuple[Runtime, ...]:
    text = (resources.files("gpu_admission") / "data" / "kserve-runtimes.yaml").read_text(
        "utf-8")
    out = []
    for row in (yaml.safe_load(text) or {}).get("runtimes", ()):
        formats = [{"name": n, "version": v, "autoSelect": a, "priority": p}
                   for n, v, a, p in row["formats"]]
        out.append(Runtime(row["name"], "built-in", "", {
            "supportedModelFormats": formats, "protocolVersions": row["protocolVersions"],
            "containers": [{"name": KSERVE_CONTAINER, "image": row["image"]}]}))
    return tuple(out)


_BUILTIN: list[tuple[Runtime, ...]] = []


class RuntimeCatalog:
    """The ServingRuntimes/ClusterServingRuntimes of one ``evaluate`` run, then KServe's
    defaults (``data/kserve-runtimes.yaml``)."""

    def __init__(self) -> None:
        self.namespaced: list[Runtime] = []
        self.cluster: list[Runtime] = []

    @staticmethod
    def is_runtime(obj: Any) -> bool:
        """A ServingRuntime/ClusterServingRuntime: no pod of its own (its containers get
        their GPUs from the models that run on it), read for the InferenceServices."""
        return isinstance(obj, dict) and api_group(obj) == "serving.kserve.io" and obj.get(
            "kind") in ("ServingRuntime", "ClusterServingRuntime")

    def add(self, obj: Any, namespace: str | None = None) -> None:
        if not isinstance(obj, dict) or api_group(obj) != "serving.kserve.io":
            return
        meta = obj.get("metadata") or {}
        spec = obj.get("spec")
        if not isinstance(meta, dict) or not isinstance(spec, dict):
            return
        name = str(meta.get("name", ""))
        if obj.get("kind") == "ServingRuntime":
            ns = namespace or str(meta.get("namespace") or "default")
            self.namespaced.append(Runtime(name, "ServingRuntime", ns, spec))
        elif obj.get("kind") == "ClusterServingRuntime":
            self.cluster.append(Runtime(name, "ClusterServingRuntime", "", spec))

    @staticmethod
    def builtin() -> tuple[Runtime, ...]:
        if not _BUILTIN:
            _BUILTIN.append(_builtin_runtimes())
        return _BUILTIN[0]

    def select(self, model: dict[str, Any], ns: str) -> Runtime | None:
        """KServe ``GetSupportingRuntimes`` then the first: the named runtime, else the
        namespace's runtimes before the cluster's, each list by format priority (highest
        first, unset last), then protocol, then name; disabled and multi-model runtimes are
        never chosen. Cluster runtimes in the files replace KServe's defaults."""
        fmt = model.get("modelFormat")
        fmt = fmt if isinstance(fmt, dict) else {}
        name = str(fmt.get("name", ""))
        version = str(fmt["version"]) if fmt.get("version") is not None else None
        named = model.get("runtime")
        protocol = str(model.get("protocolVersion") or "v1")
        cluster = self.cluster or list(self.builtin())
        pools = [[r for r in self.namespaced if r.namespace == ns], cluster]
        for pool in pools:
            if isinstance(named, str) and named:
                hit = [r for r in pool if r.name == named]
                if hit:
                    return hit[0]
                continue
            fits = [r for r in pool if r.spec.get("disabled") is not True
                    and r.spec.get("multiModel") is not True
                    and r.supports(name, version, False) and r.protocol_ok(protocol)]
            fits.sort(key=lambda r: (r.priority(name) is None, -(r.priority(name) or 0),
                                     r.protocol_rank(), r.name))
            if fits:
                return fits[0]
        return None


def _merge_env(base: list[Any], over: list[Any]) -> list[Any]:
    names = {e.get("name") for e in over if isinstance(e, dict)}
    return [e for e in base if not (isinstance(e, dict) and e.get("name") in names)] + over


def _kserve_model(model: dict[str, Any], runtime: Runtime | None,
                  fmt_name: str) -> tuple[list[Any], dict[str, Any], str]:
    """(containers, runtime pod fields, runtime description): the runtime's containers with
    the model's container fields merged into ``kserve-container`` (KServe
    ``MergeRuntimeContainers``: the model's fields win, env merged by name)."""
    own = {k: v for k, v in model.items() if k not in _MODEL_ONLY}
    if runtime is None:
        return [{"name": KSERVE_CONTAINER, **own}], {}, (
            f"no ServingRuntime supports model format {fmt_name!r}: the pod's image is unknown "
            "(add the runtime's file)")
    containers = copy.deepcopy([c for c in runtime.spec.get("containers") or ()
                                if isinstance(c, dict)])
    main = next((c for c in containers if c.get("name") == KSERVE_CONTAINER),
                containers[0] if containers else None)
    if main is None:
        main = {"name": KSERVE_CONTAINER}
        containers.append(main)
    for key, value in own.items():
        if key == "env" and isinstance(value, list):
            main["env"] = _merge_env(list(main.get("env") or []), value)
        else:
            main[key] = value
    pod_fields = {k: copy.deepcopy(v) for k, v in runtime.spec.items()
                  if k in POD_FIELDS and k != "containers"}
    return containers, pod_fields, runtime.describe()


def _inference_service(obj: dict[str, Any], spec: dict[str, Any], ns: str,
                       catalog: RuntimeCatalog) -> list[PodTemplate]:
    """KServe InferenceService (serving.kserve.io/v1beta1): one pod per component
    (predictor, transformer, explainer). A component is a PodSpec inline (its ``containers``
    shorthand) plus, for the predictor, a ``model`` (or a framework field) that runs on the
    runtime KServe selects. Pods carry ``serving.kserve.io/inferenceservice`` and
    ``component`` and the component's ``labels``/``annotations``."""
    name = str((obj.get("metadata") or {}).get("name", ""))
    identity = POD_IDENTITY["serving.kserve.io", "InferenceService"]
    out: list[PodTemplate] = []
    for comp in _KSERVE_COMPONENTS:
        raw = spec.get(comp)
        if raw is None:
            continue
        field, ptr = f"spec.{comp}", f"/spec/{comp}"
        body = _require_dict(raw, field)
        pod_spec: dict[str, Any] = {k: v for k, v in body.items()
                                    if k in POD_FIELDS and k != "containers"}
        containers = list(_list_at(body.get("containers"), f"{field}.containers"))
        places_c = [f"{ptr}/containers/{i}" for i in range(len(containers))]
        model_key = "model" if isinstance(body.get("model"), dict) else next(
            (k for k in KSERVE_FRAMEWORKS if isinstance(body.get(k), dict)), None)
        runtime_text = ""
        if model_key is not None:
            model = dict(body[model_key])
            if model_key != "model":
                model.setdefault("modelFormat", {"name": model_key})
            fmt = model.get("modelFormat")
            fmt_name = str(fmt.get("name", "")) if isinstance(fmt, dict) else ""
            runtime = catalog.select(model, ns)
            built, runtime_fields, runtime_text = _kserve_model(model, runtime, fmt_name)
            # the model's container first (KServe puts kserve-container first), then any
            # runtime sidecars (nowhere to write them back) and the shorthand's containers
            main = next(i for i, c in enumerate(built) if c.get("name") == KSERVE_CONTAINER)
            ordered = [built[main]] + [c for i, c in enumerate(built) if i != main]
            places_c = [f"{ptr}/{model_key}"] + [""] * (len(ordered) - 1) + places_c
            containers = ordered + containers
            pod_spec = {**runtime_fields, **pod_spec}
        if not containers:
            if comp == "predictor":
                raise WorkloadError(f"{field}: expected a model or containers")
            continue  # e.g. an ``art`` explainer: KServe's configured image, no GPU asked
        pod_spec["containers"] = containers
        labels = {**_str_labels(body.get("labels")), **identity.pod_labels(name, "")}
        labels["component"] = comp
        init = _list_at(pod_spec.get("initContainers"), f"{field}.initContainers")
        places = Places(spec=ptr, containers=tuple(places_c),
                        init=tuple(f"{ptr}/initContainers/{i}" for i in range(len(init))),
                        meta=ptr)
        out.append(_embedded_pod(obj, ns, spec=pod_spec, field=field, suffix=comp,
                                 places=places, labels=labels,
                                 annotations=body.get("annotations"), runtime=runtime_text))
    return out


def _llm_inference_service(obj: dict[str, Any], spec: dict[str, Any], ns: str,
                           catalog: RuntimeCatalog) -> list[PodTemplate]:
    """KServe LLMInferenceService (serving.kserve.io/v1alpha1,
    llm_inference_service_types.go): ``spec.template`` and ``spec.worker`` (PodSpecs: the
    decode/leader pods and multi-node workers), the same under ``spec.prefill``."""
    out: list[PodTemplate] = []
    prefill = spec.get("prefill")
    parts: list[tuple[str, Any]] = [("template", spec.get("template")),
                                    ("worker", spec.get("worker"))]
    if isinstance(prefill, dict):
        parts += [("prefill/template", prefill.get("template")),
                  ("prefill/worker", prefill.get("worker"))]
    for key, raw in parts:
        if raw is None:
            continue
        field, ptr = "spec." + key.replace("/", "."), "/spec/" + key
        pod_spec = _require_dict(raw, field)
        n = len(_list_at(pod_spec.get("containers"), f"{field}.containers"))
        init = _list_at(pod_spec.get("initContainers"), f"{field}.initContainers")
        places = Places(spec=ptr, containers=tuple(f"{ptr}/containers/{i}" for i in range(n)),
                        init=tuple(f"{ptr}/initContainers/{i}" for i in range(len(init))))
        out.append(_embedded_pod(obj, ns, spec=pod_spec, field=field,
                                 suffix=key.replace("/", "-"), places=places))
    return out


# --- Argo Workflows ------------------------------------------------------------------------

ARGO_MAIN = "main"
_ARGO_POD_KEYS = frozenset({"nodeSelector", "affinity", "tolerations", "schedulerName",
                            "priorityClassName", "securityContext", "serviceAccountName",
                            "hostAliases", "activeDeadlineSeconds"})


def _strategic_merge(spec: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A pod spec with a strategic-merge patch applied, for the fields that matter here:
    containers merged by name (their ``resources``/``env`` merged), other keys replaced."""
    out = copy.deepcopy(spec)
    for key, value in patch.items():
        if key in ("containers", "initContainers") and isinstance(value, list):
            items = out.setdefault(key, [])
            for c in value:
                if not isinstance(c, dict):
                    continue
                hit = next((x for x in items if x.get("name") == c.get("name")), None)
                if hit is None:
                    items.append(copy.deepcopy(c))
                    continue
                for ck, cv in c.items():
                    if ck == "resources" and isinstance(cv, dict) and isinstance(
                            hit.get("resources"), dict):
                        for rk, rv in cv.items():
                            base = hit["resources"].get(rk)
                            hit["resources"][rk] = ({**base, **rv} if isinstance(base, dict)
                                                    and isinstance(rv, dict) else rv)
                    elif ck == "env" and isinstance(cv, list):
                        hit["env"] = _merge_env(list(hit.get("env") or []), cv)
                    else:
                        hit[ck] = copy.deepcopy(cv)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = copy.deepcopy(value)
    return out


def _pod_spec_patch(text: Any, where: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the parsed ``podSpecPatch``, or a note saying why it is not read)."""
    if not isinstance(text, str):
        return None, f"{where}: podSpecPatch is not a string: not read"
    if "{{" in text:
        return None, (f"{where}: podSpecPatch uses Argo parameters ({{{{...}}}}), resolved "
                      "only when the workflow runs: not read")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return None, f"{where}: podSpecPatch is not valid YAML/JSON: not read"
    if not isinstance(value, dict):
        return None, f"{where}: podSpecPatch is not a mapping: not read"
    return value, None


def _argo_spec(obj: dict[str, Any], spec: dict[str, Any], ns: str,
               catalog: RuntimeCatalog) -> list[PodTemplate]:
    if obj.get("kind") == "CronWorkflow":
        return _argo(obj, _require_dict(spec.get("workflowSpec"), "spec.workflowSpec"), ns,
                     "spec.workflowSpec", "/spec/workflowSpec")
    return _argo(obj, spec, ns, "spec", "/spec")


def _argo(obj: dict[str, Any], wf: dict[str, Any], ns: str, base: str,
          ptr: str) -> list[PodTemplate]:
    """Argo Workflow/WorkflowTemplate/ClusterWorkflowTemplate/CronWorkflow
    (argoproj.io/v1alpha1, pkg/apis/workflow/v1alpha1/workflow_types.go): one pod per
    ``container`` or ``script`` template, the way the controller builds it
    (workflow/controller/workflowpod.go): the ``main`` container (a script's ``source`` runs
    in it) plus ``sidecars`` and ``initContainers``; node selector, affinity, tolerations and
    scheduler from the template, else the workflow; labels/annotations from the workflow's
    ``podMetadata`` and the template's ``metadata``; the template's, else the workflow's,
    ``podSpecPatch`` applied when it parses. Argo's own ``wait``/``init`` containers are not
    added (no GPU)."""
    name = str((obj.get("metadata") or {}).get("name", ""))
    identity = POD_IDENTITY["argoproj.io", "Workflow"]
    pod_meta: dict[str, Any] = (wf["podMetadata"] if isinstance(wf.get("podMetadata"), dict)
                                else {})
    out: list[PodTemplate] = []
    for i, raw in enumerate(_list_at(wf.get("templates"), f"{base}.templates")):
        field, tptr = f"{base}.templates[{i}]", f"{ptr}/templates/{i}"
        tpl = _require_dict(raw, field)
        kind = "container" if isinstance(tpl.get("container"), dict) else (
            "script" if isinstance(tpl.get("script"), dict) else None)
        if kind is None:
            continue  # steps, dag, resource, suspend, http, containerSet: no pod of its own
        main = {"name": ARGO_MAIN, **_require_dict(tpl[kind], f"{field}.{kind}")}
        sidecars = _list_at(tpl.get("sidecars"), f"{field}.sidecars")
        init = _list_at(tpl.get("initContainers"), f"{field}.initContainers")
        pod_spec: dict[str, Any] = {"containers": [main, *sidecars]}
        if init:
            pod_spec["initContainers"] = list(init)
        for key in _ARGO_POD_KEYS:
            value = tpl.get(key, wf.get(key))
            if value is not None:
                pod_spec[key] = value
        volumes = [*_list_at(wf.get("volumes"), f"{base}.volumes"),
                   *_list_at(tpl.get("volumes"), f"{field}.volumes")]
        if volumes:
            pod_spec["volumes"] = volumes
        notes: list[str] = []
        patch_text = tpl.get("podSpecPatch", wf.get("podSpecPatch"))
        if patch_text is not None:
            where = f"{field}.podSpecPatch" if "podSpecPatch" in tpl else f"{base}.podSpecPatch"
            patch, note = _pod_spec_patch(patch_text, where)
            if patch is not None:
                pod_spec = _strategic_merge(pod_spec, patch)
            elif note:
                notes.append(note)
        tmeta: dict[str, Any] = tpl["metadata"] if isinstance(tpl.get("metadata"), dict) else {}
        labels = {**_str_labels(pod_meta.get("labels")), **_str_labels(tmeta.get("labels")),
                  **identity.pod_labels(name, "Workflow")}
        annotations = {**_str_labels(pod_meta.get("annotations")),
                       **_str_labels(tmeta.get("annotations"))}
        places = Places(
            spec=tptr, containers=(f"{tptr}/{kind}",
                                   *(f"{tptr}/sidecars/{j}" for j in range(len(sidecars)))),
            init=tuple(f"{tptr}/initContainers/{j}" for j in range(len(init))),
            meta=f"{tptr}/metadata", spec_keys=_ARGO_POD_KEYS)
        out.append(_embedded_pod(obj, ns, spec=pod_spec, field=field,
                                 suffix=str(tpl.get("name", i)), places=places, labels=labels,
                                 annotations=annotations, owner=identity.owner,
                                 notes=tuple(notes)))
    return out


# --- Katib, Spark, NIM -----------------------------------------------------------------------

def _katib_experiment(obj: dict[str, Any], spec: dict[str, Any], ns: str,
                      catalog: RuntimeCatalog) -> list[PodTemplate]:
    """Katib Experiment (kubeflow.org/v1beta1, experiment_types.go): each trial creates the
    object in ``spec.trialTemplate.trialSpec`` (a batch/v1 Job, a training-operator job, ...),
    whose pods are read as that object's (named after the experiment; Katib names the trial).
    A trial template kept in a ConfigMap (``trialTemplate.configMap``) is not in the file."""
    trial = spec.get("trialTemplate")
    trial = _require_dict(trial, "spec.trialTemplate")
    inner = trial.get("trialSpec")
    if inner is None:
        return []
    inner = _require_dict(inner, "spec.trialTemplate.trialSpec")
    name = str((obj.get("metadata") or {}).get("name", ""))
    named = {**inner, "metadata": {**(inner.get("metadata") or {}), "name": name,
                                   "namespace": ns}}
    out = []
    for tpl in pod_templates(named, ns, catalog):
        places = tpl.places
        if places is not None:
            pre = "/spec/trialTemplate/trialSpec"
            places = Places(spec=pre + places.spec,
                            containers=tuple(pre + c if c else "" for c in places.containers),
                            init=tuple(pre + c for c in places.init),
                            meta=pre + places.meta if places.meta is not None else None,
                            spec_keys=places.spec_keys, container_keys=places.container_keys)
        out.append(PodTemplate(
            pod=tpl.pod, pointer="/spec/trialTemplate/trialSpec" + tpl.pointer,
            field="spec.trialTemplate.trialSpec" + ("." + tpl.field if tpl.field else ""),
            label=f"Experiment {ns}/{name} trial {tpl.label}", places=places,
            notes=tpl.notes, runtime=tpl.runtime))
    return out


_SPARK_POD_KEYS = frozenset({"nodeSelector", "affinity", "tolerations", "schedulerName"})


def _spark(obj: dict[str, Any], spec: dict[str, Any], ns: str,
           catalog: RuntimeCatalog) -> list[PodTemplate]:
    """Spark operator SparkApplication (sparkoperator.k8s.io/v1beta2,
    sparkapplication_types.go): the driver and the executors (SparkPodSpec: ``image`` or the
    application's, ``gpu: {name, quantity}`` as a resource limit, ``env``, ``labels``,
    ``annotations``, ``nodeSelector``, ``affinity``, ``tolerations``, ``schedulerName``;
    ``spec.batchScheduler`` is the pods' scheduler). Pods carry ``spark-role`` and
    ``sparkoperator.k8s.io/app-name``; executors are owned by the driver pod."""
    name = str((obj.get("metadata") or {}).get("name", ""))
    identity = POD_IDENTITY["sparkoperator.k8s.io", "SparkApplication"]
    out = []
    for role in ("driver", "executor"):
        raw = spec.get(role)
        if raw is None:
            continue
        body = _require_dict(raw, f"spec.{role}")
        container: dict[str, Any] = {"name": f"spark-kubernetes-{role}",
                                     "image": body.get("image", spec.get("image"))}
        if body.get("env") is not None:
            container["env"] = body["env"]
        gpu = body.get("gpu")
        if isinstance(gpu, dict) and gpu.get("name"):
            container["resources"] = {"limits": {str(gpu["name"]): gpu.get("quantity", 1)}}
        pod_spec: dict[str, Any] = {"containers": [container]}
        for key in _SPARK_POD_KEYS:
            if body.get(key) is not None:
                pod_spec[key] = body[key]
        if spec.get("batchScheduler") and not pod_spec.get("schedulerName"):
            pod_spec["schedulerName"] = spec["batchScheduler"]  # a job-level scheduler
        labels = {**_str_labels(body.get("labels")),
                  **identity.pod_labels(name, ""), "spark-role": role}
        places = Places(spec=f"/spec/{role}", containers=(f"/spec/{role}",),
                        meta=f"/spec/{role}", spec_keys=_SPARK_POD_KEYS,
                        container_keys=frozenset({"env"}))
        out.append(_embedded_pod(obj, ns, spec=pod_spec, field=f"spec.{role}", suffix=role,
                                 places=places, labels=labels,
                                 annotations=body.get("annotations")))
    return out


_NIM_POD_KEYS = frozenset({"nodeSelector", "affinity", "tolerations", "schedulerName",
                           "runtimeClassName", "priorityClassName"})


def _nim_service(obj: dict[str, Any], spec: dict[str, Any], ns: str,
                 catalog: RuntimeCatalog) -> list[PodTemplate]:
    """NVIDIA NIM operator NIMService (apps.nvidia.com/v1alpha1, api/apps/v1alpha1/
    nimservice_types.go): one Deployment pod, its container named after the service, image
    ``spec.image.repository:tag``, ``command``/``args``/``env``/``resources`` and the pod
    fields (``nodeSelector``, ``tolerations``, ``affinity``, ``schedulerName``, ...) from the
    spec; ``spec.labels``/``spec.annotations`` go to the pod."""
    name = str((obj.get("metadata") or {}).get("name", ""))
    image = _require_dict(spec.get("image") or {}, "spec.image")
    ref = str(image.get("repository", ""))
    if image.get("tag"):
        ref += f":{image['tag']}"
    container: dict[str, Any] = {"name": name or "nim", "image": ref}
    for key in ("command", "args", "env", "resources"):
        if spec.get(key) is not None:
            container[key] = spec[key]
    pod_spec: dict[str, Any] = {"containers": [container]}
    for key in _NIM_POD_KEYS:
        if spec.get(key) is not None:
            pod_spec[key] = spec[key]
    places = Places(spec="/spec", containers=("/spec",), meta="/spec", spec_keys=_NIM_POD_KEYS,
                    container_keys=frozenset({"env", "resources"}))
    return [_embedded_pod(obj, ns, spec=pod_spec, field="spec", suffix="", places=places,
                          labels=_str_labels(spec.get("labels")),
                          annotations=spec.get("annotations"))]


_Builder = Callable[[dict[str, Any], dict[str, Any], str, RuntimeCatalog], list[PodTemplate]]
#: Kinds whose pods are built from fields rather than a PodTemplateSpec, by (group, kind).
_EMBEDDED: dict[tuple[str, str], _Builder] = {
    ("serving.kserve.io", "InferenceService"): _inference_service,
    ("serving.kserve.io", "LLMInferenceService"): _llm_inference_service,
    ("argoproj.io", "Workflow"): _argo_spec,
    ("argoproj.io", "WorkflowTemplate"): _argo_spec,
    ("argoproj.io", "ClusterWorkflowTemplate"): _argo_spec,
    ("argoproj.io", "CronWorkflow"): _argo_spec,
    ("kubeflow.org", "Experiment"): _katib_experiment,
    ("sparkoperator.k8s.io", "SparkApplication"): _spark,
    ("apps.nvidia.com", "NIMService"): _nim_service,
}
