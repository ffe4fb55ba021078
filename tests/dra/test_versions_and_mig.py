"""The faces cannot drift (issue 22, items 1, 2 and 5): pairs of pods that must be decided
the same way, through ``gpu-admission evaluate`` (a real subprocess reading the objects from
files) and through the webhook over TLS (its DRA cache filled by the real watch code from
the test API server):

* the same claim template written in ``resource.k8s.io/v1beta1`` (``requests[].
  deviceClassName``, as Kubernetes 1.32-1.33 serves it and NVIDIA's demo specs write it) and
  in ``v1`` (``requests[].exactly``): same decision, rule, path and env vars;
* the extended-resource form (``nvidia.com/mig-1g.10gb``, ``nvidia.com/gpu.shared``,
  ``nvidia.com/mig-1g.10gb.shared``) and the DRA form (a ``mig.nvidia.com`` template; a
  TimeSlicing GpuConfig; a MigDeviceConfig TimeSlicing): same decision, rules and env vars.
  A MIG slice is dedicated hardware in both forms, and no message calls it time-sliced;
* a claim asking for consumable capacity (``capacity.requests.memory: 4Gi``) sizes the memory
  env to 4096 MiB.

The v1beta1 objects are written by :func:`v1beta1`, which moves each request's exact fields
out of ``exactly`` as the v1beta1 API has them (k8s.io/api/resource/v1beta1 DeviceRequest).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
import yaml

from tests.builders import make_review, patch_ops
from tests.builders import patch_env as env_of
from tests.dra.objects import (
    CUDA_IMAGE,
    INFERENCE,
    NS,
    POLICY_YAML,
    TRAINING,
    cluster,
    dra_pod,
    gpu_config,
    request,
    template,
)
from tests.kube_api_support import running_api
from tests.server_support import (
    SecretDir,
    Server,
    make_config,
    new_bundle,
    poll_until,
    running_server,
)

MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")


def v1beta1(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` (a v1 ResourceClaimTemplate) as resource.k8s.io/v1beta1 writes it."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = "resource.k8s.io/v1beta1"
    out["metadata"]["name"] += "-beta"
    devices = out["spec"]["spec"]["devices"]
    devices["requests"] = [{"name": r["name"], **r["exactly"]} for r in devices["requests"]]
    return out


# The templates of this test, each also in v1beta1 (name + "-beta").
TEMPLATES = [
    template("v-dedicated"),
    template("v-timesliced", config=[gpu_config("TimeSlicing", requests=["gpu"])]),
    template("v-mps", config=[gpu_config("MPS", requests=["gpu"], pinned="10Gi")]),
    template("v-mig", request("gpu", "mig.nvidia.com")),
    template("v-mig-timesliced", request("gpu", "mig.nvidia.com"),
             config=[gpu_config("TimeSlicing", kind="MigDeviceConfig")]),
    template("v-mig-gpuconfig", request("gpu", "mig.nvidia.com"),
             config=[gpu_config("TimeSlicing")]),  # a GpuConfig does not apply to MIG
    template("v-capacity", request("gpu", capacity={"requests": {"memory": "4Gi"}})),
    template("v-admin", request("gpu", adminAccess=True)),
]
OBJECTS = [*cluster(), *TEMPLATES, *(v1beta1(t) for t in TEMPLATES)]


def ext_pod(name: str, labels: dict[str, str], resource: str) -> dict[str, Any]:
    """The extended-resource form: the device plugin's resource, no claim."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": dict(labels)},
            "spec": {"containers": [{"name": "c0", "image": CUDA_IMAGE,
                                     "resources": {"limits": {resource: 1}}}]}}


@dataclass(frozen=True)
class Pair:
    id: str
    a: dict[str, Any]
    b: dict[str, Any]
    allowed: bool
    rules: tuple[str, ...]  # the rules both report
    same_paths: bool  # the violations' paths agree too (v1beta1 vs v1)
    mem: str | None  # NVIDIA_MEM_LIMIT_MB both get


def version_pairs() -> list[Pair]:
    table = [  # (template, workload, allowed, rules, NVIDIA_MEM_LIMIT_MB)
        ("v-dedicated", "training", True, (), None),
        ("v-dedicated", "inference", True, (), None),
        ("v-timesliced", "training", False, ("no-training-on-shared-gpu",), None),
        ("v-timesliced", "inference", True, (), "16000"),
        ("v-mps", "training", False, ("no-training-on-shared-gpu",), None),
        ("v-mps", "inference", True, (), "10240"),
        ("v-mig", "training", True, (), None),
        ("v-mig", "inference", True, (), None),
        ("v-mig-timesliced", "training", False, ("no-training-on-shared-gpu",), None),
        ("v-mig-gpuconfig", "training", True, (), None),
        ("v-capacity", "training", False, ("no-training-on-shared-gpu",), None),
        ("v-capacity", "inference", True, (), "4096"),
        ("v-admin", "training", False, ("no-training-on-shared-gpu",), None),
    ]
    out = []
    for name, workload, allowed, rules, mem in table:
        labels = TRAINING if workload == "training" else INFERENCE
        stem = f"{name[2:]}-{workload[:5]}"
        out.append(Pair(f"v1beta1-vs-v1-{stem}",
                        dra_pod(f"b-{stem}", labels, template_name=f"{name}-beta"),
                        dra_pod(f"v-{stem}", labels, template_name=name),
                        allowed, rules, True, mem))
    return out


