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
* ``List`` (its ``items``).

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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpu_admission.patch import escape

TEMPLATE_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet",
                            "ReplicationController"})
#: The owner the Job controller puts on every pod of a ``batch/v1`` Job.
BATCH_JOB_OWNER = ("batch/v1", "Job")
#: The label the Kubeflow notebook controller puts on a Notebook's pod.
NOTEBOOK_NAME_LABEL = "notebook-name"


class WorkloadError(ValueError):
    """An object that cannot be evaluated; the message names the field."""


@dataclass(frozen=True, slots=True)
class PodTemplate:
    """One pod to evaluate: the synthesized Pod and where its template lives in the object."""

    pod: dict[str, Any]
    pointer: str  # RFC 6901 pointer of the template in the object ("" when the object is a Pod)
    field: str  # the same as a dotted field path, for messages ("" for a Pod)
    label: str  # e.g. "PyTorchJob team-a/mnist Worker"


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
                       labels: dict[str, str] | None = None) -> PodTemplate:
    """``owner``: True = the object itself is the pod's controller; an (apiVersion, kind)
    pair = a controller of that kind named after the object (a Job a CronJob creates)."""
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
    label = f"{obj.get('kind')} {namespace}/{name}" + (f" {suffix}" if suffix else "")
    return PodTemplate(pod=pod, pointer=pointer, field=field, label=label)


def pod_templates(obj: Any, namespace: str | None = None) -> list[PodTemplate]:
    """Every pod ``obj`` would create, as Pods; ``[]`` for kinds without a pod template.

    ``namespace`` overrides the object's own (``--namespace``); default ``"default"``.
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
    if kind in TEMPLATE_KINDS and group in ("", "apps", "extensions"):
        spec = _require_dict(spec, "spec")
        return [_pod_from_template(obj, spec.get("template"), pointer="/spec/template",
                                   field="spec.template", suffix="", namespace=ns, owner=False)]
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
    for key, value in spec.items():
        if isinstance(key, str) and key.endswith("ReplicaSpecs"):  # Kubeflow training jobs
            replicas = _require_dict(value, f"spec.{key}")
            for rtype, raw in replicas.items():
                field = f"spec.{key}.{rtype}"
                rspec = _require_dict(raw, field)
                out.append(_pod_from_template(
                    obj, rspec.get("template"),
                    pointer=f"/spec/{escape(key)}/{escape(str(rtype))}/template",
                    field=f"{field}.template", suffix=str(rtype), namespace=ns, owner=True))
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


def _volcano(obj: dict[str, Any], spec: Any, ns: str) -> list[PodTemplate]:
    """Volcano ``batch.volcano.sh`` Job: ``spec.tasks[i].template`` (the job owns its pods)."""
    if obj.get("kind") != "Job":
        return []
    spec = _require_dict(spec, "spec")
    tasks = spec.get("tasks")
    if not isinstance(tasks, list):
        raise WorkloadError("spec.tasks: expected a list of tasks")
    out: list[PodTemplate] = []
    for i, raw in enumerate(tasks):
        task = _require_dict(raw, f"spec.tasks[{i}]")
        out.append(_pod_from_template(obj, task.get("template"),
                                      pointer=f"/spec/tasks/{i}/template",
                                      field=f"spec.tasks[{i}].template",
                                      suffix=str(task.get("name", i)), namespace=ns,
                                      owner=True))
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
    out: list[PodTemplate] = []
    base, pointer = (f"spec.{key}", f"/spec/{key}") if key else ("spec", "/spec")
    cluster = spec.get(key) if key else spec
    owner = ("ray.io/v1", "RayCluster")
    if cluster is not None:  # a RayJob may use an existing cluster (clusterSelector)
        cluster = _require_dict(cluster, base)
        head = cluster.get("headGroupSpec")
        if head is not None:
            head = _require_dict(head, f"{base}.headGroupSpec")
            out.append(_pod_from_template(obj, head.get("template"),
                                          pointer=f"{pointer}/headGroupSpec/template",
                                          field=f"{base}.headGroupSpec.template",
                                          suffix="head", namespace=ns, owner=owner))
        groups = cluster.get("workerGroupSpecs") or []
        if not isinstance(groups, list):
            raise WorkloadError(f"{base}.workerGroupSpecs: expected a list")
        for i, raw in enumerate(groups):
            group = _require_dict(raw, f"{base}.workerGroupSpecs[{i}]")
            out.append(_pod_from_template(
                obj, group.get("template"), pointer=f"{pointer}/workerGroupSpecs/{i}/template",
                field=f"{base}.workerGroupSpecs[{i}].template",
                suffix=str(group.get("groupName", i)), namespace=ns, owner=owner))
    if obj["kind"] == "RayJob" and spec.get("submitterPodTemplate") is not None:
        out.append(_pod_from_template(obj, spec["submitterPodTemplate"],
                                      pointer="/spec/submitterPodTemplate",
                                      field="spec.submitterPodTemplate", suffix="submitter",
                                      namespace=ns, owner=BATCH_JOB_OWNER))
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


def with_mutated_template(obj: dict[str, Any], template: PodTemplate,
                          mutated_pod: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` whose pod template carries ``mutated_pod``'s spec and annotations."""
    if not template.pointer:
        return mutated_pod
    out = copy.deepcopy(obj)
    node: Any = out
    for token in template.pointer.split("/")[1:]:
        key = token.replace("~1", "/").replace("~0", "~")
        node = node[int(key)] if isinstance(node, list) else node[key]
    node["spec"] = mutated_pod["spec"]
    annotations = mutated_pod.get("metadata", {}).get("annotations")
    if annotations:
        node.setdefault("metadata", {})["annotations"] = annotations
    return out
