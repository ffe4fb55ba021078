"""Leader election on a ``coordination.k8s.io/v1`` Lease, the way client-go's
``leaderelection`` does it (``k8s.io/client-go/tools/leaderelection``): the holder renews
``spec.renewTime`` every ``retry`` seconds; another instance takes the Lease over only when
``renewTime + leaseDurationSeconds`` has passed; every write is a PUT with the read
``resourceVersion``, so two candidates cannot both win (the loser gets a 409).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpu_admission.reclaim.kube import Kube, KubeError
from gpu_admission.reclaim.plan import parse_time


def micro_time(ts: float) -> str:
    """``MicroTime`` (RFC 3339 with microseconds), as the Lease's time fields are."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaseElector:
    kube: Kube
    namespace: str
    name: str
    identity: str
    duration: int = 15  # s: leaseDurationSeconds
    leader: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    def try_acquire_or_renew(self, now: float) -> bool:
        """One attempt; True while this instance holds the Lease. API errors count as "not
        leader" (a partitioned leader stops acting before another can take over)."""
        try:
            held = self._attempt(now)
        except KubeError:
            held = False
        with self._lock:
            self.leader = held
        return held

    def is_leader(self) -> bool:
        with self._lock:
            return self.leader

    def _spec(self, now: float, transitions: int, acquired: str | None) -> dict[str, Any]:
        return {"holderIdentity": self.identity, "leaseDurationSeconds": self.duration,
                "acquireTime": acquired or micro_time(now), "renewTime": micro_time(now),
                "leaseTransitions": transitions}

    def _attempt(self, now: float) -> bool:
        lease = self.kube.request("GET", self.path, missing_ok=True)
        if lease is None:
            created = self.kube.request(
                "POST", f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases",
                {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": self.name, "namespace": self.namespace},
                 "spec": self._spec(now, 0, None)}, conflict_ok=True)
            return created is not None
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = parse_time(spec.get("renewTime")) or 0.0
        duration = int(spec.get("leaseDurationSeconds") or self.duration)
        mine = holder == self.identity
        if not mine and holder and now < renewed + duration:
            return False  # someone else holds a live lease
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        acquired = spec.get("acquireTime") if mine else None
        updated = self.kube.request("PUT", self.path, {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace,
                         "resourceVersion": (lease.get("metadata") or {}).get(
                             "resourceVersion")},
            "spec": self._spec(now, transitions, acquired)}, conflict_ok=True)
        return updated is not None
