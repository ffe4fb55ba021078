"""DRA for ``gpu-admission evaluate``: DeviceClasses, templates and claims read from the same
files as the pods, turned into the snapshot the webhook's cache would hold.

Who uses a ResourceClaim (S3) offline: every evaluated pod template that names it, each
counted ``spec.replicas`` times for Deployments, StatefulSets and ReplicaSets (a pod template
with 2 replicas naming one claim shares it). The pod being judged is not counted as another
user of its own claim.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from gpu_admission.admission.claims import evaluate_claim
from gpu_admission.core.decision import Decision, RequestFacts
from gpu_admission.dra.model import CLAIM, DEVICE_CLASS, KINDS, TEMPLATE, DraSnapshot, Key
from gpu_admission.dra.model import pod_claim_names as claim_names
from gpu_admission.policy.model import Policy
from gpu_admission.workloads.kinds import PodTemplate, WorkloadError

_REPLICATED = frozenset({"Deployment", "StatefulSet", "ReplicaSet", "ReplicationController"})


#: NVIDIA DRA driver: the DeviceClass of a ComputeDomain's IMEX channels (not a GPU class).
IMEX_CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"


def is_compute_domain(doc: Any) -> bool:
    """An NVIDIA DRA driver ``ComputeDomain`` (``resource.nvidia.com/v1beta1``)."""
    return isinstance(doc, dict) and doc.get("kind") == "ComputeDomain" and str(
        doc.get("apiVersion", "")).startswith("resource.nvidia.com/")


def compute_domain_template(doc: dict[str, Any], namespace: str | None) -> dict[str, Any] | None:
    """The ResourceClaimTemplate the driver's ComputeDomain controller creates for
    ``spec.channel.resourceClaimTemplate.name`` in the domain's namespace: one request for an
    IMEX channel of DeviceClass ``compute-domain-default-channel.nvidia.com`` (NVIDIA
    k8s-dra-driver-gpu ``api/nvidia.com/resource/v1beta1/computedomain.go``,
    ``cmd/compute-domain-controller/resourceclaimtemplate.go``; ``dra-gpus.md`` §3.1). Not a
    GPU: pods naming it get their GPUs elsewhere (``nvidia.com/gpu``). None when the domain
    names no channel template."""
    spec = doc.get("spec")
    channel = spec.get("channel") if isinstance(spec, dict) else None
    rct = channel.get("resourceClaimTemplate") if isinstance(channel, dict) else None
    name = rct.get("name") if isinstance(rct, dict) else None
    if not isinstance(name, str) or not name:
        return None
    meta: dict[str, Any] = doc["metadata"] if isinstance(doc.get("metadata"), dict) else {}
    ns = namespace or str(meta.get("namespace") or "default")
    return {"apiVersion": "resource.k8s.io/v1", "kind": TEMPLATE,
            "metadata": {"name": name, "namespace": ns},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "channel", "exactly": {"deviceClassName": IMEX_CHANNEL_CLASS}}]}}}}


def is_dra_object(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("kind") in KINDS and str(
        doc.get("apiVersion", "")).startswith("resource.k8s.io/")


class OfflineDra:
    """The DRA objects and claim users of one ``evaluate`` run."""

    def __init__(self) -> None:
        self.objects: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
        self._users: dict[Key, set[str]] = {}
        self._ids: dict[int, str] = {}  # id(PodTemplate) -> user id of its first replica
        self._snapshot: DraSnapshot | None = None

    def take(self, doc: dict[str, Any], namespace: str | None) -> PodTemplate | None:
        """Store a DRA object; a claim or template comes back as a job for the claim rules
        (None for a DeviceClass)."""
        kind = doc["kind"]
        meta = doc.get("metadata")
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
            raise WorkloadError("metadata.name: required for a DRA object")
        obj = copy.deepcopy(doc)
        if kind != DEVICE_CLASS:
            obj["metadata"]["namespace"] = namespace or meta.get("namespace") or "default"
        self.objects[kind].append(obj)
        self._snapshot = None
        if kind == DEVICE_CLASS:
            return None
        ns = obj["metadata"]["namespace"]
        return PodTemplate(pod=obj, pointer="", field="", label=f"{kind} {ns}/{meta['name']}")

    def add_compute_domain(self, doc: dict[str, Any], namespace: str | None) -> bool:
        """Store the channel template a ComputeDomain makes the driver create (True when
        there is one), as the webhook's cache would hold it once created."""
        template = compute_domain_template(doc, namespace)
        if template is None:
            return False
        self.objects[TEMPLATE].append(template)
        self._snapshot = None
        return True

    def add_pods(self, doc: Mapping[str, Any], templates: list[PodTemplate]) -> None:
        """Count the claims each pod template names (``replicas`` times when replicated)."""
        replicas = 1
        spec = doc.get("spec")
        if doc.get("kind") in _REPLICATED and isinstance(spec, dict):
            value = spec.get("replicas", 1)
            replicas = value if isinstance(value, int) and value >= 0 else 1
        for tpl in templates:
            meta = tpl.pod.get("metadata", {})
            ns = str(meta.get("namespace", "default"))
            if doc.get("kind") == "Pod" and meta.get("name"):
                keys = [f"{ns}/{meta['name']}"]  # as the webhook's cache names pods
            else:
                keys = [tpl.label] if replicas <= 1 else [f"{tpl.label} (replica {r + 1})"
                                                          for r in range(replicas)]
            self._ids[id(tpl)] = keys[0]
            for name in claim_names(tpl.pod):
                self._users.setdefault((ns, name), set()).update(keys)
        self._snapshot = None

    def load_cluster(self, found: Mapping[str, list[dict[str, Any]]]) -> None:
        """Add the DeviceClasses, templates, claims and claim users of a live cluster, as
        :func:`gpu_admission.kube.dra.list_objects` read them (one list of each kind and of
        ``Pod``): the reading is I/O and stays in ``kube/``, so this module stays pure."""
        for kind in KINDS:
            self.objects[kind].extend(found[kind])
        for pod in found["Pod"]:
            meta = pod.get("metadata") or {}
            ns = str(meta.get("namespace") or "")
            for name in claim_names(pod):
                self._users.setdefault((ns, name), set()).add(f"{ns}/{meta.get('name')}")
        self._snapshot = None

    def snapshot(self) -> DraSnapshot:
        if self._snapshot is None:
            self._snapshot = DraSnapshot.build(
                classes=self.objects[DEVICE_CLASS], templates=self.objects[TEMPLATE],
                claims=self.objects[CLAIM], claim_users=self._users, offline=True)
        return self._snapshot

    def snapshot_for(self, tpl: PodTemplate) -> DraSnapshot:
        """The snapshot as the pod of ``tpl`` sees it: itself not among the claim users."""
        snap = self.snapshot()
        own = self._ids.get(id(tpl))
        if own is None:
            return snap
        users = {k: v - {own} for k, v in snap.claim_users.items()}
        return dataclasses.replace(snap, claim_users=users)

    @staticmethod
    def is_claim(tpl: PodTemplate) -> bool:
        return tpl.pod.get("kind") in (CLAIM, TEMPLATE)

    def decide(self, tpl: PodTemplate, facts: RequestFacts, policy: Policy) -> Decision:
        return evaluate_claim(tpl.pod, str(tpl.pod["kind"]), facts, policy, self.snapshot())
