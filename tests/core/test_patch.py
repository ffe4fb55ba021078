"""The RFC 6902 patch builder, checked against jsonpatch as the oracle.

For every case: the builder's ops apply cleanly with jsonpatch, give the expected pod, do not
touch the input, and ``jsonpatch.make_patch(before, after)`` applied to the input gives the same
result (the builder and the diff oracle agree in effect).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_admission.core.patch import PatchBuilder, changed_fields, escape, last_indexes
from tests.builders import make_container, make_pod

NOT_SHARED = {"key": "nvidia.com/gpu.sharing-strategy", "operator": "NotIn",
              "values": ["time-slicing", "mps"]}
REQ = "requiredDuringSchedulingIgnoredDuringExecution"


def _apply(pod: dict[str, Any], build: Callable[[PatchBuilder], None]) -> tuple[list[Any], Any]:
    before = copy.deepcopy(pod)
    builder = PatchBuilder(pod)
    build(builder)
    ops = builder.ops()
    assert pod == before, "builder must not modify the pod"
    after = jsonpatch.apply_patch(pod, ops, in_place=False)
    assert pod == before
    # oracle: the diff jsonpatch computes yields the same document
    oracle = jsonpatch.make_patch(before, after)
    assert jsonpatch.apply_patch(before, oracle.patch, in_place=False) == after
    return ops, after


@pytest.mark.parametrize(("token", "expected"), [
    ("plain", "plain"),
    ("gpu-admission.io/cuda-version", "gpu-admission.io~1cuda-version"),
    ("a~b", "a~0b"),
    ("~/", "~0~1"),
    ("x/~1", "x~1~01"),
], ids=["plain", "slash", "tilde", "tilde-then-slash", "already-looks-escaped"])
def test_escape_rfc6901(token: str, expected: str) -> None:
    assert escape(token) == expected
    # round trip through jsonpatch's own pointer implementation
    doc = {token: 1}
    assert jsonpatch.JsonPointer("/" + escape(token)).resolve(doc) == 1


ENV_CASES = [
    pytest.param(None, {"A": "1"}, [{"name": "A", "value": "1"}], 1, id="env-absent-adds-array"),
    pytest.param([], {"A": "1"}, [{"name": "A", "value": "1"}], 1, id="env-empty-appends"),
    pytest.param([{"name": "A", "value": "1"}], {"A": "1"}, [{"name": "A", "value": "1"}], 0,
                 id="same-value-no-op"),
    pytest.param([{"name": "B", "value": "x"}, {"name": "A", "value": "9"}], {"A": "1"},
                 [{"name": "B", "value": "x"}, {"name": "A", "value": "1"}], 1,
                 id="upsert-by-name-replaces"),
    pytest.param([{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}],
                 {"A": "1"}, [{"name": "A", "value": "1"}], 1, id="replace-drops-valueFrom"),
    pytest.param([{"name": "A", "value": "0"}, {"name": "A", "value": "5"}], {"A": "1"},
                 [{"name": "A", "value": "0"}, {"name": "A", "value": "1"}], 1,
                 id="duplicate-name-last-wins"),
    pytest.param([{"name": "Z", "value": "z"}], {"A": "1", "B": "2"},
                 [{"name": "Z", "value": "z"}, {"name": "A", "value": "1"},
                  {"name": "B", "value": "2"}], 2, id="appends-in-order"),
]


@pytest.mark.parametrize(("env", "wanted", "expected", "n_ops"), ENV_CASES)
def test_upsert_env(env: list[dict[str, Any]] | None, wanted: dict[str, str],
                    expected: list[dict[str, Any]], n_ops: int) -> None:
    pod = make_pod(containers=[make_container(env=env)])

    def build(b: PatchBuilder) -> None:
        for name, value in wanted.items():
            b.upsert_env("containers", 0, name, value)

    ops, after = _apply(pod, build)
    assert len(ops) == n_ops
    assert after["spec"]["containers"][0]["env"] == expected


def test_upsert_env_init_container() -> None:
    pod = make_pod(init_containers=[make_container("init", gpu=None),
                                    make_container("warm")])
    ops, after = _apply(pod, lambda b: b.upsert_env("initContainers", 1, "A", "1"))
    assert ops == [{"op": "add", "path": "/spec/initContainers/1/env",
                    "value": [{"name": "A", "value": "1"}]}]
    assert "env" not in after["spec"]["initContainers"][0]


@pytest.mark.parametrize(("selector", "expected_ops"), [
    (None, [{"op": "add", "path": "/spec/nodeSelector",
             "value": {"gpu-admission.io/cuda-version": "12.1"}}]),
    ({"zone": "a"}, [{"op": "add", "path": "/spec/nodeSelector/gpu-admission.io~1cuda-version",
                      "value": "12.1"}]),
    ({"gpu-admission.io/cuda-version": "12.1"}, []),
    ({"gpu-admission.io/cuda-version": "11.8"},
     [{"op": "add", "path": "/spec/nodeSelector/gpu-admission.io~1cuda-version",
       "value": "12.1"}]),
], ids=["absent-adds-map", "existing-adds-escaped-key", "same-no-op", "different-overwrites"])
def test_node_selector(selector: dict[str, str] | None, expected_ops: list[Any]) -> None:
    pod = make_pod(node_selector=selector)
    ops, after = _apply(pod, lambda b: b.set_node_selector("gpu-admission.io/cuda-version",
                                                           "12.1"))
    assert ops == expected_ops
    assert after["spec"]["nodeSelector"]["gpu-admission.io/cuda-version"] == "12.1"


def test_annotation_key_with_tilde_and_slash() -> None:
    pod = make_pod(annotations={"keep": "me"})
    builder = PatchBuilder(pod)
    ops = builder.annotation_ops("ex~ample.com/x", "v")
    assert ops == [{"op": "add", "path": "/metadata/annotations/ex~0ample.com~1x", "value": "v"}]
    after = jsonpatch.apply_patch(pod, ops)
    assert after["metadata"]["annotations"] == {"keep": "me", "ex~ample.com/x": "v"}


def test_annotation_map_absent() -> None:
    pod = make_pod()
    ops = PatchBuilder(pod).annotation_ops("a/b", "v")
    assert ops == [{"op": "add", "path": "/metadata/annotations", "value": {"a/b": "v"}}]


def _terms(after: dict[str, Any]) -> list[dict[str, Any]]:
    return after["spec"]["affinity"]["nodeAffinity"][REQ]["nodeSelectorTerms"]  # type: ignore[no-any-return]


AFFINITY_CASES = [
    pytest.param(None, [{"matchExpressions": [NOT_SHARED]}], id="no-affinity"),
    pytest.param({"podAntiAffinity": {"x": 1}}, [{"matchExpressions": [NOT_SHARED]}],
                 id="only-pod-anti-affinity"),
    pytest.param({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
                 [{"matchExpressions": [NOT_SHARED]}], id="only-preferred"),
    pytest.param({"nodeAffinity": {REQ: {"nodeSelectorTerms": []}}},
                 [{"matchExpressions": [NOT_SHARED]}], id="empty-terms"),
    pytest.param(
        {"nodeAffinity": {REQ: {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
            {"matchExpressions": [NOT_SHARED]},
        ]}}},
        [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}, NOT_SHARED]},
         {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}],
          "matchExpressions": [NOT_SHARED]},
         {"matchExpressions": [NOT_SHARED]}],
        id="several-terms-each-gets-requirement-once"),
]


@pytest.mark.parametrize(("affinity", "expected_terms"), AFFINITY_CASES)
def test_require_node_expression(affinity: dict[str, Any] | None,
                                 expected_terms: list[dict[str, Any]]) -> None:
    pod = make_pod(affinity=affinity)
    _, after = _apply(pod, lambda b: b.require_node_expression(NOT_SHARED))
    assert _terms(after) == expected_terms
    # idempotent: asking again on the result changes nothing
    again = PatchBuilder(after)
    again.require_node_expression(NOT_SHARED)
    assert again.ops() == []
    if affinity and "podAntiAffinity" in affinity:
        assert after["spec"]["affinity"]["podAntiAffinity"] == {"x": 1}


def test_alternatives_cross_product() -> None:
    alt = [[{"key": "m", "operator": "Gt", "values": ["12"]}],
           [{"key": "m", "operator": "In", "values": ["12"]},
            {"key": "n", "operator": "Gt", "values": ["0"]}]]
    pod = make_pod(affinity={"nodeAffinity": {REQ: {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
    ]}}})

    def present(term: dict[str, Any]) -> bool:
        return any(e["key"] == "m" for e in term.get("matchExpressions", []))

    def build(b: PatchBuilder) -> None:
        b.require_any_node_terms(alt, present)
        b.require_node_expression(NOT_SHARED)

    _, after = _apply(pod, build)
    terms = _terms(after)
    assert len(terms) == 4  # (a OR b) AND (newer OR same-major)
    assert all(NOT_SHARED in t["matchExpressions"] for t in terms)
    zones = [t["matchExpressions"][0]["values"][0] for t in terms]
    assert zones == ["a", "a", "b", "b"]
    again = PatchBuilder(after)
    again.require_any_node_terms(alt, present)
    again.require_node_expression(NOT_SHARED)
    assert again.ops() == []


def test_scheduler_and_changed_fields() -> None:
    pod = make_pod(containers=[make_container(), make_container("b")])

    def build(b: PatchBuilder) -> None:
        b.set_scheduler_name("gpu-aware-scheduler")
        b.upsert_env("containers", 1, "A", "1")
        b.set_node_selector("k", "v")

    ops, after = _apply(pod, build)
    assert after["spec"]["schedulerName"] == "gpu-aware-scheduler"
    assert changed_fields(ops) == ["spec.schedulerName", "spec.nodeSelector",
                                   "spec.containers[1].env"]


def test_ops_values_are_not_the_pods_objects() -> None:
    """Mutating the patch values later must not reach back into the pod."""
    pod = make_pod(affinity={"nodeAffinity": {REQ: {"nodeSelectorTerms": []}}})
    builder = PatchBuilder(pod)
    builder.require_node_expression(NOT_SHARED)
    ops = builder.ops()
    ops[0]["value"].append({"junk": True})
    ops[0]["value"][0]["matchExpressions"][0]["values"].append("x")
    assert pod["spec"]["affinity"]["nodeAffinity"][REQ]["nodeSelectorTerms"] == []
    assert NOT_SHARED["values"] == ["time-slicing", "mps"]


# --- fractional GPUs: resources, whole env entries, annotations ------------------------------
REF = {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {
    "name": "gpu-admission-gpu-x", "key": "NVIDIA_VISIBLE_DEVICES", "optional": False}}}


@pytest.mark.parametrize(("resources", "expected_ops", "expected"), [
    pytest.param({"limits": {"nvidia.com/gpu": 1}},
                 [{"op": "add", "path": "/spec/containers/0/resources/requests",
                   "value": {"gpu-admission.io/gpu-memory": "4096"}},
                  {"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu"},
                  {"op": "add", "path":
                   "/spec/containers/0/resources/limits/gpu-admission.io~1gpu-memory",
                   "value": "4096"}],
                 {"requests": {"gpu-admission.io/gpu-memory": "4096"},
                  "limits": {"gpu-admission.io/gpu-memory": "4096"}}, id="limits-only"),
    pytest.param({"requests": {"gpu-admission.io/gpu-memory": "4Ki", "cpu": "1"},
                  "limits": {"gpu-admission.io/gpu-memory": 4096}},
                 [], {"requests": {"gpu-admission.io/gpu-memory": "4Ki", "cpu": "1"},
                      "limits": {"gpu-admission.io/gpu-memory": 4096}},
                 id="equal-by-value-no-op"),
    pytest.param({"requests": {"nvidia.com/gpu.shared": "1", "gpu-admission.io/gpu-memory": "1"},
                  "limits": {"nvidia.com/gpu.shared": "1"}},
                 [{"op": "remove",
                   "path": "/spec/containers/0/resources/requests/nvidia.com~1gpu.shared"},
                  {"op": "add", "path":
                   "/spec/containers/0/resources/requests/gpu-admission.io~1gpu-memory",
                   "value": "4096"},
                  {"op": "remove",
                   "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu.shared"},
                  {"op": "add", "path":
                   "/spec/containers/0/resources/limits/gpu-admission.io~1gpu-memory",
                   "value": "4096"}],
                 {"requests": {"gpu-admission.io/gpu-memory": "4096"},
                  "limits": {"gpu-admission.io/gpu-memory": "4096"}}, id="shared-and-wrong-share"),
])
def test_resources_set_and_removed(resources: dict[str, Any], expected_ops: list[Any],
                                   expected: dict[str, Any]) -> None:
    pod = make_pod(containers=[{"name": "m", "image": "x", "resources": resources}])

    def build(b: PatchBuilder) -> None:
        for section in ("requests", "limits"):
            for name in ("nvidia.com/gpu", "nvidia.com/gpu.shared"):
                b.set_resource("containers", 0, section, name, None)
            b.set_resource("containers", 0, section, "gpu-admission.io/gpu-memory", "4096")

    ops, after = _apply(pod, build)
    assert ops == expected_ops
    assert after["spec"]["containers"][0]["resources"] == expected


@pytest.mark.parametrize(("env", "expected_ops"), [
    pytest.param(None, [{"op": "add", "path": "/spec/containers/0/env", "value": [REF]}],
                 id="absent"),
    pytest.param([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                 [{"op": "replace", "path": "/spec/containers/0/env/0", "value": REF}],
                 id="literal-replaced"),
    pytest.param([REF], [], id="same-entry-no-op"),
])
def test_whole_env_entry_upserted(env: list[Any] | None, expected_ops: list[Any]) -> None:
    pod = make_pod(containers=[make_container(env=env)])
    ops, after = _apply(pod, lambda b: b.upsert_env_entry("containers", 0, REF))
    assert ops == expected_ops
    assert after["spec"]["containers"][0]["env"][-1] == REF
    if ops:  # the rendered value is a fresh object, not the declared one
        assert ops[0]["value"] is not REF


@pytest.mark.parametrize("meta", [None, {}, {"annotations": {"a/b": "c"}}],
                         ids=["no-metadata", "no-annotations", "annotations"])
def test_declared_annotations_and_the_summary_annotation(meta: dict[str, Any] | None) -> None:
    pod: dict[str, Any] = {"spec": {"containers": []}}
    if meta is not None:
        pod["metadata"] = meta
    builder = PatchBuilder(pod)
    builder.set_annotation("gpu-admission.io/gpu-memory", "4096")
    ops = builder.ops() + builder.annotation_ops("gpu-admission.io/mutated", "resources")
    after = jsonpatch.apply_patch(pod, ops, in_place=False)
    assert after["metadata"]["annotations"] == {
        **(meta or {}).get("annotations", {}),
        "gpu-admission.io/gpu-memory": "4096", "gpu-admission.io/mutated": "resources"}
    assert changed_fields(ops) == ["metadata.annotations"]


_ENV_ENTRY = st.one_of(
    st.builds(lambda n, v: {"name": n, "value": v},
              st.sampled_from(["A", "B", "NVIDIA_VISIBLE_DEVICES", "C"]), st.just("x")),
    st.just({"value": "no name"}), st.just({"name": ["unhashable"]}), st.just({"name": 7}),
    st.just("not an object"), st.just(None))


@settings(max_examples=400, deadline=None)
@given(env=st.lists(_ENV_ENTRY, max_size=8).flatmap(  # short lists, and long ones (the C pass)
           lambda e: st.sampled_from([e, e * 8])),
       names=st.sets(st.sampled_from(["A", "B", "NVIDIA_VISIBLE_DEVICES", "Z"]), max_size=3))
def test_last_indexes_is_the_last_entry_per_name(env: list[Any], names: set[str]) -> None:
    """patch.last_indexes (the loop, or the C-level pass for long lists) against the plain
    definition: the index of the last object entry whose string name is asked for, whatever
    odd entries the list holds."""
    expected = {}
    for i, entry in enumerate(env):
        if isinstance(entry, dict) and isinstance(entry.get("name"), str) and (
                entry["name"] in names):
            expected[entry["name"]] = i
    assert last_indexes(env, names) == expected


@pytest.mark.parametrize("odd", [None, "not an object", {"value": "no name"}],
                         ids=["readable", "a-string-entry", "an-entry-without-name"])
def test_last_indexes_on_a_200_entry_list(odd: Any) -> None:
    env: list[Any] = [{"name": f"V{i % 50}", "value": str(i)} for i in range(200)]
    if odd is not None:
        env.insert(3, odd)
    shift = 0 if odd is None else 1
    assert last_indexes(env, {"V7", "V49", "ABSENT"}) == {"V7": 157 + shift, "V49": 199 + shift}
