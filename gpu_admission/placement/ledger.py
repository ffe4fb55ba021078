"""The GPU-memory ledger of fractional pools: which GPU (by UUID, per node) has given how much
memory to which pod. PURE accounting, no I/O: the extender's watch cache
(:mod:`gpu_admission.extender.kubestate`) feeds it objects; bind asks it where a pod fits and
records what it hands out before the API shows it.

Where the numbers come from (the API is the truth, so a restarted or newly elected replica
rebuilds exactly this from one list of pods, ConfigMaps and nodes):

* a **fractional pod** (annotation :data:`~gpu_admission.core.vocab.GPU_MEMORY_ANNOTATION` = MiB,
  :data:`~gpu_admission.core.vocab.GPU_CONFIGMAP_ANNOTATION` = its ConfigMap) bound to a node and
  not terminated (phase ``Succeeded``/``Failed`` or deleted frees its memory) uses its MiB on
  the GPU its ConfigMap names: our label, owned by that pod's UID, key
  :data:`~gpu_admission.core.vocab.GPU_CONFIGMAP_KEY` = the UUID (bare, or the CDI name
  ``k8s.device-plugin.nvidia.com/gpu=<UUID>``);
* a **reservation pod** (label :data:`~gpu_admission.core.vocab.RESERVATION_LABEL`, in the install
  namespace) opens one GPU of its node: it holds one whole ``nvidia.com/gpu`` from the device
  plugin, and its annotation :data:`~gpu_admission.core.vocab.GPU_UUID_ANNOTATION` says which;
  until it says, the GPU is *opening* (identified by the reservation's name);
* **whole-GPU pods** hold ``nvidia.com/gpu`` devices; a node's whole GPUs still free =
  allocatable ``nvidia.com/gpu`` minus those and the reservations (KAI-Scheduler's
  reservation pattern, ``shared/reference/exact-gpu-placement.md`` §2).

Memory is MiB throughout. A bound fractional pod whose ConfigMap is missing or not ours is
counted as *unplaced* on its node (its GPU is unknown, so no card is charged; reported).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gpu_admission.core.quantity import integer_quantity
from gpu_admission.core.vocab import (
    GPU_CONFIGMAP_ANNOTATION,
    GPU_CONFIGMAP_KEY,
    GPU_MEMORY_ANNOTATION,
    GPU_RESOURCE,
    GPU_UUID_ANNOTATION,
    RESERVATION_LABEL,
)
from gpu_admission.facts.fractional import CDI_GPU_PREFIX

OPENING_PREFIX: Final = "opening:"  # GPU id of a reservation that has not published its UUID
TERMINATED: Final = frozenset({"Succeeded", "Failed"})

Key = tuple[str, str]  # (namespace, name)


def uuid_of(value: str) -> str:
    """The GPU UUID in a ``NVIDIA_VISIBLE_DEVICES`` value written by
    :func:`gpu_admission.facts.fractional.visible_devices_value`."""
    value = value.strip()
    return value.removeprefix(CDI_GPU_PREFIX)


def parse_mib(value: Any) -> int | None:
    """A positive integer MiB annotation value, else None."""
    if isinstance(value, str) and value.strip().isdigit() and int(value) > 0:
        return int(value)
    return None


def _whole(value: Any) -> int:
    """An integer extended-resource quantity (``nvidia.com/gpu`` is whole numbers); 0 when
    absent or not a whole quantity."""
    return max(0, integer_quantity(value) or 0)


def gpu_request(pod: Mapping[str, Any]) -> int:
    """Whole ``nvidia.com/gpu`` a pod holds: max(sum over app containers, max over init
    containers) of limits (else requests), as Kubernetes computes effective requests."""
    spec = pod.get("spec") or {}
    app = init = 0
    for kind in ("containers", "initContainers"):
        for c in spec.get(kind) or []:
            res = (c or {}).get("resources") or {}
            amount = _whole((res.get("limits") or {}).get(
                GPU_RESOURCE, (res.get("requests") or {}).get(GPU_RESOURCE, 0)))
            if kind == "initContainers":
                init = max(init, amount)
            else:
                app += amount
    return max(app, init)


@dataclass(frozen=True, slots=True)
class PodEntry:
    """What the ledger keeps of a pod that holds GPU capacity on a node."""

    namespace: str
    name: str
    uid: str
    node: str
    memory_mib: int = 0  # fractional: the share (MiB)
    configmap: str = ""  # fractional: its ConfigMap's name
    whole_gpus: int = 0  # whole nvidia.com/gpu held (reservation pods: 1)
    reservation: bool = False
    gpu_uuid: str = ""  # reservation: the UUID it published ("" while opening)
    created: str = ""  # reservation: metadata.creationTimestamp (RFC 3339)

    @property
    def key(self) -> Key:
        return self.namespace, self.name

    @property
    def fractional(self) -> bool:
        return self.memory_mib > 0 and bool(self.configmap)


def is_fractional_pod(pod: Mapping[str, Any]) -> bool:
    """A pod the webhook made fractional: both annotations, a valid MiB share."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return (parse_mib(annotations.get(GPU_MEMORY_ANNOTATION)) is not None
            and bool(annotations.get(GPU_CONFIGMAP_ANNOTATION)))


