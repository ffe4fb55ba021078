"""Regenerate the decision-log fixtures in this directory (run from the repo root:
``python tests/data/audit/generate.py``). The files are committed; tests read them as they
are, so a change in ``decision_record`` that breaks old logs shows up as a test failure.
"""

from __future__ import annotations

import gzip
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from gpu_admission.auditlog.record import audit_annotations, decision_record
from gpu_admission.core.decision import Decision, Mode, RequestFacts, Stage, Violation

HERE = Path(__file__).parent
T0 = datetime(2026, 11, 28, 9, 0, 0, tzinfo=UTC)

TRAINING = Violation("no-training-on-shared-gpu", "spec.containers[0].resources.limits",
                     "training pods need a whole GPU: request nvidia.com/gpu, not "
                     "nvidia.com/gpu.shared")
MEMORY = Violation("gpu-memory-limit", "spec.containers[0].env",
                   "no GPU memory limit set; added CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M",
                   Mode.WARN)
PATCH = ({"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"},
         {"op": "add", "path": "/spec/containers/0/env",
          "value": [{"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=8192M"}]})


def pod(name: str, ns: str, *, generate: bool = False, owner: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": ns}
    if generate:
        meta["generateName"] = name
    else:
        meta["name"] = name
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "kubeflow.org/v1", "kind": owner,
                                    "name": f"{name}job", "uid": "o-1", "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": []}}


def rec(n: int, hours: float, ns: str, decision: Decision, p: dict[str, Any] | None, *,
        user: str = "alice@example.com", dry: bool = False, stage: Stage = "mutate",
        op: str = "CREATE") -> dict[str, Any]:
    return decision_record(
        decision=decision,
        facts=RequestFacts(ns, op, user, ("system:authenticated", f"team:{ns}"), dry, stage),
        pod=p, uid=f"{n:08x}-1111-4222-8333-{n:012x}", policy_digest="sha256:5f1c9e",
        instance="gpu-admission-7d9f-abcde", time=T0 + timedelta(hours=hours))


