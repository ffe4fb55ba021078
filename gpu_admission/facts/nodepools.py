"""Node pools read from the nodes themselves: which GPU nodes share their cards, and how.

Why (issue 33): a policy with ``nodePools: []`` made the webhook treat every GPU as a
time-sliced one (caps on an 8-GPU JAX pod, a 16,000 MiB cap on a 15,360 MiB T4). The nodes
already say how their GPUs are shared: GPU Feature Discovery (GFD, part of the NVIDIA device
plugin) labels every GPU node (``internal/lm/resource.go`` of
https://github.com/NVIDIA/k8s-device-plugin; ``shared/reference/gpu-facts.md`` §5.3):

=================================== ===========================================================
``nvidia.com/gpu.product``          the model, ``-SHARED`` appended when replicas > 1 and the
                                    resource is not renamed; MIG single: ``<model>-MIG-<profile>``
``nvidia.com/gpu.memory``           memory of one GPU in **MiB** (``GetTotalMemoryMB`` returns
                                    NVML's bytes / 2**20); MIG: of one slice
``nvidia.com/gpu.replicas``         0 without a sharing config, else the configured replicas
``nvidia.com/gpu.sharing-strategy`` ``none`` | ``time-slicing`` | ``mps`` (none unless replicas > 1)
``nvidia.com/mig.strategy``         ``single`` | ``mixed``; mixed nodes carry
                                    ``nvidia.com/mig-<g>g.<N>gb.count``
=================================== ===========================================================

This module is pure (floor 1): Node objects in (plain dicts, from the webhook's watch cache,
:mod:`gpu_admission.kube.nodes`, or from ``evaluate``'s files), a :class:`NodeView` out, and
:func:`place` answers, for one pod, where it can land and what that means: caps sized from the
pool's card and replicas when every node it can land on shares its GPU (or when it shares by
default and is routed to a sharing pool), no caps otherwise. A node that a declared
``spec.nodePools`` entry selects belongs to that pool (the policy overrides); the other GFD
nodes form pools named after their labels (``gfd-<product>[-<strategy>-x<replicas>]``).
A node without GFD's product and memory labels is not a GPU node here.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gpu_admission.core.vocab import (
    CUDA_VERSION_LABEL,
    GFD_MEMORY,
    GFD_PRODUCT,
    GFD_REPLICAS,
    GFD_SHARING_STRATEGY,
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    SHARED_STRATEGIES,
    SHARED_SUFFIX,
)
from gpu_admission.facts.other_systems import HAMI, HAMI_NODE_ANNOTATIONS
from gpu_admission.policy.model import NodePool, Policy

#: GFD's MIG strategy label (``single`` | ``mixed``), GFD README.
GFD_MIG_STRATEGY: Final = "nvidia.com/mig.strategy"
_MIG_PRODUCT = "-MIG-"  # MIG single: product "<model>-MIG-<g>g.<N>gb" (resource.go)
_MIG_MIXED_COUNT = re.compile(r"^nvidia\.com/mig-[0-9]+g\.[0-9]+gb\.count$")
_NOT_DNS = re.compile(r"[^a-z0-9-]+")

#: What a decision says when it cannot use the nodes (docs/pools.md).
ASSUMED_POOLS: Final = ("assumed the policy's declared pools and defaults (spec.nodePools, "
                        "spec.memoryLimits)")
ASSUMED: Final = "no GPU nodes visible: " + ASSUMED_POOLS


@dataclass(frozen=True, slots=True)
class GpuNode:
    """One GPU node as the policy needs it: its labels, the GPU resources it can allocate
    (None: the object carried no ``status.allocatable``, so any), and its pool."""

    name: str
    labels: Mapping[str, str]
    resources: frozenset[str] | None
    pool: NodePool


@dataclass(frozen=True)
class NodeView:
    """The GPU nodes visible to the webhook, grouped into pools for one policy."""

    nodes: tuple[GpuNode, ...]
    pools: tuple[NodePool, ...]  # the pools nodes belong to: declared ones first, then GFD
    #: where the view comes from, for messages ("nodes from the watch", "nodes in the files")
    source: str = "nodes"
    #: other GPU-sharing systems the nodes show (HAMi's node annotations, sharing_systems)
    systems: frozenset[str] = frozenset()
    _memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def any_shared(self) -> bool:
        return any(p.shared for p in self.pools)

    @property
    def cuda_labelled(self) -> bool:
        """Whether some GPU node carries ``gpu-admission.io/cuda-version`` (CUDA routing
        to a node without it would leave the pod unschedulable)."""
        memo = self._memo.get("cuda")
        if memo is None:
            memo = self._memo["cuda"] = any(CUDA_VERSION_LABEL in n.labels for n in self.nodes)
        return bool(memo)


def _dns(text: str) -> str:
    name = _NOT_DNS.sub("-", text.lower()).strip("-")
    name = re.sub("-{2,}", "-", name) or "gpu"
    if len(name) > 63:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = name[:54].rstrip("-") + "-" + digest
    return name


def _int(value: Any) -> int | None:
    try:
        number = int(str(value).strip())
    except ValueError:
        return None
    return number


def _gpu_resources(node: Mapping[str, Any]) -> frozenset[str] | None:
    status = node.get("status")
    allocatable = status.get("allocatable") if isinstance(status, dict) else None
    if not isinstance(allocatable, dict):
        return None
    return frozenset(name for name, quantity in allocatable.items()
                     if isinstance(name, str) and (name.startswith((GPU_RESOURCE,
                                                                    MIG_RESOURCE_PREFIX)))
                     and str(quantity).strip() not in ("", "0"))


def gfd_pool(labels: Mapping[str, str]) -> NodePool | None:
    """The pool GFD's labels describe, or None when the node carries no usable GPU labels
    (no product, or no positive ``nvidia.com/gpu.memory`` in MiB)."""
    product = labels.get(GFD_PRODUCT)
    memory = _int(labels.get(GFD_MEMORY))
    if not product or memory is None or memory <= 0:
        return None
    strategy = labels.get(GFD_SHARING_STRATEGY, "none")
    replicas = _int(labels.get(GFD_REPLICAS)) or 0
    selector = {GFD_PRODUCT: product}
    if GFD_SHARING_STRATEGY in labels:
        selector[GFD_SHARING_STRATEGY] = strategy
    if strategy in SHARED_STRATEGIES and replicas > 1:
        selector[GFD_REPLICAS] = labels[GFD_REPLICAS]
        return NodePool.model_validate({
            "name": _dns(f"gfd-{product}-{strategy}-x{replicas}"), "nodeSelector": selector,
            "sharing": strategy, "replicasPerGPU": replicas, "memoryMiB": memory})
    mig = _MIG_PRODUCT in product or (labels.get(GFD_MIG_STRATEGY) == "mixed" and any(
        _MIG_MIXED_COUNT.match(key) for key in labels))
    return NodePool.model_validate({
        "name": _dns(f"gfd-{product}" + ("-mig" if mig and _MIG_PRODUCT not in product else "")),
        "nodeSelector": selector, "sharing": "mig" if mig else "none", "memoryMiB": memory})


def _selected(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def node_view(nodes: Iterable[Any], policy: Policy, source: str = "nodes") -> NodeView | None:
    """The GPU nodes of ``nodes`` (Node objects, plain dicts) grouped into pools: a node
    selected by a declared ``spec.nodePools`` entry belongs to the first such pool (the
    policy overrides what GFD says), any other node to the pool its GFD labels describe
    (two label sets that differ only in memory share one pool sized by the smaller card).
    None when no node is a GPU node and no other sharing system shows: the caller then
    assumes the policy's pools. (A HAMi cluster without GFD gives a view with no GPU nodes
    but ``systems`` set: pods are then sized as without nodes, HAMi's pods are HAMi's.)"""
    declared = policy.spec.node_pools
    found: list[GpuNode] = []
    gfd: dict[str, NodePool] = {}
    systems: set[str] = set()
    for node in nodes:
        if not isinstance(node, dict):
            continue
        meta = node.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        annotations = meta.get("annotations")
        if isinstance(annotations, dict) and any(a in annotations for a in HAMI_NODE_ANNOTATIONS):
            systems.add(HAMI)
        raw = meta.get("labels")
        labels = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        pool = next((p for p in declared if _selected(p.node_selector, labels)), None)
        if pool is None:
            pool = gfd_pool(labels)
            if pool is None:
                continue
            known = gfd.get(pool.name)
            if known is not None and known.memory_mib <= pool.memory_mib:
                pool = known
            gfd[pool.name] = pool
        found.append(GpuNode(str(meta.get("name", "")), labels, _gpu_resources(node), pool))
    if not found and not systems:
        return None
    # a smaller card seen later replaces the pool of the nodes before it
    found = [GpuNode(n.name, n.labels, n.resources, gfd.get(n.pool.name, n.pool))
             if n.pool.name in gfd else n for n in found]
    pools = [p for p in declared if any(n.pool is p for n in found)]
    pools.extend(sorted(gfd.values(), key=lambda p: p.name))
    return NodeView(tuple(found), tuple(pools), source, frozenset(systems))


# --- where a pod can land -------------------------------------------------------------------

def _expression_matches(expr: Mapping[str, Any], labels: Mapping[str, str], name: str,
                        key_field: bool = False) -> bool:
    """One ``NodeSelectorRequirement`` (operators In, NotIn, Exists, DoesNotExist, Gt, Lt:
    https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#NodeSelectorRequirement);
    ``key_field``: a ``matchFields`` entry (only ``metadata.name`` exists)."""
    key = expr.get("key")
    op = expr.get("operator")
    values = expr.get("values")
    values = [str(v) for v in values] if isinstance(values, list) else []
    if key_field:
        present, value = key == "metadata.name", name
    else:
        present = isinstance(key, str) and key in labels
        value = labels.get(key, "") if isinstance(key, str) else ""
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1:
        have, want = _int(value), _int(values[0])
        if have is None or want is None:
            return False
        return have > want if op == "Gt" else have < want
    return False


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    exprs = term.get("matchExpressions")
    fields = term.get("matchFields")
    exprs = exprs if isinstance(exprs, list) else []
    fields = fields if isinstance(fields, list) else []
    if not exprs and not fields:
        return False  # an empty term matches no node (NodeSelectorTerm docs)
    return (all(isinstance(e, dict) and _expression_matches(e, labels, name) for e in exprs)
            and all(isinstance(f, dict) and _expression_matches(f, labels, name, True)
                    for f in fields))


def can_land(node: GpuNode, selector: Mapping[str, Any],
             terms: Sequence[Mapping[str, Any]] | None, resources: frozenset[str]) -> bool:
    """Whether a pod with this nodeSelector, required node-affinity terms (None: none given;
    terms are ORed) and GPU resource names can be scheduled on ``node``, as far as labels and
    allocatable resources tell."""
    labels = node.labels
    for key, value in selector.items():
        if labels.get(key) != str(value):
            return False
    if terms is not None and not any(_term_matches(t, labels, node.name) for t in terms):
        return False
    return node.resources is None or resources <= node.resources


@dataclass(frozen=True, slots=True)
class Landing:
    """What :func:`place` found for one pod (nodes visible)."""

    pool: NodePool | None  # the pool whose card sizes the caps (shared) or the dedicated one
    share: bool  # the pod will share a card: memory caps, engine settings
    route: NodePool | None  # required node affinity to this pool's labels (routed to share)
    protect: bool  # required node affinity sharing-strategy NotIn [time-slicing, mps]
    note: str  # what the decision says about it


def _tightest(pools: Iterable[NodePool]) -> NodePool:
    return min(pools, key=lambda p: (p.memory_per_replica_mib, -p.replicas_per_gpu, p.name))


def place(view: NodeView, *, selector: Mapping[str, Any],
          terms: Sequence[Mapping[str, Any]] | None, resources: frozenset[str],
          shares_by_default: bool) -> Landing | None:
    """Where a GPU pod can land among the visible nodes, and whether it then shares a card:

    * every node it can land on shares its GPU (time-slicing, MPS): caps from the pool with
      the smallest share of them (never above any card it may get);
    * none does: a dedicated GPU (or MIG), no caps, no routing;
    * both: a pod that shares by default (one-GPU inference or notebook) is routed to the
      first sharing pool (node affinity to its labels) and capped from it; any other pod is
      kept off the sharing nodes (``sharing-strategy NotIn [time-slicing, mps]``).

    None when the pod can land on no visible GPU node (its selector names nodes not seen):
    the caller assumes the policy's pools, as without nodes.
    """
    key = (tuple(sorted((str(k), str(v)) for k, v in selector.items())), repr(terms),
           resources, shares_by_default)
    memo = view._memo.get("place")
    if memo is None:
        memo = view._memo["place"] = {}
    elif key in memo:
        return memo[key]  # type: ignore[no-any-return]
    landing = _place(view, selector, terms, resources, shares_by_default)
    if len(memo) > 4096:
        memo.clear()
    memo[key] = landing
    return landing


def _place(view: NodeView, selector: Mapping[str, Any],
           terms: Sequence[Mapping[str, Any]] | None, resources: frozenset[str],
           shares_by_default: bool) -> Landing | None:
    pools: list[NodePool] = []
    seen: set[int] = set()
    for node in view.nodes:
        if id(node.pool) not in seen and can_land(node, selector, terms, resources):
            seen.add(id(node.pool))
            pools.append(node.pool)
    if not pools:
        return None
    order = {p.name: i for i, p in enumerate(view.pools)}
    pools.sort(key=lambda p: order.get(p.name, len(order)))
    shared = [p for p in pools if p.shared]
    dedicated = [p for p in pools if not p.shared]
    names = ", ".join(p.name for p in pools)
    if not shared:
        return Landing(dedicated[0], False, None, False,
                       f"dedicated GPU: the nodes it can land on do not share GPUs ({names}; "
                       f"{view.source})")
    if not dedicated:
        pool = _tightest(shared)
        return Landing(pool, True, None, False,
                       f"shared GPU: pool {pool.name} ({pool.sharing}, {pool.replicas_per_gpu} "
                       f"per {pool.memory_mib} MiB card; {view.source})")
    if shares_by_default:
        pool = shared[0]
        return Landing(pool, True, pool, False,
                       f"routed to shared pool {pool.name} ({pool.sharing}, "
                       f"{pool.replicas_per_gpu} per {pool.memory_mib} MiB card; {view.source})")
    return Landing(dedicated[0], False, None, True,
                   f"dedicated GPU: kept off the sharing pools "
                   f"({', '.join(p.name for p in shared)}; {view.source})")


def pod_gpu_resources(names: Iterable[str]) -> frozenset[str]:
    """The GPU resource names a pod asks for, as node allocatable lists them (a
    ``.shared`` name as is; MIG and whole-GPU names as is)."""
    return frozenset(n for n in names if n == GPU_RESOURCE or n.endswith(SHARED_SUFFIX)
                     or n.startswith(MIG_RESOURCE_PREFIX))
