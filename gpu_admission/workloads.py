"""Pods out of workload objects, for offline evaluation (``gpu-admission evaluate``).

The webhook only ever sees Pods, but people review Deployments and training jobs. Like
``kyverno apply`` does with its auto-gen rules, we evaluate each pod template as the Pod its
controller would create: the template's metadata and spec, the workload's namespace, and (for
training jobs) the owner reference the controller sets, so the classification matches what the
webhook sees at admission time (Kubeflow training-operator ``pkg/controller.v1/common/pod.go``
puts a controller ownerReference to the job into each pod).

Supported: Pod; Deployment, StatefulSet, DaemonSet, ReplicaSet, ReplicationController, Job
(``spec.template``); CronJob (``spec.jobTemplate.spec.template``); Kubeflow jobs
(``spec.<x>ReplicaSpecs.<type>.template``: PyTorchJob, TFJob, MPIJob, XGBoostJob, PaddleJob,
JAXJob); Volcano Job (``spec.tasks[i].template``); JobSet
(``spec.replicatedJobs[i].template.spec.template``); ``List`` (its ``items``).
Other kinds have no pod template and are skipped.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpu_admission.patch import escape

TEMPLATE_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet",
                            "ReplicationController", "Job"})


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
                       suffix: str, namespace: str, owner: bool) -> PodTemplate:
    template = _require_dict(template, field)
    meta_in = template.get("metadata") or {}
    meta_in = _require_dict(meta_in, f"{field}.metadata")
    obj_meta = obj.get("metadata") or {}
    name = str(obj_meta.get("name", "")) if isinstance(obj_meta, dict) else ""
    meta: dict[str, Any] = {**meta_in, "namespace": namespace}
    meta.setdefault("generateName", f"{name}-{suffix}-" if suffix else f"{name}-")
    if owner:
        meta["ownerReferences"] = [{
            "apiVersion": obj.get("apiVersion", ""), "kind": obj.get("kind", ""), "name": name,
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
    if kind in TEMPLATE_KINDS:
        spec = _require_dict(spec, "spec")
        return [_pod_from_template(obj, spec.get("template"), pointer="/spec/template",
                                   field="spec.template", suffix="", namespace=ns, owner=False)]
    if kind == "CronJob":
        spec = _require_dict(spec, "spec")
        job = _require_dict(spec.get("jobTemplate"), "spec.jobTemplate")
        job_spec = _require_dict(job.get("spec"), "spec.jobTemplate.spec")
        return [_pod_from_template(obj, job_spec.get("template"),
                                   pointer="/spec/jobTemplate/spec/template",
                                   field="spec.jobTemplate.spec.template", suffix="",
                                   namespace=ns, owner=False)]
    if not isinstance(spec, dict):
        return []
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
    if obj.get("apiVersion", "").startswith("batch.volcano.sh/") and isinstance(
            spec.get("tasks"), list):
        for i, raw in enumerate(spec["tasks"]):
            task = _require_dict(raw, f"spec.tasks[{i}]")
            out.append(_pod_from_template(obj, task.get("template"),
                                          pointer=f"/spec/tasks/{i}/template",
                                          field=f"spec.tasks[{i}].template",
                                          suffix=str(task.get("name", i)), namespace=ns,
                                          owner=True))
    if kind == "JobSet" and isinstance(spec.get("replicatedJobs"), list):
        for i, raw in enumerate(spec["replicatedJobs"]):
            field = f"spec.replicatedJobs[{i}].template"
            rjob = _require_dict(raw, f"spec.replicatedJobs[{i}]")
            job = _require_dict(rjob.get("template"), field)
            job_spec = _require_dict(job.get("spec"), f"{field}.spec")
            out.append(_pod_from_template(
                obj, job_spec.get("template"),
                pointer=f"/spec/replicatedJobs/{i}/template/spec/template",
                field=f"{field}.spec.template", suffix=str(rjob.get("name", i)), namespace=ns,
                owner=False))
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
