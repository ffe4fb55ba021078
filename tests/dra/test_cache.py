"""The server's DRA watch cache against a test API endpoint: readiness until the first list,
live changes, 410 Gone -> re-list, bookmarks, metrics; and the second rule set (claims and
templates at their own CREATE) through the webhook over TLS.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import make_review
from tests.dra.objects import (
    EXTRA_CLASS,
    INFERENCE,
    POLICY_YAML,
    TRAINING,
    cluster,
    dra_pod,
    gpu_config,
    request,
    template,
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


@asynccontextmanager
async def stack(tmp: Path, *, hold_lists: bool = False,
                **config: Any) -> AsyncIterator[tuple[FakeApiServer, Server]]:
    (tmp / "policy.yaml").write_text(POLICY_YAML)
    secret = SecretDir(tmp / "certs", new_bundle())
    async with running_api(tmp) as (api, kubeconfig):
        api.apply(*cluster())
        if hold_lists:
            api.lists_open.clear()
        cfg = make_config(secret, policy_path=tmp / "policy.yaml", dra_source=str(kubeconfig),
                          **config)
        async with running_server(cfg, secret.bundles[0].ca_pem) as server:
            if not hold_lists:
                await poll_until(lambda: server.state.dra is not None
                                 and server.state.dra.synced, within=20)
            yield api, server


async def decide(server: Server, obj: dict[str, Any], *, group: str = "",
                 kind: str = "Pod") -> dict[str, Any]:
    review = make_review(obj, kind=kind)
    if group:
        gvk = {"group": group, "version": "v1", "kind": kind}
        review["request"]["kind"] = review["request"]["requestKind"] = gvk
        resource = {"group": group, "version": "v1", "resource": kind.lower() + "s"}
        review["request"]["resource"] = review["request"]["requestResource"] = resource
    status, body, _ = await server.post("/mutate", review)
    assert status == 200, body
    response: dict[str, Any] = body["response"]
    return response


def rules_of(response: dict[str, Any]) -> str:
    return str(response.get("status", {}).get("message", "")) + " ".join(
        response.get("warnings", []))


async def metric(server: Server, name: str, **labels: str) -> float:
    async with server.session.get(server.probe_url("/metrics")) as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v
                                           for k, v in labels.items()):
                return float(sample.value)
    return 0.0


async def readyz(server: Server) -> tuple[int, dict[str, Any]]:
    async with server.session.get(server.url("/readyz"), server_hostname=SERVICE_HOST) as resp:
        return resp.status, await resp.json()


async def test_not_ready_until_the_first_list_completes(tmp_path: Path) -> None:
    async with stack(tmp_path, hold_lists=True) as (api, server):
        status, body = await readyz(server)
        assert (status, body) == (503, {"status": "not ready",
                                        "reasons": ["DRA cache not synced"]})
        assert await metric(server, "gpu_admission_dra_cache_synced") == 0
        # decided meanwhile: unknown references, safe default (training denied, retry)
        response = await decide(server, dra_pod("t", TRAINING, template_name="dedicated"))
        assert response["allowed"] is False
        assert "[dra-reference-unknown]" in response["status"]["message"]
        api.lists_open.set()
        await poll_until(lambda: server.state.dra is not None and server.state.dra.synced,
                         within=20)
        status, body = await readyz(server)
        assert status == 200
        assert await metric(server, "gpu_admission_dra_cache_synced") == 1
        assert await metric(server, "gpu_admission_dra_cache_objects",
                            resource="resourceclaimtemplates") == 7
        response = await decide(server, dra_pod("t", TRAINING, template_name="dedicated"))
        assert response["allowed"] is True


async def test_a_cluster_without_resource_k8s_io_v1_is_ready_and_refs_are_unknown(
        tmp_path: Path) -> None:
    """Before Kubernetes 1.34 the API server answers 404 for resource.k8s.io/v1: the cache
    counts those resources as listed and empty (the webhook must not stay unready)."""
    async with running_api(tmp_path) as (api, kubeconfig):
        api.not_served = {"deviceclasses", "resourceclaimtemplates", "resourceclaims"}
        secret = SecretDir(tmp_path / "certs", new_bundle())
        cfg = make_config(secret, dra_source=str(kubeconfig))
        async with running_server(cfg, secret.bundles[0].ca_pem) as server:
            await poll_until(lambda: server.state.dra is not None and server.state.dra.synced,
                             within=20)
            assert (await readyz(server))[0] == 200
            response = await decide(server, dra_pod("t", TRAINING, template_name="dedicated"))
            assert response["allowed"] is False
            assert "[dra-reference-unknown]" in response["status"]["message"]


async def test_watch_events_change_the_decision(tmp_path: Path) -> None:
    pod = dra_pod("late-user", TRAINING, template_name="late")
    async with stack(tmp_path) as (api, server):
        assert "[dra-reference-unknown]" in rules_of(await decide(server, pod))
        late = template("late", config=[gpu_config("TimeSlicing")])
        api.apply(late)  # ADDED over the open watch

        async def denied_for_sharing() -> bool:
            return "[no-training-on-shared-gpu]" in rules_of(await decide(server, pod))

        await poll_async(denied_for_sharing)
        fixed = copy.deepcopy(late)
        del fixed["spec"]["spec"]["devices"]["config"]
        api.apply(fixed)  # MODIFIED

        async def allowed() -> bool:
            return bool((await decide(server, pod))["allowed"])

        await poll_async(allowed)
        api.delete(fixed)  # DELETED: unknown again

        async def unknown() -> bool:
            return "[dra-reference-unknown]" in rules_of(await decide(server, pod))

        await poll_async(unknown)
        assert await metric(server, "gpu_admission_dra_cache_events_total",
                            resource="resourceclaimtemplates", type="MODIFIED") == 1


async def test_claim_users_come_from_the_pod_watch(tmp_path: Path) -> None:
    """S3: a second pod naming ``solo-claim`` appears in the cluster: now it is shared."""
    pod = dra_pod("trainer", TRAINING, claim_name="solo-claim")
    async with stack(tmp_path) as (api, server):
        first = await decide(server, pod)
        assert first["allowed"] is True
        assert first["warnings"] == [
            "dra-sharing-possible: GPU may become shared: ResourceClaim ml/solo-claim: no other "
            "pod names it yet"]
        api.apply(dra_pod("server-b", INFERENCE, claim_name="solo-claim"))

        async def shared() -> bool:
            response = await decide(server, pod)
            return "is also named by pod ml/server-b" in rules_of(response)

        await poll_async(shared)


async def test_410_gone_relists_and_keeps_watching(tmp_path: Path) -> None:
    pod = dra_pod("t", TRAINING, template_name="after-expiry")
    async with stack(tmp_path) as (api, server):
        lists = api.count("resourceclaimtemplates", watch=False)
        await poll_until(lambda: bool(api.watches["resourceclaimtemplates"]))
        api.expire("resourceclaimtemplates")  # ERROR 410 on the open watch
        # a change made while the client re-lists must not be lost
        api.apply(template("after-expiry", config=[gpu_config("MPS")]))
        await poll_until(lambda: api.count("resourceclaimtemplates", watch=False) > lists,
                         within=10)

        async def denied() -> bool:
            return "[no-training-on-shared-gpu]" in rules_of(await decide(server, pod))

        await poll_async(denied)
        assert await metric(server, "gpu_admission_dra_cache_lists_total",
                            resource="resourceclaimtemplates", reason="gone") == 1
        # and the new watch is live: a later change arrives as an event
        api.apply(template("after-expiry"))

        async def allowed() -> bool:
            return bool((await decide(server, pod))["allowed"])

        await poll_async(allowed)


async def test_bookmark_moves_the_resource_version_on(tmp_path: Path) -> None:
    """A watch that ends (timeoutSeconds) resumes from the bookmark's resourceVersion."""
    async with stack(tmp_path, dra_watch_timeout_seconds=1) as (api, server):
        api.apply(template("unrelated"))  # moves the global resourceVersion on
        version = str(api.version)

        def resumed_from_bookmark() -> bool:
            return any(path == "/api/v1/pods" and query.get("resourceVersion") == version
                       for path, query in api.requests)

        async def bookmarked() -> bool:
            # send it to an open pods watch (between two 1 s watches there is none)
            await poll_until(lambda: bool(api.watches["pods"]), within=5)
            api.bookmark("pods")
            await asyncio.sleep(1.5)  # > the watch timeout: the client has resumed by now
            return resumed_from_bookmark()

        await poll_async(bookmarked, within=20)
        assert await metric(server, "gpu_admission_dra_cache_events_total",
                            resource="pods", type="BOOKMARK") >= 1
        assert await metric(server, "gpu_admission_dra_cache_lists_total",
                            resource="pods", reason="gone") == 0


