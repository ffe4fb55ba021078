"""Nodes and pods for ``gpu-admission simulate``, read from Alibaba's openb CSVs or from
Kubernetes Node and Pod objects. PURE: text or dicts in, :class:`NodeSpec`/:class:`PodSpec`
out; bad input raises :class:`TraceError` naming the row (or object) and the field.

openb (``alibaba/clusterdata`` ``cluster-trace-gpu-v2023``): nodes ``sn, cpu_milli,
memory_mib, gpu, model``; pods ``name, cpu_milli, memory_mib, num_gpu, gpu_milli`` and
optionally ``gpu_spec`` (other columns ignored). A pod with ``num_gpu`` 1 and ``gpu_milli``
< 1000 asks a share of one card of any model (the trace's pods carry no labels: the built-in
policy makes such a pod fractional, as one that asks with ``gpu-admission.io/gpu-memory``);
``gpu_milli`` 1000 asks ``num_gpu`` whole cards; ``gpu_spec`` lists the models allowed, joined
by ``|`` (absent or empty: any model).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpu_admission.core.quantity import integer_quantity, quantity_mib, quantity_value
from gpu_admission.core.vocab import GPU_MEMORY_ANNOTATION, GPU_RESOURCE
from gpu_admission.placement.frag import MILLI, Shape

NODE_COLUMNS: Final = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
#: ``gpu_spec`` may be left out (the openb ``multigpu*`` traces have no such column): any model
POD_COLUMNS: Final = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
MODEL_LABEL: Final = "nvidia.com/gpu.product"  # GFD
CARD_MEMORY_LABEL: Final = "nvidia.com/gpu.memory"  # GFD, MiB


class TraceError(ValueError):
    """Input the simulator cannot use; the message names the row and the field."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    cpu_milli: int
    mem_mib: int
    gpus: int
    model: str  # "" without GPUs


@dataclass(frozen=True, slots=True)
class PodSpec:
    name: str
    shape: Shape

    @property
    def kind(self) -> str:
        """cpu, share, 1-gpu, multi-gpu (the failed-pod and workload report's classes)."""
        s = self.shape
        if s.gpus == 0:
            return "cpu"
        if s.gpu_milli < MILLI:
            return "share"
        return "1-gpu" if s.gpus == 1 else "multi-gpu"


