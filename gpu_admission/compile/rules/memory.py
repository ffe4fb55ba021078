"""The GPU-memory limits (:mod:`gpu_admission.rules.memory`) in CEL.

The compiler unit of that rule module; what a unit contributes, and the analysis
every unit reads, are in :mod:`gpu_admission.compile.units`.
"""

from __future__ import annotations

from typing import Any

from gpu_admission.facts.fractional import NVIDIA_MEM_LIMIT_MB
from gpu_admission.policy.model import Policy
from gpu_admission.rules import memory
from gpu_admission.rules.memory import format_fraction

from ..cel import concat, lit, pyrepr, rec, srec, trunc, var
from ..units import MAX_SAFE_INT, CompileError, Program, container_path, gpu_count


def _wanted(policy: Policy) -> list[tuple[str, str, str, str]]:
    """(env name, CEL value, CEL check -> "ok"|"exceeds"|"invalid" over ``v``, CEL expected
    text) of memory.wanted_env, with the pool-dependent numbers read from variables."""
    env = policy.spec.memory_limits.env
    mem = var("memMiB")
    frac_text = var("fractionText")
    out: list[tuple[str, str, str, str]] = []
    t = "v.trim()"
    int_re = "'^[+-]?[0-9]+(_[0-9]+)*$'"
    sig = f"{t}.replace(\"_\", \"\").find('[1-9][0-9]*$')"
    int_check = (f"!{t}.matches({int_re}) ? \"invalid\"\n"
                 f"  : size({sig}) > 15 ? \"exceeds\"\n"
                 f"  : int({t}.replace(\"_\", \"\")) > 0 && int({t}.replace(\"_\", \"\")) <= "
                 f'{mem} ? "ok" : "exceeds"')
    if env.nvidia_mem_limit_mb:
        out.append((NVIDIA_MEM_LIMIT_MB, f"string({mem})", int_check,
                    f'"<= " + string({mem}) + " (MiB)"'))
    float_re = _FLOAT_RE
    low = f"{t}.lowerAscii()"
    frac_check = (f"{low}.matches('^[+-]?(inf|infinity)$') ? \"exceeds\"\n"
                  f"  : {low}.matches('^[+-]?nan$') ? \"invalid\"\n"
                  f"  : !{t}.matches({float_re}) ? \"invalid\"\n"
                  f"  : v in {var('largeFractions')} ? \"exceeds\"\n"
                  f"  : double({t}.replace(\"_\", \"\")) > 0.0 && "
                  f"double({t}.replace(\"_\", \"\")) <= {var('fractionMax')}\n"
                  '    ? "ok" : "exceeds"')
    if env.gpu_memory_fraction:
        out.append((memory.GPU_MEMORY_FRACTION, frac_text, frac_check, f'"<= " + {frac_text}'))
    if env.jax_mem_fraction:
        for name in (memory.XLA_CLIENT_MEM_FRACTION, memory.XLA_PYTHON_CLIENT_MEM_FRACTION):
            out.append((name, frac_text, frac_check, f'"<= " + {frac_text}'))
    if env.tf_allow_growth:
        out.append((memory.TF_FORCE_GPU_ALLOW_GROWTH, '"true"',
                    f'{low} == "true" ? "ok" : "exceeds"', '"true"'))
    return out


def _at_least_ten() -> str:
    """|v| >= 10, decided on the text of a number ``float_re`` accepted, for ``v`` bound.

    Why: cel-go's ``double()`` is ``strconv.ParseFloat``, which fails on a value beyond the
    double range (``1e400``, 400 digits): a run-time error, so a denial under
    ``failurePolicy: Fail`` even in warn or audit mode, where the webhook (Python ``float``:
    ``inf``) only reports "exceeds". A fraction limit is at most 1, so every value of 10 or more
    exceeds it, and below 10 ``double()`` cannot overflow. The decimal magnitude of
    ``<int>.<frac>e<exp>`` is (significant integer digits - 1) + exp, or, without integer
    digits, exp - (leading zeros of frac) - 1; an exponent of more than 7 digits is decided
    without ``int()`` (it would overflow): huge means >= 10, tiny means 0 (both "exceeds").
    Used by the ``largeFractions`` variable, not inline: nested in ``memEnv`` it would push
    that expression past cel-cpp's parser depth (tests/compile/test_cel_cpp_typecheck.py)."""
    s = 'n.split("e")'
    mant_int = f'{s}[0].split(".")[0]'
    frac = f'{s}[0].split(".")[1]'
    sig = "find('[1-9][0-9]*$')"
    magnitude = (f"(size({mant_int}.{sig}) >= 1 ? size({mant_int}.{sig}) - 1\n"
                 f'      : (size({s}[0].split(".")) > 1 ? size({frac}.{sig}) - size({frac}) : 0)'
                 " - 1)\n"
                 f"    + (size({s}) > 1 ? int({s}[1]) : 0) >= 1")
    return (f'[v.trim().replace("_", "").lowerAscii()].map(n,\n'
            f"    size({s}) > 1 && size({s}[1].{sig}) > 7 ? true\n"
            f"    : {magnitude})[0]")


