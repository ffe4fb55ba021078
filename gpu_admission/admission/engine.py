"""The policy engine: ``evaluate(pod, facts, policy) -> Decision``. Pure, no I/O.

A review flows one way: the request (the pod dict as the API server sent it in
``request.object``, and :class:`~gpu_admission.core.decision.RequestFacts`) -> the facts about
the pod, gathered once (:func:`gpu_admission.admission.pod.gather`: GPU containers, DRA claims,
other sharing systems, workload class, CUDA, pool and landing, fractional plan) -> every rule
of :data:`gpu_admission.rules.RULES`, in order, on those facts (:func:`judge`) -> the patch ->
the frozen :class:`~gpu_admission.core.decision.Decision` the server records and answers. The
engine calls down only: the facts do not call back into it, nor do the rules.

The pod stays a plain dict; it is read, never modified, never copied whole and never parsed
into typed models, so one decision plus its patch stays within tens of microseconds. The
collected violations and declared changes become the decision:

* any ``enforce`` violation -> denied, no patch;
* ``warn`` violations -> allowed with a short admission warning each (<= 120 chars, the
  apiserver's recommendation, see ``api/admission/v1/types.go``);
* ``audit`` violations -> allowed, only recorded.

Pods without a GPU container only meet the GPU-access guard
(:mod:`gpu_admission.rules.gpu_access`, Pod CREATE only, after the exemptions): their
``Decision`` has ``gpu=False``, no workload or CUDA, and may still carry the guard's patch
(``NVIDIA_VISIBLE_DEVICES=void``) or its denials, and the GPU-aware scheduler
(``spec.scheduling.cpuPods``, :func:`gpu_admission.rules.scheduler.cpu_pod_scheduler`). The
GPU path runs every rule, the guard included.

A ``pods/ephemeralcontainers`` UPDATE (``kubectl debug``) meets only the guard, for the ephemeral
containers it adds (:func:`_ephemeral`); other subresources are not the engine's.

Only a Pod CREATE or an ephemeral-container UPDATE at ``stage == "mutate"`` gets a patch.
``stage == "validate"`` (after all mutating webhooks) and UPDATE re-check the object and never
return a patch; a pod that merely lacks our mutations is not denied for that.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from gpu_admission.admission.pod import DRA_UNRESOLVED, NO_GPU, PodFacts, exemption, gather
from gpu_admission.core.decision import Decision, Mode, RequestFacts, Violation
from gpu_admission.core.patch import PatchBuilder, changed_fields
from gpu_admission.core.vocab import MUTATED_ANNOTATION
from gpu_admission.dra.model import DraSnapshot
from gpu_admission.facts.nodepools import NodeView
from gpu_admission.facts.other_systems import SYSTEM_NAMES
from gpu_admission.policy.model import Compiled, Policy
from gpu_admission.rules import RULES, Context
from gpu_admission.rules.dra import UNKNOWN as DRA_UNKNOWN
from gpu_admission.rules.dra import unknown_message
from gpu_admission.rules.gpu_access import EPHEMERAL_KIND, EPHEMERAL_SUBRESOURCE, guard
from gpu_admission.rules.other_systems import RULE as OTHER_RULE
from gpu_admission.rules.other_systems import undeclared_message
from gpu_admission.rules.scheduler import cpu_pod_scheduler

MAX_WARNING = 120
_ALLOWED = Decision(allowed=True)


def short_warning(violation: Violation) -> str:
    """One admission warning: ``<rule>: <message>``, one line, at most 120 characters."""
    text = " ".join(f"{violation.rule}: {violation.message}".split())
    return text if len(text) <= MAX_WARNING else text[:MAX_WARNING - 3].rstrip() + "..."


def _annotation_value(existing: Any, fields: list[str]) -> str:
    """Stable summary: sorted kinds of fields we mutated, merged with any earlier summary.

    E.g. ``affinity,env,nodeSelector,schedulerName``; re-running on the patched pod changes
    nothing, so the value stays put. Memoised (:func:`_summary`): the same fields repeat
    across reviews.
    """
    text = existing if isinstance(existing, str) else None
    if text is not None and len(text) > 200:  # not ours (ours is short): no memo for it
        return _summary(text, tuple(fields))
    return _cached_summary(text, tuple(fields))


def _summary(existing: str | None, fields: tuple[str, ...]) -> str:
    kinds = {f.rsplit(".", 1)[-1] if f.startswith(("spec.containers[", "spec.initContainers["))
             else f.split(".", 1)[1] for f in fields if f.startswith("spec.")}
    if isinstance(existing, str) and existing:
        kinds.update(k for k in existing.split(",") if k)
    return ",".join(sorted(kinds))


_cached_summary = functools.lru_cache(maxsize=1024)(_summary)


def evaluate(pod: Mapping[str, Any], facts: RequestFacts, policy: Policy,
             dra: DraSnapshot | None = None, nodes: NodeView | None = None) -> Decision:
    """Decide one Pod: :func:`~gpu_admission.admission.pod.gather` its facts, then
    :func:`judge` them. Pure: no I/O, does not modify ``pod``.

    ``dra``: the DeviceClasses, claims and templates the pod may name (the server's cache,
    or files offline); None means none known, so every DRA reference is unknown (docs/dra.md).
    ``nodes``: the GPU nodes visible (:func:`gpu_admission.facts.nodepools.node_view`, from the
    webhook's Node watch or ``evaluate``'s files); None: none visible, the policy's declared
    pools and defaults are assumed and the decision says so (``Decision.placement``).

    ``facts.stage == "mutate"``: the decision carries the RFC 6902 patch.
    ``facts.stage == "validate"``: re-check the final object, never a patch.
    Non-Pod objects, DELETE/CONNECT: allowed, no patch. Pods without GPU resources: only the
    GPU-access guard, on CREATE (see the module docstring).
    """
    if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
        return _ALLOWED
    if facts.operation not in ("CREATE", "UPDATE"):
        return _ALLOWED
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return _ALLOWED
    if facts.sub_resource:
        if facts.sub_resource == EPHEMERAL_SUBRESOURCE and facts.operation == "UPDATE":
            return _ephemeral(pod, spec, facts, policy.compiled)
        return _ALLOWED
    return judge(gather(pod, spec, facts, policy, dra=dra, nodes=nodes))


def judge(pf: PodFacts) -> Decision:
    """The rules on the gathered facts, then the patch and the decision."""
    if pf.kind == NO_GPU:
        return _non_gpu(pf)
    if pf.kind == DRA_UNRESOLVED:
        return _dra_unresolved(pf)
    if pf.exempt:
        return Decision(allowed=True, gpu=True, workload=pf.workload,
                        workload_reason=pf.workload_reason, cuda_version=pf.cuda_version,
                        cuda_source=pf.cuda_source, exempt=pf.exempt)
    facts = pf.request
    mutate = facts.stage == "mutate" and facts.operation == "CREATE"
    ctx = Context(
        pod=pf.pod, spec=pf.spec, facts=facts, policy=pf.policy, compiled=pf.policy.compiled,
        patch=PatchBuilder(pf.pod) if mutate else None,
        gpu_containers=list(pf.gpu_containers), labels=pf.labels, workload=pf.workload,
        workload_reason=pf.workload_reason, bad_workload_label=pf.bad_workload_label,
        cuda_version=pf.cuda_version, cuda_source=pf.cuda_source,
        cuda_conflict=dict(pf.cuda_conflict), cuda_label_invalid=pf.cuda_label_invalid,
        node_selector=pf.node_selector, required_terms=list(pf.required_terms), pool=pf.pool,
        shared_reasons=list(pf.shared_reasons), mig=pf.mig, dra=pf.dra,
        fraction_plan=pf.fraction_plan, other=pf.other, landing=pf.landing,
        route_cuda=pf.route_cuda,
    )
    for rule in RULES:
        rule.check(ctx)
    return _finish(pf.meta, ctx.violations, ctx.patch, gpu=True, workload=pf.workload,
                   workload_reason=pf.workload_reason, cuda_version=pf.cuda_version,
                   cuda_source=pf.cuda_source, placement=pf.placement)


def _dra_unresolved(pf: PodFacts) -> Decision:
    """A pod whose only possible GPU is behind DRA references the cache does not hold:
    report them (rule ``dra-reference-unknown``, see gpu_admission.rules.dra), mutate nothing
    but the GPU-access guard's ``void`` for containers that use no claim."""
    if pf.exempt:
        return Decision(allowed=True, gpu=True, workload=pf.workload,
                        workload_reason=pf.workload_reason, exempt=pf.exempt)
    assert pf.dra is not None  # gather(): DRA_UNRESOLVED has the DRA view
    compiled = pf.policy.compiled
    facts = pf.request
    training = pf.workload == "training"
    mode = compiled.modes[DRA_UNKNOWN] if training else compiled.dra_unknown_other
    violations = [Violation(DRA_UNKNOWN, path,
                            unknown_message(what, training, offline=pf.dra.offline), mode)
                  for path, what in pf.dra.unresolved]
    builder = PatchBuilder(pf.pod) if facts.stage == "mutate" and facts.operation == "CREATE" \
        else None
    if facts.operation == "CREATE":
        spec = pf.spec
        with_claims = frozenset(
            (kind, i) for kind in ("containers", "initContainers")
            for i, c in enumerate(spec.get(kind) or ())
            if isinstance(c, dict) and isinstance(c.get("resources"), dict)
            and c["resources"].get("claims"))
        guard(spec, with_claims, compiled.modes, builder, violations)
    return _finish(pf.meta, violations, builder, gpu=True, workload=pf.workload,
                   workload_reason=pf.workload_reason)