# --------------------------------------------------------------------------- claim objects
CLAIM_CASES = [
    ("training-template-timeslicing",
     template("train-ts", config=[gpu_config("TimeSlicing")], labels=TRAINING), False,
     "[no-training-on-shared-gpu] spec.spec.devices.config[0]: training ResourceClaimTemplate "
     "ml/train-ts (label gpu-admission.io/workload) shares its GPU (request gpu: "
     "sharing.strategy TimeSlicing in spec.spec.devices.config[0] (GpuConfig)); time-slicing "
     "and MPS make each training job ~3x slower: remove the sharing config, or label it "
     "gpu-admission.io/workload=inference if it only serves"),
    ("training-template-class-config",
     template("train-class", request("gpu", EXTRA_CLASS), labels=TRAINING), False,
     "[no-training-on-shared-gpu] spec.spec.devices.requests[0]: training "
     "ResourceClaimTemplate ml/train-class (label gpu-admission.io/workload) shares its GPU "
     f"(request gpu: sharing.strategy TimeSlicing in DeviceClass {EXTRA_CLASS} spec.config[0] "
     "(GpuConfig)); time-slicing and MPS make each training job ~3x slower: remove the "
     "sharing config, or label it gpu-admission.io/workload=inference if it only serves"),
    ("training-template-dedicated", template("train-ded", labels=TRAINING), True, ""),
    ("inference-template-mps",
     template("infer-mps", config=[gpu_config("MPS", pinned="8Gi")], labels=INFERENCE), True,
     ""),
    ("unlabelled-template-timeslicing",
     template("plain-ts", config=[gpu_config("TimeSlicing")]), True, ""),
]