def pod_entry(pod: Mapping[str, Any], reservation_namespace: str) -> PodEntry | None:
    """The ledger's view of ``pod``, or None when it holds nothing on a node (not bound,
    terminated, or neither fractional, reservation nor GPU pod)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    phase = (pod.get("status") or {}).get("phase")
    if not node or phase in TERMINATED:
        return None
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    namespace, name, uid = (str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                            str(meta.get("uid") or ""))
    if labels.get(RESERVATION_LABEL) == "true" and namespace == reservation_namespace:
        return PodEntry(namespace, name, uid, str(node), whole_gpus=1, reservation=True,
                        gpu_uuid=str(annotations.get(GPU_UUID_ANNOTATION) or ""),
                        created=str(meta.get("creationTimestamp") or ""))
    mib = parse_mib(annotations.get(GPU_MEMORY_ANNOTATION))
    cm = annotations.get(GPU_CONFIGMAP_ANNOTATION)
    whole = gpu_request(pod)
    if mib is not None and isinstance(cm, str) and cm:
        return PodEntry(namespace, name, uid, str(node), memory_mib=mib, configmap=cm,
                        whole_gpus=whole)
    if whole:
        return PodEntry(namespace, name, uid, str(node), whole_gpus=whole)
    return None


@dataclass(frozen=True, slots=True)
class ConfigMapEntry:
    owner_uid: str  # the pod that owns it (ownerReferences, kind Pod)
    uuid: str  # the GPU it names ("" when the key is missing)


def configmap_entry(cm: Mapping[str, Any]) -> ConfigMapEntry:
    meta = cm.get("metadata") or {}
    owner = next((str(r.get("uid") or "") for r in meta.get("ownerReferences") or []
                  if isinstance(r, dict) and r.get("kind") == "Pod"), "")
    value = (cm.get("data") or {}).get(GPU_CONFIGMAP_KEY)
    return ConfigMapEntry(owner, uuid_of(value) if isinstance(value, str) else "")


@dataclass(frozen=True, slots=True)
class GpuState:
    """One open GPU of a node: memory given out (MiB) and by how many pods."""

    gpu_id: str  # the UUID, or OPENING_PREFIX + reservation pod name
    used_mib: int
    pods: int
    reservation: str = ""  # the reservation pod's name ("": none; fractional pods hold it)

    @property
    def uuid(self) -> str:
        return "" if self.gpu_id.startswith(OPENING_PREFIX) else self.gpu_id


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node's GPU accounting for fractional placement."""

    name: str
    allocatable_gpus: int  # nvidia.com/gpu allocatable (whole devices)
    whole_pod_gpus: int  # held by whole-GPU pods
    reservations: int  # held by reservation pods (incl. opening ones)
    open: tuple[GpuState, ...]  # sorted by gpu_id
    unplaced_mib: int = 0  # bound fractional pods whose GPU is unknown

    @property
    def orphans(self) -> int:
        """Open GPUs used by fractional pods without a reservation pod (its deletion raced
        their binding): the device plugin thinks they are free, so count them as taken."""
        return sum(1 for g in self.open if not g.reservation)

    @property
    def free_whole(self) -> int:
        return max(0, self.allocatable_gpus - self.whole_pod_gpus - self.reservations
                   - self.orphans)


