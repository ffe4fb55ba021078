"""The pure DRA analysis (S1-S8 of shared/reference/dra-gpus.md §4), case by case, and the
policy's ``spec.dra`` section. End-to-end faces: test_dra_decisions.py, test_cache.py."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_admission.core.quantity import quantity_mib
from gpu_admission.dra.analysis import DEFAULT_GPU_CLASSES, analyze_pod
from gpu_admission.dra.model import DraSnapshot
from gpu_admission.policy.model import PolicyError, policy_from_dict
from tests.dra.objects import (
    INFERENCE,
    NS,
    TRAINING,
    claim,
    device_class,
    dra_pod,
    gpu_config,
    nvidia_gpu_class,
    nvidia_mig_class,
    request,
    template,
)

GPU_CLASSES = frozenset({*DEFAULT_GPU_CLASSES, "slices.example.com"})


def snapshot(*objs: dict[str, Any], users: dict[str, set[str]] | None = None) -> DraSnapshot:
    kinds: dict[str, list[dict[str, Any]]] = {"DeviceClass": [nvidia_gpu_class(),
                                                              nvidia_mig_class()],
                                              "ResourceClaimTemplate": [], "ResourceClaim": []}
    for obj in objs:
        kinds[obj["kind"]].append(obj)
    return DraSnapshot.build(classes=kinds["DeviceClass"],
                             templates=kinds["ResourceClaimTemplate"],
                             claims=kinds["ResourceClaim"],
                             claim_users={(NS, k): v for k, v in (users or {}).items()})


def two_container_pod(requests: tuple[str | None, str | None]) -> dict[str, Any]:
    pod = dra_pod("p", INFERENCE, template_name="two", containers=2)
    for container, req in zip(pod["spec"]["containers"], requests, strict=True):
        if req is not None:
            container["resources"]["claims"] = [{"name": "gpu", "request": req}]
    return pod


def summary(pod: dict[str, Any], snap: DraSnapshot) -> dict[str, Any]:
    dra = analyze_pod(pod, NS, snap, GPU_CLASSES)
    return {"containers": [(c.kind, c.index, sorted({r.check for r in c.shared}), c.mig,
                            c.mps_limit_mib) for c in dra.containers],
            "unresolved": [p for p, _ in dra.unresolved],
            "possible": [p for p, _ in dra.possible]}


TWO = template("two", request("a"), request("b"))
CASES: list[tuple[str, dict[str, Any], DraSnapshot, dict[str, Any]]] = [
    ("s1-claim-timeslicing",
     dra_pod("p", TRAINING, template_name="t"),
     snapshot(template("t", config=[gpu_config("TimeSlicing")])),
     {"containers": [("containers", 0, ["S1"], False, None)], "unresolved": [],
      "possible": []}),
    ("s1-config-for-another-request-does-not-apply",
     dra_pod("p", TRAINING, template_name="t"),
     snapshot(template("t", request("gpu"), request("nic", "nic.example.com"),
                       config=[gpu_config("TimeSlicing", requests=["nic"])])),
     {"containers": [("containers", 0, [], False, None)], "unresolved": [], "possible": []}),
    ("s1-other-driver-config-ignored",
     dra_pod("p", TRAINING, template_name="t"),
     snapshot(template("t", config=[{"opaque": {"driver": "gpu.example.com", "parameters": {
         "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}}}])),
     {"containers": [("containers", 0, [], False, None)], "unresolved": [], "possible": []}),
    ("s1-mps-pinned-limit-mib",
     dra_pod("p", INFERENCE, template_name="t"),
     snapshot(template("t", config=[gpu_config("MPS", pinned="6Gi")])),
     {"containers": [("containers", 0, ["S1"], False, 6144)], "unresolved": [],
      "possible": []}),
    ("s2-class-config",
     dra_pod("p", TRAINING, template_name="t"),
     snapshot(device_class("gpu.nvidia.com", "true", config=[gpu_config("MPS")]),
              template("t")),
     {"containers": [("containers", 0, ["S2"], False, None)], "unresolved": [],
      "possible": []}),
    ("claim-config-without-sharing-overrides-class-timeslicing",
     dra_pod("p", TRAINING, template_name="t"),
     snapshot(device_class("gpu.nvidia.com", "true", config=[gpu_config("TimeSlicing")]),
              template("t", config=[gpu_config(None)])),
     {"containers": [("containers", 0, [], False, None)], "unresolved": [], "possible": []}),
    ("s3-claim-users-from-the-cache",
     dra_pod("p", TRAINING, claim_name="c"), snapshot(claim("c"), users={"c": {"ml/q"}}),
     {"containers": [("containers", 0, ["S3"], False, None)], "unresolved": [],
      "possible": []}),
    ("s3-the-pod-itself-is-not-another-user",
     dra_pod("p", TRAINING, claim_name="c"), snapshot(claim("c"), users={"c": {"ml/p"}}),
     {"containers": [("containers", 0, [], False, None)], "unresolved": [],
      "possible": ["spec.resourceClaims[0]"]}),
    ("s3-reserved-for-another-pod",
     dra_pod("p", TRAINING, claim_name="c"),
     snapshot({**claim("c"), "status": {"reservedFor": [
         {"resource": "pods", "name": "scheduled", "uid": "u"}]}}),
     {"containers": [("containers", 0, ["S3"], False, None)], "unresolved": [],
      "possible": []}),
    ("s4-two-containers-whole-claim",
     two_container_pod((None, None)), snapshot(TWO),
     {"containers": [("containers", 0, ["S4"], False, None),
                     ("containers", 1, ["S4"], False, None)], "unresolved": [],
      "possible": []}),
    ("s4-different-requests-do-not-overlap",
     two_container_pod(("a", "b")), snapshot(TWO),
     {"containers": [("containers", 0, [], False, None), ("containers", 1, [], False, None)],
      "unresolved": [], "possible": []}),
    ("s4-whole-claim-overlaps-a-request",
     two_container_pod((None, "b")), snapshot(TWO),
     {"containers": [("containers", 0, ["S4"], False, None),
                     ("containers", 1, ["S4"], False, None)], "unresolved": [],
      "possible": []}),
    # S5 (issue 22): a MIG slice is dedicated (MIG-only, no shared reason) unless a
    # MigDeviceConfig sharing config applies; a GpuConfig does not apply to a MIG device.
    ("s5-mig-class-by-cel-selector-is-dedicated",
     dra_pod("p", TRAINING, template_name="t"),
     snapshot(device_class("slices.example.com",
                           "device.attributes['gpu.nvidia.com'].type == 'mig'"),
              template("t", request("gpu", "slices.example.com"))),
     {"containers": [("containers", 0, [], True, None)], "unresolved": [],
      "possible": []}),
    ("s5-mig-slice-with-migdeviceconfig-timeslicing-is-shared",
     dra_pod("p", TRAINING, template_name="t"),
     snapshot(template("t", request("gpu", "mig.nvidia.com"),
                       config=[gpu_config("TimeSlicing", kind="MigDeviceConfig")])),
     {"containers": [("containers", 0, ["S1"], True, None)], "unresolved": [],
      "possible": []}),
    ("s5-mig-slice-with-migdeviceconfig-mps-keeps-the-pinned-limit",
     dra_pod("p", INFERENCE, template_name="t"),
     snapshot(template("t", request("gpu", "mig.nvidia.com"),
                       config=[gpu_config("MPS", pinned="2Gi", kind="MigDeviceConfig")])),
     {"containers": [("containers", 0, ["S1"], True, 2048)], "unresolved": [],
      "possible": []}),
    ("s5-gpuconfig-does-not-apply-to-a-mig-slice",
     dra_pod("p", TRAINING, template_name="t"),
     snapshot(template("t", request("gpu", "mig.nvidia.com"),
                       config=[gpu_config("TimeSlicing")])),
     {"containers": [("containers", 0, [], True, None)], "unresolved": [],
      "possible": []}),
    ("first-available-with-a-mig-alternative-is-not-a-sharing-risk",
     dra_pod("p", TRAINING, template_name="t"),
     snapshot(template("t", {"name": "gpu", "firstAvailable": [
         {"name": "full", "deviceClassName": "gpu.nvidia.com"},
         {"name": "slice", "deviceClassName": "mig.nvidia.com"}]})),
     {"containers": [("containers", 0, [], False, None)], "unresolved": [],
      "possible": []}),
    ("s7-consumable-capacity",
     dra_pod("p", TRAINING, template_name="t"),
     snapshot(template("t", request("gpu", capacity={"requests": {"memory": "8Gi"}}))),
     {"containers": [("containers", 0, ["S7"], False, None)], "unresolved": [],
      "possible": []}),
    ("s8-admin-access",
     dra_pod("p", TRAINING, template_name="t"),
     snapshot(template("t", request("gpu", adminAccess=True))),
     {"containers": [("containers", 0, ["S8"], False, None)], "unresolved": [],
      "possible": []}),
    ("non-gpu-class-is-not-a-gpu-container",
     dra_pod("p", TRAINING, template_name="t"),
     snapshot(template("t", request("nic", "nic.example.com"))),
     {"containers": [], "unresolved": [], "possible": []}),
    ("unknown-device-class-is-unresolved",
     dra_pod("p", TRAINING, template_name="t"),
     DraSnapshot.build(templates=[template("t")]),
     {"containers": [("containers", 0, [], False, None)],
      "unresolved": ["spec.resourceClaims[0]"], "possible": []}),
    ("unknown-claim-is-unresolved",
     dra_pod("p", TRAINING, claim_name="nope"), snapshot(),
     {"containers": [], "unresolved": ["spec.resourceClaims[0]"], "possible": []}),
    ("init-container-on-a-shared-template",
     {**dra_pod("p", INFERENCE, template_name="t"), "spec": {
         "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
         "containers": [{"name": "main", "image": "busybox"}],
         "initContainers": [{"name": "warm", "image": "x",
                             "resources": {"claims": [{"name": "gpu"}]}}]}},
     snapshot(template("t", config=[gpu_config("TimeSlicing")])),
     {"containers": [("initContainers", 0, ["S1"], False, None)], "unresolved": [],
      "possible": []}),
    ("s6-deviceclass-resource-of-a-mig-class-is-dedicated",
     dra_pod("p", TRAINING, limits={"deviceclass.resource.kubernetes.io/mig.nvidia.com": 1}),
     snapshot(),
     {"containers": [("containers", 0, [], True, None)], "unresolved": [],
      "possible": []}),
    ("pod-group-template-claims-may-be-shared",
     {**(p := dra_pod("p", TRAINING, template_name="t")),
      "spec": {**p["spec"], "schedulingGroup": {"podGroupName": "g"}}},
     snapshot(template("t")),
     {"containers": [("containers", 0, [], False, None)], "unresolved": [],
      "possible": ["spec.schedulingGroup"]}),
]


@pytest.mark.parametrize(("pod", "snap", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_analysis(pod: dict[str, Any], snap: DraSnapshot, expected: dict[str, Any]) -> None:
    before = copy.deepcopy(pod)
    assert summary(pod, snap) == expected
    assert summary(pod, snap) == expected  # again, from the snapshot's memo
    assert pod == before  # pure: the pod is not modified


@pytest.mark.parametrize(("value", "mib"), [
    ("10Gi", 10240), ("512Mi", 512), ("1Gi", 1024), ("8G", 7629), ("0.5Gi", 512),
    (1048576, 1), ("1e9", 953), ("100Ki", None), ("0", None), ("-1Gi", None), ("lots", None),
    (True, None), (None, None)], ids=str)
def test_quantity_in_whole_mib(value: Any, mib: int | None) -> None:
    assert quantity_mib(value) == mib


# --------------------------------------------------------------------------- spec.dra
BASE = {"apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUSharingPolicy"}


@pytest.mark.parametrize(("dra", "message"), [
    ({"gpuDeviceClasses": []}, "spec.dra.gpuDeviceClasses: expected at least 1 entries, got []"),
    ({"gpuDeviceClasses": ["GPU_Class"]},
     'spec.dra.gpuDeviceClasses[0]: expected a DeviceClass name (DNS subdomain, e.g. '
     'gpu.nvidia.com), got "GPU_Class"'),
    ({"gpuDeviceClasses": ["gpu.nvidia.com", "gpu.nvidia.com"]},
     'spec.dra.gpuDeviceClasses: duplicate DeviceClass "gpu.nvidia.com"'),
    ({"nonTrainingUnknownReferences": "allow"},
     "spec.dra.nonTrainingUnknownReferences: expected 'enforce', 'warn' or 'audit', "
     "got \"allow\""),
    ({"gpuClasses": ["x"]}, "spec.dra.gpuClasses: unknown field"),
], ids=["empty", "not-a-dns-name", "duplicate", "bad-mode", "typo"])
def test_spec_dra_errors_name_the_field(dra: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyError) as info:
        policy_from_dict({**BASE, "spec": {"dra": dra}})
    assert str(info.value).startswith(message)


def test_spec_dra_compiles() -> None:
    policy = policy_from_dict({**BASE, "spec": {"dra": {
        "gpuDeviceClasses": ["gpu.example.com"], "nonTrainingUnknownReferences": "audit"}}})
    assert policy.compiled.dra_gpu_classes == frozenset({"gpu.example.com"})
    assert str(policy.compiled.dra_unknown_other) == "audit"


def test_evaluate_reports_a_bad_dra_policy_and_counts_replicas(tmp_path: Path) -> None:
    """Through the CLI: a bad spec.dra exits 2 naming the field; a Deployment with two
    replicas naming one ResourceClaim shares it (S3)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**BASE, "spec": {"dra": {"gpuDeviceClasses": []}}}))
    files = tmp_path / "objs.yaml"
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "trainer", "namespace": NS},
                  "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "t"}},
                           "template": {"metadata": {"labels": {"app": "t", **TRAINING}},
                                        "spec": dra_pod("x", TRAINING,
                                                        claim_name="c")["spec"]}}}
    files.write_text(yaml.safe_dump_all([nvidia_gpu_class(), claim("c"), deployment]))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpu_admission", "evaluate", *args],
                              capture_output=True, text=True, timeout=60, check=False)

    proc = run("--policy", str(bad), "-f", str(files))
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith(
        "spec.dra.gpuDeviceClasses: expected at least 1 entries, got []")
    proc = run("-f", str(files), "-o", "json")
    assert proc.returncode == 1, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["kind"], r["allowed"]) for r in rows] == [("ResourceClaim", True),
                                                         ("Deployment", False)]
    (violation,) = rows[1]["violations"]
    assert violation["message"].startswith(
        "training pod targets a time-sliced GPU (ResourceClaim ml/c is also named by pod "
        "Deployment ml/trainer (replica 2)); ")