def _non_gpu(pf: PodFacts) -> Decision:
    """A pod without GPU containers: only the GPU-access guard, on CREATE, unless exempt, and
    the GPU-aware scheduler when ``spec.scheduling.cpuPods`` routes it
    (:func:`gpu_admission.rules.scheduler.cpu_pod_scheduler`); plus rule
    ``other-sharing-system`` when it asks an undeclared system for a GPU (it is voided like
    any pod without a GPU, never silently). A pod naming another sharing system
    (``pf.foreign``: KAI's annotations, HAMi's resources, any quantity) keeps its scheduler."""
    facts = pf.request
    if facts.operation != "CREATE":
        return _ALLOWED
    if pf.exempt:
        return Decision(allowed=True, exempt=pf.exempt)
    compiled = pf.policy.compiled
    builder = PatchBuilder(pf.pod) if facts.stage == "mutate" else None
    violations: list[Violation] = []
    if builder is not None and not pf.foreign:  # another system's pod: its own scheduler
        target = cpu_pod_scheduler(pf.spec, pf.meta, compiled.cpu_scheduler)
        if target is not None:
            builder.set_scheduler_name(target)
    guard(pf.spec, frozenset(), compiled.modes, builder, violations)
    other = pf.other
    if other is not None:  # after the guard, as in the rule order
        mode = compiled.modes[OTHER_RULE]
        if not other.declared:
            path, why = other.asked
            violations.append(Violation(OTHER_RULE, path,
                                        undeclared_message(other.system, why), mode))
        else:  # declared, but it serves no container (a KAI container name that is wrong)
            violations.extend(Violation(OTHER_RULE, path, f"{SYSTEM_NAMES[other.system]} "
                                        f"request: {problem}", mode)
                              for path, problem in other.problems)
    return _finish(pf.meta, violations, builder, gpu=False)