_AT_LEAST_TEN = _at_least_ten()


_DIGITS = "[0-9](_?[0-9])*"


_FLOAT_RE = f"'^[+-]?({_DIGITS}(\\\\.({_DIGITS})?)?|\\\\.{_DIGITS})([eE][+-]?{_DIGITS})?$'"


_MPS_RE = ("'(?i)^\\\\s*[0-9]+\\\\s*=\\\\s*[0-9]+(\\\\.[0-9]+)?\\\\s*[kmgt]?(i?b)?\\\\s*$'")


def _mps_check() -> str:
    """memory._mps_ok over ``v``: every non-blank ``<dev>=<size>`` entry within the limit."""
    entries = 'v.split(",").filter(e, e.trim() != "")'
    rhs = 'e.split("=")[1].trim()'
    num = f"{rhs}.find('[0-9]+(\\\\.[0-9]+)?')"
    unit = f"{rhs}.substring(size({num})).trim().lowerAscii()"
    factor = ('{"k": 0.0009765625, "m": 1.0, "g": 1024.0, "t": 1048576.0, "": 1.0}'
              f'[{unit}.matches("^[kmgt]") ? {unit}.substring(0, 1) : ""]')
    mib = f"double({num}) * {factor}"
    limit = f"double({var('memMiB')})"
    # A size of more than 300 significant digits exceeds any limit and would overflow
    # double() (a run-time error in cel-go, see _at_least_ten): decided on the text.
    huge = f"size({num}.split(\".\")[0].find('[1-9][0-9]*$')) > 300"
    bad = (f"{entries}.filter(e, !e.matches({_MPS_RE}) || ({huge} ? true\n"
           f"  : !({mib} > 0.0 && {mib} <= {limit})))")
    return (f"size({entries}) == 0 ? \"invalid\"\n"
            f"  : size({bad}) == 0 ? \"ok\"\n"
            f"  : {bad}[0].matches({_MPS_RE}) ? \"exceeds\" : \"invalid\"")


def _written_values_ok(policy: Policy) -> set[str]:
    """The env names whose written value (``memory.wanted_env``'s, for every pool and for an
    unknown pool, one and two devices) passes the engine's check of a value already there:
    for those a value equal to the written one is "ok" without parsing it. A pool whose own
    value would fail its check (0 MiB per replica, a fraction that rounds to 0) keeps the
    full check for every pod."""
    limits = policy.spec.memory_limits
    ok: dict[str, bool] = {}
    for pool in [None, *policy.compiled.pools]:
        for devices in (1, 2):
            wanted, _ = memory.wanted_env(pool, limits, devices)
            settled = memory.settled_names(wanted)  # the engine's own shortcut, per pool
            for name, *_ in wanted:
                ok[name] = ok.get(name, True) and name in settled
    return {name for name, good in ok.items() if good}


