"""What the compiler units share: the :class:`Program` they write into, the :class:`Unit`
protocol, and the engine's analysis as CEL variables. The units themselves, one per engine rule
module and under its name, are :mod:`gpu_admission.compile.rules`.

Each unit mirrors one rule module of :mod:`gpu_admission.rules` (read its docstring for *why*
the rule exists; the unit only says *how* it is written in CEL). A unit contributes

* ``variables``: named CEL expressions (``variables.<name>`` in Kubernetes admission policies),
  evaluated on the Pod (``object``) and the request;
* a CEL list of violations ``{"rule", "path", "message"}`` with the engine's exact texts;
* for rules that mutate, CEL lists of RFC 6902 operations ``{"op", "path", "value"}``
  computed against the pod as received, exactly as :class:`gpu_admission.core.patch.PatchBuilder`
  renders them (index-addressed env upserts, whole-map adds where the parent is missing).

Every value the engine takes from the policy or from the package data files (pools, memory
values, the NGC / TensorFlow / serving image tables, ``spec.cudaRouting.images``) is read at
compile time from the same :class:`~gpu_admission.policy.model.Policy` and data files the
engine uses, and baked into the CEL as literals.

Kubernetes CEL facts used here (``shared/reference/admission-policy-cel.md``):
``object`` fields the typed Pod omits are *absent* (guard with ``has()``); quantities are
strings; map iteration order is not defined (so every "first key" is taken after ``sort()``,
which is also the order the webhook sees: the API server serialises Go maps with sorted keys).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Final, Protocol

import yaml

from gpu_admission.admission.pod import BATCH_JOB_API_VERSIONS
from gpu_admission.core.cuda import parse_repository
from gpu_admission.core.vocab import (
    CUDA_VERSION_LABEL,
    GFD_CUDA_RUNTIME_MAJOR,
    GFD_CUDA_RUNTIME_MINOR,
    GFD_PRODUCT,
    GFD_SHARING_STRATEGY,
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    SHARED_PRODUCT_SUFFIX,
    SHARED_STRATEGIES,
    SHARED_SUFFIX,
    WORKLOAD_CLASSES,
    WORKLOAD_LABEL,
)
from gpu_admission.policy.model import Policy
from gpu_admission.rules import (
    training,
)

from .cel import concat, glob_to_re2, has_path, let, lit, norm_version, rec, srec, var

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
REQ_PTR = "/spec/affinity/nodeAffinity/" + REQUIRED
# Values at or above this cannot be compared with CEL int (int64) without overflow guards.
MAX_SAFE_INT = 10**15


class CompileError(Exception):
    """A part of the policy that CEL cannot express: names the rule and the policy field."""

    def __init__(self, rule: str, field: str, why: str, pods: str | None = None) -> None:
        super().__init__(f"rule {rule}: {field}: {why}")
        self.rule = rule
        self.field = field
        self.why = why
        self.pods = pods  # CEL over ``object``: the pods it concerns (None: every pod)


@dataclass(frozen=True, slots=True)
class Var:
    name: str
    expr: str
    comment: str = ""


@dataclass(slots=True)
class Program:
    """What the units produce for one policy, before it is split into cluster objects."""

    variables: list[Var] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)  # CEL lists, engine rule order
    # the rule ids each entry of ``violations`` may report (its unit's ids), so each policy
    # can evaluate only the rules of its own mode
    violation_ids: list[tuple[str, ...]] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)  # CEL op lists, PatchBuilder.ops() order
    env_ops: list[str] = field(default_factory=list)  # env upserts (memory, then the guard)
    kinds: list[tuple[str, str]] = field(default_factory=list)  # (CEL bool, annotation kind)

    def add(self, name: str, expr: str, comment: str = "") -> str:
        self.variables.append(Var(name, expr, comment))
        return var(name)


class Unit(Protocol):
    """A compiler unit: the CEL form of one engine rule (all of its rule ids)."""

    ids: tuple[str, ...]

    def emit(self, policy: Policy, prog: Program) -> None:
        """Add variables, violations and operations to ``prog``; raise CompileError when
        the policy uses something CEL cannot express."""


def violation(rule: str, path: str, message: str) -> str:
    return srec(rule=lit(rule), path=path, message=message)


# ---------------------------------------------------------------------------- analysis
def _gpu_name(key: str) -> str:
    return (f"({key} == {lit(GPU_RESOURCE)} || {key} == {lit(GPU_RESOURCE + SHARED_SUFFIX)} "
            f"|| {key}.startsWith({lit(MIG_RESOURCE_PREFIX)}))")


def _gpu_names(c: str) -> str:
    """Non-zero GPU resource names of container ``c``: requests first, then limits-only
    names (the engine's merged ``found`` dict order), each sorted."""
    req = f"{c}.resources.requests"
    lim = f"{c}.resources.limits"
    has_req = has_path(c, "resources", "requests")
    has_lim = has_path(c, "resources", "limits")
    nonzero_req = f'(k in {req} && !({req}[k] in ["0", ""]))'
    return (f"(({has_req}) ? {req}.filter(k, {_gpu_name('k')} && !({req}[k] in [\"0\", \"\"]))"
            f".sort() : []) + "
            f"(({has_lim}) ? {lim}.filter(k, {_gpu_name('k')} && !({lim}[k] in [\"0\", \"\"]) "
            f"&& !(({has_req}) && {nonzero_req})).sort() : [])")


def gpu_count(g: str) -> str:
    """``GpuContainer.gpu_count``: sum of the quantities (non-integers count 1), at least 1."""
    c = f"{g}.c"
    lim = f"{c}.resources.limits"
    req = f"{c}.resources.requests"
    has_lim = has_path(c, "resources", "limits")
    qty = (f"(({has_lim}) && n in {lim} && !({lim}[n] in [\"0\", \"\"]) ? {lim}[n] : {req}[n])")
    total = f"{g}.names.map(n, {qty}.matches('^[0-9]{{1,15}}$') ? int({qty}) : 1).sum()"
    return f"({total} > 1 ? {total} : 1)"


def container_path(g: str) -> str:
    """CEL for a GPU container's path, ``spec.containers[0]``, as the engine's messages name it."""
    return f'"spec." + {g}.kind + "[" + string({g}.index) + "]"'


def analysis(policy: Policy, prog: Program) -> None:
    """The engine's per-pod analysis (``engine.evaluate`` before the rules run): GPU
    containers, workload class, CUDA version, node pool, time-sliced targets."""
    spec = policy.spec
    compiled = policy.compiled
    prog.add("containers", "has(object.spec.containers) ? object.spec.containers : []")
    prog.add("initContainers",
             "has(object.spec.initContainers) ? object.spec.initContainers : []")
    records = []
    for kind in ("containers", "initContainers"):
        lst = var(kind)
        c = f"{lst}[i]"
        record = rec(kind=lit(kind), index="i", c=c, names="names")
        records.append(
            f"lists.range(size({lst})).map(i, [{_gpu_names(c)}].map(names, {record})[0])\n"
            f"    .filter(g, size(g.names) > 0)")
    prog.add("gpu", concat(records),
             "GPU containers (engine.gpu_containers): a non-zero nvidia.com/gpu, "
             "nvidia.com/gpu.shared or nvidia.com/mig-* request or limit")
    prog.add("isGpu", f"size({var('gpu')}) > 0")
    prog.add("labels", "has(object.metadata.labels) ? object.metadata.labels : {}")
    labels = var("labels")
    wl = lit(WORKLOAD_LABEL)
    owners = "object.metadata.ownerReferences"
    kinds = lit(sorted(compiled.training_kinds))
    by_owner = f"has({owners}) && {owners}.exists(r, r.kind in {kinds})"
    prefixes = " || ".join(f"k.startsWith({lit(p)})" for p in compiled.training_prefixes)
    by_prefix = f"{labels}.exists(k, {prefixes})" if prefixes else "false"
    first_owner = f"{owners}.filter(r, r.kind in {kinds})[0]"
    first_prefix = f"{labels}.filter(k, {prefixes}).sort()[0]" if prefixes else '""'
    valid_label = f"{wl} in {labels} && {labels}[{wl}] in {lit(list(WORKLOAD_CLASSES))}"
    chain = [(valid_label, f"{labels}[{wl}]", lit(f"label {WORKLOAD_LABEL}")),
             (by_owner, '"training"',
              f'"owner " + {first_owner}.kind + "/" + '
              f'(has({first_owner}.name) ? {first_owner}.name : "")'),
             (by_prefix, '"training"', f'"label " + {first_prefix}')]
    chain += [(f"{lit(key)} in {labels}", '"notebook"', lit(f"label {key}"))
              for key in compiled.notebook_labels]
    if compiled.notebook_images:  # engine.classify: a container image of a notebook stack
        starts = " || ".join(f"c.image.startsWith({lit(p)})"
                             for p in compiled.notebook_images)
        prog.add("notebookImages",
                 f"object.spec.containers.filter(c, has(c.image) && ({starts}))"
                 ".map(c, c.image)", "engine.classify: classification.notebookImages")
        nb = var("notebookImages")
        chain.append((f"size({nb}) > 0", '"notebook"', f'"image " + {nb}[0]'))
    if compiled.batch_job_workload is not None:  # engine.classify: a batch/v1 Job owner
        is_job = f'r.kind == "Job" && r.apiVersion in {lit(list(BATCH_JOB_API_VERSIONS))}'
        first_job = f"{owners}.filter(r, {is_job})[0]"
        chain.append((f"has({owners}) && {owners}.exists(r, {is_job})",
                      lit(compiled.batch_job_workload),
                      f'"owner Job/" + (has({first_job}.name) ? {first_job}.name : "") + '
                      f'{lit(" (classification.batchJobWorkload)")}'))
    default = spec.classification.default_workload
    workload = reason = ""
    for cond, value, why in reversed(chain):
        workload = f"{cond}\n  ? {value}\n  : {workload or lit(default)}"
        reason = f"{cond}\n  ? {why}\n  : {reason or lit('default')}"
    prog.add("workload", workload, "engine.classify: label, training owner kinds, "
             "training label prefixes, notebook labels, else the policy default")
    prog.add("workloadReason", reason)
    _cuda_analysis(policy, prog)
    prog.add("nodeSelector", "has(object.spec.nodeSelector) ? object.spec.nodeSelector : {}")
    terms = "object.spec.affinity.nodeAffinity." + REQUIRED + ".nodeSelectorTerms"
    has_terms = has_path("object.spec", "affinity", "nodeAffinity", REQUIRED, "nodeSelectorTerms")
    prog.add("terms", f"({has_terms}) ? {terms} : []",
             "required node-affinity terms as sent (engine._terms)")
    ns = var("nodeSelector")
    cuda = lit(CUDA_VERSION_LABEL)
    route = (f'{var("cudaVersion")} != "" && {var("workload")} != "training" && '
             f"{lit(spec.cuda_routing.node_selector)} && !({cuda} in {ns})")
    prog.add("routeCuda", route, "the CUDA label goes into the routed nodeSelector")
    _pool(policy, prog)
    _shared_reasons(prog)


@dataclass(frozen=True, slots=True)
class ImageRow:
    """One image -> CUDA rule (cuda.ImageRule), with its tag glob kept as written."""

    registry: str
    repository: str
    glob: str | None
    digests: tuple[str, ...]
    cuda_version: str


def policy_image_rows(policy: Policy) -> list[ImageRow]:
    """spec.cudaRouting.images, in order (ImageCuda.rule() normalises the repository)."""
    rows = []
    for entry in policy.spec.cuda_routing.images:
        rule = entry.rule()
        rows.append(ImageRow(rule.registry, rule.repository, entry.tags,
                             tuple(sorted(rule.digests)), rule.cuda_version))
    return rows


def serving_image_rows() -> list[ImageRow]:
    """data/serving-cuda.yaml read as cuda.serving_rules() reads it (one rule per glob)."""
    text = (resources.files("gpu_admission") / "data" / "serving-cuda.yaml").read_text("utf-8")
    data = yaml.safe_load(text) or {}
    rows = []
    for row in data.get("images", []):
        registry, repository = parse_repository(row["repository"])
        globs = row.get("tags") or []
        for glob in globs if isinstance(globs, list) else [globs]:
            rows.append(ImageRow(registry, repository, str(glob), (), str(row["cudaVersion"])))
    return rows


def _image_rule(rule: ImageRow, m: str) -> str:
    """``ImageRule.matches`` over ``m``, one image's split reference (variable ``img``)."""
    reg, repo, tag, dig = (f"{m}.{k}" for k in ("registry", "repo", "tag", "digest"))
    if rule.registry:
        where = f"{reg} == {lit(rule.registry)} && {repo} == {lit(rule.repository)}"
    else:
        where = (f"({repo} == {lit(rule.repository)} || "
                 f"{repo}.endsWith({lit('/' + rule.repository)}))")
    if rule.glob is None and not rule.digests:
        return where
    which = []
    if rule.digests:
        which.append(f'({dig} != "" && {dig} in {lit(list(rule.digests))})')
    if rule.glob is not None:
        which.append(f'({tag} != "" && {tag}.matches({lit(_tags_re2(rule.glob))}))')
    return f"{where} && ({' || '.join(which)})"


#: joins the tag globs of consecutive rows merged by :func:`_merged` (not a glob character)
GLOB_JOIN: Final = "\n"


def _tags_re2(globs: str) -> str:
    """One anchored RE2 pattern for one glob, or for several joined by :data:`GLOB_JOIN`
    (any of them)."""
    parts = [glob_to_re2(glob) for glob in globs.split(GLOB_JOIN)]
    if len(parts) == 1:
        return parts[0]
    return "^(?:" + "|".join(part[1:-1] for part in parts) + ")$"  # each is ^...$


def _merged(rules: Sequence[ImageRow]) -> list[ImageRow]:
    """Consecutive rows for the same repository and CUDA version that differ only in their
    tag glob, as one row whose tags match any of the globs: the same first match wins (no
    row lies between them), one repository test and one ``matches()`` instead of one per
    row, for every GPU container (the CEL cost budget, docs/compile.md)."""
    out: list[ImageRow] = []
    for rule in rules:
        last = out[-1] if out else None
        if (last is not None and rule.glob is not None and last.glob is not None
                and not rule.digests and not last.digests
                and (last.registry, last.repository, last.cuda_version)
                == (rule.registry, rule.repository, rule.cuda_version)):
            out[-1] = ImageRow(last.registry, last.repository,
                               last.glob + GLOB_JOIN + rule.glob, (), last.cuda_version)
        else:
            out.append(rule)
    return out


def _table_lookup(rules: Sequence[ImageRow], m: str) -> str:
    out = '""'
    for rule in reversed(_merged(rules)):
        out = f"({_image_rule(rule, m)})\n    ? {lit(rule.cuda_version)}\n    : {out}"
    return out


def _ngc_tables() -> dict[str, Any]:
    text = (resources.files("gpu_admission") / "data" / "ngc-cuda.yaml").read_text("utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def _first_of(prefix: str, *candidates: str) -> str:
    """The first non-empty string of ``candidates``, each computed at most once and only when
    the ones before it are empty (the engine's "first match wins" chains); ``prefix`` names
    the bound values (no shadowing between nested chains)."""
    out = candidates[-1]
    for n, candidate in reversed(list(enumerate(candidates[:-1]))):
        out = let(candidate, f"{prefix}{n}", f'{prefix}{n} != "" ? {prefix}{n} : {out}')
    return out


def _cuda_analysis(policy: Policy, prog: Program) -> None:
    """engine._cuda and gpu_admission.core.cuda: the pod label, else the GPU containers' images
    (the policy's cudaRouting.images, the serving table, the built-in rules and NGC tables).

    Per container, two variables (the facts of one object computed once, not one variable
    per step): ``img``, the split reference of its image (cuda.split_reference,
    cuda.split_image), and ``imgCuda``, its CUDA from the first source that knows it. The NGC
    and TensorFlow tables are literals in the expression: the API server builds a constant
    map once, when it compiles the expression (cel-go's OptOptimize), where a variable holding
    it would be one more evaluation per policy."""
    gpu = var("gpu")
    rng = f"lists.range(size({gpu}))"
    # cuda.split_reference / split_image over one image string s, step by step: r (no
    # digest), t (index of the tag's ':' or -1), n (name), h (host), p (path), reg (registry;
    # Docker Hub's hosts are none).
    first = 'n.substring(0, n.indexOf("/"))'
    record = ('{"image": s, "digest": s.contains("@") ? s.substring(s.indexOf("@") + 1) : "", '
              '"tag": t >= 0 ? r.substring(t + 1) : "", "registry": reg, '
              '"repo": reg == "" && p.startsWith("library/") ? p.substring(8) : p}')
    split = let('h in ["docker.io", "index.docker.io", "registry-1.docker.io"] ? "" : h',
                 "reg", record)
    split = let('h != "" ? n.substring(size(h) + 1) : n', "p", split)
    split = let(f'n.contains("/") && ({first}.contains(".") || {first}.contains(":") || '
                 f'{first} == "localhost") ? {first} : ""', "h", split)
    split = let('t >= 0 ? r.substring(0, t) : r', "n", split)
    split = let('r.lastIndexOf(":") > r.lastIndexOf("/") ? r.lastIndexOf(":") : -1', "t",
                 split)
    split = let('s.split("@")[0]', "r", split)
    image = let('has(g.c.image) ? string(g.c.image) : ""', "s", split)
    prog.add("img", f"{gpu}.map(g, {image})",
             "cuda.split_reference and split_image of each GPU container's image: image, "
             "digest, tag, registry (\"\" for Docker Hub), repository")
    tag = "m.tag"
    repo = "m.repo"
    tables = _ngc_tables()
    monthly = lit({str(k): str(v) for k, v in (tables.get("monthly") or {}).items()})
    overrides = {str(c): {str(k): str(v) for k, v in rows.items()}
                 for c, rows in (tables.get("overrides") or {}).items()}
    ovr = lit(overrides) if overrides else "{}"
    tf_gpu = lit({str(k): str(v) for k, v in (tables.get("tensorflow_gpu") or {}).items()})
    release = f"{tag}.substring(0, 5)"
    container = f'{repo}.substring({repo}.lastIndexOf("/") + 1)'
    # data/ngc-cuda.yaml: the overrides, then the monthly table
    ngc = (f'm.registry == "nvcr.io" && {repo}.startsWith("nvidia/") && '
           f"{tag}.matches('^[0-9]{{2}}\\\\.[0-9]{{2}}([-.]|$)')\n"
           f"    ? ({container} in {ovr} && {release} in {ovr}[{container}] ? "
           f"{ovr}[{container}][{release}]\n"
           f"       : {release} in {monthly} ? {monthly}[{release}] : \"\")\n"
           f'    : ""')
    # data/ngc-cuda.yaml tensorflow_gpu ("none": a -gpu tag the table lacks)
    tf_key = f"{tag}.find('^[0-9]+\\\\.[0-9]+')"
    tf = (f'{repo} == "tensorflow/tensorflow" && '
          f"{tag}.matches('^[0-9]+\\\\.[0-9]+(\\\\.[0-9]+)?(rc[0-9]+)?-gpu')\n"
          f'    ? ({tf_key} in {tf_gpu} ? {tf_gpu}[{tf_key}] : "none") : ""')
    cu_re = "'(^|[-_.+])cu[0-9]{2,3}($|[-_.+])'"

    def cu_of(text: str) -> str:
        """a cu<XY>/cu<XYZ> token (cu121 = 12.1)"""
        digits = f"{text}.find({cu_re}).find('[0-9]+')"
        return (f"{text}.matches({cu_re}) ? "
                f"string(int({digits}.substring(0, size({digits}) - 1))) "
                f'+ "." + string(int({digits}.substring(size({digits}) - 1))) : ""')

    cuda_re = "'(^|[-_.+])cuda-?[0-9]{1,2}\\\\.[0-9]{1,2}($|[-_.+]|\\\\.[0-9])'"
    found = f"{tag}.find({cuda_re}).find('[0-9]{{1,2}}\\\\.[0-9]{{1,2}}')"
    cuda_token = f'{tag}.matches({cuda_re}) ? {norm_version(found)} : ""'
    nv_found = tag + ".find('^[0-9]+\\\\.[0-9]+')"
    nv_cuda = (f"{tag}.matches('^[0-9]{{1,9}}\\\\.[0-9]{{1,9}}(\\\\.[0-9]+)?(-|$)') ? "
               f"{norm_version(nv_found)} : \"\"")
    pt_found = f"{tag}.find('-cuda[0-9]+\\\\.[0-9]+(-|$)').find('[0-9]+\\\\.[0-9]+')"
    pytorch = (f"{tag}.matches('-cuda[0-9]{{1,9}}\\\\.[0-9]{{1,9}}(-|$)') ? "
               f'{norm_version(pt_found)} : ""')
    name_cu = cu_of(container)  # a token in the image name's last component (cuda._name_token)
    tf_or_rest = let(tf, "tf", 'tf != "" ? (tf == "none" ? "" : tf) : '
                                + _first_of("token", cu_of(tag), cuda_token, name_cu))
    builtin = (f'{tag} == "" ? ({name_cu})\n'
               f'  : {repo} == "nvidia/cuda" || {repo}.endsWith("/nvidia/cuda") ? ({nv_cuda})\n'
               f'  : {repo} == "pytorch/pytorch" ? ({pytorch})\n'
               f'  : {let(ngc, "ngc", "ngc != " + lit("") + " ? ngc : " + tf_or_rest)}')
    # The image tables in a variable of their own: in one expression with the built-in rules
    # the AST nests deeper than cel-cpp's checked-expression decoder takes (upb's depth
    # limit of 100), with a policy table of a few rows.
    rows = [*policy_image_rows(policy), *serving_image_rows()]
    table = var("imgTable") + "[i]"
    if rows:
        prog.add("imgTable", f'{var("img")}.map(m, {_table_lookup(rows, "m")})',
                 "spec.cudaRouting.images, then data/serving-cuda.yaml: first match wins")
    cuda = ('m.image == "" ? ""\n' + (f'  : {table} != "" ? {table}\n' if rows else "")
            + f"  : {builtin}")
    prog.add("imgCuda", f'lists.range(size({var("img")})).map(i, '
                        f'{let(var("img") + "[i]", "m", cuda)})',
             "CUDA of each GPU container's image (\"\" = unknown): the tables, then "
             "cuda.cuda_from_image (nvidia/cuda, pytorch/pytorch, NGC, tensorflow, cu/cuda "
             "tokens)")
    labels = var("labels")
    cl = lit(CUDA_VERSION_LABEL)
    prog.add("cudaLabelValid",
             f"{cl} in {labels} && {labels}[{cl}].matches('^[0-9]{{1,3}}\\\\.[0-9]{{1,3}}$')")
    prog.add("cudaVersions", f'{var("imgCuda")}.filter(v, v != "").distinct().sort()',
             "distinct image CUDA versions (more than one: cuda-version-conflict)")
    first_i = f'{rng}.filter(i, {var("imgCuda")}[i] != "")[0]'
    prog.add("cudaVersion", f"{var('cudaLabelValid')} ? {norm_version(f'{labels}[{cl}]')}\n"
                            f"  : size({var('cudaVersions')}) == 1 ? {var('cudaVersions')}[0] "
                            f': ""')
    prog.add("cudaSource",
             f"{var('cudaLabelValid')} ? {lit('label ' + CUDA_VERSION_LABEL)}\n"
             f"  : size({var('cudaVersions')}) == 1 ? \"image \" + {var('img')}[{first_i}].image "
             f"+ \" (\" + {container_path(f'{gpu}[{first_i}]')} + \")\" : \"\"")
    prog.add("cudaConflict", f"!{var('cudaLabelValid')} && size({var('cudaVersions')}) > 1")


def _pool(policy: Policy, prog: Program) -> None:
    """engine._find_pool: explicit choice, then every required term, then routed selector."""
    compiled = policy.compiled
    ns = var("nodeSelector")
    cuda = CUDA_VERSION_LABEL
    if not compiled.pools:
        prog.add("pool", '""', "the policy defines no node pools")
    else:
        def own(items: Sequence[tuple[str, str]]) -> str:
            return " && ".join(f"{lit(k)} in {ns} && {ns}[{lit(k)}] == {lit(v)}"
                               for k, v in items)

        def in_terms(items: Sequence[tuple[str, str]]) -> str:
            each = " && ".join(f"{lit(k + '=' + v)} in t" for k, v in items)
            return f"size({var('termsIn')}) > 0 && {var('termsIn')}.all(t, {each})"

        prog.add("termsIn", f"{var('terms')}.map(t, has(t.matchExpressions) ? "
                            "t.matchExpressions.filter(e, e.operator == \"In\" && has(e.values))"
                            '.map(e, e.values.map(v, e.key + "=" + v)).flatten() : [])',
                 'engine._term_in: the "key=value" pairs each required term allows (In)')

        def routed(items: Sequence[tuple[str, str]]) -> str:
            parts = []
            for k, v in items:
                if k == cuda:
                    parts.append(f"({lit(k)} in {ns} ? {ns}[{lit(k)}] == {lit(v)} : "
                                 f"{var('routeCuda')} && {var('cudaVersion')} == {lit(v)})")
                else:
                    parts.append(f"{lit(k)} in {ns} && {ns}[{lit(k)}] == {lit(v)}")
            return " && ".join(parts)

        chain = ([(own(items), p.name) for p, items in compiled.explicit_pools]
                 + [(in_terms(items), p.name) for p, items in compiled.pool_selectors]
                 + [(routed(items), p.name) for p, items in compiled.pool_selectors])
        expr = '""'
        for cond, name in reversed(chain):
            expr = f"({cond})\n  ? {lit(name)}\n  : {expr}"
        prog.add("pool", expr, "engine._find_pool: explicit pools, every required term, then "
                               "the routed nodeSelector; first match in policy order")
    pools = compiled.pools

    def table(values: dict[str, Any], default: Any) -> str:
        if not pools:
            return lit(default)
        return f'{var("pool")} in {lit(values)} ? {lit(values)}[{var("pool")}] : {lit(default)}'

    prog.add("poolSharing", table({p.name: p.sharing for p in pools}, ""))
    prog.add("poolShared", f'{var("poolSharing")} in {lit(list(SHARED_STRATEGIES))}')
    prog.add("poolCuda", table({p.name: p.cuda_version or "" for p in pools}, ""))
    prog.add("mig", f'{var("gpu")}.exists(g, g.names.exists(n, n.startsWith('
                    f'{lit(MIG_RESOURCE_PREFIX)}))) || {var("poolSharing")} == "mig"')


def _term_values(t: str, key: str) -> str:
    return (f"(has({t}.matchExpressions) ? {t}.matchExpressions.filter(e, e.operator == \"In\" "
            f"&& e.key == {lit(key)} && has(e.values)).map(e, e.values).flatten() : [])")


def _shared_reasons(prog: Program) -> None:
    """engine._shared_reasons: why the pod targets a time-sliced GPU, (path, why) each."""
    gpu = var("gpu")
    ns = var("nodeSelector")
    strat = lit(GFD_SHARING_STRATEGY)
    product = lit(GFD_PRODUCT)
    shared = f"n.endsWith({lit(SHARED_SUFFIX)})"
    term_shared = (f"({_term_values(var('terms') + '[i]', GFD_SHARING_STRATEGY)}"
                   f".filter(v, v in {lit(list(SHARED_STRATEGIES))}) + "
                   f"{_term_values(var('terms') + '[i]', GFD_PRODUCT)}"
                   f".filter(v, v.endsWith({lit(SHARED_PRODUCT_SUFFIX)})))")
    resource = srec(path=container_path("g") + ' + ".resources"',
                    why=f'"resource " + g.names.filter(n, {shared})[0]')
    by_strategy = srec(path=lit(f"spec.nodeSelector[{GFD_SHARING_STRATEGY}]"),
                       why=f"{lit(GFD_SHARING_STRATEGY + '=')} + {ns}[{strat}]")
    by_product = srec(path=lit(f"spec.nodeSelector[{GFD_PRODUCT}]"),
                      why=f'"product " + {ns}[{product}]')
    term_path = lit(f"spec.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms[")
    by_term = srec(path=f'{term_path} + string(i) + "]"',
                   why=f'"node affinity " + {term_shared}.distinct().sort().join(", ")')
    by_pool = srec(path=lit("spec.nodeSelector"),
                   why=f'"pool " + {var("pool")} + " is " + {var("poolSharing")}')
    shared_list = lit(list(SHARED_STRATEGIES))
    parts = [
        f"{gpu}.filter(g, g.names.exists(n, {shared})).map(g, {resource})",
        f"{strat} in {ns} && {ns}[{strat}] in {shared_list} ? [{by_strategy}] : []",
        f"{product} in {ns} && {ns}[{product}].endsWith({lit(SHARED_PRODUCT_SUFFIX)}) ? "
        f"[{by_product}] : []",
        f"lists.range(size({var('terms')})).filter(i, size({term_shared}) > 0)"
        f".map(i, {by_term})",
        f"{var('poolShared')} ? [{by_pool}] : []",
    ]
    prog.add("sharedReasons", concat(parts),
             "engine._shared_reasons: .shared resources, GFD labels in the nodeSelector or in "
             "a required term, a time-sliced/MPS pool")


def affinity_ops(policy: Policy, prog: Program) -> None:
    """PatchBuilder._affinity_ops: the training-protection requirement ANDed into every
    required term and/or the driver-CUDA alternatives crossed into the terms."""
    terms = var("terms")
    p_lit = lit(dict(training.PROTECTION))
    exprs = "(has(t.matchExpressions) ? t.matchExpressions : [])"
    need_p = f"{var('protect')} && !{exprs}.exists(e, e == {p_lit})"
    prog.add("hadTerms", f"size({terms}) > 0")
    base = f"({var('hadTerms')} ? {terms} : [{{}}])"
    def term(group: str) -> str:
        """``{**t, "matchExpressions": exprs + group}`` (a term has only these two fields)."""
        both = rec(matchExpressions=f"{exprs} + {group}", matchFields="t.matchFields")
        return f"(has(t.matchFields) ? {both} : {rec(matchExpressions=f'{exprs} + {group}')})"

    if policy.spec.cuda_routing.driver_affinity:
        version = var("cudaVersion")
        major = f'{version}.split(".")[0]'
        minor = f'int({version}.split(".")[1])'
        gt_major = rec(key=lit(GFD_CUDA_RUNTIME_MAJOR), operator=lit("Gt"), values=f"[{major}]")
        in_major = rec(key=lit(GFD_CUDA_RUNTIME_MAJOR), operator=lit("In"), values=f"[{major}]")
        gt_minor = rec(key=lit(GFD_CUDA_RUNTIME_MINOR), operator=lit("Gt"),
                       values=f"[string({minor} - 1)]")
        newer = f"[{gt_major}]"
        same = f"[{in_major}] + ({minor} > 0 ? [{gt_minor}] : [])"
        present = f"{exprs}.exists(e, e.key == {lit(GFD_CUDA_RUNTIME_MAJOR)})"
        crossed = (f"{var('driverOn')} ? {base}.map(t, {present} ? [t] : [{term(newer)}, "
                   f"{term(same)}]).flatten() : {base}")
        prog.add("crossed", f"{var('driverOn')} && {base}.exists(t, !{present})")
    else:
        crossed = base
        prog.add("crossed", "false")
    prog.add("crossTerms", crossed, "required terms after crossing in the driver-CUDA "
                                    "alternatives (terms are ORed, expressions ANDed)")
    prog.add("finalTerms", f"{var('crossTerms')}.map(t, {need_p} ? {term(f'[{p_lit}]')} : t)")
    prog.add("affinityChange",
             f"({var('protect')} || {var('driverOn')}) && ({var('crossed')} || "
             f"!{var('hadTerms')} || {var('crossTerms')}.exists(t, {need_p}))")
    required = rec(nodeSelectorTerms=var("finalTerms"))
    a = "object.spec.affinity"
    term_ptr = f'{lit(REQ_PTR + "/nodeSelectorTerms/")} + string(i) + "/matchExpressions"'
    append = rec(op=lit("add"), path=f'{term_ptr} + "/-"', value=p_lit)
    create = rec(op=lit("add"), path=term_ptr, value=f"[{p_lit}]")
    per_term = (f"lists.range(size({terms})).filter(i, [{terms}[i]].exists(t, {need_p}))"
                f".map(i, has({terms}[i].matchExpressions) ? {append} : {create})")
    add_affinity = rec(op=lit("add"), path=lit("/spec/affinity"),
                       value=rec(nodeAffinity=rec(**{REQUIRED: required})))
    add_node = rec(op=lit("add"), path=lit("/spec/affinity/nodeAffinity"),
                   value=rec(**{REQUIRED: required}))
    add_required = rec(op=lit("add"), path=lit(REQ_PTR), value=required)
    add_terms = rec(op=lit("add"), path=lit(REQ_PTR + "/nodeSelectorTerms"),
                    value=var("finalTerms"))
    ops = (f"!{var('affinityChange')} ? []\n"
           f"  : !has({a}) ? [{add_affinity}]\n"
           f"  : !has({a}.nodeAffinity) ? [{add_node}]\n"
           f"  : !has({a}.nodeAffinity.{REQUIRED}) ? [{add_required}]\n"
           f"  : {var('crossed')} || !{var('hadTerms')} ? [{add_terms}]\n"
           f"  : {per_term}")
    prog.ops.append(ops)
    prog.kinds.append((f"{var('affinityChange')}", "affinity"))


