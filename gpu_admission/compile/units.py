"""The policy, rule by rule, as CEL: one compiler unit per engine rule, plus the shared analysis.

Each unit mirrors one rule module of :mod:`gpu_admission.rules` (read its docstring for *why*
the rule exists; this module only says *how* it is written in CEL). A unit contributes

* ``variables``: named CEL expressions (``variables.<name>`` in Kubernetes admission policies),
  evaluated on the Pod (``object``) and the request;
* a CEL list of violations ``{"rule", "path", "message"}`` with the engine's exact texts;
* for rules that mutate, CEL lists of RFC 6902 operations ``{"op", "path", "value"}``
  computed against the pod as received, exactly as :class:`gpu_admission.patch.PatchBuilder`
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
from typing import Any, Protocol

import yaml

from gpu_admission.cuda import parse_repository
from gpu_admission.decision import Mode
from gpu_admission.dra.analysis import DEVICECLASS_RESOURCE_PREFIX
from gpu_admission.engine import BATCH_JOB_API_VERSIONS
from gpu_admission.policy.model import Policy
from gpu_admission.rules import (
    cuda_routing,
    gpu_access,
    memory,
    other_systems,
    scheduler,
    training,
)
from gpu_admission.rules.memory import format_fraction
from gpu_admission.sharing_systems import (
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
from gpu_admission.vocab import (
    CUDA_VERSION_LABEL,
    DEFAULT_SCHEDULER,
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

from .cel import concat, glob_to_re2, has_path, lit, norm_version, pyrepr, rec, srec, trunc, var

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


def _gpu_count(g: str) -> str:
    """``GpuContainer.gpu_count``: sum of the quantities (non-integers count 1), at least 1."""
    c = f"{g}.c"
    lim = f"{c}.resources.limits"
    req = f"{c}.resources.requests"
    has_lim = has_path(c, "resources", "limits")
    qty = (f"(({has_lim}) && n in {lim} && !({lim}[n] in [\"0\", \"\"]) ? {lim}[n] : {req}[n])")
    total = f"{g}.names.map(n, {qty}.matches('^[0-9]{{1,15}}$') ? int({qty}) : 1).sum()"
    return f"({total} > 1 ? {total} : 1)"


def _path(g: str) -> str:
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


def _image_rule(rule: ImageRow, i: str) -> str:
    """``ImageRule.matches`` over the split reference of image ``i``."""
    reg, repo, tag, dig = (f"{var(n)}[{i}]" for n in ("imgRegistry", "imgRepo", "imgTag",
                                                        "imgDigest"))
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
        which.append(f'({tag} != "" && {tag}.matches({lit(glob_to_re2(rule.glob))}))')
    return f"{where} && ({' || '.join(which)})"


def _table_lookup(rules: Sequence[ImageRow], i: str) -> str:
    out = '""'
    for rule in reversed(rules):
        out = f"({_image_rule(rule, i)})\n    ? {lit(rule.cuda_version)}\n    : {out}"
    return out


def _ngc_tables() -> dict[str, Any]:
    text = (resources.files("gpu_admission") / "data" / "ngc-cuda.yaml").read_text("utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def _cuda_analysis(policy: Policy, prog: Program) -> None:
    """engine._cuda and gpu_admission.cuda: the pod label, else the GPU containers' images
    (the policy's cudaRouting.images, the serving table, the built-in rules and NGC tables)."""
    gpu = var("gpu")
    rng = f"lists.range(size({gpu}))"
    prog.add("imgImage", f'{gpu}.map(g, has(g.c.image) ? g.c.image : "")')
    prog.add("imgRef", f'{var("imgImage")}.map(s, s.split("@")[0])',
             "cuda.split_reference: the reference without its digest")
    prog.add("imgDigest", f'{var("imgImage")}.map(s, s.contains("@") ? '
                          's.substring(s.indexOf("@") + 1) : "")')
    prog.add("imgTag", f'{var("imgRef")}.map(r, r.lastIndexOf(":") > r.lastIndexOf("/") ? '
                       'r.substring(r.lastIndexOf(":") + 1) : "")')
    prog.add("imgName", f'{var("imgRef")}.map(r, r.lastIndexOf(":") > r.lastIndexOf("/") ? '
                        'r.substring(0, r.lastIndexOf(":")) : r)')
    first = 'n.split("/")[0]'
    prog.add("imgHost", f'{var("imgName")}.map(n, n.contains("/") && ({first}.contains(".") '
                        f'|| {first}.contains(":") || {first} == "localhost") ? {first} : "")',
             "cuda.split_image: a first component with '.' or ':' or 'localhost' is a host")
    prog.add("imgPath", f'{rng}.map(i, {var("imgHost")}[i] != "" ? '
                        f'{var("imgName")}[i].substring(size({var("imgHost")}[i]) + 1) : '
                        f'{var("imgName")}[i])')
    prog.add("imgRegistry", f'{var("imgHost")}.map(h, h in ["docker.io", "index.docker.io", '
                            '"registry-1.docker.io"] ? "" : h)')
    prog.add("imgRepo", f'{rng}.map(i, {var("imgRegistry")}[i] == "" && '
                        f'{var("imgPath")}[i].startsWith("library/") ? '
                        f'{var("imgPath")}[i].substring(8) : {var("imgPath")}[i])')
    prog.add("imgPolicy", f"{rng}.map(i, {_table_lookup(policy_image_rows(policy), 'i')})",
             "spec.cudaRouting.images, first match wins")
    prog.add("imgServing", f"{rng}.map(i, {_table_lookup(serving_image_rows(), 'i')})",
             "data/serving-cuda.yaml, first match wins")
    tag = f"{var('imgTag')}[i]"
    repo = f"{var('imgRepo')}[i]"
    tables = _ngc_tables()
    monthly = {str(k): str(v) for k, v in (tables.get("monthly") or {}).items()}
    overrides = {str(c): {str(k): str(v) for k, v in rows.items()}
                 for c, rows in (tables.get("overrides") or {}).items()}
    tf_gpu = {str(k): str(v) for k, v in (tables.get("tensorflow_gpu") or {}).items()}
    prog.add("ngcMonthly", lit(monthly), "data/ngc-cuda.yaml monthly: NGC release -> CUDA")
    prog.add("ngcOverrides", lit(overrides) if overrides else "{}",
             "data/ngc-cuda.yaml overrides: container -> release -> CUDA")
    prog.add("tfGpu", lit(tf_gpu), "data/ngc-cuda.yaml tensorflow_gpu: TF x.y -> CUDA")
    release = f"{tag}.substring(0, 5)"
    container = f'{repo}.substring({repo}.lastIndexOf("/") + 1)'
    ovr = var("ngcOverrides")
    monthly_var = var("ngcMonthly")
    ngc = (f'{var("imgRegistry")}[i] == "nvcr.io" && {repo}.startsWith("nvidia/") && '
           f"{tag}.matches('^[0-9]{{2}}\\\\.[0-9]{{2}}([-.]|$)')\n"
           f"    ? ({container} in {ovr} && {release} in {ovr}[{container}] ? "
           f"{ovr}[{container}][{release}]\n"
           f"       : {release} in {monthly_var} ? {monthly_var}[{release}] : \"\")\n"
           f'    : ""')
    prog.add("imgNgc", f"{rng}.map(i, {ngc})", "data/ngc-cuda.yaml (overrides, then monthly)")
    tf_key = f"{tag}.find('^[0-9]+\\\\.[0-9]+')"
    tf = (f'{repo} == "tensorflow/tensorflow" && '
          f"{tag}.matches('^[0-9]+\\\\.[0-9]+(\\\\.[0-9]+)?(rc[0-9]+)?-gpu')\n"
          f'    ? ({tf_key} in {var("tfGpu")} ? {var("tfGpu")}[{tf_key}] : "none") : ""')
    prog.add("imgTf", f"{rng}.map(i, {tf})",
             'data/ngc-cuda.yaml tensorflow_gpu ("none": a -gpu tag the table lacks)')
    cu_re = "'(^|[-_.+])cu[0-9]{2,3}($|[-_.+])'"

    def cu_of(text: str) -> str:
        digits = f"{text}.find({cu_re}).find('[0-9]+')"
        return (f"{text}.matches({cu_re}) ? "
                f"string(int({digits}.substring(0, size({digits}) - 1))) "
                f'+ "." + string(int({digits}.substring(size({digits}) - 1))) : ""')

    prog.add("imgCu", f"{rng}.map(i, {cu_of(tag)})", "a cu<XY>/cu<XYZ> tag token (cu121 = 12.1)")
    prog.add("imgNameCu", f"{rng}.map(i, {cu_of(container)})",
             "a cu<XY>/cu<XYZ> token in the image name's last component (cuda._name_token)")
    cuda_re = "'(^|[-_.+])cuda-?[0-9]{1,2}\\\\.[0-9]{1,2}($|[-_.+]|\\\\.[0-9])'"
    found = f"{tag}.find({cuda_re}).find('[0-9]{{1,2}}\\\\.[0-9]{{1,2}}')"
    prog.add("imgCudaToken", f'{rng}.map(i, {tag}.matches({cuda_re}) ? '
                             f'{norm_version(found)} : "")', "a cuda<X.Y> tag token")
    nv_found = tag + ".find('^[0-9]+\\\\.[0-9]+')"
    nv_cuda = (f"{tag}.matches('^[0-9]{{1,9}}\\\\.[0-9]{{1,9}}(\\\\.[0-9]+)?(-|$)') ? "
               f"{norm_version(nv_found)} : \"\"")
    pt_found = f"{tag}.find('-cuda[0-9]+\\\\.[0-9]+(-|$)').find('[0-9]+\\\\.[0-9]+')"
    pytorch = (f"{tag}.matches('-cuda[0-9]{{1,9}}\\\\.[0-9]{{1,9}}(-|$)') ? "
               f'{norm_version(pt_found)} : ""')
    name_cu = f'{var("imgNameCu")}[i]'
    builtin = (f'{tag} == "" ? {name_cu}\n'
               f'  : {repo} == "nvidia/cuda" || {repo}.endsWith("/nvidia/cuda") ? ({nv_cuda})\n'
               f'  : {repo} == "pytorch/pytorch" ? ({pytorch})\n'
               f'  : {var("imgNgc")}[i] != "" ? {var("imgNgc")}[i]\n'
               f'  : {var("imgTf")}[i] != "" ? ({var("imgTf")}[i] == "none" ? "" : '
               f'{var("imgTf")}[i])\n'
               f'  : {var("imgCu")}[i] != "" ? {var("imgCu")}[i]\n'
               f'  : {var("imgCudaToken")}[i] != "" ? {var("imgCudaToken")}[i]\n'
               f'  : {name_cu}')
    prog.add("imgBuiltin", f"{rng}.map(i, {builtin})",
             "cuda.cuda_from_image: nvidia/cuda, pytorch/pytorch, NGC, tensorflow, cu/cuda tokens")
    prog.add("imgCuda", f'{rng}.map(i, {var("imgImage")}[i] == "" ? ""\n'
                        f'  : {var("imgPolicy")}[i] != "" ? {var("imgPolicy")}[i]\n'
                        f'  : {var("imgServing")}[i] != "" ? {var("imgServing")}[i]\n'
                        f'  : {var("imgBuiltin")}[i])',
             'CUDA of each GPU container\'s image ("" = unknown)')
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
             f"  : size({var('cudaVersions')}) == 1 ? \"image \" + {var('imgImage')}[{first_i}] "
             f"+ \" (\" + {_path(f'{gpu}[{first_i}]')} + \")\" : \"\"")
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
    resource = srec(path=_path("g") + ' + ".resources"',
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


# ---------------------------------------------------------------------------- units
class WorkloadLabelUnit:
    ids: tuple[str, ...] = ("workload-label",)

    def emit(self, policy: Policy, prog: Program) -> None:
        labels = var("labels")
        wl = lit(WORKLOAD_LABEL)
        bad = f"{wl} in {labels} && !({labels}[{wl}] in {lit(list(WORKLOAD_CLASSES))})"
        value = f"{labels}[{wl}]"
        message = (f'"unknown workload " + {pyrepr(trunc(value, 20))} + '
                   f'{lit("; use one of " + ", ".join(WORKLOAD_CLASSES) + " (classified as ")}'
                   f' + {var("workload")} + ")"')
        prog.violations.append(
            f"{var('isGpu')} && {bad} ? "
            f"[{violation('workload-label', lit(f'metadata.labels[{WORKLOAD_LABEL}]'), message)}]"
            " : []")


class TrainingUnit:
    ids: tuple[str, ...] = (training.RULE,)

    def emit(self, policy: Policy, prog: Program) -> None:
        text = ("; time-slicing makes each training job ~3x slower. Request nvidia.com/gpu on a "
                "dedicated node pool (sharing none) or MIG, or label the pod "
                "gpu-admission.io/workload=inference if it only serves")
        message = f'"training pod targets a time-sliced GPU (" + r.why + ")" + {lit(text)}'
        prog.violations.append(
            f"{var('isGpu')} && {var('workload')} == \"training\" ? "
            f"{var('sharedReasons')}.map(r, {violation(training.RULE, 'r.path', message)}) : []")
        prog.add("protect", f'{var("isGpu")} && {var("workload")} == "training" && '
                            f'size({var("sharedReasons")}) == 0',
                 "training on plain nvidia.com/gpu: add the training-protection requirement")


class SchedulerUnit:
    ids: tuple[str, ...] = (scheduler.RULE,)

    def emit(self, policy: Policy, prog: Program) -> None:
        target = policy.spec.scheduler_name
        if not target:
            prog.add("schedulerOp", "false", "spec.schedulerName is null: rule off")
            return
        cur = var("schedulerCurrent")
        prog.add("schedulerCurrent",
                 'has(object.spec.schedulerName) ? object.spec.schedulerName : ""')
        prog.add("schedulerApplies", f'{var("isGpu")} && !(has(object.spec.nodeName) && '
                                     'object.spec.nodeName != "")',
                 "a pod with nodeName bypasses scheduling and is left alone")
        message = (f'"keeps scheduler " + {pyrepr(trunc(cur, 40))} + '
                   f'{lit(f", not {target!r} (GPU packing off)")}')
        prog.violations.append(
            f'{var("schedulerApplies")} && !({cur} in ["", {lit(DEFAULT_SCHEDULER)}]) && '
            f"{cur} != {lit(target)} ? "
            f"[{violation(scheduler.RULE, lit('spec.schedulerName'), message)}] : []")
        prog.add("schedulerOp", f'{var("schedulerApplies")} && {cur} in ["", '
                                f'{lit(DEFAULT_SCHEDULER)}] && {cur} != {lit(target)}')


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
                 f".map(i, {_path(gpu + '[i]')}).join(\", \")")
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
        out.append((memory.NVIDIA_MEM_LIMIT_MB, f"string({mem})", int_check,
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
                           f'lists.range({_gpu_count("g")}).map(d, string(d) + "=" + '
                           f'string({mem}) + "M").join(",")',
                           _mps_check(), f'"<= " + string({mem}) + "M per device"'))
        gpu = var("gpu")
        env = "env"  # bound below to the container's env list ([] when absent)
        rows = []
        for name, value, check, expected in wanted:
            found = f"names.lastIndexOf({lit(name)})"  # names: the env entries' names
            last = "at"  # bound below: the index of the last entry named `name`, or -1
            entry = f"{env}[at]"
            state = (f"{last} < 0 ? \"upsert\"\n"
                     f"  : has({entry}.valueFrom) ? \"unverifiable\"\n"
                     f"  : !(has({entry}.value) && {entry}.value.trim() != \"\") ? \"upsert\"\n"
                     f"  : [{entry}.value].map(v, {check})[0]")
            row = rec(name=lit(name), at=last, value=value, expected=expected, state=state,
                      current=f'{last} >= 0 && has({entry}.value) ? {entry}.value : ""')
            row = f"[{found}].map(at, {row})[0]"
            if name == memory.CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:
                row = f"{var('mps')} ? [{row}] : []"
            else:
                row = f"[{row}]"
            rows.append(row)
        prog.add("memEnv",
                 f"{var('memApplies')} ? {gpu}.map(g, [has(g.c.env) ? g.c.env : []].map(env, "
                 f"[env.map(e, e.name)].map(names, {rec(g='g', env=concat(rows))})[0])[0]) : []",
                 "per GPU container, per memory env var: where it is and what to do "
                 "(upsert | ok | exceeds | invalid | unverifiable)")
        src = var("memSource")
        cur = pyrepr(trunc("w.current", 20))
        message = (f'w.state == "unverifiable" ? w.name + " uses valueFrom; cannot check it is " '
                   f"+ w.expected\n"
                   f'  : w.state == "exceeds" ? w.name + "=" + {cur} + " exceeds the GPU memory '
                   f'allowed on a shared GPU (" + {src} + "): must be " + w.expected\n'
                   f'  : w.name + "=" + {cur} + " is not a valid value; expected " + w.expected '
                   f'+ " (" + {src} + ")"')
        rule = (f'w.state == "unverifiable" ? {lit(memory.UNVERIFIABLE)} : '
                f"{lit(memory.LIMIT)}")
        path = f'{_path("m.g")} + ".env[" + string(w.at) + "]"'
        prog.violations.append(
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
            f"{var('memEnv')}.filter(m, {ups}.size() > 0).map(m, !has(m.g.c.env) ? {whole} "
            f": {each}).flatten()")


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
        prog.add("ephemeral", f'request.subResource == {lit(gpu_access.EPHEMERAL_SUBRESOURCE)}',
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


def other_system_pods() -> str:
    """engine._maybe_other: KAI's annotations, or a HAMi resource named in some container's
    limits or requests (CEL over ``object``)."""
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
        hami_why = f'"HAMi vGPU " + string({var("hamiAsks")}[0].parts.join(", "))'
        kai_msg = self._message(KAI, kai_why)
        hami_msg = self._message(HAMI, hami_why)
        rule = other_systems.RULE
        prog.violations.append(
            f'request.operation == "CREATE" || {var("isGpu")}\n'
            f"  ? ({kai_ask} ? [{violation(rule, kai_path, kai_msg)}]\n"
            f'     : size({var("hamiAsks")}) > 0 ? '
            f'[{violation(rule, "string(" + var("hamiAsks") + "[0].path)", hami_msg)}] : [])\n'
            "  : []")

    @staticmethod
    def _message(system: str, why: str) -> str:
        """other_systems.undeclared_message with ``why`` a CEL string."""
        head, tail = other_systems.undeclared_message(system, "\0").split("\0")
        assert SYSTEM_NAMES[system] in head
        return f"{lit(head)} + {why} + {lit(tail)}"


# The engine's rule modules, in RULES order, and the unit that compiles each.
UNITS: tuple[Unit, ...] = (WorkloadLabelUnit(), TrainingUnit(), SchedulerUnit(), CudaUnit(),
                           MemoryUnit(), GuardUnit(), OtherSystemsUnit())


@dataclass(frozen=True, slots=True)
class WebhookOnly:
    """A rule CEL admission cannot express: why, the policy field, and (CEL over ``object``)
    which pods it concerns, so the compiled policies skip them and a webhook scoped to them
    keeps the rule (``None``: every pod)."""

    field: str
    why: str
    pods: str | None


def _dra_pods() -> str:
    """gpu_admission.dra.analysis.needs_analysis, without the cluster's extended-resource
    names (those live in DeviceClasses, which CEL admission cannot read)."""
    prefix = lit(DEVICECLASS_RESOURCE_PREFIX)
    per_kind = []
    for kind in ("containers", "initContainers"):
        lst = f"object.spec.{kind}"
        names = " || ".join(
            f"(has(c.resources.{key}) && c.resources.{key}.exists(k, k.startsWith({prefix})))"
            for key in ("limits", "requests"))
        per_kind.append(f"(has({lst}) && {lst}.exists(c, has(c.resources) && ({names})))")
    return ("(has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0) || "
            + " || ".join(per_kind))


_DRA_WHY = ("needs the webhook's cache of ResourceClaims, ResourceClaimTemplates and "
            "DeviceClasses; CEL admission sees only the request and one params object")

#: Rule ids that stay with the webhook (compile fails naming them unless --partial).
WEBHOOK_ONLY: dict[str, WebhookOnly] = {
    "dra-reference-unknown": WebhookOnly("spec.dra (pods with spec.resourceClaims)", _DRA_WHY,
                                         _dra_pods()),
    "dra-sharing-possible": WebhookOnly("spec.dra (pods with spec.resourceClaims)", _DRA_WHY,
                                        _dra_pods()),
}


def unit_for(rule: str) -> Unit | None:
    for unit in UNITS:
        if rule in unit.ids:
            return unit
    return None
