"""CUDA rules: ``cuda-version-conflict``, ``cuda-node-selector-conflict``, ``cuda-version-unknown``.

Why (seed article, pitfall 1): pods with different CUDA versions time-sharing one GPU give
mysterious driver errors; the fix is a node pool per CUDA version. So a non-training GPU pod
gets ``nodeSelector gpu-admission.io/cuda-version: "<major>.<minor>"``. Containers that disagree
on the version, and a nodeSelector/pool that contradicts it, are reported; an unknown version
is reported (default mode warn) and the pod is not routed.

With ``spec.cudaRouting.driverAffinity`` the pod also gets required node affinity on the GFD
labels ``nvidia.com/cuda.runtime-version.major/.minor`` (the highest CUDA the node's driver
supports, DP ``internal/lm/nvml.go``): driver CUDA >= pod CUDA, i.e.
``major Gt X`` OR (``major In [X]`` AND ``minor Gt Y-1``). ``Gt`` compares integers
(https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#operators).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_admission.core.cuda import version_tuple
from gpu_admission.core.vocab import (
    CUDA_VERSION_LABEL,
    GFD_CUDA_RUNTIME_MAJOR,
    GFD_CUDA_RUNTIME_MINOR,
)
from gpu_admission.rules.base import Context

CONFLICT = "cuda-version-conflict"
SELECTOR_CONFLICT = "cuda-node-selector-conflict"
UNKNOWN = "cuda-version-unknown"


def driver_alternatives(version: str) -> list[list[dict[str, Any]]]:
    """Node-selector requirement groups meaning "driver supports CUDA >= version" (ORed)."""
    major, minor = version_tuple(version)
    newer_major = [{"key": GFD_CUDA_RUNTIME_MAJOR, "operator": "Gt", "values": [str(major)]}]
    same_major: list[dict[str, Any]] = [
        {"key": GFD_CUDA_RUNTIME_MAJOR, "operator": "In", "values": [str(major)]}]
    if minor > 0:
        same_major.append(
            {"key": GFD_CUDA_RUNTIME_MINOR, "operator": "Gt", "values": [str(minor - 1)]})
    return [newer_major, same_major]


def _has_driver_requirement(term: Mapping[str, Any]) -> bool:
    exprs = term.get("matchExpressions")
    return isinstance(exprs, list) and any(
        isinstance(e, dict) and e.get("key") == GFD_CUDA_RUNTIME_MAJOR for e in exprs)


def _affinity_excludes(terms: list[Mapping[str, Any]], version: str) -> bool:
    """True when every required term pins the CUDA label to other versions."""
    if not terms:
        return False
    for term in terms:
        exprs = term.get("matchExpressions")
        pinned = False
        if isinstance(exprs, list):
            for expr in exprs:
                if (isinstance(expr, dict) and expr.get("key") == CUDA_VERSION_LABEL
                        and expr.get("operator") == "In"
                        and isinstance(expr.get("values"), list)
                        and version not in expr["values"]):
                    pinned = True
        if not pinned:
            return False
    return True


class CudaRouting:
    ids: tuple[str, ...] = (CONFLICT, SELECTOR_CONFLICT, UNKNOWN)

    def check(self, ctx: Context) -> None:
        routing = ctx.policy.spec.cuda_routing
        version = ctx.cuda_version
        if ctx.cuda_conflict:
            found = "; ".join(f"{v} in {', '.join(paths)}"
                              for v, paths in sorted(ctx.cuda_conflict.items()))
            ctx.violate(CONFLICT, "spec.containers",
                        f"containers disagree on the CUDA version ({found}); pods sharing a GPU "
                        f"must use one CUDA version: align the images or set the label "
                        f"{CUDA_VERSION_LABEL}")
            return
        if not ctx.route_cuda:  # nodes visible: no card shared, or no node has the label
            return
        relevant = ctx.workload != "training" or routing.driver_affinity
        if version is None:
            # A pod that pins the CUDA pool itself is routed; nothing to warn about.
            if relevant and CUDA_VERSION_LABEL not in ctx.node_selector:
                if ctx.cuda_label_invalid is not None:
                    message = (f"label {CUDA_VERSION_LABEL}={ctx.cuda_label_invalid[:12]!r} is "
                               "not <major>.<minor>; not routed to a CUDA pool")
                else:
                    message = (f"CUDA version unknown; set label {CUDA_VERSION_LABEL}; "
                               "not routed to a CUDA pool")
                ctx.violate(UNKNOWN, f"metadata.labels[{CUDA_VERSION_LABEL}]", message)
            return
        conflicted = False
        pinned = ctx.node_selector.get(CUDA_VERSION_LABEL)
        if pinned is not None and str(pinned) != version:
            conflicted = True
            ctx.violate(SELECTOR_CONFLICT, f"spec.nodeSelector[{CUDA_VERSION_LABEL}]",
                        f"nodeSelector asks for CUDA {str(pinned)[:12]} but the pod uses CUDA "
                        f"{version} ({ctx.cuda_source}); fix the selector or the image")
        if _affinity_excludes(ctx.required_terms, version):
            conflicted = True
            ctx.violate(SELECTOR_CONFLICT, "spec.affinity.nodeAffinity",
                        f"required node affinity excludes CUDA {version} nodes "
                        f"({ctx.cuda_source}); fix the affinity or the image")
        pool = ctx.pool
        if pool is not None and pool.cuda_version is not None and pool.cuda_version != version:
            conflicted = True
            ctx.violate(SELECTOR_CONFLICT, "spec.nodeSelector",
                        f"pod targets pool {pool.name!r} (CUDA {pool.cuda_version}) but uses CUDA "
                        f"{version} ({ctx.cuda_source})")
        if ctx.patch is None or conflicted:
            return
        if routing.node_selector and ctx.workload != "training" and pinned is None:
            ctx.patch.set_node_selector(CUDA_VERSION_LABEL, version)
        if routing.driver_affinity:
            ctx.patch.require_any_node_terms(driver_alternatives(version), _has_driver_requirement)