@dataclass(frozen=True, slots=True)
class Assignment:
    """Memory bind has handed out but the watch may not show yet (MiB on a GPU)."""

    namespace: str
    name: str
    uid: str
    node: str
    gpu_id: str
    memory_mib: int


@dataclass
class Ledger:
    """The accounting; mutated only on the event loop (watch events, bind)."""

    reservation_namespace: str
    nodes: dict[str, int] = field(default_factory=dict)  # name -> allocatable nvidia.com/gpu
    node_labels: dict[str, Mapping[str, str]] = field(default_factory=dict)
    pods: dict[Key, PodEntry] = field(default_factory=dict)
    configmaps: dict[Key, ConfigMapEntry] = field(default_factory=dict)
    #: pod UID -> what bind handed out; dropped once the watch shows the pod placed, or gone
    assumed: dict[str, Assignment] = field(default_factory=dict)
    #: reservation pods bind created that the watch has not shown yet: name -> node
    opening: dict[str, str] = field(default_factory=dict)
    #: reservation pods being deleted (empty): still holding their GPU, no longer open
    closing: set[str] = field(default_factory=set)
    #: reservation name -> the UUID it published, learned from whichever comes first: the
    #: watch (its annotation) or the binder (:meth:`resolve`). Every GPU id is read through
    #: it (:meth:`gpu_id`), so ``opening:<reservation>`` and the UUID are one card from the
    #: first moment either is known (issue 36: a card shown empty beside its own shares)
    published: dict[str, str] = field(default_factory=dict)
    _by_node: dict[str, set[Key]] = field(default_factory=dict)
    #: ConfigMap key -> the keys of the bound pods naming it (a ConfigMap event touches
    #: those alone: no scan of every pod per event during a burst)
    _by_configmap: dict[Key, set[Key]] = field(default_factory=dict)
    _views: dict[str, NodeView] = field(default_factory=dict)
    #: nodes whose view changed since the placer last read them (``changed_all``: every
    #: node, after a relist): the extender's :class:`~gpu_admission.placement.fractional.Placer`
    #: re-reads only these rows (:meth:`take_changed`), not every node per request
    changed: set[str] = field(default_factory=set)
    changed_all: bool = False

    def _stale(self, node: str) -> None:
        self._views.pop(node, None)
        self.changed.add(node)

    def _stale_all(self) -> None:
        self._views.clear()
        self.changed_all = True

    def take_changed(self) -> set[str] | None:
        """The nodes changed since the last call (None: every node may have), and forget
        them: one reader (the extender's placer)."""
        out = None if self.changed_all else self.changed
        self.changed = set()
        self.changed_all = False
        return out

    # --- feeding (from the watch cache) ------------------------------------------------

    def set_node(self, node: Mapping[str, Any]) -> None:
        meta = node.get("metadata") or {}
        name = str(meta.get("name") or "")
        alloc = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, 0)
        self.nodes[name] = _whole(alloc)
        self.node_labels[name] = dict(meta.get("labels") or {})
        self._stale(name)

    def remove_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self.node_labels.pop(name, None)
        self._stale(name)

    def replace_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        self.nodes.clear()
        self.node_labels.clear()
        self._stale_all()
        for node in nodes:
            self.set_node(node)

    def set_pod(self, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        self._drop_pod(key)
        entry = pod_entry(pod, self.reservation_namespace)
        if entry is None:
            uid = str(meta.get("uid") or "")
            phase = (pod.get("status") or {}).get("phase")
            if phase in TERMINATED:
                self._forget_assumed(uid)
            return
        self.pods[key] = entry
        self._by_node.setdefault(entry.node, set()).add(key)
        if entry.configmap:
            self._by_configmap.setdefault((entry.namespace, entry.configmap), set()).add(key)
        self._stale(entry.node)
        if entry.reservation:
            self.opening.pop(entry.name, None)
            if entry.gpu_uuid:
                self._publish(entry.name, entry.gpu_uuid)
        elif entry.uid in self.assumed and self._placed(entry):
            self._forget_assumed(entry.uid)

    def remove_pod(self, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        self._drop_pod(key)
        if key[0] == self.reservation_namespace:
            self.closing.discard(key[1])
            if key[1] not in self.opening:
                self.published.pop(key[1], None)
        self._forget_assumed(str(meta.get("uid") or ""))

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        self.pods.clear()
        self._by_node.clear()
        self._by_configmap.clear()
        self._stale_all()
        for pod in pods:
            self.set_pod(pod)
        # forget reservations gone while the watch was away (none in flight)
        listed = {e.name for e in self.pods.values() if e.reservation}
        for name in [n for n in self.published if n not in listed and n not in self.opening]:
            del self.published[name]
        self.closing &= listed

    def set_configmap(self, cm: Mapping[str, Any]) -> None:
        meta = cm.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        self.configmaps[key] = configmap_entry(cm)
        self._touch_configmap(key)

    def remove_configmap(self, cm: Mapping[str, Any]) -> None:
        meta = cm.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        self.configmaps.pop(key, None)
        self._touch_configmap(key)

    def replace_configmaps(self, cms: Iterable[Mapping[str, Any]]) -> None:
        self.configmaps.clear()
        for cm in cms:
            meta = cm.get("metadata") or {}
            self.configmaps[(str(meta.get("namespace") or ""),
                             str(meta.get("name") or ""))] = configmap_entry(cm)
        self._stale_all()

    def _touch_configmap(self, key: Key) -> None:
        """A ConfigMap changes the view of the node its pod is on."""
        for pod_key in list(self._by_configmap.get(key, ())):
            entry = self.pods.get(pod_key)
            if entry is None:
                continue
            self._stale(entry.node)
            if entry.uid in self.assumed and self._placed(entry):
                self._forget_assumed(entry.uid)

    def _drop_pod(self, key: Key) -> None:
        old = self.pods.pop(key, None)
        if old is not None:
            self._by_node.get(old.node, set()).discard(key)
            if old.configmap:
                holders = self._by_configmap.get((old.namespace, old.configmap))
                if holders is not None:
                    holders.discard(key)
                    if not holders:
                        del self._by_configmap[(old.namespace, old.configmap)]
            self._stale(old.node)

    def _forget_assumed(self, uid: str) -> None:
        a = self.assumed.pop(uid, None)
        if a is not None:
            self._stale(a.node)

    def _placed(self, entry: PodEntry) -> bool:
        """The watch shows a fractional pod on its GPU (its own ConfigMap names one)."""
        cm = self.configmaps.get((entry.namespace, entry.configmap))
        return cm is not None and cm.owner_uid == entry.uid and bool(cm.uuid)

    # --- bind's own records ---------------------------------------------------------------

    def gpu_id(self, gpu_id: str) -> str:
        """The card's id as every reader must see it: ``opening:<reservation>`` becomes the
        UUID once the reservation has published one, by the watch or by :meth:`resolve`."""
        if gpu_id.startswith(OPENING_PREFIX):
            return self.published.get(gpu_id[len(OPENING_PREFIX):], gpu_id)
        return gpu_id

    def assume(self, assignment: Assignment) -> None:
        """Record what a bind hands out; counted by :meth:`view` at once (filter, prioritize
        and the next bind), until the watch shows the pod placed or the bind undoes it."""
        gpu_id = self.gpu_id(assignment.gpu_id)
        if gpu_id != assignment.gpu_id:
            assignment = Assignment(assignment.namespace, assignment.name, assignment.uid,
                                    assignment.node, gpu_id, assignment.memory_mib)
        self.assumed[assignment.uid] = assignment
        self._stale(assignment.node)

    def unassume(self, uid: str) -> None:
        self._forget_assumed(uid)

    def open_gpu(self, reservation: str, node: str) -> str:
        """Record a reservation pod bind is creating; its GPU id until it publishes a UUID."""
        self.opening[reservation] = node
        self._stale(node)
        return OPENING_PREFIX + reservation

    def resolve(self, reservation: str, uuid: str) -> None:
        """The binder learned that the reservation published ``uuid`` (idempotent: the
        watch may have told the ledger first, see :meth:`_publish`)."""
        self._publish(reservation, uuid)

    def _publish(self, reservation: str, uuid: str) -> None:
        """From now on ``opening:<reservation>`` is ``uuid``: move the shares assumed on the
        opening id, in the same step (no instant shows the card without them)."""
        self.published[reservation] = uuid
        old = OPENING_PREFIX + reservation
        node = self.opening.get(reservation)
        if node is not None:
            self._stale(node)
        for uid, a in list(self.assumed.items()):
            if a.gpu_id == old:
                self.assumed[uid] = Assignment(a.namespace, a.name, a.uid, a.node, uuid,
                                               a.memory_mib)
                self._stale(a.node)

    def close_opening(self, reservation: str) -> None:
        """A reservation that failed: forget it and every share assumed on it. It is also
        marked closing until the watch shows it deleted: a UUID it publishes late (its pod
        started while the binder gave up on it) must not offer its card again."""
        self.closing.add(reservation)
        node = self.opening.pop(reservation, None)
        old = self.gpu_id(OPENING_PREFIX + reservation)
        self.published.pop(reservation, None)
        for uid, a in list(self.assumed.items()):
            if a.gpu_id == old:
                self._forget_assumed(uid)
        if node is not None:
            self._stale(node)

    # --- reading ------------------------------------------------------------------------------

    def view(self, node: str) -> NodeView:
        cached = self._views.get(node)
        if cached is not None:
            return cached
        used: dict[str, list[int]] = {}  # gpu id -> [MiB, pods]
        holders: dict[str, str] = {}  # gpu id -> reservation name
        whole = reservations = unplaced = 0
        counted: set[str] = set()
        for key in self._by_node.get(node, ()):
            e = self.pods[key]
            if e.reservation:
                reservations += 1
                if e.name in self.closing:
                    continue  # being deleted: holds its GPU, takes no new pod
                gpu_id = e.gpu_uuid or self.gpu_id(OPENING_PREFIX + e.name)
                holders[gpu_id] = e.name
                used.setdefault(gpu_id, [0, 0])
                continue
            whole += e.whole_gpus
            if not e.fractional:
                continue
            cm = self.configmaps.get((e.namespace, e.configmap))
            if cm is not None and cm.owner_uid == e.uid and cm.uuid:
                gpu_id = cm.uuid
            elif e.uid in self.assumed:
                continue  # counted below from bind's record
            else:
                unplaced += e.memory_mib
                continue
            counted.add(e.uid)
            slot = used.setdefault(gpu_id, [0, 0])
            slot[0] += e.memory_mib
            slot[1] += 1
        for name, where in self.opening.items():
            gpu_id = self.gpu_id(OPENING_PREFIX + name)
            if where == node and gpu_id not in holders:
                reservations += 1
                holders[gpu_id] = name
                used.setdefault(gpu_id, [0, 0])
        for a in self.assumed.values():
            if a.node == node and a.uid not in counted:
                slot = used.setdefault(self.gpu_id(a.gpu_id), [0, 0])
                slot[0] += a.memory_mib
                slot[1] += 1
        view = NodeView(node, self.nodes.get(node, 0), whole, reservations,
                        tuple(GpuState(g, u[0], u[1], holders.get(g, ""))
                              for g, u in sorted(used.items())), unplaced)
        self._views[node] = view
        return view

    def usage(self) -> dict[str, dict[str, int]]:
        """node -> GPU UUID -> MiB given out (opening GPUs by their id); for tests and
        ``/readyz``. Equal ledgers rebuilt from the same API state compare equal."""
        out: dict[str, dict[str, int]] = {}
        for node in sorted(set(self._by_node) | {a.node for a in self.assumed.values()}
                           | set(self.opening.values())):
            gpus = {g.gpu_id: g.used_mib for g in self.view(node).open}
            if gpus:
                out[node] = gpus
        return out

    def close(self, reservation: str) -> None:
        """Mark an empty reservation as being deleted: no GPU choice sees it open again."""
        self.closing.add(reservation)
        for e in self.pods.values():
            if e.reservation and e.name == reservation:
                self._stale(e.node)

    def empty_reservations(self) -> list[PodEntry]:
        """Reservation pods (seen by the watch) whose GPU no fractional pod uses and no bind
        is handing out: candidates for deletion."""
        out = []
        for e in self.pods.values():
            if not e.reservation or e.name in self.closing:
                continue
            gpu_id = e.gpu_uuid or self.gpu_id(OPENING_PREFIX + e.name)
            state = next((g for g in self.view(e.node).open if g.gpu_id == gpu_id), None)
            if state is None or state.pods == 0:
                out.append(e)
        return out
