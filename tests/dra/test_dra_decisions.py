"""DRA GPU pods, decided end to end through both faces of the policy:

* ``gpu-admission evaluate -f cluster.yaml -f pods.yaml`` (a real subprocess), which reads the
  DeviceClasses, templates and claims from the same files;
* the webhook over TLS (``POST /mutate``), whose DRA cache is filled by the server's real
  watch code (the ``kubernetes`` client in threads) from a test API endpoint serving list and
  watch responses as kube-apiserver does (tests/kube_api_support.py).

Every case states the expected verdict, violations and memory env; and both faces must give
the same answer (same patch, same messages), which holds the webhook to the engine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
import yaml

from tests.builders import make_review, patch_ops
from tests.dra.objects import (
    EXTRA_CLASS,
    INFERENCE,
    POLICY_YAML,
    TRAINING,
    cluster,
    dra_pod,
)
from tests.kube_api_support import FakeApiServer, running_api
from tests.server_support import (
    SERVICE_HOST,
    SecretDir,
    Server,
    make_config,
    new_bundle,
    poll_until,
    running_server,
)

MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")

MEM = "NVIDIA_MEM_LIMIT_MB"
TRAINING_RULE = "no-training-on-shared-gpu"


@dataclass
class Case:
    id: str
    pod: dict[str, Any]
    allowed: bool
    violations: list[tuple[str, str, str]] = field(default_factory=list)  # rule, path, mode
    mem: dict[int, str | None] = field(default_factory=dict)  # container -> NVIDIA_MEM_LIMIT_MB
    says: list[str] = field(default_factory=list)  # the first violation message contains
    mutated: bool = True  # an admitted pod gets the GPU-aware scheduler (unless unknown)


CASES = [
    Case("training-dedicated-template", dra_pod("t-ded", TRAINING, template_name="dedicated"),
         True, mem={0: None}),
    Case("training-timeslicing-template",
         dra_pod("t-ts", TRAINING, template_name="timesliced"), False,
         [(TRAINING_RULE, "spec.resourceClaims[0]", "enforce")],
         says=["ResourceClaimTemplate ml/timesliced request gpu",
               "sharing.strategy TimeSlicing in spec.spec.devices.config[0] (GpuConfig)"]),
    Case("training-mps-template", dra_pod("t-mps", TRAINING, template_name="mps"), False,
         [(TRAINING_RULE, "spec.resourceClaims[0]", "enforce")],
         says=["sharing.strategy MPS", "pinned memory 10240 MiB"]),
    Case("inference-mps-template-pinned-limit",
         dra_pod("i-mps", INFERENCE, template_name="mps"), True, mem={0: "10240"}),
    Case("inference-timeslicing-template-policy-share",
         dra_pod("i-ts", INFERENCE, template_name="timesliced"), True, mem={0: "16000"}),
    Case("inference-dedicated-template-no-memory-env",
         dra_pod("i-ded", INFERENCE, template_name="dedicated"), True, mem={0: None}),
    Case("training-claim-named-by-another-pod",
         dra_pod("t-shared", TRAINING, claim_name="shared-claim"), False,
         [(TRAINING_RULE, "spec.resourceClaims[0]", "enforce")],
         says=["ResourceClaim ml/shared-claim is also named by pod", "other-user"]),
    Case("inference-claim-named-by-another-pod",
         dra_pod("i-shared", INFERENCE, claim_name="shared-claim"), True, mem={0: "16000"}),
    Case("training-claim-named-by-this-pod-only",
         dra_pod("t-solo", TRAINING, claim_name="solo-claim"), True,
         [("dra-sharing-possible", "spec.resourceClaims[0]", "warn")],
         says=["GPU may become shared: ResourceClaim ml/solo-claim: no other pod names "
               "it yet"]),
    Case("inference-two-containers-one-claim",
         dra_pod("i-two", INFERENCE, template_name="dedicated", containers=2), True,
         mem={0: "16000", 1: "16000"}),
    Case("training-two-containers-one-claim",
         dra_pod("t-two", TRAINING, template_name="dedicated", containers=2), False,
         [(TRAINING_RULE, "spec.containers[0].resources.claims", "enforce"),
          (TRAINING_RULE, "spec.containers[1].resources.claims", "enforce")],
         says=["is also used by spec.containers[1] of this pod"]),
    # issue 22: a MIG slice is dedicated hardware (as nvidia.com/mig-1g.10gb is): training
    # is allowed, no memory env
    Case("training-mig-slice", dra_pod("t-mig", TRAINING, template_name="mig-slice"), True,
         mem={0: None}),
    Case("inference-mig-slice-no-memory-env",
         dra_pod("i-mig", INFERENCE, template_name="mig-slice"), True, mem={0: None}),
    Case("training-class-config-timeslicing",
         dra_pod("t-class", TRAINING, template_name="class-shared"), False,
         [(TRAINING_RULE, "spec.resourceClaims[0]", "enforce")],
         says=[f"DeviceClass {EXTRA_CLASS} spec.config[0]"]),
    Case("inference-claim-config-overrides-class",
         dra_pod("i-override", INFERENCE, template_name="claim-overrides-class"), True,
         mem={0: "4096"}),
    Case("training-extended-resource-of-shared-class",
         dra_pod("t-ext", TRAINING,
                 limits={f"deviceclass.resource.kubernetes.io/{EXTRA_CLASS}": 1}), False,
         [(TRAINING_RULE, f"spec.containers[0].resources.limits"
                          f"[deviceclass.resource.kubernetes.io/{EXTRA_CLASS}]", "enforce")],
         says=["is served by DRA: sharing.strategy TimeSlicing"]),
    Case("inference-extended-resource-of-shared-class",
         dra_pod("i-ext", INFERENCE,
                 limits={f"deviceclass.resource.kubernetes.io/{EXTRA_CLASS}": 1}), True,
         mem={0: "16000"}),
    Case("training-nvidia-gpu-extended-resource-dedicated",
         dra_pod("t-nvgpu", TRAINING, limits={"nvidia.com/gpu": 1}), True, mem={0: None}),
    # issue 34: an IMEX channel (NVIDIA DRA driver ComputeDomain) is not a GPU claim: the
    # pod's GPUs are its whole nvidia.com/gpu
    Case("training-imex-channel-beside-nvidia-gpu-computedomain",
         dra_pod("t-imex", TRAINING, template_name="imex-channel",
                 limits={"nvidia.com/gpu": 4}), True, mem={0: None}),
    Case("inference-imex-channel-beside-nvidia-gpu-computedomain",
         dra_pod("i-imex", INFERENCE, template_name="imex-channel",
                 limits={"nvidia.com/gpu": 1}), True, mem={0: "16000"}),
    Case("training-unknown-template", dra_pod("t-unknown", TRAINING, template_name="nope"),
         False, [("dra-reference-unknown", "spec.resourceClaims[0]", "enforce")],
         # offline: "not in the files given to evaluate", webhook: "retry" (tests below)
         says=["ResourceClaimTemplate ml/nope is not in the"]),
    Case("inference-unknown-template", dra_pod("i-unknown", INFERENCE, template_name="nope"),
         True, [("dra-reference-unknown", "spec.resourceClaims[0]", "warn")],
         says=["ResourceClaimTemplate ml/nope is not in the"], mutated=False),
]
IDS = [c.id for c in CASES]


def env_of(pod_patch: list[dict[str, Any]], container: int) -> dict[str, str]:
    for op in pod_patch:
        if op["path"] == f"/spec/containers/{container}/env":
            return {e["name"]: e["value"] for e in op["value"]}
    return {}


def check_case(case: Case, allowed: bool, violations: list[dict[str, str]],
               patch: list[dict[str, Any]]) -> None:
    assert allowed is case.allowed
    assert [(v["rule"], v["path"], v["mode"]) for v in violations] == case.violations
    if case.says:
        for text in case.says:
            assert text in violations[0]["message"], violations[0]["message"]
    for index, value in case.mem.items():
        assert env_of(patch, index).get(MEM) == value
    scheduler = {"op": "add", "path": "/spec/schedulerName", "value": "gpu-aware-scheduler"}
    assert (scheduler in patch) is (allowed and case.mutated)


# --------------------------------------------------------------------------- evaluate -f
@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One ``gpu-admission evaluate`` run over the cluster file and every case pod."""
    tmp = tmp_path_factory.mktemp("dra-eval")
    (tmp / "policy.yaml").write_text(POLICY_YAML)
    (tmp / "cluster.yaml").write_text(yaml.safe_dump_all(cluster()))
    (tmp / "pods.yaml").write_text(yaml.safe_dump_all([c.pod for c in CASES]))
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_admission", "evaluate", "--policy", str(tmp / "policy.yaml"),
         "-f", str(tmp / "cluster.yaml"), "-f", str(tmp / "pods.yaml"), "-o", "json"],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1, proc.stderr  # some cases are denied
    assert proc.stderr == ""
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    return {r["name"]: r for r in rows}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_evaluate_decides_dra_pods_from_files(case: Case,
                                              offline: dict[str, dict[str, Any]]) -> None:
    row = offline[case.pod["metadata"]["name"]]
    assert row["gpu"] is True
    check_case(case, row["allowed"], row["violations"], row["patch"])