FORM_PAIRS = [  # (id, extended resource, template, workload, allowed, rules, memory)
    ("mig-training", "nvidia.com/mig-1g.10gb", "v-mig", TRAINING, True, (), None),
    ("mig-inference", "nvidia.com/mig-1g.10gb", "v-mig", INFERENCE, True, (), None),
    ("shared-mig-training", "nvidia.com/mig-1g.10gb.shared", "v-mig-timesliced", TRAINING,
     False, ("no-training-on-shared-gpu",), None),
    ("shared-mig-inference", "nvidia.com/mig-1g.10gb.shared", "v-mig-timesliced", INFERENCE,
     True, (), None),
    ("timesliced-training", "nvidia.com/gpu.shared", "v-timesliced", TRAINING, False,
     ("no-training-on-shared-gpu",), None),
    ("timesliced-inference", "nvidia.com/gpu.shared", "v-timesliced", INFERENCE, True, (),
     "16000"),
    ("dedicated-training", "nvidia.com/gpu", "v-dedicated", TRAINING, True, (), None),
]
PAIRS = version_pairs() + [
    Pair(f"extended-vs-dra-{i}", ext_pod(f"e-{i}", labels, resource),
         dra_pod(f"d-{i}", labels, template_name=tpl), allowed, rules, False, mem)
    for i, resource, tpl, labels, allowed, rules, mem in FORM_PAIRS]
IDS = [p.id for p in PAIRS]



def summary(allowed: bool, violations: list[dict[str, Any]], patch: list[dict[str, Any]],
            paths: bool) -> tuple[Any, ...]:
    return (allowed, [(v["rule"], v["path"] if paths else "") for v in violations
                      if v["rule"] != "cuda-version-unknown"], env_of(patch))


def check_pair(pair: Pair, a: tuple[Any, ...], b: tuple[Any, ...],
               messages: list[str]) -> None:
    assert a == b, pair.id
    allowed, rules, env = a
    assert allowed is pair.allowed
    assert tuple(r for r, _ in rules) == pair.rules
    assert env.get("NVIDIA_MEM_LIMIT_MB") == pair.mem
    if "mig" in pair.id and not pair.rules:  # a dedicated MIG slice is never "time-sliced"
        assert not any("time-sliced" in m or "MIG slice" in m for m in messages), messages


# --------------------------------------------------------------------------- evaluate -f
@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("versions")
    (tmp / "policy.yaml").write_text(POLICY_YAML)
    (tmp / "objects.yaml").write_text(yaml.safe_dump_all(OBJECTS))
    pods = [p for pair in PAIRS for p in (pair.a, pair.b)]
    (tmp / "pods.yaml").write_text(yaml.safe_dump_all(pods))
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_admission", "evaluate", "--policy", str(tmp / "policy.yaml"),
         "-f", str(tmp / "objects.yaml"), "-f", str(tmp / "pods.yaml"), "-o", "json"],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1, proc.stderr
    return {r["name"]: r for r in map(json.loads, proc.stdout.splitlines())}


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_evaluate_decides_each_pair_alike(pair: Pair,
                                          offline: dict[str, dict[str, Any]]) -> None:
    rows = [offline[p["metadata"]["name"]] for p in (pair.a, pair.b)]
    a, b = (summary(r["allowed"], r["violations"], r["patch"], pair.same_paths) for r in rows)
    check_pair(pair, a, b, [v["message"] for r in rows for v in r["violations"]])


def test_evaluate_reads_v1beta1_claim_objects_too(
        offline: dict[str, dict[str, Any]]) -> None:
    """The v1beta1 templates themselves get a row (the second rule set), like the v1 ones."""
    assert offline["v-mps-beta"]["kind"] == "ResourceClaimTemplate"
    assert offline["v-mps-beta"]["allowed"] is True  # not labelled training


# --------------------------------------------------------------------------- the webhook
@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    tmp = tmp_path_factory.mktemp("versions-webhook")
    (tmp / "policy.yaml").write_text(POLICY_YAML)
    secret = SecretDir(tmp / "certs", new_bundle())
    async with running_api(tmp) as (api, kubeconfig):
        # the cache hands over the objects as the API server serves them: v1beta1-shaped
        # templates next to v1 ones
        api.apply(*OBJECTS)
        config = make_config(secret, policy_path=tmp / "policy.yaml",
                             dra_source=str(kubeconfig))
        async with running_server(config, secret.bundles[0].ca_pem) as running:
            await poll_until(lambda: running.state.dra is not None and running.state.dra.synced,
                             within=20)
            yield running


