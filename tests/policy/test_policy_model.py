"""The GPUSharingPolicy model: the default, files on disk, and error messages naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_admission.core.decision import Mode
from gpu_admission.policy.model import (
    RULE_IDS,
    Policy,
    PolicyError,
    default_policy,
    default_policy_text,
    load_policy,
    policy_from_dict,
    policy_from_yaml,
)

DATA = Path(__file__).parent.parent / "data" / "evaluate"


def _doc(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUSharingPolicy",
            "metadata": {"name": "t"}, "spec": spec}


def _pool(**over: Any) -> dict[str, Any]:
    pool: dict[str, Any] = {"name": "p", "nodeSelector": {"pool": "p"}, "sharing": "time-slicing",
                            "replicasPerGPU": 4, "memoryMiB": 81920, "cudaVersion": "12.1"}
    pool.update(over)
    return pool


def test_default_policy_values() -> None:
    policy = default_policy()
    spec = policy.spec
    assert spec.scheduler_name == "gpu-aware-scheduler"
    assert spec.node_pools == []
    assert spec.memory_limits.default_memory_mib == 16000
    assert spec.memory_limits.default_fraction == 0.2
    assert spec.exemptions.namespaces == ["kube-system"]
    assert spec.other_sharing_systems == []  # off by default (issue 22)
    assert spec.classification.batch_job_workload == "training"
    assert policy.compiled.modes == {
        "workload-label": Mode.WARN, "no-training-on-shared-gpu": Mode.ENFORCE,
        "scheduler-name": Mode.WARN, "cuda-version-conflict": Mode.ENFORCE,
        "cuda-node-selector-conflict": Mode.ENFORCE, "cuda-version-unknown": Mode.WARN,
        "memory-limit": Mode.ENFORCE, "memory-limit-unverifiable": Mode.WARN,
        "gpu-access-isolation": Mode.ENFORCE, "gpu-visible-devices": Mode.ENFORCE,
        "gpu-device-hostpath": Mode.ENFORCE, "dra-reference-unknown": Mode.ENFORCE,
        "dra-sharing-possible": Mode.WARN, "other-sharing-system": Mode.ENFORCE}
    assert set(policy.compiled.modes) == set(RULE_IDS)
    assert default_policy() is policy  # parsed once


def test_default_yaml_equals_model_defaults() -> None:
    """The data file states every default explicitly and agrees with the model's defaults."""
    from_file = default_policy()
    from_model = policy_from_dict({"apiVersion": "gpu-admission.io/v1alpha1",
                                   "kind": "GPUSharingPolicy", "metadata": {"name": "default"}})
    assert from_file.model_dump() == from_model.model_dump()
    assert from_file.digest == from_model.digest
    assert "nodePools: []" in default_policy_text()


def test_digest_is_stable_and_content_sensitive() -> None:
    a = policy_from_dict(_doc(schedulerName="x"))
    b = policy_from_yaml(yaml.safe_dump(_doc(schedulerName="x"), sort_keys=True))
    c = policy_from_dict(_doc(schedulerName="y"))
    assert a.digest == b.digest
    assert a.digest != c.digest
    assert a.digest.startswith("sha256:") and len(a.digest) == len("sha256:") + 16


def test_pools_example_file_loads() -> None:
    policy = load_policy(DATA / "policy-pools.yaml")
    names = [p.name for p in policy.spec.node_pools]
    assert names == ["a100-ts-cuda121", "a100-mps-cuda124", "h100-dedicated", "a100-mig"]
    ts = policy.spec.node_pools[0]
    assert ts.memory_per_replica_mib == 20480 and ts.shared
    assert policy.mode("scheduler-name") is Mode.AUDIT


def test_policy_is_immutable() -> None:
    policy = default_policy()
    with pytest.raises(ValueError, match="frozen"):
        policy.spec.scheduler_name = "other"


