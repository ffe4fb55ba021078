"""Property tests (hypothesis) on generated GPU pods.

For every generated pod and policy:

* ``evaluate`` does not modify its input; a denial carries no patch;
* the patch applies cleanly with jsonpatch, and evaluating the result (under a new request
  UID) gives an empty patch (idempotent) and is still allowed;
* nothing outside the fields a rule owns changes;
* the patch builder agrees with a naive reference (deep copy + direct edits) in effect, and
  with the ``jsonpatch.make_patch`` diff of that reference (the applied results are equal).
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpu_admission.admission.engine import evaluate
from gpu_admission.admission.pod import _scan, gpu_containers
from gpu_admission.core.decision import RequestFacts
from gpu_admission.core.patch import REQUIRED, PatchBuilder
from gpu_admission.dra.analysis import DEVICECLASS_RESOURCE_PREFIX, needs_analysis
from gpu_admission.facts.other_systems import HAMI_RESOURCES
from gpu_admission.facts.serving_engines import ENGINES
from gpu_admission.policy.model import Policy, default_policy, policy_from_dict
from tests.fractional.support import policy as fractional_policy
from tests.policy_helpers import policy_with, pools_policy

OWNED_ENV = {"NVIDIA_MEM_LIMIT_MB", "GPU_MEMORY_FRACTION", "XLA_CLIENT_MEM_FRACTION",
             "XLA_PYTHON_CLIENT_MEM_FRACTION", "TF_FORCE_GPU_ALLOW_GROWTH",
             "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
             "CUDA_DEVICE_MEMORY_LIMIT",  # fractional pools with hamiCore
             "NVIDIA_VISIBLE_DEVICES",  # the GPU-access guard's (and fractional pods' reference)
             "CUDA_MEMORY_FRACTION"}  # TGI's own (issue 33, facts.serving_engines)
#: a serving engine's own memory flag, appended to args as one --flag=value (issue 33)
OWNED_ARGS = tuple(f"{flag}=" for engine in ENGINES for flag in engine.flags)
# fractional GPUs (gpu_admission.facts.fractional): what the webhook owns on a fractional pod
GPU_MEMORY = "gpu-admission.io/gpu-memory"
GPU_CONFIGMAP = "gpu-admission.io/gpu-configmap"
FRACTIONAL_RESOURCES = {"nvidia.com/gpu", "nvidia.com/gpu.shared", GPU_MEMORY}
CUDA_LABEL = "gpu-admission.io/cuda-version"
MUTATED = "gpu-admission.io/mutated"

IMAGES = ["nvidia/cuda:12.1.1-runtime-ubuntu22.04", "nvcr.io/nvidia/tritonserver:24.05-py3",
          "pytorch/pytorch:2.2.2-cuda12.1-cudnn8-runtime", "vllm/vllm-openai:latest",
          "example.com/app:1.0-cu118", "python:3.11"]
RESOURCES = ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb", "cpu",
             "gpu-admission.io/gpu-memory"]
ODD_KEYS = ["ex~ample.com/x", "a/b~c", "plain", "gpu-admission.io/cuda-version"]

quantities = st.sampled_from([1, "1", 2, "2", 0, "0"])
env_values = st.one_of(
    st.builds(lambda v: {"value": v},
              st.sampled_from(["", "1", "8000", "16000", "99999", "0.1", "0.2", "0.9", "true",
                               "false", "0=4096M", "lots", "void", "none", "all"])),
    st.just({"valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}),
)
env_entries = st.lists(
    st.tuples(st.sampled_from([*sorted(OWNED_ENV), "OTHER", "PATH"]), env_values)
    .map(lambda t: {"name": t[0], **t[1]}), max_size=4)


@st.composite
def containers(draw: st.DrawFn, prefix: str) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(1, 3))):
        c: dict[str, Any] = {"name": f"{prefix}{i}", "image": draw(st.sampled_from(IMAGES))}
        shape = draw(st.sampled_from(["none", "empty", "limits", "requests", "both"]))
        if shape == "empty":
            c["resources"] = {}
        elif shape != "none":
            res = {draw(st.sampled_from(RESOURCES)): draw(quantities)}
            c["resources"] = {"limits": res, "requests": dict(res)} if shape == "both" else {
                shape: res}
        env = draw(st.one_of(st.none(), env_entries))
        if env is not None:
            c["env"] = env
        out.append(c)
    return out


expressions = st.fixed_dictionaries({
    "key": st.sampled_from(["nvidia.com/gpu.sharing-strategy", "zone", "nvidia.com/gpu.product",
                            CUDA_LABEL]),
    "operator": st.sampled_from(["In", "NotIn"]),
    "values": st.lists(st.sampled_from(["none", "time-slicing", "mps", "a", "Tesla-T4-SHARED",
                                        "12.1", "12.4"]), min_size=1, max_size=2, unique=True),
})
terms = st.one_of(
    st.fixed_dictionaries({"matchExpressions": st.lists(expressions, min_size=1, max_size=2)}),
    st.just({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}),
)
affinities = st.one_of(
    st.none(),
    st.just({}),
    st.just({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}),
    st.builds(lambda ts: {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": ts}}},
              st.lists(terms, max_size=3)),
)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    labels = draw(st.dictionaries(
        st.sampled_from(["app", "gpu-admission.io/workload", "training.kubeflow.org/job-name",
                         CUDA_LABEL, "a/b~c"]),
        st.sampled_from(["training", "inference", "notebook", "x", "12.1", "12"]), max_size=3))
    meta: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    if labels:
        meta["labels"] = labels
    annotations = draw(st.one_of(st.none(), st.dictionaries(
        st.sampled_from([*ODD_KEYS, MUTATED]), st.sampled_from(["env", "v", ""]), max_size=2)))
    if draw(st.integers(0, 3)) == 0:  # an explicit ask for a GPU fraction, good or bad
        annotations = {**(annotations or {}), GPU_MEMORY: draw(st.sampled_from(
            ["4096", "16000", "45000", "99999", "0", "lots"]))}
    if annotations is not None:
        meta["annotations"] = annotations
    if draw(st.booleans()):
        meta["ownerReferences"] = [{"apiVersion": "kubeflow.org/v1", "kind": draw(
            st.sampled_from(["PyTorchJob", "ReplicaSet"])), "name": "o", "uid": "u",
            "controller": True}]
    spec: dict[str, Any] = {"containers": draw(containers("c"))}
    if draw(st.booleans()):
        spec["initContainers"] = draw(containers("i"))
    selector = draw(st.one_of(st.none(), st.dictionaries(
        st.sampled_from(["nvidia.com/gpu.sharing-strategy", CUDA_LABEL, "ex~ample.com/x",
                         "pool.example.com/name"]),
        st.sampled_from(["time-slicing", "none", "12.1", "12.4", "h100-dedicated", "a100-mig",
                         "l40s-frac"]),
        max_size=2)))
    if selector is not None:
        spec["nodeSelector"] = selector
    affinity = draw(affinities)
    if affinity is not None:
        spec["affinity"] = affinity
    scheduler = draw(st.sampled_from([None, "", "default-scheduler", "volcano",
                                      "gpu-aware-scheduler"]))
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if draw(st.integers(0, 9)) == 0:
        spec["nodeName"] = "n1"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _fractional_pools_policy(**rules: str) -> Policy:
    """The fractional example (a CUDA-routed fractional pool, hamiCore on) plus the pools of
    ``pools_policy`` and an explicitly chosen fractional pool with a default split."""
    doc = fractional_policy().model_dump(mode="json", by_alias=True)
    pools = pools_policy().model_dump(mode="json", by_alias=True)["spec"]["nodePools"]
    doc["spec"]["nodePools"] += [p for p in pools if p["name"] != "a100-ts-cuda121"] + [{
        "name": "l40s-frac", "nodeSelector": {"pool.example.com/name": "l40s-frac"},
        "sharing": "fractional", "replicasPerGPU": 3, "memoryMiB": 46068}]
    doc["spec"]["rules"].update(rules)
    return policy_from_dict(doc)


POLICIES: list[Policy] = [default_policy(), pools_policy(),
                          policy_with(cudaRouting={"driverAffinity": True},
                                      rules={"memory-limit": "warn",
                                             "cuda-version-conflict": "audit"}),
                          _fractional_pools_policy(),
                          _fractional_pools_policy(**{"memory-limit": "warn",
                                                      "gpu-visible-devices": "warn"})]


def _strip_owned(pod: dict[str, Any], fractional: bool = False) -> dict[str, Any]:
    """The pod without the fields rules own (so the rest must be byte-for-byte equal);
    ``fractional``: also the GPU resources and annotations of a fractional pod."""
    out = copy.deepcopy(pod)
    spec = out["spec"]
    if fractional:
        for kind in ("containers", "initContainers"):
            for c in spec.get(kind, []):
                resources = c.get("resources")
                for section in ("requests", "limits"):
                    values = resources.get(section) if isinstance(resources, dict) else None
                    if isinstance(values, dict):
                        for name in FRACTIONAL_RESOURCES:
                            values.pop(name, None)
                        if not values:
                            resources.pop(section)
        for key in (GPU_MEMORY, GPU_CONFIGMAP):
            out["metadata"].get("annotations", {}).pop(key, None)
    spec.pop("schedulerName", None)
    selector = spec.get("nodeSelector")
    if isinstance(selector, dict):
        selector.pop(CUDA_LABEL, None)
        if not selector:
            spec.pop("nodeSelector")
    affinity = spec.get("affinity")
    if isinstance(affinity, dict):
        node_affinity = affinity.get("nodeAffinity")
        if isinstance(node_affinity, dict):
            node_affinity.pop(REQUIRED, None)
            if not node_affinity:
                affinity.pop("nodeAffinity")
        if not affinity:
            spec.pop("affinity")
    for kind in ("containers", "initContainers"):
        for c in spec.get(kind, []):
            if isinstance(c.get("args"), list):
                c["args"] = [a for a in c["args"]
                             if not (isinstance(a, str) and a.startswith(OWNED_ARGS))]
                if not c["args"]:
                    c.pop("args")
            if "env" in c:
                c["env"] = [e for e in c["env"] if e["name"] not in OWNED_ENV]
                if not c["env"]:
                    c.pop("env")
    annotations = out["metadata"].get("annotations")
    if isinstance(annotations, dict):
        annotations.pop(MUTATED, None)
        if not annotations:
            out["metadata"].pop("annotations")
    return out


def _check_oracle(before: dict[str, Any], after: dict[str, Any]) -> None:
    """The ``jsonpatch.make_patch(before, after)`` diff, applied to ``before``, gives ``after``.

    jsonpatch 1.33's list diff is itself unreliable (and non-deterministic) on lists of equal
    items that change length, e.g. cross-producted affinity terms: stale ``move`` sources and
    wrong op order (python-json-patch issues #160, #179). When the diff oracle contradicts
    itself we record a hypothesis ``event`` and rely on the deterministic reference
    (:func:`_reference`, compared with ``==``) instead of failing on jsonpatch's bug.
    """
    try:
        oracle = copy.deepcopy(jsonpatch.make_patch(before, after).patch)
        reproduced = jsonpatch.apply_patch(before, oracle, in_place=False)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException):
        event("jsonpatch.make_patch produced an unusable diff")
        return
    if reproduced != after:
        event("jsonpatch.make_patch produced a wrong diff")


def _assert_upserted_not_appended(before: dict[str, Any], after: dict[str, Any]) -> None:
    """Env vars are upserted by name: no owned name gains a second entry."""
    for kind in ("containers", "initContainers"):
        for old, new in zip(before["spec"].get(kind, []), after["spec"].get(kind, []),
                            strict=True):
            for name in OWNED_ENV:
                n_old = sum(e["name"] == name for e in old.get("env", []))
                n_new = sum(e["name"] == name for e in new.get("env", []))
                assert n_new <= max(n_old, 1), (name, old.get("env"), new.get("env"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=pods(), policy_index=st.integers(0, len(POLICIES) - 1))
def test_patch_properties(pod: dict[str, Any], policy_index: int) -> None:
    _check_properties(pod, POLICIES[policy_index])


@st.composite
def fractional_candidates(draw: st.DrawFn) -> dict[str, Any]:
    """Generated pods pushed towards fractional GPUs: the first container asks for one GPU,
    and the pod targets a fractional pool (by CUDA routing or by an explicit pool label)."""
    pod = draw(pods())
    first = pod["spec"]["containers"][0]
    first["resources"] = {draw(st.sampled_from(["limits", "requests"])): {
        draw(st.sampled_from(["nvidia.com/gpu", "nvidia.com/gpu.shared", GPU_MEMORY])):
            draw(st.sampled_from([1, "1", "16k", 4096]))}}
    if draw(st.booleans()):
        pod["spec"]["nodeSelector"] = {"pool.example.com/name": "l40s-frac"}
    else:
        pod["metadata"].setdefault("labels", {})[CUDA_LABEL] = "12.4"
    return pod


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=fractional_candidates(), policy_index=st.integers(3, len(POLICIES) - 1))
def test_fractional_patch_properties(pod: dict[str, Any], policy_index: int) -> None:
    _check_properties(pod, POLICIES[policy_index])


def _check_properties(pod: dict[str, Any], policy: Policy) -> None:
    request = RequestFacts(namespace="team-a", uid="1b2c3d4e-0000-4000-8000-000000000001")
    before = copy.deepcopy(pod)
    decision = evaluate(pod, request, policy)
    assert pod == before
    if not decision.allowed:
        assert decision.patch == ()
        return
    after = jsonpatch.apply_patch(pod, list(decision.patch), in_place=False)
    assert pod == before
    again = evaluate(after, RequestFacts(namespace="team-a", uid="another-request"), policy)
    assert again.patch == (), again.patch
    assert again.allowed, again.violations
    fractional = GPU_CONFIGMAP in (after["metadata"].get("annotations") or {}) and (
        GPU_CONFIGMAP not in (before["metadata"].get("annotations") or {}))
    if fractional:
        event("made fractional")
    assert _strip_owned(after, fractional) == _strip_owned(before, fractional)
    _assert_upserted_not_appended(before, after)
    _check_oracle(before, after)
    # validating the mutated pod finds nothing to deny
    assert evaluate(after, RequestFacts(namespace="team-a", stage="validate"), policy).allowed
    # the webhook's own output when validated again as a CREATE under any UID
    assert evaluate(after, RequestFacts(namespace="team-a", uid="x", stage="validate"),
                    policy).violations == evaluate(
        after, RequestFacts(namespace="team-a", stage="validate"), policy).violations


# --- the builder against a naive reference --------------------------------------------
declarations = st.fixed_dictionaries({
    "scheduler": st.one_of(st.none(), st.sampled_from(["gpu-aware-scheduler", "x"])),
    "selector": st.dictionaries(st.sampled_from(ODD_KEYS), st.sampled_from(["1", "2"]),
                                max_size=2),
    "env": st.lists(st.tuples(st.sampled_from(["containers", "initContainers"]),
                              st.integers(0, 2), st.sampled_from(sorted(OWNED_ENV)),
                              st.sampled_from(["1", "0.2", "true"])), max_size=4),
    "require": st.booleans(),
    "alternatives": st.booleans(),
})
ALTERNATIVES = [[{"key": "m", "operator": "Gt", "values": ["12"]}],
                [{"key": "m", "operator": "In", "values": ["12"]},
                 {"key": "n", "operator": "Gt", "values": ["0"]}]]


def _has_m(term: dict[str, Any]) -> bool:
    return any(e.get("key") == "m" for e in term.get("matchExpressions", []))
REQUIREMENT = {"key": "nvidia.com/gpu.sharing-strategy", "operator": "NotIn",
               "values": ["time-slicing", "mps"]}


def _reference(pod: dict[str, Any], decl: dict[str, Any],
               env: list[tuple[str, int, str, str]]) -> dict[str, Any]:
    """Deep copy + direct edits: what the declarations mean."""
    out = copy.deepcopy(pod)
    spec = out["spec"]
    if decl["scheduler"] is not None:
        spec["schedulerName"] = decl["scheduler"]
    if decl["selector"]:
        if not isinstance(spec.get("nodeSelector"), dict):
            spec["nodeSelector"] = {}
        spec["nodeSelector"].update(decl["selector"])
    for kind, index, name, value in env:
        c = spec[kind][index]
        if not isinstance(c.get("env"), list):
            c["env"] = []
        where = [i for i, e in enumerate(c["env"]) if e.get("name") == name]
        if where:
            c["env"][where[-1]] = {"name": name, "value": value}
        else:
            c["env"].append({"name": name, "value": value})
    if decl["require"] or decl["alternatives"]:
        affinity = spec.get("affinity")
        if not isinstance(affinity, dict):
            affinity = spec["affinity"] = {}
        node_affinity = affinity.setdefault("nodeAffinity", {})
        required = node_affinity.get(REQUIRED)
        if not isinstance(required, dict):
            required = node_affinity[REQUIRED] = {}
        ts = required.get("nodeSelectorTerms") or [{}]
        if decl["alternatives"]:
            crossed = []
            for t in ts:
                if _has_m(t):
                    crossed.append(t)
                    continue
                for alt in ALTERNATIVES:
                    crossed.append({**copy.deepcopy(t), "matchExpressions": [
                        *copy.deepcopy(t.get("matchExpressions", [])), *copy.deepcopy(alt)]})
            ts = crossed
        if decl["require"]:
            for t in ts:
                exprs = t.setdefault("matchExpressions", [])
                if REQUIREMENT not in exprs:
                    exprs.append(copy.deepcopy(REQUIREMENT))
        required["nodeSelectorTerms"] = ts
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=pods(), decl=declarations)
def test_builder_matches_reference(pod: dict[str, Any], decl: dict[str, Any]) -> None:
    before = copy.deepcopy(pod)
    env = [(k, i, n, v) for k, i, n, v in decl["env"] if i < len(pod["spec"].get(k, []))]
    builder = PatchBuilder(pod)
    if decl["scheduler"] is not None:
        builder.set_scheduler_name(decl["scheduler"])
    for key, value in decl["selector"].items():
        builder.set_node_selector(key, value)
    for kind, index, name, value in env:
        builder.upsert_env(kind, index, name, value)
    if decl["alternatives"]:
        builder.require_any_node_terms(ALTERNATIVES, _has_m)
    if decl["require"]:
        builder.require_node_expression(REQUIREMENT)
    ops = builder.ops()
    assert pod == before
    expected = _reference(pod, decl, env)
    applied = jsonpatch.apply_patch(pod, ops, in_place=False)
    assert applied == expected
    _check_oracle(before, applied)


# --- hostile shapes never crash the engine ---------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False)
    | st.sampled_from(["", "0", "1", "12.1", "nvidia.com/gpu", "time-slicing", "In", "Gt",
                       "training", "PyTorchJob", "gpu-admission.io/cuda-version",
                       "4096", "16k", "9" * 5000, GPU_MEMORY]),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(["name", "value", "valueFrom", "key", "operator",
                                       "values", "kind", "limits", "requests",
                                       "nvidia.com/gpu", "matchExpressions"]),
                      children, max_size=3),
    max_leaves=8)
SPOTS = [("metadata", "labels"), ("metadata", "annotations"), ("metadata", "ownerReferences"),
         ("spec", "nodeSelector"), ("spec", "affinity"), ("spec", "schedulerName"),
         ("spec", "initContainers"), ("spec", "nodeName"), ("c", "env"), ("c", "resources"),
         ("c", "image"), ("limits", "nvidia.com/gpu"), ("spec", "containers"),
         # fractional GPUs: the ask, the resource, a forged reference
         ("annotations", GPU_MEMORY), ("annotations", GPU_CONFIGMAP), ("limits", GPU_MEMORY)]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spots=st.lists(st.tuples(st.sampled_from(SPOTS), json_values), min_size=1, max_size=4),
       policy_index=st.integers(0, len(POLICIES) - 1),
       stage=st.sampled_from(["mutate", "validate"]))
def test_garbage_never_raises(spots: list[tuple[tuple[str, str], Any]], policy_index: int,
                              stage: str) -> None:
    limits: dict[str, Any] = {"nvidia.com/gpu": 1}
    container: dict[str, Any] = {"name": "c", "image": "nvidia/cuda:12.1.1-base-ubuntu22.04",
                                 "resources": {"limits": limits}}
    annotations: dict[str, Any] = {}
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": "p", "namespace": "team-a",
                                        "annotations": annotations},
                           "spec": {"containers": [container]}}
    targets = {"metadata": pod["metadata"], "spec": pod["spec"], "c": container,
               "limits": limits, "annotations": annotations}
    for (where, key), value in spots:
        targets[where][key] = value
    before = copy.deepcopy(pod)
    decision = evaluate(pod, RequestFacts(namespace="team-a", stage=stage),  # type: ignore[arg-type]
                        POLICIES[policy_index])
    assert pod == before
    assert all(len(w) <= 120 for w in decision.warnings)
    if decision.patch:
        jsonpatch.apply_patch(pod, list(decision.patch), in_place=False)


SCAN_NAMES = ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb", "cpu",
              "nvidia.com/gpucores", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage",
              "deviceclass.resource.kubernetes.io/gpu.example.com", "example.com/notable"]
_quantity_maps = st.dictionaries(st.sampled_from(SCAN_NAMES), quantities, max_size=3)
_resources: st.SearchStrategy[Any] = st.one_of(
    st.none(), st.just("not-an-object"),
    st.fixed_dictionaries({}, optional={"limits": st.one_of(_quantity_maps, st.just([])),
                                        "requests": _quantity_maps}))
_scan_containers = st.lists(st.one_of(
    st.just("not-a-container"),
    st.builds(lambda r: {"name": "c"} if r is None else {"name": "c", "resources": r},
              _resources)), max_size=3)


@settings(max_examples=300, deadline=None)
@given(containers=_scan_containers, init=st.one_of(st.none(), _scan_containers),
       extended=st.sampled_from([None, frozenset(), frozenset({"example.com/notable"}),
                                 frozenset({"nvidia.com/gpumem"})]))
def test_one_scan_answers_the_per_pod_prechecks(
        containers: list[Any], init: list[Any] | None, extended: frozenset[str] | None) -> None:
    """engine._scan's flags are what the separate passes answered: DRA's
    (dra.analysis.needs_analysis, a limit only) and another sharing system's (a HAMi resource
    in limits or requests), and its containers are gpu_containers'."""
    spec: dict[str, Any] = {"containers": containers}
    if init is not None:
        spec["initContainers"] = init
    every = [c for c in containers + (init or []) if isinstance(c, dict)
             and isinstance(c.get("resources"), dict)]

    def names(key: str) -> set[str]:
        return {n for c in every if isinstance(c["resources"].get(key), dict)
                for n in c["resources"][key]}

    gcs, dra, hami = _scan(spec, False, extended)
    assert [(g.kind, g.index, g.resources) for g in gcs] == [
        (g.kind, g.index, g.resources) for g in gpu_containers(spec)]
    assert hami == bool((names("limits") | names("requests")) & set(HAMI_RESOURCES))
    assert dra == any(n.startswith(DEVICECLASS_RESOURCE_PREFIX) or n in (extended or ())
                      for n in names("limits"))
    if extended is None:
        assert dra == needs_analysis(spec, None)
