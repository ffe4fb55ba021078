"""The GPU-access guard (:mod:`gpu_admission.rules.gpu_access`) in CEL.

The compiler unit of that rule module; what a unit contributes, and the analysis
every unit reads, are in :mod:`gpu_admission.compile.units`.
"""

from __future__ import annotations

from gpu_admission.core.decision import Mode
from gpu_admission.policy.model import Policy
from gpu_admission.rules import gpu_access

from ..cel import concat, has_path, lit, pyrepr, rec, request_field_is, srec, trunc, var
from ..units import Program, violation


class GuardUnit:
    """gpu_access.guard: no GPU without a GPU request (Pod CREATE only)."""

    ids: tuple[str, ...] = (gpu_access.ISOLATION, gpu_access.VISIBLE_DEVICES,
                            gpu_access.DEVICE_HOSTPATH)

    def __init__(self, *, gpu: bool = True, modes: str | None = None) -> None:
        """``gpu``: the pod may have GPU containers (the full compile; the guard half of
        :mod:`gpu_admission.compile.guard` sees only pods without any). ``modes``: a CEL map
        rule id -> mode to read the modes from at run time (the guard half, whose modes the
        Helm chart fills in), instead of baking the policy's modes into the expressions."""
        self.gpu = gpu
        self.modes = modes

    def emit(self, policy: Policy, prog: Program) -> None:
        modes = policy.compiled.modes
        env_name = lit(gpu_access.ENV)
        records = []
        for kind in ("containers", "initContainers"):
            lst = var(kind) if self.gpu else f"object.spec.{kind}"
            if not self.gpu:  # no analysis variables in the guard half
                records.append(f"(has({lst}) ? lists.range(size({lst})).map(i, "
                               f"{rec(kind=lit(kind), index='i', c=f'{lst}[i]')}) : [])")
                continue
            records.append(f"lists.range(size({lst})).map(i, "
                           f"{rec(kind=lit(kind), index='i', c=f'{lst}[i]')})")
        # kubectl debug: a pods/ephemeralcontainers UPDATE (the whole Pod) adds ephemeral
        # containers; the ones the old pod had are immutable and not judged (engine._ephemeral).
        eph_kind = gpu_access.EPHEMERAL_KIND
        eph = f"object.spec.{eph_kind}"
        old_names = (f"(has(oldObject.spec.{eph_kind}) ? oldObject.spec.{eph_kind}"
                     ".map(c, c.name) : [])")
        added = (f"(has({eph}) ? lists.range(size({eph})).filter(i, !({eph}[i].name in "
                 f"{old_names})).map(i, {rec(kind=lit(eph_kind), index='i', c=f'{eph}[i]')}) "
                 ": [])")
        env = "env"  # bound below to the container's env list ([] when absent)
        found = f"env.map(e, e.name).lastIndexOf({env_name})"
        last = "at"  # bound below: the index of the last NVIDIA_VISIBLE_DEVICES entry, or -1
        entry = f"{env}[at]"
        keys = f'{var("gpu")}.map(g, g.kind + "/" + string(g.index))'
        gpu_state = (f'a.kind != {lit(eph_kind)} && (a.kind + "/" + string(a.index)) in {keys} '
                     f'? ({last} >= 0 ? "gpu-set" : "ok")\n  : ') if self.gpu else ""
        state = (f'{gpu_state}{last} < 0 ? "isolate"\n'
                 f'  : has({entry}.valueFrom) ? "valueFrom"\n'
                 f'  : !(has({entry}.value) && {entry}.value.trim() != "") ? "isolate"\n'
                 f'  : {entry}.value in {lit(sorted(gpu_access.NO_DEVICE_VALUES))} ? "ok" : "set"')
        current = f'{last} >= 0 && has({entry}.value) ? {entry}.value : ""'
        guard_record = rec(kind="a.kind", index="a.index", at=last, state=state,
                           has_env="has(a.c.env)", value=current)
        prog.add("ephemeral", request_field_is("subResource",
                                                lit(gpu_access.EPHEMERAL_SUBRESOURCE)),
                 "kubectl debug (pods/ephemeralcontainers UPDATE): only the guard, for the "
                 "ephemeral containers it adds")
        prog.add("guardContainers",
                 f'{var("ephemeral")} ? {added}\n'
                 f'  : request.operation == "CREATE" ? {concat(records)} : []',
                 "the containers the guard judges: every container and init container on "
                 "CREATE, the added ephemeral containers on a pods/ephemeralcontainers UPDATE")
        prog.add("guardStates",
                 f"{var('guardContainers')}.map(a, "
                 f"[has(a.c.env) ? a.c.env : []].map(env, [{found}].map(at, "
                 f"{guard_record})[0])[0])",
                 "gpu_access.guard: every judged container's last NVIDIA_VISIBLE_DEVICES entry "
                 "and what it means (ok | isolate | set | valueFrom | gpu-set)")
        cpath = '"spec." + a.kind + "[" + string(a.index) + "]"'
        epath = cpath + ' + ".env[" + string(a.at) + "]"'
        gpu_set = (f"{gpu_access.ENV} is set in a container that requests a GPU; the device "
                   f"plugin chooses its GPU: remove {gpu_access.ENV} from env")
        tail = (" without a GPU request gives this container GPUs outside the scheduler's "
                f"accounting; request nvidia.com/gpu, or set {gpu_access.ENV}=void")
        shown = f'a.state == "valueFrom" ? "valueFrom" : {pyrepr(trunc("a.value", 40))}'
        isolation = (f"no GPU request and no {gpu_access.ENV}=void: a CUDA image (which sets "
                     f"{gpu_access.ENV}=all) would see every GPU of the node")
        visible = gpu_access.VISIBLE_DEVICES
        set_msg = f'{lit(gpu_access.ENV + "=")} + ({shown}) + {lit(tail)}'
        items = [f'a.state == "gpu-set" ? [{violation(visible, epath, lit(gpu_set))}]',
                 f'a.state in ["set", "valueFrom"] ? [{violation(visible, epath, set_msg)}]']
        isolate = violation(gpu_access.ISOLATION, cpath, lit(isolation))
        mutates = (f"{self.modes}[{lit(gpu_access.ISOLATION)}] == {lit(str(Mode.ENFORCE))}"
                   if self.modes else "")
        if self.modes:
            items.append(f'a.state == "isolate" && !({mutates}) ? [{isolate}]')
        elif modes[gpu_access.ISOLATION] is not Mode.ENFORCE:
            items.append(f'a.state == "isolate" ? [{isolate}]')
        per_container = " : ".join(items) + " : []"
        device = "'^(?:" + gpu_access.DEVICE_PATH_PATTERN.replace("\\", "\\\\") + ")$'"
        vols = "object.spec.volumes"
        path = f"{vols}[i].hostPath.path"
        exposes = (" exposes GPU device nodes (/dev/nvidia*, /dev/dri) outside the device "
                   "plugin; request nvidia.com/gpu instead")
        hostpath_msg = f'"hostPath " + {pyrepr(trunc(path, 40))} + {lit(exposes)}'
        vol_path = '"spec.volumes[" + string(i) + "].hostPath.path"'
        hostpaths = (f'request.operation == "CREATE" && has({vols}) ? lists.range(size({vols}))'
                     f'.filter(i, {has_path(vols + "[i]", "hostPath", "path")} && {path} != "" '
                     f"&& {path}.matches({device}))"
                     f".map(i, {violation(gpu_access.DEVICE_HOSTPATH, vol_path, hostpath_msg)})"
                     " : []")
        prog.violations.append(prog.add(
            "guardViolations",
            f"{var('guardStates')}.map(a, {per_container}).flatten()\n  + ({hostpaths})",
            "the guard's violations (gpu-visible-devices, gpu-device-hostpath, and "
            "gpu-access-isolation outside enforce)"))
        if self.modes or modes[gpu_access.ISOLATION] is Mode.ENFORCE:
            value = srec(name=env_name, value=lit(gpu_access.VOID))
            base = '"/spec/" + a.kind + "/" + string(a.index) + "/env"'
            whole = rec(op=lit("add"), path=base, value=f"[{value}]")
            append = rec(op=lit("add"), path=f'{base} + "/-"', value=value)
            replace = rec(op=lit("replace"), path=f'{base} + "/" + string(a.at)', value=value)
            prog.env_ops.append(prog.add(
                "guardOps",
                (f"!({mutates}) ? [] : " if self.modes else "")
                + f'{var("guardStates")}.filter(a, a.state == "isolate").map(a, '
                f"!a.has_env ? {whole}\n  : a.at < 0 ? {append}\n  : {replace})",
                "the guard's NVIDIA_VISIBLE_DEVICES=void upserts"))
