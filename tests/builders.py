"""Small builders for test inputs: pods, containers, AdmissionReviews.

Every test builds its objects through these so the tables stay short and readable.
"""

from __future__ import annotations

import base64
import copy
import uuid
from typing import Any

import orjson


def make_container(
    name: str = "main",
    image: str = "nvcr.io/nvidia/tritonserver:24.05-py3",
    *,
    gpu: int | str | None = 1,
    resource: str = "nvidia.com/gpu",
    requests_only: bool = False,
    env: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A container; ``gpu=None`` means no GPU resource at all."""
    container: dict[str, Any] = {"name": name, "image": image}
    if gpu is not None:
        key = "requests" if requests_only else "limits"
        container["resources"] = {key: {resource: gpu}}
    if env is not None:
        container["env"] = env
    return container


def make_pod(
    name: str = "pod",
    namespace: str = "team-a",
    *,
    containers: list[dict[str, Any]] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
    affinity: dict[str, Any] | None = None,
    scheduler_name: str | None = None,
    owner_kind: str | None = None,
    owner_api_version: str = "kubeflow.org/v1",
    **spec_extra: Any,
) -> dict[str, Any]:
    """A Pod as the API server sends it in ``request.object`` (a plain dict)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels is not None:
        metadata["labels"] = dict(labels)
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    if owner_kind is not None:
        metadata["ownerReferences"] = [{
            "apiVersion": owner_api_version, "kind": owner_kind, "name": f"{name}-owner",
            "uid": "00000000-0000-0000-0000-000000000001", "controller": True,
            "blockOwnerDeletion": True,
        }]
    spec: dict[str, Any] = {
        "containers": copy.deepcopy(containers) if containers is not None else [make_container()],
    }
    if init_containers is not None:
        spec["initContainers"] = copy.deepcopy(init_containers)
    if node_selector is not None:
        spec["nodeSelector"] = dict(node_selector)
    if affinity is not None:
        spec["affinity"] = copy.deepcopy(affinity)
    if scheduler_name is not None:
        spec["schedulerName"] = scheduler_name
    spec.update(spec_extra)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def make_review(
    obj: dict[str, Any] | None,
    *,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    uid: str | None = None,
    namespace: str | None = None,
    user: str = "alice@example.com",
    groups: list[str] | None = None,
    dry_run: bool = False,
    api_version: str = "admission.k8s.io/v1",
    kind: str = "Pod",
) -> dict[str, Any]:
    """An AdmissionReview request as the API server POSTs it."""
    if namespace is None:
        namespace = (obj or old or {}).get("metadata", {}).get("namespace", "team-a")
    name = (obj or old or {}).get("metadata", {}).get("name", "")
    return {
        "apiVersion": api_version,
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
            "requestKind": {"group": "", "version": "v1", "kind": kind},
            "requestResource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
            "name": name,
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": user, "uid": "u-1",
                         "groups": groups if groups is not None else ["system:authenticated"]},
            "object": obj,
            "oldObject": old,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def patch_ops(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The RFC 6902 ops of an AdmissionReview response ([] when it carries none). A patch comes
    with ``patchType: JSONPatch`` and never without it (``VerifyAdmissionResponse`` in
    k8s.io/apiserver/pkg/admission/plugin/webhook/request/admissionreview.go)."""
    raw = response.get("patch")
    if raw is None:
        assert "patchType" not in response, response
        return []
    assert response.get("patchType") == "JSONPatch", response
    ops: list[dict[str, Any]] = orjson.loads(base64.b64decode(raw))
    return ops


def patch_env(patch: list[dict[str, Any]], container: int = 0) -> dict[str, str]:
    """The env vars a patch gives ``spec.containers[container]`` (the whole list added, or
    appended one by one), by name."""
    out: dict[str, str] = {}
    base = f"/spec/containers/{container}/env"
    for op in patch:
        if op["path"] == base:
            out.update({e["name"]: e["value"] for e in op["value"]})
        elif op["path"] == base + "/-":
            out[op["value"]["name"]] = op["value"]["value"]
    return out