@pytest.mark.parametrize(("obj", "allowed", "message"), [c[1:] for c in CLAIM_CASES],
                         ids=[c[0] for c in CLAIM_CASES])
async def test_claim_templates_are_judged_at_creation(
        tmp_path: Path, obj: dict[str, Any], allowed: bool, message: str) -> None:
    async with stack(tmp_path) as (_, server):
        response = await decide(server, obj, group="resource.k8s.io",
                                kind="ResourceClaimTemplate")
        assert response["allowed"] is allowed
        assert "patch" not in response
        if not allowed:
            assert response["status"] == {"status": "Failure", "code": 403,
                                          "reason": "Forbidden", "message": message}


async def test_training_claim_with_mps_is_refused_and_scheduler_claims_are_not_judged(
        tmp_path: Path) -> None:
    claim_obj: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": "train-mps", "namespace": "ml", "labels": TRAINING},
                 "spec": {"devices": {"requests": [request()],
                                      "config": [gpu_config("MPS", pinned="10Gi")]}}}
    async with stack(tmp_path) as (_, server):
        response = await decide(server, claim_obj, group="resource.k8s.io", kind="ResourceClaim")
        assert response["allowed"] is False
        assert response["status"]["message"].startswith(
            "[no-training-on-shared-gpu] spec.devices.config[0]: training ResourceClaim "
            "ml/train-mps (label gpu-admission.io/workload) shares its GPU (request gpu: "
            "sharing.strategy MPS in spec.devices.config[0] (GpuConfig), pinned memory "
            "10240 MiB)")
        made_by_scheduler = copy.deepcopy(claim_obj)
        made_by_scheduler["metadata"]["annotations"] = {
            "resource.kubernetes.io/extended-resource-claim": "true"}
        response = await decide(server, made_by_scheduler, group="resource.k8s.io",
                                kind="ResourceClaim")
        assert response["allowed"] is True


async def poll_async(cond: Any, within: float = 10.0) -> None:
    """Wait until the async predicate is true (the watch thread applies changes)."""
    async with asyncio.timeout(within):
        while not await cond():  # noqa: ASYNC110 - state changes in another thread
            await asyncio.sleep(0.05)
