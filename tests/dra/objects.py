"""Builders for DRA objects (``resource.k8s.io/v1``) and DRA pods, and the small cluster the
DRA tests share (no tests here).

DeviceClasses are written as NVIDIA's DRA driver chart installs them
(``deployments/helm/*/templates/deviceclass-*.yaml``; ``extendedResourceName: nvidia.com/gpu``
since v25.12.0, ``shared/reference/dra-gpus.md`` §1.3, §3.1); sharing configs are the driver's
``resource.nvidia.com/v1beta1`` ``GpuConfig`` (§3.2).
"""

from __future__ import annotations

import copy
from typing import Any

NS = "ml"
CUDA_IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"  # CUDA 12.4 (NGC release notes)
TRAINING = {"gpu-admission.io/workload": "training"}
INFERENCE = {"gpu-admission.io/workload": "inference"}
EXTRA_CLASS = "timesliced.gpu.example.com"
# The policy the DRA tests use: the default plus one site-specific GPU class (S2 via a class).
POLICY_YAML = f"""\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUSharingPolicy
metadata: {{name: dra-test}}
spec:
  dra:
    gpuDeviceClasses: [gpu.nvidia.com, mig.nvidia.com, {EXTRA_CLASS}]
"""


def device_class(name: str, cel: str, *, extended: str | None = None,
                 config: list[dict[str, Any]] | None = None,
                 created: str = "2026-11-01T00:00:00Z") -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": cel}}]}
    if extended:
        spec["extendedResourceName"] = extended
    if config:
        spec["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


def nvidia_gpu_class() -> dict[str, Any]:
    return device_class(
        "gpu.nvidia.com",
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        extended="nvidia.com/gpu")


def nvidia_mig_class() -> dict[str, Any]:
    return device_class(
        "mig.nvidia.com",
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'")


def gpu_config(strategy: str | None, *, requests: list[str] | None = None,
               pinned: str | None = None, kind: str = "GpuConfig") -> dict[str, Any]:
    """An NVIDIA opaque config entry (claim ``devices.config[]`` / class ``spec.config[]``)."""
    params: dict[str, Any] = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind}
    if strategy is not None:
        params["sharing"] = {"strategy": strategy}
        if strategy == "TimeSlicing":
            params["sharing"]["timeSlicingConfig"] = {"interval": "Long"}
        if strategy == "MPS":
            params["sharing"]["mpsConfig"] = {"defaultActiveThreadPercentage": 50}
            if pinned:
                params["sharing"]["mpsConfig"]["defaultPinnedDeviceMemoryLimit"] = pinned
    entry: dict[str, Any] = {"opaque": {"driver": "gpu.nvidia.com", "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def request(name: str = "gpu", device_class_name: str = "gpu.nvidia.com",
            **exactly: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class_name, **exactly}}


def claim_spec(*requests: dict[str, Any],
               config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests) or [request()]}
    if config:
        devices["config"] = config
    return {"devices": devices}


def template(name: str, *requests: dict[str, Any], config: list[dict[str, Any]] | None = None,
             labels: dict[str, str] | None = None, namespace: str = NS) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": meta, "spec": {"spec": claim_spec(*requests, config=config)}}


def claim(name: str, *requests: dict[str, Any], config: list[dict[str, Any]] | None = None,
          labels: dict[str, str] | None = None, namespace: str = NS) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": claim_spec(*requests, config=config)}


def dra_pod(name: str, labels: dict[str, str], *, template_name: str | None = None,
            claim_name: str | None = None, containers: int = 1,
            limits: dict[str, Any] | None = None, namespace: str = NS) -> dict[str, Any]:
    """A pod whose containers all use one claim entry ``gpu`` (template or claim by name), or,
    with ``limits``, the extended-resource form (no claim entry)."""
    spec: dict[str, Any] = {"containers": []}
    if template_name or claim_name:
        entry: dict[str, Any] = {"name": "gpu"}
        if template_name:
            entry["resourceClaimTemplateName"] = template_name
        else:
            entry["resourceClaimName"] = claim_name
        spec["resourceClaims"] = [entry]
    for i in range(containers):
        resources: dict[str, Any] = {}
        if template_name or claim_name:
            resources["claims"] = [{"name": "gpu"}]
        if limits:
            resources["limits"] = dict(limits)
        spec["containers"].append({"name": f"c{i}", "image": CUDA_IMAGE,
                                   "resources": resources})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "spec": spec}


IMEX_CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"


def cluster() -> list[dict[str, Any]]:
    """The objects of the DRA test cluster: NVIDIA's classes, a site class with a
    TimeSlicing config, templates and claims, and a pod already using ``shared-claim``."""
    return copy.deepcopy([
        nvidia_gpu_class(),
        nvidia_mig_class(),
        device_class(EXTRA_CLASS, "device.driver == 'gpu.nvidia.com'",
                     config=[gpu_config("TimeSlicing")]),
        template("dedicated"),
        template("timesliced", config=[gpu_config("TimeSlicing", requests=["gpu"])]),
        template("mps", config=[gpu_config("MPS", requests=["gpu"], pinned="10Gi")]),
        template("mig-slice", request("gpu", "mig.nvidia.com")),
        template("class-shared", request("gpu", EXTRA_CLASS)),
        template("claim-overrides-class", request("gpu", EXTRA_CLASS),
                 config=[gpu_config("MPS", pinned="4Gi")]),
        claim("shared-claim"),
        claim("solo-claim"),
        dra_pod("other-user", INFERENCE, claim_name="shared-claim"),
        # the IMEX channel template NVIDIA's ComputeDomain controller creates (issue 34):
        # DeviceClass compute-domain-default-channel.nvidia.com, not a GPU
        template("imex-channel", request("channel", IMEX_CHANNEL_CLASS)),
    ])