def _ephemeral(pod: Mapping[str, Any], spec: Mapping[str, Any], facts: RequestFacts,
               compiled: Compiled) -> Decision:
    """``kubectl debug``: a ``pods/ephemeralcontainers`` UPDATE adding ephemeral containers to a
    running pod. Only the GPU-access guard applies, to the containers not in the old pod
    (``facts.existing_ephemeral``; the others are immutable, the API server refuses any change
    to them): they cannot request a GPU, so a CUDA image gets ``void`` and an explicit
    ``NVIDIA_VISIBLE_DEVICES`` granting GPUs is refused. The patch touches only their ``env``:
    the subresource keeps nothing else of the update (``dropNonEphemeralContainerUpdates`` in
    kubernetes ``pkg/registry/core/pod/strategy.go``), so no ``gpu-admission.io/mutated``
    annotation is written."""
    exempt = exemption(facts, compiled)
    if exempt:
        return Decision(allowed=True, exempt=exempt)
    builder = PatchBuilder(pod) if facts.stage == "mutate" else None
    violations: list[Violation] = []
    guard(spec, frozenset(), compiled.modes, builder, violations, kinds=(EPHEMERAL_KIND,),
          existing=facts.existing_ephemeral, volumes=False)
    return _finish(None, violations, builder)


def _finish(meta: Mapping[str, Any] | None, found: list[Violation],
            builder: PatchBuilder | None, **about: Any) -> Decision:
    """The Decision from the collected violations and declared changes: any enforce
    violation denies (no patch); otherwise the patch plus our annotation, if anything changes
    (no annotation when ``meta`` is None: an ephemeral-container update keeps only them)."""
    violations = tuple(found)
    allowed = not any(v.mode is Mode.ENFORCE for v in violations)
    warnings = tuple(dict.fromkeys(short_warning(v) for v in violations if v.mode is Mode.WARN))
    patch: tuple[dict[str, Any], ...] = ()
    changes: tuple[str, ...] = ()
    if allowed and builder is not None and not builder.empty:
        ops = builder.ops()
        if ops:
            fields = changed_fields(ops)
            if meta is not None:
                annotations = meta.get("annotations")
                existing = (annotations.get(MUTATED_ANNOTATION)
                            if isinstance(annotations, dict) else None)
                summary = _annotation_value(existing, fields)
                if summary != existing:
                    ops.extend(builder.annotation_ops(MUTATED_ANNOTATION, summary))
                    if "metadata.annotations" not in fields:
                        fields.append("metadata.annotations")
            patch = tuple(ops)
            changes = tuple(fields)
    return Decision(allowed=allowed, patch=patch, violations=violations, warnings=warnings,
                    changes=changes, **about)