def test_evaluate_judges_the_claim_objects_in_the_files_too(
        offline: dict[str, dict[str, Any]]) -> None:
    """Templates and claims without a training label are admitted; the pod already using
    ``shared-claim`` is an inference pod on a shared claim: memory env."""
    assert offline["timesliced"]["kind"] == "ResourceClaimTemplate"
    assert offline["timesliced"]["allowed"] is True
    assert env_of(offline["other-user"]["patch"], 0)[MEM] == "16000"


# --------------------------------------------------------------------------- the webhook
@dataclass
class Stack:
    api: FakeApiServer
    server: Server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    tmp = tmp_path_factory.mktemp("dra-webhook")
    (tmp / "policy.yaml").write_text(POLICY_YAML)
    secret = SecretDir(tmp / "certs", new_bundle())
    async with running_api(tmp) as (api, kubeconfig):
        api.apply(*cluster())
        # the case pods that name a claim exist in the cluster as they do in the files, so
        # both faces count the same users of a ResourceClaim (S3)
        api.apply(*(c.pod for c in CASES
                    if any("resourceClaimName" in e for e in c.pod["spec"].get(
                        "resourceClaims", []))))
        config = make_config(secret, policy_path=tmp / "policy.yaml",
                             dra_source=str(kubeconfig))
        async with running_server(config, secret.bundles[0].ca_pem) as server:
            await poll_until(lambda: server.state.dra is not None and server.state.dra.synced,
                             within=20)
            yield Stack(api, server)


