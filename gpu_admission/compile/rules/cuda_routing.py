"""The CUDA routing rules (:mod:`gpu_admission.rules.cuda_routing`) in CEL.

The compiler unit of that rule module; what a unit contributes, and the analysis
every unit reads, are in :mod:`gpu_admission.compile.units`.
"""

from __future__ import annotations

from gpu_admission.core.vocab import (
    CUDA_VERSION_LABEL,
)
from gpu_admission.policy.model import Policy
from gpu_admission.rules import cuda_routing

from ..cel import concat, lit, pyrepr, trunc, var
from ..units import Program, container_path, violation


class CudaUnit:
    ids: tuple[str, ...] = (cuda_routing.CONFLICT, cuda_routing.SELECTOR_CONFLICT,
                            cuda_routing.UNKNOWN)

    def emit(self, policy: Policy, prog: Program) -> None:
        routing = policy.spec.cuda_routing
        gpu = var("gpu")
        version = var("cudaVersion")
        source = var("cudaSource")
        ns = var("nodeSelector")
        cl = lit(CUDA_VERSION_LABEL)
        labels = var("labels")
        paths = (f"lists.range(size({gpu})).filter(i, {var('imgCuda')}[i] == v)"
                 f".map(i, {container_path(gpu + '[i]')}).join(\", \")")
        tail = ("); pods sharing a GPU must use one CUDA version: align the images or set the "
                f"label {CUDA_VERSION_LABEL}")
        conflict_msg = (f'"containers disagree on the CUDA version (" + '
                        f'{var("cudaVersions")}.map(v, v + " in " + {paths}).join("; ") + '
                        f"{lit(tail)}")
        conflict = (f"[{violation(cuda_routing.CONFLICT, lit('spec.containers'), conflict_msg)}]")
        relevant = f'({var("workload")} != "training" || {lit(routing.driver_affinity)})'
        invalid = f"{cl} in {labels} && !{var('cudaLabelValid')}"
        no_label = (f"CUDA version unknown; set label {CUDA_VERSION_LABEL}; not routed to a "
                    "CUDA pool")
        unknown_msg = (f"{invalid} ? {lit(f'label {CUDA_VERSION_LABEL}=')} + "
                       f"{pyrepr(trunc(f'{labels}[{cl}]', 12))} + "
                       f"{lit(' is not <major>.<minor>; not routed to a CUDA pool')} : "
                       f"{lit(no_label)}")
        label_path = lit(f"metadata.labels[{CUDA_VERSION_LABEL}]")
        unknown = (f"{relevant} && !({cl} in {ns}) ? "
                   f"[{violation(cuda_routing.UNKNOWN, label_path, unknown_msg)}] : []")
        prog.add("cudaPinnedConflict", f"{cl} in {ns} && {ns}[{cl}] != {version}")
        pinned_path = lit(f"spec.nodeSelector[{CUDA_VERSION_LABEL}]")
        pinned_msg = (f'"nodeSelector asks for CUDA " + {trunc(f"{ns}[{cl}]", 12)} + '
                      f'" but the pod uses CUDA " + {version} + " (" + {source} + '
                      f'"); fix the selector or the image"')
        prog.add("cudaAffinityExcludes",
                 f"size({var('terms')}) > 0 && {var('terms')}.all(t, has(t.matchExpressions) && "
                 f"t.matchExpressions.exists(e, e.key == {cl} && e.operator == \"In\" && "
                 f"has(e.values) && !({version} in e.values)))")
        affinity_msg = (f'"required node affinity excludes CUDA " + {version} + " (" + '
                        f'{source} + "); fix the affinity or the image"')
        prog.add("cudaPoolConflict", f'{var("poolCuda")} != "" && {var("poolCuda")} != {version}')
        pool_msg = (f"\"pod targets pool '\" + {var('pool')} + \"' (CUDA \" + {var('poolCuda')} + "
                    f'") but uses CUDA " + {version} + " (" + {source} + ")"')
        rule = cuda_routing.SELECTOR_CONFLICT
        known = concat([
            f"{var('cudaPinnedConflict')} ? [{violation(rule, pinned_path, pinned_msg)}] : []",
            f"{var('cudaAffinityExcludes')} ? "
            f"[{violation(rule, lit('spec.affinity.nodeAffinity'), affinity_msg)}] : []",
            f"{var('cudaPoolConflict')} ? "
            f"[{violation(rule, lit('spec.nodeSelector'), pool_msg)}] : []",
        ])
        prog.violations.append(
            f"!{var('isGpu')} ? []\n  : {var('cudaConflict')} ? {conflict}\n"
            f'  : {version} == "" ? ({unknown})\n  : {known}')
        ok = (f'{var("isGpu")} && !{var("cudaConflict")} && {version} != "" && '
              f'!{var("cudaPinnedConflict")} && !{var("cudaAffinityExcludes")} && '
              f'!{var("cudaPoolConflict")}')
        prog.add("cudaOk", ok, "a known CUDA version and nothing contradicts it")
        prog.add("nodeSelectorOp",
                 f'{var("cudaOk")} && {lit(routing.node_selector)} && '
                 f'{var("workload")} != "training" && !({cl} in {ns})')
        prog.add("driverOn", f'{var("cudaOk")} && {lit(routing.driver_affinity)}',
                 "spec.cudaRouting.driverAffinity: driver CUDA >= the pod's CUDA")