def _rows(text: str, columns: Sequence[str], what: str) -> Iterable[tuple[int, dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    missing = [c for c in columns if c not in header]
    if missing:
        raise TraceError(f"{what} row 1 (header): missing column {', '.join(missing)} "
                         f"(expected {', '.join(columns)}; got {', '.join(header) or 'none'})")
    yield from enumerate(reader, start=2)  # row 1 is the header


def _int(row: Mapping[str, str], field: str, where: str, *, low: int = 0) -> int:
    raw = (row.get(field) or "").strip()
    try:
        value = int(raw)
    except ValueError:
        raise TraceError(f"{where}, field {field}: expected an integer, got {raw!r}") from None
    if value < low:
        raise TraceError(f"{where}, field {field}: expected an integer >= {low}, got {value}")
    return value


def openb_nodes(text: str, what: str = "nodes") -> list[NodeSpec]:
    out = []
    seen: set[str] = set()
    for i, row in _rows(text, NODE_COLUMNS, what):
        where = f"{what} row {i}"
        name = (row.get("sn") or "").strip()
        if not name:
            raise TraceError(f"{where}, field sn: expected a node name, got ''")
        if name in seen:
            raise TraceError(f"{where}, field sn: node {name!r} listed twice")
        seen.add(name)
        gpus = _int(row, "gpu", where)
        model = (row.get("model") or "").strip()
        if model and gpus == 0:
            raise TraceError(f"{where}, field gpu: node {name} of GPU model {model} (its "
                             f"fractional pool) has no GPUs")
        if gpus and not model:
            raise TraceError(f"{where}, field model: node {name} has {gpus} GPUs but no "
                             f"model")
        out.append(NodeSpec(name, _int(row, "cpu_milli", where, low=1),
                            _int(row, "memory_mib", where, low=1), gpus, model))
    if not out:
        raise TraceError(f"{what}: no nodes")
    return out


def openb_pods(text: str, what: str = "pods") -> list[PodSpec]:
    out = []
    for i, row in _rows(text, POD_COLUMNS, what):
        where = f"{what} row {i}"
        name = (row.get("name") or "").strip()
        if not name:
            raise TraceError(f"{where}, field name: expected a pod name, got ''")
        num = _int(row, "num_gpu", where)
        milli = _int(row, "gpu_milli", where)
        if num == 0 and milli:
            raise TraceError(f"{where}, field gpu_milli: {milli} milli-GPU with num_gpu 0")
        if num and not 0 < milli <= MILLI:
            raise TraceError(f"{where}, field gpu_milli: pod {name} asks {milli} milli-GPU "
                             f"of one card (a card has {MILLI}; more than one card is "
                             f"num_gpu > 1 with gpu_milli {MILLI})")
        if num > 1 and milli < MILLI:
            raise TraceError(f"{where}, field gpu_milli: pod {name} asks {num} shares of "
                             f"{milli} milli-GPU (a share is of one card: num_gpu 1)")
        spec = (row.get("gpu_spec") or "").strip()
        models = tuple(sorted(m for m in spec.split("|") if m)) if spec else ()
        out.append(PodSpec(name, Shape(_int(row, "cpu_milli", where),
                                       _int(row, "memory_mib", where), milli if num else 0,
                                       num, models)))
    return out


# --- Kubernetes objects -------------------------------------------------------------------------

def _items(objects: Iterable[Any]) -> Iterable[Mapping[str, Any]]:
    for obj in objects:
        if isinstance(obj, dict) and obj.get("kind", "").endswith("List"):
            yield from (i for i in obj.get("items") or [] if isinstance(i, dict))
        elif isinstance(obj, dict):
            yield obj


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def k8s_objects(objects: Iterable[Any], card_mib: Mapping[str, int],
                selectors: Mapping[str, Mapping[str, str]] | None = None
                ) -> tuple[list[NodeSpec], list[PodSpec]]:
    """Nodes (allocatable cpu, memory, ``nvidia.com/gpu``; model from GFD's
    ``nvidia.com/gpu.product``) and pods (requests summed over app containers, max with init
    containers; ``gpu-admission.io/gpu-memory`` MiB -> milli-GPU of ``card_mib[model]``, or
    of the node label ``nvidia.com/gpu.memory``). Pods that are bound keep their order;
    the protocol replays them all. ``selectors``: fractional pool -> nodeSelector; a node a
    pool selects must have GPUs."""
    nodes: list[NodeSpec] = []
    pods: list[tuple[str, Mapping[str, Any]]] = []
    for obj in _items(objects):
        kind = obj.get("kind")
        if kind == "Node":
            node = _k8s_node(obj, card_mib)
            labels = (obj.get("metadata") or {}).get("labels") or {}
            for pool, sel in (selectors or {}).items():
                if node.gpus == 0 and all(labels.get(k) == v for k, v in sel.items()):
                    raise TraceError(f"Node {node.name}, field status.allocatable"
                                     f"[{GPU_RESOURCE}]: the node is in fractional pool "
                                     f"{pool} (nodeSelector {dict(sel)}) but has no GPUs")
            nodes.append(node)
        elif kind == "Pod":
            pods.append((_name(obj), obj))
    if not nodes:
        raise TraceError("nodes: no Node objects (kubectl get nodes -o yaml)")
    cards = dict(card_mib)
    for n in nodes:
        cards.setdefault(n.model, 0)
    sizes = {m: v for m, v in cards.items() if v > 0}
    return nodes, [_k8s_pod(name, p, sizes) for name, p in pods]


def _k8s_node(obj: Mapping[str, Any], card_mib: Mapping[str, int]) -> NodeSpec:
    name = _name(obj)
    alloc = (obj.get("status") or {}).get("allocatable") or {}
    labels = (obj.get("metadata") or {}).get("labels") or {}
    cpu = quantity_value(alloc.get("cpu"))
    mem = quantity_mib(alloc.get("memory"))
    if cpu is None:
        raise TraceError(f"Node {name}, field status.allocatable.cpu: expected a quantity, "
                         f"got {alloc.get('cpu')!r}")
    if mem is None:
        raise TraceError(f"Node {name}, field status.allocatable.memory: expected a "
                         f"quantity, got {alloc.get('memory')!r}")
    gpus = integer_quantity(alloc.get(GPU_RESOURCE, 0)) or 0
    model = str(labels.get(MODEL_LABEL) or "") if gpus else ""
    if gpus and not model:
        model = "gpu"
    return NodeSpec(name, int(cpu * 1000), mem, gpus, model)


def _k8s_pod(name: str, obj: Mapping[str, Any], card_mib: Mapping[str, int]) -> PodSpec:
    spec = obj.get("spec") or {}
    app = [0, 0, 0]
    init = [0, 0, 0]
    for kind, acc in (("containers", app), ("initContainers", init)):
        for c in spec.get(kind) or []:
            res = (c or {}).get("resources") or {}
            req = {**(res.get("limits") or {}), **(res.get("requests") or {})}
            cpu = quantity_value(req.get("cpu", 0))
            mem = quantity_mib(req.get("memory", 0))
            gpu = integer_quantity(req.get(GPU_RESOURCE, 0))
            if cpu is None or mem is None or gpu is None:
                raise TraceError(f"Pod {name}, field spec.{kind}.resources: expected "
                                 f"quantities for cpu, memory, {GPU_RESOURCE}")
            vals = (int(cpu * 1000), mem, gpu)
            for j, v in enumerate(vals):
                acc[j] = acc[j] + v if kind == "containers" else max(acc[j], v)
    cpu_m, mem_m, gpus = (max(a, b) for a, b in zip(app, init, strict=True))
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    share = annotations.get(GPU_MEMORY_ANNOTATION)
    if share is not None:
        if not str(share).strip().isdigit() or int(share) <= 0:
            raise TraceError(f"Pod {name}, field metadata.annotations"
                             f"[{GPU_MEMORY_ANNOTATION}]: expected a positive integer "
                             f"(MiB), got {share!r}")
        if len(set(card_mib.values())) != 1:
            raise TraceError(f"Pod {name}, field metadata.annotations"
                             f"[{GPU_MEMORY_ANNOTATION}]: a share in MiB needs one card "
                             f"size (the policy's fractional nodePools[].memoryMiB), got "
                             f"{sorted(set(card_mib.values())) or 'none'}")
        card = next(iter(card_mib.values()))
        milli = -(-int(share) * MILLI // card)
        if milli > MILLI:
            raise TraceError(f"Pod {name}, field metadata.annotations"
                             f"[{GPU_MEMORY_ANNOTATION}]: {share} MiB is more than one "
                             f"card ({card} MiB)")
        return PodSpec(name, Shape(cpu_m, mem_m, milli, 1))
    return PodSpec(name, Shape(cpu_m, mem_m, MILLI if gpus else 0, gpus))
