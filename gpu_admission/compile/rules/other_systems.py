"""Rule ``other-sharing-system`` (:mod:`gpu_admission.rules.other_systems`) in CEL.

The compiler unit of that rule module; what a unit contributes, and the analysis
every unit reads, are in :mod:`gpu_admission.compile.units`.
"""

from __future__ import annotations

from gpu_admission.facts.other_systems import (
    HAMI,
    HAMI_CORES,
    HAMI_MEMORY,
    HAMI_MEMORY_PERCENT,
    HAMI_RESOURCES,
    KAI,
    KAI_ANNOTATIONS,
    KAI_FRACTION,
    KAI_MEMORY,
    SYSTEM_NAMES,
)
from gpu_admission.policy.model import Policy
from gpu_admission.rules import other_systems

from ..cel import concat, has_path, lit, rec, trunc, var
from ..units import CompileError, Program, violation


def other_system_pods() -> str:
    """engine.evaluate's other-system test (engine._scan): KAI's annotations, or a HAMi
    resource named in some container's limits or requests (CEL over ``object``)."""
    ann = "object.metadata.annotations"
    kai = " || ".join(f"{lit(a)} in {ann}" for a in KAI_ANNOTATIONS)
    per_kind = []
    for kind in ("containers", "initContainers"):
        lst = f"object.spec.{kind}"
        names = " || ".join(
            f"(has(c.resources.{key}) && c.resources.{key}.exists(k, k in "
            f"{lit(list(HAMI_RESOURCES))}))" for key in ("limits", "requests"))
        per_kind.append(f"(has({lst}) && {lst}.exists(c, has(c.resources) && ({names})))")
    return f"(has({ann}) && ({kai})) || " + " || ".join(per_kind)


class OtherSystemsUnit:
    """rules/other_systems.py for a policy that declares no other sharing system: a pod that
    asks KAI-Scheduler (annotations) or HAMi (resources) for its GPU is reported, naming
    what to declare; the guard units still void/deny it as any pod without a GPU request.

    A policy that declares systems keeps those pods with the webhook (``pods``: the compiled
    policies skip them): their GPU containers, KAI's ConfigMap shape and the capped memory
    variables are decided by the engine (docs/compile.md)."""

    ids: tuple[str, ...] = (other_systems.RULE,)

    def emit(self, policy: Policy, prog: Program) -> None:
        if policy.spec.other_sharing_systems:
            raise CompileError(other_systems.RULE, "spec.otherSharingSystems",
                               "pods of a declared KAI-Scheduler/HAMi are GPU pods by their "
                               "system's annotations and resources; the webhook decides them",
                               other_system_pods())
        ann = "object.metadata.annotations"
        has_fraction = f"has({ann}) && {lit(KAI_FRACTION)} in {ann}"
        kai_path = (f'{has_fraction} ? {lit(f"metadata.annotations[{KAI_FRACTION}]")} : '
                    f'{lit(f"metadata.annotations[{KAI_MEMORY}]")}')
        kai_value = f"({has_fraction} ? {ann}[{lit(KAI_FRACTION)}] : {ann}[{lit(KAI_MEMORY)}])"
        kai_why = (f'"KAI-Scheduler annotation " + ({has_fraction} ? {lit(KAI_FRACTION)} : '
                   f'{lit(KAI_MEMORY)}) + "=" + {trunc(kai_value, 20)}')
        kai_ask = f"has({ann}) && ({' || '.join(f'{lit(a)} in {ann}' for a in KAI_ANNOTATIONS)})"

        def value(c: str, name: str) -> str:
            """The container's non-zero quantity of ``name`` as a string, limits over
            requests ("" when neither), as sharing_systems.hami_resources merges them."""
            out = '""'
            for key in ("requests", "limits"):
                values = f"{c}.resources.{key}"
                ok = (f"{has_path(c, 'resources', key)} && {lit(name)} in {values} && "
                      f"!(string({values}[{lit(name)}]) in [\"0\", \"\"])")
                out = f"(({ok}) ? string({values}[{lit(name)}]) : {out})"
            return out

        records = []
        for kind in ("containers", "initContainers"):
            lst = var(kind)
            mem, pct, cores = (value("c", n) for n in (HAMI_MEMORY, HAMI_MEMORY_PERCENT,
                                                        HAMI_CORES))
            path = f'{lit(f"spec.{kind}[")} + string(i) + {lit("].resources")}'
            parts = (f'[{mem} != "" ? {lit(HAMI_MEMORY + "=")} + {mem} : {pct} != "" ? '
                     f'{lit(HAMI_MEMORY_PERCENT + "=")} + {pct} : "", {cores} != "" ? '
                     f'{lit(HAMI_CORES + "=")} + {cores} : ""].filter(p, p != "")')
            records.append(
                f"lists.range(size({lst})).map(i, [{lst}[i]].map(c, "
                f"{rec(path=path, parts=parts)})[0])"
                ".filter(r, size(r.parts) > 0)")
        prog.add("hamiAsks", concat(records),
                 "sharing_systems.analyse: containers with a non-zero HAMi resource")
        names = lit(list(HAMI_RESOURCES))
        named = " || ".join(f"({has_path('c', 'resources', key)} && "
                            f"c.resources.{key}.exists(r, r in {names}))"
                            for key in ("limits", "requests"))
        # One walk of the resource names first: the quantities (hamiAsks) only for a pod
        # that names a HAMi resource at all (variables are evaluated lazily).
        prog.add("hamiNamed", " || ".join(f"{var(kind)}.exists(c, {named})"
                                          for kind in ("containers", "initContainers")),
                 "a container or init container names a HAMi resource")
        hami_why = f'"HAMi vGPU " + string({var("hamiAsks")}[0].parts.join(", "))'
        kai_msg = self._message(KAI, kai_why)
        hami_msg = self._message(HAMI, hami_why)
        rule = other_systems.RULE
        prog.violations.append(
            f'request.operation == "CREATE" || {var("isGpu")}\n'
            f"  ? ({kai_ask} ? [{violation(rule, kai_path, kai_msg)}]\n"
            f'     : {var("hamiNamed")} && size({var("hamiAsks")}) > 0 ? '
            f'[{violation(rule, "string(" + var("hamiAsks") + "[0].path)", hami_msg)}] : [])\n'
            "  : []")

    @staticmethod
    def _message(system: str, why: str) -> str:
        """other_systems.undeclared_message with ``why`` a CEL string."""
        head, tail = other_systems.undeclared_message(system, "\0").split("\0")
        assert SYSTEM_NAMES[system] in head
        return f"{lit(head)} + {why} + {lit(tail)}"