async def admit(server: Server, pod: dict[str, Any], path: str = "/mutate") -> dict[str, Any]:
    status, body, _ = await server.post(path, make_review(pod))
    assert status == 200, body
    response: dict[str, Any] = body["response"]
    return response


@MODULE_LOOP
@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_webhook_decides_dra_pods_from_its_watch_cache(
        case: Case, stack: Stack, offline: dict[str, dict[str, Any]]) -> None:
    response = await admit(stack.server, case.pod)
    row = offline[case.pod["metadata"]["name"]]
    # same verdict, patch and warnings as `evaluate` (offline reads the same objects)
    assert response["allowed"] is row["allowed"]
    assert patch_ops(response) == row["patch"]
    if any(v["rule"] == "dra-reference-unknown" for v in row["violations"]):
        # the faces say where the object is missing from: the cache (retry) or the files
        assert "DRA cache" in str(response.get("warnings", response.get("status")))
        assert "files given to evaluate" in row["violations"][0]["message"]
    else:
        assert response.get("warnings", []) == row["warnings"]
    if not row["allowed"] and "DRA cache" not in response["status"]["message"]:
        assert response["status"]["message"] == "; ".join(
            f"[{v['rule']}] {v['path']}: {v['message']}" for v in row["violations"]
            if v["mode"] == "enforce")
    check_case(case, row["allowed"], row["violations"], patch_ops(response))


@MODULE_LOOP
async def test_training_on_timeslicing_template_denial_exact(stack: Stack) -> None:
    response = await admit(stack.server, dra_pod("t-ts", TRAINING, template_name="timesliced"))
    assert response["allowed"] is False
    assert response["status"] == {
        "status": "Failure", "code": 403, "reason": "Forbidden",
        "message": "[no-training-on-shared-gpu] spec.resourceClaims[0]: training pod targets a "
                   "time-sliced GPU (ResourceClaimTemplate ml/timesliced request gpu: "
                   "sharing.strategy TimeSlicing in spec.spec.devices.config[0] (GpuConfig)); "
                   "time-slicing makes each training job ~3x slower. Request nvidia.com/gpu on "
                   "a dedicated node pool (sharing none) or MIG, or label the pod "
                   "gpu-admission.io/workload=inference if it only serves"}


@MODULE_LOOP
async def test_inference_on_mps_template_patch_exact(stack: Stack) -> None:
    response = await admit(stack.server, dra_pod("i-mps", INFERENCE, template_name="mps"))
    assert response["allowed"] is True
    assert patch_ops(response) == [
        {"op": "add", "path": "/spec/schedulerName", "value": "gpu-aware-scheduler"},
        {"op": "add", "path": "/spec/nodeSelector",
         "value": {"gpu-admission.io/cuda-version": "12.4"}},
        {"op": "add", "path": "/spec/containers/0/env", "value": [
            {"name": "NVIDIA_MEM_LIMIT_MB", "value": "10240"},  # 10Gi pinned, in MiB
            {"name": "GPU_MEMORY_FRACTION", "value": "0.2"},
            {"name": "XLA_CLIENT_MEM_FRACTION", "value": "0.2"},
            {"name": "XLA_PYTHON_CLIENT_MEM_FRACTION", "value": "0.2"},
            {"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "true"}]},
        {"op": "add", "path": "/metadata/annotations",
         "value": {"gpu-admission.io/mutated": "env,nodeSelector,schedulerName"}},
    ]


@MODULE_LOOP
async def test_readyz_reports_the_synced_cache(stack: Stack) -> None:
    async with stack.server.session.get(stack.server.url("/readyz"),
                                        server_hostname=SERVICE_HOST) as resp:
        assert resp.status == 200
    # the cache really came from list + watch on resource.k8s.io/v1 and pods
    for resource in ("deviceclasses", "resourceclaimtemplates", "resourceclaims", "pods"):
        assert stack.api.count(resource, watch=False) >= 1
        await poll_until(lambda r=resource: stack.api.count(r, watch=True) >= 1)  # type: ignore[misc]