def main() -> None:
    mutated = Decision(allowed=True, gpu=True, patch=PATCH, violations=(MEMORY,),
                       warnings=("added GPU memory limit 8192 MiB",), workload="inference",
                       workload_reason="owner Deployment", cuda_version="12.2",
                       cuda_source="image nvcr.io/nvidia/tritonserver:23.10-py3",
                       changes=("schedulerName=hami-scheduler",
                                "env CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M"))
    denied = Decision(allowed=False, gpu=True, violations=(TRAINING,), workload="training",
                      workload_reason="owner PyTorchJob", cuda_version="12.1",
                      cuda_source="image pytorch/pytorch:2.1.0-cuda12.1-cudnn8-runtime")
    audited = Decision(allowed=True, gpu=True,
                       violations=(Violation(TRAINING.rule, TRAINING.path, TRAINING.message,
                                             Mode.AUDIT),),
                       workload="training", workload_reason="label")
    plain = Decision(allowed=True, gpu=False)
    exempt = Decision(allowed=True, gpu=True, exempt="namespace kube-system")

    # oldest file: rotated twice and gzipped
    old = [rec(1, 0, "team-a", mutated, pod("infer-0", "team-a")),
           rec(2, 1, "team-b", denied, pod("train-", "team-b", generate=True, owner="PyTorchJob"),
               user="bob@example.com"),
           rec(3, 2, "team-a", plain, pod("web", "team-a"))]
    rotated = [rec(4, 24, "team-a", mutated, pod("infer-1", "team-a")),
               rec(5, 25, "team-b", denied, pod("train-1", "team-b", owner="PyTorchJob"),
                   user="bob@example.com", dry=True),
               rec(6, 26, "ml-research", audited, pod("train-2", "ml-research",
                                                      owner="PyTorchJob"),
                   user="carol@example.com")]
    current = [rec(7, 48, "team-a", mutated, pod("infer-2", "team-a")),
               rec(8, 49, "ml-research", audited, pod("train-3", "ml-research"),
                   user="carol@example.com", stage="validate"),
               rec(9, 50, "kube-system", exempt, pod("dcgm", "kube-system"),
                   user="system:serviceaccount:kube-system:daemon-set-controller"),
               rec(10, 51, "team-b", denied, pod("train-4", "team-b"), user="bob@example.com"),
               rec(11, 52, "team-b", plain, None, op="DELETE")]

    def lines(records: list[dict[str, Any]]) -> bytes:
        return b"".join(orjson.dumps(r) + b"\n" for r in records)

    (HERE / "decisions.log.2.gz").write_bytes(gzip.compress(lines(old), mtime=0))
    (HERE / "decisions.log.1").write_bytes(lines(rotated))
    (HERE / "decisions.log").write_bytes(lines(current))
    # corrupt.log: good, invalid JSON, wrong type, missing field, good, truncated last line
    good = lines([rec(20, 60, "team-c", mutated, pod("infer-9", "team-c"))])
    bad_time = rec(21, 61, "team-c", plain, pod("x", "team-c"))
    bad_time["time"] = "yesterday"
    no_uid = rec(22, 62, "team-c", plain, pod("y", "team-c"))
    del no_uid["uid"]
    tail = lines([rec(23, 63, "team-c", denied, pod("z", "team-c"))])
    (HERE / "corrupt.log").write_bytes(
        good + b'{"schemaVersion": 1, "time": \n' + b"[1, 2, 3]\n" + orjson.dumps(bad_time)
        + b"\n" + orjson.dumps(no_uid) + b"\n\n" + good.replace(b"00000014", b"00000018")
        + tail[: len(tail) // 2])

    write_apiserver_log(mutated, denied, audited)


def event(audit_id: str, when: datetime, *, ns: str, name: str, verb: str = "create",
          code: int = 201, notes: dict[str, str], user: str = "alice@example.com",
          uri_extra: str = "", level: str = "Metadata",
          request_object: dict[str, Any] | None = None,
          status: dict[str, Any] | None = None) -> dict[str, Any]:
    """An audit.k8s.io/v1 Event as the API server's log backend writes it."""
    stamp = when.isoformat(timespec="microseconds").replace("+00:00", "Z")
    done = (when + timedelta(milliseconds=14)).isoformat(timespec="microseconds")
    out: dict[str, Any] = {
        "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": level, "auditID": audit_id,
        "stage": "ResponseComplete",
        "requestURI": f"/api/v1/namespaces/{ns}/pods{uri_extra}", "verb": verb,
        "user": {"username": user, "uid": "u-" + user[:5],
                 "groups": ["system:authenticated", f"team:{ns}"]},
        "sourceIPs": ["10.0.0.12"], "userAgent": "kubectl/v1.30.2 (linux/amd64) kubernetes/3968350",
        "objectRef": {"resource": "pods", "namespace": ns, "name": name, "apiVersion": "v1"},
        "responseStatus": status or {"metadata": {}, "code": code},
        "requestReceivedTimestamp": stamp,
        "stageTimestamp": done.replace("+00:00", "Z"),
        "annotations": {"authorization.k8s.io/decision": "allow",
                        "authorization.k8s.io/reason":
                            f'RBAC: allowed by RoleBinding "edit/{ns}" of ClusterRole "edit" '
                            f'to Group "team:{ns}"',
                        "pod-security.kubernetes.io/enforce-policy": "baseline:latest",
                        **notes},
    }
    if not name:
        del out["objectRef"]["name"]
    if request_object is not None:
        out["requestObject"] = request_object
    return out


def ours(hook: str, decision: Decision) -> dict[str, str]:
    return {f"{hook}/{k}": v for k, v in audit_annotations(decision).items()}


def mutation(index: int, hook: str, mutated: bool) -> dict[str, str]:
    value = {"configuration": "gpu-admission", "webhook": hook, "mutated": mutated}
    return {f"mutation.webhook.admission.k8s.io/round_0_index_{index}":
            orjson.dumps(value).decode()}


def write_apiserver_log(mutated: Decision, denied: Decision, audited: Decision) -> None:
    t = datetime(2026, 11, 30, 14, 0, 0, 250000, tzinfo=UTC)
    m, v = "mutate.gpu-admission.io", "validate.gpu-admission.io"
    patch_note = {"patch.webhook.admission.k8s.io/round_0_index_1": orjson.dumps({
        "configuration": "gpu-admission", "webhook": m, "patchType": "JSONPatch",
        "patch": [{"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"},
                  {"op": "add", "path": "/spec/containers/0/env",
                   "value": [{"name": "HF_TOKEN", "value": "hf_secret_do_not_log"}]}]}
        ).decode()}
    denial = ("admission webhook \"mutate.gpu-admission.io\" denied the request: "
              "[no-training-on-shared-gpu] spec.containers[0].resources.limits: training pods "
              "need a whole GPU")
    events = [
        # 1: mutated by us (another webhook ran first at index 0), then validated
        event("5d0e6c1a-7f3b-4c2e-9a41-0b8e2d7c6f10", t, ns="team-a", name="infer-7",
              level="RequestResponse",
              notes={**mutation(0, "sidecar.istio.io", False), **mutation(1, m, True),
                     **patch_note, **ours(m, mutated),
                     **ours(v, Decision(allowed=True, gpu=True, workload="inference"))}),
        # 2: denied at mutate (validate never ran); generateName create, name empty
        event("9c4f2a77-1e5d-4b8a-8f0c-3d2e1a9b7c55", t + timedelta(minutes=5), ns="team-b",
              name="", user="bob@example.com", uri_extra="?dryRun=All", level="Request",
              request_object={"kind": "Pod", "apiVersion": "v1",
                              "metadata": {"generateName": "pytorchjob-worker-",
                                           "namespace": "team-b"}},
              status={"metadata": {}, "status": "Failure", "message": denial,
                      "reason": "Forbidden", "code": 403},
              notes={**mutation(0, m, False), **ours(m, denied)}),
        # 3: only the apiserver's failed-open note (our webhook timed out, failurePolicy Ignore)
        event("e17b9d02-5a6c-4f3e-b2d8-6c9a0f4e1b23", t + timedelta(hours=3), ns="ml-research",
              name="notebook-0",
              notes={"failed-open.mutation.webhook.admission.k8s.io/round_0_index_1": m}),
        # 4: training allowed in audit mode, seen by the validating webhook
        event("3a8e5f61-9b2d-4e7c-a0f1-8d6b4c2e9a07", t + timedelta(days=1), ns="ml-research",
              name="train-5", user="carol@example.com",
              notes={**mutation(0, m, False), **ours(v, audited)}),
        # 5: a pod create that no webhook of ours annotated (other webhook only)
        event("b6d1c0e9-2f4a-4a5b-9e3c-7f8a1d0c2b44", t + timedelta(days=1, hours=1),
              ns="default", name="nginx", notes=mutation(0, "sidecar.istio.io", True)),
        # 6: a plain GET: no admission at all
        event("72f0a3b8-6d1e-4c9f-8b2a-5e4d3c1b0a96", t + timedelta(days=1, hours=2),
              ns="team-a", name="infer-7", verb="get", code=200, notes={}),
    ]
    lines = [orjson.dumps(e) for e in events]
    # 7: the webhook backend's batch form, one EventList with one of our events
    batch = event("c3e9b4d5-8a7f-4d2c-b1e0-9f6a5b4c3d28", t + timedelta(days=1, hours=3),
                  ns="team-a", name="infer-8",
                  notes={**mutation(0, m, True), **ours(m, mutated)})
    lines.append(orjson.dumps({"kind": "EventList", "apiVersion": "audit.k8s.io/v1",
                               "metadata": {}, "items": [batch]}))
    (HERE / "apiserver-audit.log").write_bytes(b"\n".join(lines) + b"\n")


if __name__ == "__main__":
    main()