async def admit(server: Server, obj: dict[str, Any], **review: Any) -> dict[str, Any]:
    status, body, _ = await server.post("/mutate", make_review(obj, **review))
    assert status == 200, body
    response: dict[str, Any] = body["response"]
    return response


def violations_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The (rule, path, message) of a response: the denial message's parts, or warnings."""
    if response["allowed"]:
        return [{"rule": w.split(":", 1)[0], "path": "", "message": w}
                for w in response.get("warnings", [])]
    out = []
    for part in response["status"]["message"].split("; ["):
        rule, rest = part.lstrip("[").split("] ", 1)
        path, message = rest.split(": ", 1)
        out.append({"rule": rule, "path": path, "message": message})
    return out


@MODULE_LOOP
@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
async def test_webhook_decides_each_pair_alike(pair: Pair, server: Server,
                                               offline: dict[str, dict[str, Any]]) -> None:
    responses = [await admit(server, p) for p in (pair.a, pair.b)]
    # warn-mode rules appear as warnings without a path: compare the denials' paths only
    paths = pair.same_paths and not pair.allowed
    a, b = (summary(r["allowed"], violations_of(r), patch_ops(r), paths) for r in responses)
    check_pair(pair, a, b, [v["message"] for r in responses for v in violations_of(r)])
    # and the webhook's patch is evaluate's, pod for pod
    for pod, response in zip((pair.a, pair.b), responses, strict=True):
        assert patch_ops(response) == offline[pod["metadata"]["name"]]["patch"]


@MODULE_LOOP
async def test_webhook_judges_a_v1beta1_training_template_at_creation(server: Server) -> None:
    obj = v1beta1(template("train-mps", config=[gpu_config("MPS", pinned="10Gi")],
                           labels=TRAINING))
    review = make_review(obj, kind="ResourceClaimTemplate")
    gvk = {"group": "resource.k8s.io", "version": "v1beta1", "kind": "ResourceClaimTemplate"}
    review["request"]["kind"] = review["request"]["requestKind"] = gvk
    resource = {"group": "resource.k8s.io", "version": "v1beta1",
                "resource": "resourceclaimtemplates"}
    review["request"]["resource"] = review["request"]["requestResource"] = resource
    status, body, _ = await server.post("/mutate", review)
    assert status == 200
    assert body["response"]["allowed"] is False
    assert body["response"]["status"]["message"] == (
        "[no-training-on-shared-gpu] spec.spec.devices.config[0]: training "
        "ResourceClaimTemplate ml/train-mps-beta (label gpu-admission.io/workload) shares its "
        "GPU (request gpu: sharing.strategy MPS in spec.spec.devices.config[0] (GpuConfig), "
        "pinned memory 10240 MiB); time-slicing and MPS make each training job ~3x slower: "
        "remove the sharing config, or label it gpu-admission.io/workload=inference if it "
        "only serves")


def test_the_v1beta1_writer_writes_what_the_schema_says() -> None:
    """The v1beta1 template is valid against the Kubernetes OpenAPI schema of that version
    (kubernetes-validate), so the pairs compare real shapes."""
    import kubernetes_validate  # noqa: PLC0415 - slow import, one test

    for obj in (v1beta1(t) for t in TEMPLATES if "capacity" not in json.dumps(t)):
        kubernetes_validate.validate(obj, "1.32", strict=True)


async def test_a_cluster_serving_only_v1beta1_decides_as_v1(
        tmp_path_factory: pytest.TempPathFactory, offline: dict[str, dict[str, Any]]) -> None:
    """Kubernetes 1.32 serves resource.k8s.io/v1beta1 only: the cache watches that version
    (tests/dra/test_served_version.py) and hands the v1beta1 objects on; every v1beta1 pod of
    the pairs gets the decision and patch ``evaluate`` gives the v1 pod of its pair."""
    tmp = tmp_path_factory.mktemp("v1beta1-only")
    (tmp / "policy.yaml").write_text(POLICY_YAML)
    secret = SecretDir(tmp / "certs", new_bundle())
    async with running_api(tmp) as (api, kubeconfig):
        api.dra_versions = ["v1beta1"]
        api.apply(*(o for o in OBJECTS if o["kind"] == "DeviceClass"
                    or o["apiVersion"] == "resource.k8s.io/v1beta1"))
        config = make_config(secret, policy_path=tmp / "policy.yaml",
                             dra_source=str(kubeconfig))
        async with running_server(config, secret.bundles[0].ca_pem) as running:
            await poll_until(lambda: running.state.dra is not None and running.state.dra.synced,
                             within=20)
            for pair in (p for p in PAIRS if p.same_paths):
                response = await admit(running, pair.a)
                row = offline[pair.b["metadata"]["name"]]  # the v1 pod's row
                assert response["allowed"] is row["allowed"], pair.id
                assert env_of(patch_ops(response)) == env_of(row["patch"]), pair.id