class MemoryUnit:
    ids: tuple[str, ...] = (memory.LIMIT, memory.UNVERIFIABLE)

    def emit(self, policy: Policy, prog: Program) -> None:
        limits = policy.spec.memory_limits
        pools = policy.compiled.pools
        for pool in pools:
            if pool.memory_mib >= MAX_SAFE_INT:
                raise CompileError(memory.LIMIT, f"spec.nodePools[{pool.name}].memoryMiB",
                                   f"{pool.memory_mib} MiB is beyond what the CEL int "
                                   f"comparison is written for (< {MAX_SAFE_INT})")
        if limits.default_memory_mib >= MAX_SAFE_INT:
            raise CompileError(memory.LIMIT, "spec.memoryLimits.defaultMemoryMiB",
                               f"beyond what the CEL int comparison is written for "
                               f"(< {MAX_SAFE_INT})")

        def per_pool(fn: Any, default: Any) -> str:
            if not pools:
                return lit(default)
            values = {p.name: fn(p) for p in pools}
            return (f'{var("pool")} in {lit(values)} ? {lit(values)}[{var("pool")}] : '
                    f"{lit(default)}")

        frac = limits.default_fraction
        prog.add("memApplies", f'{var("isGpu")} && {var("workload")} != "training" && '
                               f'!{var("mig")} && ({var("pool")} == "" || {var("poolShared")})',
                 "memory.shares_a_gpu: not training, not MIG, pool unknown or time-shared")
        prog.add("memMiB", per_pool(lambda p: p.memory_per_replica_mib, limits.default_memory_mib),
                 "MiB per container: pool memoryMiB // replicasPerGPU, else the default")
        prog.add("fractionText", per_pool(lambda p: format_fraction(1 / p.replicas_per_gpu),
                                          format_fraction(frac)),
                 "share of the card, rounded down to 3 decimals (a ratio, not %)")
        prog.add("fractionMax", per_pool(lambda p: 1 / p.replicas_per_gpu + 1e-9, frac + 1e-9),
                 "largest accepted fraction (the engine's 1e-9 tolerance included)")
        prog.add("memSource", per_pool(lambda p: f"pool {p.name}", "policy default"))
        mps = any(p.sharing == "mps" for p in pools) and limits.env.mps_pinned_mem_limit
        prog.add("mps", f'{var("poolSharing")} == "mps" && {lit(limits.env.mps_pinned_mem_limit)}')
        fractions = [n for n, on in ((memory.GPU_MEMORY_FRACTION, limits.env.gpu_memory_fraction),
                                     (memory.XLA_CLIENT_MEM_FRACTION, limits.env.jax_mem_fraction),
                                     (memory.XLA_PYTHON_CLIENT_MEM_FRACTION,
                                      limits.env.jax_mem_fraction)) if on]
        prog.add("largeFractions",
                 f"{var('gpu')}.map(g, has(g.c.env) ? g.c.env.filter(e, has(e.name) && "
                 f"e.name in {lit(fractions)} && has(e.value)).map(e, e.value) : []).flatten()"
                 f".filter(v, v.trim().matches({_FLOAT_RE}) ? {_AT_LEAST_TEN} : false)",
                 "fraction values of 10 or more, decided on the text (double() of 1e400 is a "
                 "run-time error in cel-go)")
        wanted = _wanted(policy)
        if mps:
            mem = var("memMiB")
            wanted.append((memory.CUDA_MPS_PINNED_DEVICE_MEM_LIMIT,
                           f'lists.range({gpu_count("g")}).map(d, string(d) + "=" + '
                           f'string({mem}) + "M").join(",")',
                           _mps_check(), f'"<= " + string({mem}) + "M per device"'))
        gpu = var("gpu")
        env = "env"  # bound below to the container's env list ([] when absent)
        rows = []
        written_ok = _written_values_ok(policy)
        for name, value, check, expected in wanted:
            found = f"names.lastIndexOf({lit(name)})"  # names: the env entries' names
            last = "at"  # bound below: the index of the last entry named `name`, or -1
            entry = f"{env}[at]"
            # The value the mutating policy writes is "ok" by the engine's own check (asserted
            # at compile time for every pool, _written_values_ok): the validating policies,
            # which see the mutated pod, answer it with one string comparison instead of the
            # regular expressions and the largeFractions walk (issue 21).
            shortcut = (f"  : {entry}.value == {value} ? \"ok\"\n"
                        if name in written_ok else "")
            state = (f"{last} < 0 ? \"upsert\"\n"
                     f"  : has({entry}.valueFrom) ? \"unverifiable\"\n"
                     f"  : !(has({entry}.value) && {entry}.value.trim() != \"\") ? \"upsert\"\n"
                     + shortcut +
                     f"  : [{entry}.value].map(v, {check})[0]")
            row = rec(name=lit(name), at=last, value=value, expected=expected, state=state,
                      current=f'{last} >= 0 && has({entry}.value) ? {entry}.value : ""')
            row = f"[{found}].map(at, {row})[0]"
            if name == memory.CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:
                row = f"{var('mps')} ? [{row}] : []"
            else:
                row = f"[{row}]"
            rows.append(row)
        # The pod as the mutating policy leaves it (what the validating policies see): the
        # last entry of every wanted name holds exactly the written value, so every state is
        # "ok" (not valueFrom, not blank, and the written values pass the engine's checks,
        # _written_values_ok): no finding, no upsert. memEnv (a record per name) is then never
        # evaluated for such a pod: variables are lazy (issue 21).
        settled = []
        for name, value, _check, _expected in wanted:
            same = (f"[names.lastIndexOf({lit(name)})].all(at, at >= 0 && "
                    f"has(c.env[at].value) && !has(c.env[at].valueFrom) && "
                    f"c.env[at].value != \"\" && c.env[at].value == {value})")
            if name == memory.CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:
                same = f"(!{var('mps')} || {same})"
            settled.append(same)
        if all(name in written_ok for name, *_ in wanted) and settled:
            body = " &&\n    ".join(settled)
            prog.add("memSettled",
                     f"!{var('memApplies')} || {gpu}.all(g, [g.c].all(c, has(c.env) && "
                     f"[c.env.map(e, e.name)].all(names,\n    {body})))",
                     "every GPU container's last entry of each memory variable holds exactly "
                     "the value the mutating policy writes: no finding, no upsert")
        else:
            prog.add("memSettled", "false", "a written value would fail its own check: "
                                            "always the full analysis")
        prog.add("memEnv",
                 f"{var('memApplies')} ? {gpu}.map(g, [has(g.c.env) ? g.c.env : []].map(env, "
                 f"[env.map(e, e.name)].map(names, {rec(g='g', env=concat(rows))})[0])[0]) : []",
                 "per GPU container, per memory env var: where it is and what to do "
                 "(upsert | ok | exceeds | invalid | unverifiable)")
        src = var("memSource")
        cur = pyrepr(trunc("w.current", 20))
        way_out = lit("; " + memory.WAY_OUT)  # issue 33: a denial names the way out
        message = (f'w.state == "unverifiable" ? w.name + " uses valueFrom; cannot check it is " '
                   f"+ w.expected\n"
                   f'  : w.state == "exceeds" ? w.name + "=" + {cur} + " exceeds the GPU memory '
                   f'allowed on a shared GPU (" + {src} + "): must be " + w.expected + {way_out}\n'
                   f'  : w.name + "=" + {cur} + " is not a valid value; expected " + w.expected '
                   f'+ " (" + {src} + ")"')
        rule = (f'w.state == "unverifiable" ? {lit(memory.UNVERIFIABLE)} : '
                f"{lit(memory.LIMIT)}")
        path = f'{container_path("m.g")} + ".env[" + string(w.at) + "]"'
        prog.violations.append(
            f"{var('memSettled')} ? [] : "
            f"{var('memEnv')}.map(m, m.env.filter(w, w.state in [\"unverifiable\", "
            f"\"exceeds\", \"invalid\"]).map(w, {srec(rule=rule, path=path, message=message)}))"
            ".flatten()")
        ups = 'm.env.filter(w, w.state == "upsert")'
        base = '"/spec/" + m.g.kind + "/" + string(m.g.index) + "/env"'
        entry_value = srec(name="w.name", value="w.value")
        whole_op = rec(op=lit("add"), path=base, value=f"{ups}.map(w, {entry_value})")
        append_op = rec(op=lit("add"), path=f'{base} + "/-"', value=entry_value)
        replace_op = rec(op=lit("replace"), path=f'{base} + "/" + string(w.at)',
                         value=entry_value)
        whole = f"[{whole_op}]"
        each = f"{ups}.map(w, w.at < 0 ? {append_op} : {replace_op})"
        prog.env_ops.append(
            f"{var('memSettled')} ? [] : "
            f"{var('memEnv')}.filter(m, {ups}.size() > 0).map(m, !has(m.g.c.env) ? {whole} "
            f": {each}).flatten()")
