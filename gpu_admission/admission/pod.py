"""The facts about a pod, gathered once (:func:`gather`) before any rule judges them.

A review flows one way: the wire (``server/wire.py``, or ``evaluate``'s files) hands the engine
a pod dict and the request; :func:`gather` reads, once and in this order, what the rules need
to know about it -- its GPU containers (device plugin, DRA claims, another sharing system's
share), its workload class, its CUDA version, whether it is exempt, the node pool it lands in
(declared pools, or the visible nodes), its fractional plan and why it targets a shared GPU --
into a frozen :class:`PodFacts`; the engine (:mod:`gpu_admission.admission.engine`) then runs
the rules on them, writes the patch and returns the decision. Nothing here judges, and nothing
here calls back into the engine.

The same readings serve the other faces: the scheduler extender and reclaim
(:func:`analyse_gpu_pod`), the DRA claim rules (:func:`classify`, :func:`exemption`),
``images scan`` (:func:`gpu_containers`). Pure, no I/O; the pod is read, never modified.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from gpu_admission.core.cuda import normalize_version
from gpu_admission.core.decision import RequestFacts
from gpu_admission.core.patch import REQUIRED
from gpu_admission.core.vocab import (
    CUDA_VERSION_LABEL,
    GFD_PRODUCT,
    GFD_SHARING_STRATEGY,
    GPU_MEMORY_ANNOTATION,
    GPU_MEMORY_RESOURCE,
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    SHARED_PRODUCT_SUFFIX,
    SHARED_STRATEGIES,
    SHARED_SUFFIX,
    WORKLOAD_CLASSES,
    WORKLOAD_LABEL,
)
from gpu_admission.dra.analysis import (
    DEVICECLASS_RESOURCE_PREFIX,
    DraPod,
    analyze_pod,
    notable_extended,
)
from gpu_admission.dra.model import DraSnapshot
from gpu_admission.facts.fractional import ANNOTATION_PATH, NOT_FRACTIONAL, Fraction, Plan
from gpu_admission.facts.fractional import plan as fraction_plan
from gpu_admission.facts.nodepools import (
    ASSUMED,
    ASSUMED_POOLS,
    Landing,
    NodeView,
    place,
    pod_gpu_resources,
)
from gpu_admission.facts.other_systems import (
    HAMI_RESOURCES,
    KAI_ANNOTATIONS,
    OtherGpu,
    found_systems,
)
from gpu_admission.facts.other_systems import analyse as analyse_other
from gpu_admission.policy.model import Compiled, NodePool, Policy
from gpu_admission.rules import GpuContainer

#: What :func:`gather` found the pod to be: what the engine does with it.
GPU: Final = "gpu"  # GPU containers (device plugin, DRA or another system): every rule
DRA_UNRESOLVED: Final = "dra-unresolved"  # its only GPU is behind DRA references not known
NO_GPU: Final = "no-gpu"  # no GPU container: the GPU-access guard (and other systems' rule)

#: Owners whose GPU pods are batch jobs (spec.classification.batchJobWorkload): a batch/v1
#: Job (CronJobs create Jobs) and a Volcano Job.
BATCH_JOB_API_VERSIONS: Final = ("batch/v1", "batch.volcano.sh/v1alpha1")
_FULL_GPU_RESOURCES = frozenset({GPU_RESOURCE, GPU_RESOURCE + SHARED_SUFFIX})
_EMPTY: Mapping[str, Any] = {}


def is_gpu_resource(name: str) -> bool:
    """``nvidia.com/gpu``, ``nvidia.com/gpu.shared``, ``nvidia.com/mig-<g>g.<N>gb[.shared]``.
    (A fractional GPU's ``gpu-admission.io/gpu-memory`` counts only under a policy with a
    fractional pool: :func:`gpu_containers`.)"""
    return name in _FULL_GPU_RESOURCES or name.startswith(MIG_RESOURCE_PREFIX)


def _zero(quantity: Any) -> bool:
    if quantity.__class__ is int:  # the common case (JSON numbers): no string work
        return bool(quantity == 0)
    return quantity == 0 or (isinstance(quantity, str) and quantity.strip() in {"0", ""})


def has_fractional_pools(policy: Policy) -> bool:
    """Whether the policy has a ``sharing: fractional`` pool. Without one, fractional GPUs
    do not exist for the engine: ``gpu-admission.io/gpu-memory`` (annotation or resource)
    means nothing, exactly as for the compiled policies, which refuse fractional pools.
    Computed once per policy (``Compiled.fractional``): this is asked on every review."""
    return policy.compiled.fractional


def gpu_containers(spec: Mapping[str, Any], fractional: bool = False) -> list[GpuContainer]:
    """Containers and init containers that request or limit a GPU resource; with
    ``fractional`` (the policy has a fractional pool, :func:`has_fractional_pools`) also
    ``gpu-admission.io/gpu-memory``, a fractional GPU's share.

    Ephemeral containers cannot have resources (Kubernetes API: "Resources are not allowed
    for ephemeral containers") and are ignored.
    """
    return _scan(spec, fractional, None)[0]


def _scan(spec: Mapping[str, Any], fractional: bool,
          extended: frozenset[str] | None) -> tuple[list[GpuContainer], bool, bool]:
    """:func:`gpu_containers`, and from the same pass over every container's resource names
    what the per-pod pre-checks ask (each was a pass of its own, ~1.3 µs a review):

    * whether a limit asks for DRA (``dra.analysis.needs_analysis``, less its
      ``resourceClaims`` test: a DeviceClass-backed extended resource, or one of the
      ``extended`` names the cluster's DRA classes make notable);
    * whether a request or limit names a HAMi resource (with KAI's pod annotations, which
      :func:`gather` tests, the cheap test for another sharing system's pod).
    """
    out: list[GpuContainer] = []
    dra = hami = False
    for kind in ("containers", "initContainers"):
        items = spec.get(kind)
        if not isinstance(items, list):
            continue
        for index, container in enumerate(items):
            if not isinstance(container, dict):
                continue
            resources = container.get("resources")
            if not isinstance(resources, dict):
                continue
            found: dict[str, Any] | None = None
            # requests first so limits win when both name the resource (limits set the
            # allocation for extended resources; requests must equal them if both are given)
            for key in ("requests", "limits"):
                values = resources.get(key)
                if not isinstance(values, dict):
                    continue
                for name, quantity in values.items():
                    # is_gpu_resource, inlined: this loop sees every resource of every container
                    if ((name in _FULL_GPU_RESOURCES or (name.__class__ is str and name.startswith(
                            MIG_RESOURCE_PREFIX)) or (fractional and name == GPU_MEMORY_RESOURCE))
                            and not _zero(quantity)):
                        if found is None:
                            found = {}
                        found[name] = quantity
                    if name in _HAMI_KEYS:
                        hami = True
                    if key == "limits" and name.__class__ is str and (
                            name.startswith(DEVICECLASS_RESOURCE_PREFIX)
                            or (extended and name in extended)):
                        dra = True
            if found:
                shared = mig = False
                for name in found:
                    shared = shared or name.endswith(SHARED_SUFFIX)
                    mig = mig or name.startswith(MIG_RESOURCE_PREFIX)
                out.append(GpuContainer(kind, index, container, found, shared=shared, mig=mig,
                                        fractional=GPU_MEMORY_RESOURCE in found))
    return out, dra, hami


def classify(meta: Mapping[str, Any], labels: Mapping[str, Any],
             compiled: Compiled, default: str,
             spec: Mapping[str, Any] | None = None) -> tuple[str, str, str | None]:
    """(class, reason, invalid label value) -- label, then training owner/labels, notebook
    labels, a notebook image (``classification.notebookImages``: a container of ``spec``
    whose image starts with one), then a batch/v1 Job owner
    (``spec.classification.batchJobWorkload``), then the default."""
    bad: str | None = None
    value = labels.get(WORKLOAD_LABEL)
    if value is not None:
        if value in WORKLOAD_CLASSES:
            return str(value), f"label {WORKLOAD_LABEL}", None
        bad = str(value)
    owners = meta.get("ownerReferences")
    if isinstance(owners, list):
        for ref in owners:
            kind = ref.get("kind") if isinstance(ref, dict) else None
            if isinstance(kind, str) and kind in compiled.training_kinds:
                return "training", f"owner {kind}/{ref.get('name', '')}", bad
    for key in labels:
        if isinstance(key, str) and key.startswith(compiled.training_prefixes):
            return "training", f"label {key}", bad
    for key in compiled.notebook_labels:
        if key in labels:
            return "notebook", f"label {key}", bad
    if spec is not None and compiled.notebook_images:
        containers = spec.get("containers")
        for container in containers if isinstance(containers, list) else ():
            image = container.get("image") if isinstance(container, dict) else None
            if isinstance(image, str) and image.startswith(compiled.notebook_images):
                return "notebook", f"image {image}", bad
    if compiled.batch_job_workload is not None and isinstance(owners, list):
        for ref in owners:
            if (isinstance(ref, dict) and ref.get("kind") == "Job"
                    and ref.get("apiVersion") in BATCH_JOB_API_VERSIONS):
                return (compiled.batch_job_workload,
                        f"owner Job/{ref.get('name', '')} (classification.batchJobWorkload)",
                        bad)
    return default, "default", bad


def _terms(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    affinity = spec.get("affinity")
    if not isinstance(affinity, dict):
        return []
    node_affinity = affinity.get("nodeAffinity")
    if not isinstance(node_affinity, dict):
        return []
    required = node_affinity.get(REQUIRED)
    if not isinstance(required, dict):
        return []
    terms = required.get("nodeSelectorTerms")
    return [t for t in terms if isinstance(t, dict)] if isinstance(terms, list) else []


def _term_in(term: Mapping[str, Any]) -> dict[str, set[str]]:
    """``In`` constraints of one term: key -> allowed values."""
    out: dict[str, set[str]] = {}
    exprs = term.get("matchExpressions")
    if isinstance(exprs, list):
        for expr in exprs:
            if (isinstance(expr, dict) and expr.get("operator") == "In"
                    and isinstance(expr.get("key"), str) and isinstance(expr.get("values"), list)):
                out.setdefault(expr["key"], set()).update(str(v) for v in expr["values"])
    return out


def _find_pool(compiled: Compiled, own: Mapping[str, Any], routed: Mapping[str, Any],
               terms_in: list[dict[str, set[str]]]) -> NodePool | None:
    """The pool the pod lands in (first match in policy order, in three passes):

    1. a pool chosen explicitly: its nodeSelector has a label other than the CUDA label and
       all its labels are in the pod's own nodeSelector;
    2. a pool all of whose labels are ``In`` requirements of every required affinity term;
    3. a pool all of whose labels are in the nodeSelector after CUDA routing.

    The pod's explicit choice wins over our routing, and the answer is the same for the pod
    and for its patched self (idempotence): the routing label only ever decides in pass 3.
    """
    # Plain loops with for/else: this runs for every GPU pod and a generator per pool and
    # pass cost more than the comparisons themselves.
    for pool, items in compiled.explicit_pools:
        for key, value in items:
            if own.get(key) != value:
                break
        else:
            return pool
    if terms_in:
        for pool, items in compiled.pool_selectors:
            if all(all(v in t.get(k, ()) for k, v in items) for t in terms_in):
                return pool
    for pool, items in compiled.pool_selectors:
        for key, value in items:
            if routed.get(key) != value:
                break
        else:
            return pool
    return None


def _shared_reasons(gcs: list[GpuContainer], selector: Mapping[str, Any],
                    terms_in: list[dict[str, set[str]]],
                    pool: NodePool | None, plan: Plan) -> list[tuple[str, str]]:
    reasons: list[tuple[str, str]] = []
    for gc in gcs:
        if gc.shared:
            name = next(n for n in gc.resources if n.endswith(SHARED_SUFFIX))
            reasons.append((f"{gc.path}.resources", f"resource {name}"))
    strategy = selector.get(GFD_SHARING_STRATEGY)
    if strategy in SHARED_STRATEGIES:
        reasons.append((f"spec.nodeSelector[{GFD_SHARING_STRATEGY}]",
                        f"{GFD_SHARING_STRATEGY}={strategy}"))
    product = selector.get(GFD_PRODUCT)
    if isinstance(product, str) and product.endswith(SHARED_PRODUCT_SUFFIX):
        reasons.append((f"spec.nodeSelector[{GFD_PRODUCT}]", f"product {product}"))
    for index, term in enumerate(terms_in):
        strategies = term.get(GFD_SHARING_STRATEGY, set()) & set(SHARED_STRATEGIES)
        products = {p for p in term.get(GFD_PRODUCT, ()) if p.endswith(SHARED_PRODUCT_SUFFIX)}
        if strategies or products:
            what = ", ".join(sorted(strategies | products))
            reasons.append((f"spec.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms[{index}]",
                            f"node affinity {what}"))
    if pool is not None and pool.shared:
        reasons.append(("spec.nodeSelector", f"pool {pool.name} is {pool.sharing}"))
    if plan.explicit:
        reasons.append((ANNOTATION_PATH, f"a GPU fraction ({GPU_MEMORY_ANNOTATION})"))
    return reasons


def _cuda(labels: Mapping[str, Any], gcs: list[GpuContainer],
          image_cuda: Callable[[str], str | None]
          ) -> tuple[str | None, str, dict[str, list[str]], str | None]:
    """(version, source, conflicts, invalid label) -- pod label first, then GPU images
    (``image_cuda``: the policy's ``cudaRouting.images``, then the built-in rules)."""
    label = labels.get(CUDA_VERSION_LABEL)
    invalid: str | None = None
    if label is not None:
        version = normalize_version(str(label))
        if version is not None:
            return version, f"label {CUDA_VERSION_LABEL}", {}, None
        invalid = str(label)
    seen: dict[str, list[str]] = {}
    source = ""
    for gc in gcs:
        image = gc.container.get("image")
        version = image_cuda(image) if isinstance(image, str) else None
        if version is not None:
            if version not in seen:
                source = f"image {image} ({gc.path})"
            seen.setdefault(version, []).append(gc.path)
    if len(seen) == 1:
        return next(iter(seen)), source, {}, invalid
    if len(seen) > 1:
        return None, "", seen, invalid
    return None, "", {}, invalid


def exemption(facts: RequestFacts, compiled: Compiled) -> str:
    """Why the request is exempt (``namespace X``, ``user X``, ``group X``), "" when it is not;
    public because the DRA claim rules (:mod:`gpu_admission.admission.claims`) exempt alike."""
    if facts.namespace in compiled.exempt_namespaces:
        return f"namespace {facts.namespace}"
    if facts.user and facts.user in compiled.exempt_users:
        return f"user {facts.user}"
    for group in facts.groups:
        if group in compiled.exempt_groups:
            return f"group {group}"
    return ""


def _routed(node_selector: Mapping[str, Any], cuda_version: str | None, workload: str,
            policy: Policy) -> dict[str, Any]:
    """The pod's nodeSelector after CUDA routing (rule ``cuda-version-conflict`` adds the
    label; training pods are not routed)."""
    routed = dict(node_selector)
    if (cuda_version is not None and workload != "training"
            and policy.spec.cuda_routing.node_selector and CUDA_VERSION_LABEL not in routed):
        routed[CUDA_VERSION_LABEL] = cuda_version
    return routed


@dataclass(frozen=True, slots=True)
class GpuPod:
    """A GPU pod as the policy sees it: what the scheduler extender needs (GPU containers,
    workload class, node pool, MIG), read by the same functions as :func:`gather`."""

    containers: tuple[GpuContainer, ...]
    workload: str
    pool: NodePool | None
    mig: bool
    # a fractional pod (gpu_admission.facts.fractional): its share and recorded ConfigMap
    fraction: Fraction | None = None


def analyse_gpu_pod(pod: Mapping[str, Any], policy: Policy) -> GpuPod | None:
    """The policy's view of ``pod`` for placement, or None for a pod without GPU resources.
    Pure. Exemptions do not matter here: an exempt pod still uses a GPU."""
    spec = pod.get("spec") if isinstance(pod, dict) else None
    if not isinstance(spec, dict):
        return None
    gcs = gpu_containers(spec, has_fractional_pools(policy))
    if not gcs:
        return None
    compiled = policy.compiled
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, dict) else _EMPTY
    labels = meta.get("labels")
    labels = labels if isinstance(labels, dict) else _EMPTY
    workload, _, _ = classify(meta, labels, compiled,
                              policy.spec.classification.default_workload, spec)
    cuda_version = _cuda(labels, gcs, compiled.image_cuda)[0]
    node_selector = spec.get("nodeSelector")
    node_selector = node_selector if isinstance(node_selector, dict) else _EMPTY
    routed = _routed(node_selector, cuda_version, workload, policy)
    terms_in = [_term_in(t) for t in _terms(spec)]
    pool = _find_pool(compiled, node_selector, routed, terms_in) if compiled.pools else None
    mig = any(gc.mig for gc in gcs) or (pool is not None and pool.sharing == "mig")
    plan = _fraction_plan(pod, meta, gcs, workload=workload, mig=mig, dra=False, pool=pool,
                          policy=policy, uid="") if has_fractional_pools(policy) else NOT_FRACTIONAL
    return GpuPod(tuple(gcs), workload, pool, mig, plan.fraction)


def _fraction_plan(pod: Mapping[str, Any], meta: Mapping[str, Any], gcs: list[GpuContainer],
                   *, workload: str, mig: bool, dra: bool, pool: NodePool | None,
                   policy: Policy, uid: str) -> Plan:
    """:func:`gpu_admission.facts.fractional.plan` for pods that may be fractional (a fractional
    pool, the annotation or the extended resource); the others skip the work."""
    annotations = meta.get("annotations")
    if not ((pool is not None and pool.fractional) or any(gc.fractional for gc in gcs)
            or (isinstance(annotations, dict) and GPU_MEMORY_ANNOTATION in annotations)):
        return NOT_FRACTIONAL
    app = init = 0
    for gc in gcs:
        if gc.kind == "initContainers":
            init = max(init, gc.gpu_count)
        else:
            app += gc.gpu_count
    return fraction_plan(pod, [(gc.path, gc.container) for gc in gcs], gpus=max(app, init),
                         workload=workload, mig=mig, dra=dra, pool=pool, policy=policy, uid=uid)


def _assumed_pool(pool: NodePool | None) -> str:
    return (f"; pool {pool.name} ({pool.sharing})" if pool is not None
            else "; no declared pool selected: spec.memoryLimits defaults")


def _landing(nodes: NodeView, policy: Policy, spec: Mapping[str, Any],
             node_selector: Mapping[str, Any], gcs: list[GpuContainer], *, workload: str,
             mig: bool) -> Landing | None:
    """:func:`gpu_admission.facts.nodepools.place` for this pod: whether it shares a card by
    default (``spec.defaultSharing``: its class, at most ``maxGPUs`` GPUs, not MIG)."""
    app = init = 0
    names: set[str] = set()
    for gc in gcs:
        names.update(gc.resources)
        if gc.kind == "initContainers":
            init = max(init, gc.gpu_count)
        else:
            app += gc.gpu_count
    defaults = policy.spec.default_sharing
    by_default = (workload in defaults.workloads and max(app, init) <= defaults.max_gpus
                  and not mig)
    terms = _terms(spec)
    affinity = spec.get("affinity")
    given = (isinstance(affinity, dict) and isinstance(affinity.get("nodeAffinity"), dict)
             and isinstance(affinity["nodeAffinity"].get(REQUIRED), dict))
    return place(nodes, selector=node_selector, terms=terms if given else None,
                 resources=pod_gpu_resources(names), shares_by_default=by_default)


_KAI_KEYS = frozenset(KAI_ANNOTATIONS)
_HAMI_KEYS = frozenset(HAMI_RESOURCES)


def _with_other(gcs: list[GpuContainer], other: OtherGpu,
                spec: Mapping[str, Any]) -> list[GpuContainer]:
    """The GPU containers plus those a declared other sharing system serves, each carrying
    its share (``gc.other``) so memory variables are capped. An undeclared system's view is
    not used (rule ``other-sharing-system`` reports the pod; the guard voids as usual)."""
    if not other.declared:
        return gcs
    by_place = {(gc.kind, gc.index): gc for gc in gcs}
    for oc in other.containers:
        gc = by_place.get((oc.kind, oc.index))
        if gc is None:
            gc = by_place[oc.kind, oc.index] = GpuContainer(
                oc.kind, oc.index, spec[oc.kind][oc.index], {}, shared=False, mig=False)
        gc.other = oc
    return sorted(by_place.values(), key=lambda gc: (gc.kind != "containers", gc.index))


def _with_dra(gcs: list[GpuContainer], dra_pod: DraPod,
              spec: Mapping[str, Any]) -> list[GpuContainer]:
    """The GPU containers plus those that get a GPU through DRA (docs/dra.md); a container
    that also has a device-plugin resource carries its DRA view only when that is shared."""
    if not dra_pod.containers:
        return gcs
    by_place = {(gc.kind, gc.index): gc for gc in gcs}
    for dc in dra_pod.containers:
        gc = by_place.get((dc.kind, dc.index))
        if gc is None:
            by_place[dc.kind, dc.index] = GpuContainer(dc.kind, dc.index, spec[dc.kind][dc.index],
                                                       {}, shared=False, mig=dc.mig, dra=dc)
        elif dc.shared:
            gc.dra = dc
    return sorted(by_place.values(), key=lambda gc: (gc.kind != "containers", gc.index))


class PodFacts(NamedTuple):
    """Everything the rules read about one pod, gathered once by :func:`gather`; immutable.

    ``kind`` says which facts exist: :data:`NO_GPU` carries the exemption and another sharing
    system's view; :data:`DRA_UNRESOLVED` adds the DRA view and the workload class; :data:`GPU`
    the rest, unless ``exempt`` (an exempt GPU pod is only described: class and CUDA).

    A NamedTuple, not a frozen dataclass: built once per review, in ~2 µs where a frozen
    dataclass of 27 fields (one ``object.__setattr__`` each) costs ~18 µs, as much as a whole
    CPU pod's decision. The mappings it holds are read, never written.
    """

    kind: str
    pod: Mapping[str, Any]
    spec: Mapping[str, Any]
    meta: Mapping[str, Any]
    request: RequestFacts
    policy: Policy
    exempt: str = ""  # exemption(): "namespace X", "user X", "group X", or ""
    gpu_containers: tuple[GpuContainer, ...] = ()
    dra: DraPod | None = None  # the DRA view, when it names claims or DRA resources
    other: OtherGpu | None = None  # another sharing system's view (refined by the pool's card)
    labels: Mapping[str, Any] = _EMPTY
    workload: str = ""
    workload_reason: str = ""
    bad_workload_label: str | None = None
    cuda_version: str | None = None
    cuda_source: str = ""
    cuda_conflict: Mapping[str, list[str]] = _EMPTY
    cuda_label_invalid: str | None = None
    node_selector: Mapping[str, Any] = _EMPTY
    required_terms: tuple[Mapping[str, Any], ...] = ()
    pool: NodePool | None = None
    mig: bool = False
    fraction_plan: Plan = NOT_FRACTIONAL
    landing: Landing | None = None
    placement: str = ""  # Decision.placement: where the pod was judged to land, and why
    shared_reasons: tuple[tuple[str, str], ...] = ()
    route_cuda: bool = True
    foreign: bool = False  # names another sharing system (KAI, HAMi): keeps its scheduler


def gather(pod: Mapping[str, Any], spec: Mapping[str, Any], request: RequestFacts,
           policy: Policy, *, dra: DraSnapshot | None = None,
           nodes: NodeView | None = None) -> PodFacts:
    """The facts about a Pod CREATE or UPDATE (``spec``: its ``spec``, a dict), read once.

    ``dra``: the DeviceClasses, claims and templates known (None: none); ``nodes``: the GPU
    nodes visible (None: none, the declared pools and defaults are assumed). Stops early where
    the engine needs no more: a pod without GPU containers, an exempt GPU pod.
    """
    compiled = policy.compiled
    fractional = compiled.fractional
    gcs, dra_limit, hami = _scan(spec, fractional,
                                 notable_extended(dra) if dra is not None else None)
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, dict) else _EMPTY
    # dra.analysis.needs_analysis, and another sharing system's cheap test: their resource
    # scans done by _scan
    dra_pod = (analyze_pod(pod, request.namespace, dra, compiled.dra_gpu_classes)
               if dra_limit or spec.get("resourceClaims") else None)
    if dra_pod is not None:
        gcs = _with_dra(gcs, dra_pod, spec)
    annotations = meta.get("annotations")
    systems = compiled.other_systems
    if nodes is not None and not systems:  # found in the cluster; a declared list overrides
        systems = found_systems(nodes.systems, spec)
    # another sharing system's pod by its names (KAI's annotations, HAMi's resources, at any
    # quantity): the compiled split's test (compile.rules.other_systems.other_system_pods)
    foreign = hami or (annotations.__class__ is dict and not _KAI_KEYS.isdisjoint(annotations))
    other = analyse_other(pod, spec, systems) if foreign else None
    if other is not None:
        gcs = _with_other(gcs, other, spec)
    if not gcs:
        if dra_pod is not None and dra_pod.unresolved:
            labels = meta.get("labels")
            labels = labels if isinstance(labels, dict) else _EMPTY
            workload, reason, _ = classify(meta, labels, compiled,
                                           policy.spec.classification.default_workload, spec)
            return PodFacts(DRA_UNRESOLVED, pod, spec, meta, request, policy,
                            exempt=exemption(request, compiled), dra=dra_pod, labels=labels,
                            workload=workload, workload_reason=reason)
        return PodFacts(NO_GPU, pod, spec, meta, request, policy,
                        exempt=exemption(request, compiled), other=other, foreign=foreign)
    labels = meta.get("labels")
    labels = labels if isinstance(labels, dict) else _EMPTY
    workload, workload_reason, bad_label = classify(
        meta, labels, compiled, policy.spec.classification.default_workload, spec)
    cuda_version, cuda_source, conflict, cuda_invalid = _cuda(labels, gcs, compiled.image_cuda)

    exempt = exemption(request, compiled)
    if exempt:
        return PodFacts(GPU, pod, spec, meta, request, policy, exempt=exempt,
                        gpu_containers=tuple(gcs), dra=dra_pod, other=other, labels=labels,
                        workload=workload, workload_reason=workload_reason,
                        cuda_version=cuda_version, cuda_source=cuda_source)

    node_selector = spec.get("nodeSelector")
    node_selector = node_selector if isinstance(node_selector, dict) else _EMPTY
    routed = _routed(node_selector, cuda_version, workload, policy)
    terms = _terms(spec)
    terms_in = [_term_in(t) for t in terms]
    pool = _find_pool(compiled, node_selector, routed, terms_in) if compiled.pools else None
    mig = any(gc.mig for gc in gcs) or (pool is not None and pool.sharing == "mig")
    plan = _fraction_plan(pod, meta, gcs, workload=workload, mig=mig,
                          dra=any(gc.dra is not None for gc in gcs), pool=pool, policy=policy,
                          uid=request.uid) if fractional else NOT_FRACTIONAL
    landing = (_landing(nodes, policy, spec, node_selector, gcs, workload=workload,
                         mig=mig)
               if nodes is not None and plan.fraction is None else None)
    if landing is not None:
        pool = landing.pool
        mig = mig or (pool is not None and pool.sharing == "mig")
        placement = landing.note
    elif nodes is not None:
        placement = ("no visible GPU node matches the pod's node selection and GPU resources: "
                     + ASSUMED_POOLS + _assumed_pool(pool))
    else:
        placement = ASSUMED + _assumed_pool(pool)
    shared = _shared_reasons(gcs, node_selector, terms_in, pool, plan)
    if dra_pod is not None:
        shared.extend((r.path, r.why) for r in dra_pod.reasons)
    if other is not None and other.declared:  # undeclared: only its rule speaks
        refined = (analyse_other(pod, spec, systems, pool.memory_mib)
                   if pool is not None else None)  # the card is known: MiB and fraction
        if refined is not None:
            other = refined
            gcs = _with_other(gcs, other, spec)
        shared.extend((oc.path, oc.why) for oc in other.containers if oc.shared)
    return PodFacts(
        GPU, pod, spec, meta, request, policy, gpu_containers=tuple(gcs), dra=dra_pod,
        other=other, labels=labels, workload=workload, workload_reason=workload_reason,
        bad_workload_label=bad_label, cuda_version=cuda_version, cuda_source=cuda_source,
        cuda_conflict=conflict, cuda_label_invalid=cuda_invalid, node_selector=node_selector,
        required_terms=tuple(terms), pool=pool, mig=mig, fraction_plan=plan, landing=landing,
        placement=placement, shared_reasons=tuple(shared),
        route_cuda=landing is None or (landing.share and nodes is not None
                                       and nodes.cuda_labelled))