ERRORS = [
    pytest.param({"nodePools": [_pool(), _pool(name="q", memoryMiB="lots")]},
                 'spec.nodePools[1].memoryMiB: expected an integer > 0, got "lots"', id="bad-int"),
    pytest.param({"nodePools": [_pool(memoryMiB=0)]},
                 "spec.nodePools[0].memoryMiB: expected an integer > 0, got 0", id="zero"),
    pytest.param({"nodePools": [_pool(replicasPerGPU=True)]},
                 "spec.nodePools[0].replicasPerGPU: expected an integer > 0, got true",
                 id="bool-is-not-int"),
    pytest.param({"nodePools": [_pool(cudaVersion=12.1)]},
                 'spec.nodePools[0].cudaVersion: expected a quoted "<major>.<minor>" string '
                 'like "12.1", got 12.1', id="unquoted-cuda-float"),
    pytest.param({"nodePools": [_pool(sharing="timeslicing")]},
                 "spec.nodePools[0].sharing: expected 'none', 'time-slicing', 'mps', 'mig' or "
                 "'fractional', got \"timeslicing\"", id="bad-sharing"),
    pytest.param({"nodePools": [_pool(nodeSelector={})]},
                 "spec.nodePools[0].nodeSelector: expected at least 1 entries, got {}",
                 id="empty-selector"),
    pytest.param({"nodePools": [_pool(nodeSelector={"nvidia.com/gpu.present": True})]},
                 'spec.nodePools[0].nodeSelector["nvidia.com/gpu.present"]: expected a quoted '
                 "Kubernetes label value, got true", id="unquoted-label-value"),
    pytest.param({"nodePools": [_pool(), _pool()]},
                 'spec.nodePools: duplicate pool name "p"', id="duplicate-pool"),
    pytest.param({"nodePools": [_pool(name="Bad_Name")]},
                 'spec.nodePools[0].name: expected a DNS label (a-z, 0-9, -), got "Bad_Name"',
                 id="pool-name"),
    pytest.param({"nodePools": [_pool(memoryMib=1)]},
                 "spec.nodePools[0].memoryMib: unknown field (check the spelling; see "
                 "docs/policy.md)", id="typo-extra-field"),
    pytest.param({"rules": {"memory-limit": "deny"}},
                 "spec.rules[\"memory-limit\"]: expected 'enforce', 'warn' or 'audit', "
                 'got "deny"', id="bad-mode"),
    pytest.param({"rules": {"no-such-rule": "warn"}},
                 'spec.rules["no-such-rule"]: unknown field (check the spelling; see '
                 "docs/policy.md)", id="unknown-rule"),
    pytest.param({"memoryLimits": {"defaultFraction": 1.5}},
                 "spec.memoryLimits.defaultFraction: expected a number in (0, 1], got 1.5",
                 id="fraction-range"),
    pytest.param({"exemptions": {"namespaces": "kube-system"}},
                 'spec.exemptions.namespaces: expected a list, got "kube-system"',
                 id="list-expected"),
    pytest.param({"cudaRouting": {"driverAffinity": "maybe"}},
                 'spec.cudaRouting.driverAffinity: expected true or false, got "maybe"',
                 id="bool-expected"),
    pytest.param({"classification": {"defaultWorkload": "batch"}},
                 "spec.classification.defaultWorkload: expected 'training', 'inference' or "
                 "'notebook', got \"batch\"", id="bad-workload"),
]


@pytest.mark.parametrize(("spec", "message"), ERRORS)
def test_errors_name_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyError) as info:
        policy_from_dict(_doc(**spec), "p.yaml")
    assert str(info.value) == f"p.yaml: {message}"


def test_several_errors_listed_together() -> None:
    with pytest.raises(PolicyError) as info:
        policy_from_dict({"kind": "Other", "spec": {"schedulerNam": "x"}})
    assert str(info.value) == (
        "3 problems:\n  apiVersion: required field is missing\n"
        "  kind: expected 'GPUSharingPolicy', got \"Other\"\n"
        "  spec.schedulerNam: unknown field (check the spelling; see docs/policy.md)")


@pytest.mark.parametrize(("text", "message"), [
    ("a: [", "invalid YAML: line 1, column 5: expected the node content, but found "
             "'<stream end>'"),
    ("- 1\n- 2\n", "expected a GPUSharingPolicy mapping, got [1, 2]"),
    ("", "expected exactly one GPUSharingPolicy document, found 0"),
    ("kind: a\n---\nkind: b\n", "expected exactly one GPUSharingPolicy document, found 2"),
], ids=["yaml-syntax", "not-a-mapping", "empty", "two-documents"])
def test_file_level_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert str(info.value) == f"{path}: {message}"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy file"):
        load_policy(tmp_path / "nope.yaml")


def test_round_trip_by_alias() -> None:
    policy = load_policy(DATA / "policy-pools.yaml")
    dumped = policy.model_dump(mode="json", by_alias=True)
    assert Policy.model_validate(dumped) == policy
    assert dumped["spec"]["nodePools"][0]["replicasPerGPU"] == 4


def test_docs_show_the_real_default() -> None:
    """docs/policy.md's "built-in default" block is the default policy, field for field."""
    text = (Path(__file__).parents[2] / "docs" / "policy.md").read_text()
    section = text.split("## The built-in default", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert policy_from_yaml(block).model_dump() == default_policy().model_dump()


def test_model_copy_recomputes_derived_data() -> None:
    policy = default_policy()
    assert policy.compiled.exempt_namespaces == frozenset({"kube-system"})
    exemptions = policy.spec.exemptions.model_copy(update={"namespaces": []})
    copied = policy.model_copy(update={"spec": policy.spec.model_copy(
        update={"exemptions": exemptions})})
    assert copied.compiled.exempt_namespaces == frozenset()
    assert copied.digest != policy.digest
