"""``gpu-admission compile`` through the CLI: objects, determinism, Kubernetes schemas,
``--partial`` and the webhook side, and ``evaluate --compiled`` against ``evaluate``."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, cast

import celpy
import celpy.adapter
import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner, Result

from gpu_admission.cli import main
from gpu_admission.compile.rules import UNITS, WEBHOOK_ONLY, unit_for
from gpu_admission.evaluate.cli import COMPILED_PLACEMENT
from gpu_admission.facts.nodepools import ASSUMED
from gpu_admission.policy.model import RULE_IDS, default_policy, load_policy, policy_from_yaml
from tests.builders import make_container, make_pod
from tests.compile_support import modes_policy
from tests.install.test_manifests import render
from tests.policy_helpers import DATA

# kubernetes-validate ships schemas up to 1.37; 1.36 is the first with admissionregistration v1
# MutatingAdmissionPolicy (GA), 1.37 the newest.
SCHEMAS = ["1.36.0", "1.37.0"]
EVALUATE_FILES = ["mixed.yaml", "workloads.yaml", "list.yaml", "inference-pod.yaml",
                  "pod.json"]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def write_policy(tmp_path: Path, doc: dict[str, Any], name: str = "policy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def partial_output() -> str:
    result = invoke("compile", "--partial")
    assert result.exit_code == 0, result.output
    return result.stdout


def test_every_rule_has_a_compiler_unit_or_stays_with_the_webhook() -> None:
    missing = [r for r in RULE_IDS if unit_for(r) is None and r not in WEBHOOK_ONLY]
    assert missing == [], f"rules without a compiler unit: {missing} (gpu_admission/compile)"
    unit_ids = [r for unit in UNITS for r in unit.ids]
    assert len(unit_ids) == len(set(unit_ids)) and set(unit_ids) <= set(RULE_IDS)


def test_strict_fails_naming_the_rules_that_stay_with_the_webhook() -> None:
    result = CliRunner().invoke(main, ["compile", "--strict"])
    assert (result.exit_code, result.stdout) == (1, "")
    for rule, stay in WEBHOOK_ONLY.items():
        assert f"  {rule}: {stay.field}: {stay.why}" in result.stderr
    assert "without --strict they stay with the webhook" in result.stderr


STAYS_HEADER = ("compiled what runs in the API server; these rules stay with the webhook (its "
                "scoped configuration is in the output; --strict fails instead):")


@pytest.mark.parametrize("args", [[], ["--partial"]], ids=["default", "partial-alias"])
def test_compile_on_the_built_in_policy_succeeds_and_names_what_stays(
        args: list[str], partial_output: str) -> None:
    """Issue 33: ``compile`` of the built-in policy exits 0, compiles what runs in the API
    server and names on stderr what stays with the webhook (``--partial``: the old spelling)."""
    result = CliRunner().invoke(main, ["compile", *args])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == partial_output
    assert result.stderr.splitlines() == [STAYS_HEADER] + [
        f"  {rule}: {stay.field}: {stay.why}" for rule, stay in WEBHOOK_ONLY.items()]


def test_strict_and_partial_together_are_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["compile", "--strict", "--partial"])
    assert result.exit_code == 2
    assert "--partial and --strict contradict each other" in result.output


def test_partial_writes_the_objects_and_names_what_stays(partial_output: str) -> None:
    result = CliRunner().invoke(main, ["compile", "--partial"])
    assert result.stderr.splitlines() == [STAYS_HEADER] + [
        f"  {rule}: {stay.field}: {stay.why}" for rule, stay in WEBHOOK_ONLY.items()]
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs(partial_output)]
    assert kinds == [
        ("MutatingAdmissionPolicy", "mutate.gpu-admission.io"),
        ("MutatingAdmissionPolicyBinding", "mutate.gpu-admission.io"),
        ("ValidatingAdmissionPolicy", "enforce.gpu-admission.io"),
        ("ValidatingAdmissionPolicyBinding", "enforce.gpu-admission.io"),
        ("ValidatingAdmissionPolicy", "warn.gpu-admission.io"),
        ("ValidatingAdmissionPolicyBinding", "warn.gpu-admission.io"),
        # (no audit policy: the built-in policy has no rule in audit mode; the enforce
        # policy carries the audit annotations)
        # the guard half: pods without a GPU or DRA resource (compile --guard)
        ("MutatingAdmissionPolicy", "guard.gpu-admission.io"),
        ("MutatingAdmissionPolicyBinding", "guard.gpu-admission.io"),
        # (no guard-warn, no guard-audit: no guard rule in those modes)
        ("ValidatingAdmissionPolicy", "guard-enforce.gpu-admission.io"),
        ("ValidatingAdmissionPolicyBinding", "guard-enforce.gpu-admission.io"),
        ("ConfigMap", "gpu-admission-policy"),
        ("MutatingWebhookConfiguration", "gpu-admission"),
        ("ValidatingWebhookConfiguration", "gpu-admission")]
    assert partial_output.startswith("# Compiled by `gpu-admission compile` from "
                                     "GPUSharingPolicy 'default'")
    actions = {d["metadata"]["name"]: d["spec"]["validationActions"]
               for d in docs(partial_output) if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert actions == {"enforce.gpu-admission.io": ["Deny"], "warn.gpu-admission.io": ["Warn"],
                       "guard-enforce.gpu-admission.io": ["Deny"]}


@pytest.mark.parametrize("version", SCHEMAS)
@pytest.mark.parametrize("policy", ["default", "modes"])
def test_objects_match_the_kubernetes_openapi_schema(tmp_path: Path, version: str,
                                                     policy: str) -> None:
    args = ["compile", "--partial"]
    if policy == "modes":
        args += ["--policy", str(write_policy(
            tmp_path, modes_policy().model_dump(mode="json", by_alias=True)))]
    result = invoke(*args)
    for doc in docs(result.stdout):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} invalid for {version}: "
                        f"{exc.message} at {list(exc.path)}")


def test_the_schema_check_catches_a_typo(partial_output: str) -> None:
    policy = copy.deepcopy(docs(partial_output)[0])
    policy["spec"]["mutations"][0]["jsonpatch"] = policy["spec"]["mutations"][0].pop("jsonPatch")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(policy, SCHEMAS[0], strict=True)


def _reorder(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reorder(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reorder(v) for v in value]
    return value


def test_output_is_deterministic_across_runs_and_key_orders(tmp_path: Path) -> None:
    doc = modes_policy().model_dump(mode="json", by_alias=True)
    first = invoke("compile", "--partial", "--policy", str(write_policy(tmp_path, doc))).stdout
    again = invoke("compile", "--partial", "--policy", str(write_policy(tmp_path, doc))).stdout
    reordered = invoke("compile", "--partial", "--policy",
                       str(write_policy(tmp_path, _reorder(doc), "reordered.yaml"))).stdout
    assert first == again == reordered
    out = tmp_path / "out.yaml"
    assert invoke("compile", "--partial", "--policy", str(tmp_path / "policy.yaml"),
                  "--out", str(out)).stdout == ""
    assert out.read_text() == first


def test_every_expression_compiles_and_comments_say_why(partial_output: str) -> None:
    env = celpy.Environment()
    count = 0
    for doc in docs(partial_output):
        spec = doc.get("spec") or {}
        items = [*spec.get("variables", []), *spec.get("matchConditions", []),
                 *spec.get("validations", []), *spec.get("auditAnnotations", []),
                 *[m["jsonPatch"] for m in spec.get("mutations", [])]]
        for item in items:
            for key, expr in item.items():
                if key in ("expression", "messageExpression", "valueExpression"):
                    env.compile(expr)
                    count += 1
    assert count > 100
    gpu = next(v for v in docs(partial_output)[0]["spec"]["variables"] if v["name"] == "gpu")
    assert gpu["expression"].startswith("// GPU containers (engine.gpu_containers)")


def test_memory_beyond_cel_int_fails_naming_rule_and_field(tmp_path: Path) -> None:
    doc = load_policy(DATA / "policy-pools.yaml").model_dump(mode="json", by_alias=True)
    doc["spec"]["nodePools"][0]["memoryMiB"] = 10**16
    path = write_policy(tmp_path, doc)
    result = CliRunner().invoke(main, ["compile", "--strict", "--policy", str(path)])
    assert result.exit_code == 1
    assert ("  memory-limit: spec.nodePools[a100-ts-cuda121].memoryMiB: 10000000000000000 MiB is "
            "beyond what the CEL int comparison is written for (< 1000000000000000)"
            in result.output)
    assert "  memory-limit-unverifiable: spec.nodePools[a100-ts-cuda121].memoryMiB" in result.output
    partial = invoke("compile", "--partial", "--policy", str(path))
    out = partial.stdout
    assert "memory-limit" not in out.split("# The webhook's mutate stage")[1].split(
        "kind: ConfigMap")[0]
    webhooks = [d for d in docs(out) if d["kind"].endswith("WebhookConfiguration")]
    # memory-limit concerns every pod: the webhook sees every pod again
    assert all("matchConditions" not in d["webhooks"][0] for d in webhooks)


def _cel(expression: str, pod: dict[str, Any]) -> bool:
    env = celpy.Environment()
    act = celpy.adapter.json_to_cel({"object": pod})
    return bool(env.program(env.compile(expression)).evaluate(cast(Any, act)))


def test_webhook_side_is_scoped_to_the_pods_that_stay(partial_output: str) -> None:
    objs = docs(partial_output)
    configmap = next(d for d in objs if d["kind"] == "ConfigMap")
    assert policy_from_yaml(configmap["data"]["policy.yaml"]) == default_policy()
    dra_pod = make_pod(resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "t"}])
    plain = make_pod(containers=[make_container(gpu="1")])
    for hook in (d["webhooks"][0] for d in objs if d["kind"].endswith("WebhookConfiguration")):
        [condition] = hook["matchConditions"]
        assert _cel(condition["expression"], dra_pod) and not _cel(condition["expression"], plain)
    compiled = objs[0]["spec"]["matchConditions"]
    # the GPU policies: not the webhook's DRA pods, and GPU pods only (the guard half has the
    # others)
    assert [c["name"] for c in compiled] == ["not-for-the-webhook-1", "gpu-or-dra-pod"]
    assert not _cel(compiled[0]["expression"], dra_pod)
    assert _cel(compiled[0]["expression"], plain)
    assert _cel(compiled[1]["expression"], plain)
    assert not _cel(compiled[1]["expression"], make_pod(containers=[make_container(gpu=None)]))


@pytest.mark.parametrize("policy", ["built-in", "policy-pools.yaml"])
@pytest.mark.parametrize("extra", [[], ["--operation", "UPDATE"], ["--stage", "validate"],
                                   ["-n", "kube-system"]], ids=["create", "update", "validate",
                                                                "exempt-ns"])
def test_evaluate_compiled_prints_what_evaluate_prints(policy: str, extra: list[str]) -> None:
    args = ["evaluate", "-o", "json", *extra]
    for name in EVALUATE_FILES:
        args += ["-f", str(DATA / name)]
    if policy != "built-in":
        args += ["--policy", str(DATA / policy)]
    engine = CliRunner().invoke(main, args)
    compiled = CliRunner().invoke(main, [*args, "--compiled"])
    assert compiled.exit_code == engine.exit_code
    assert engine.stdout.count("\n") >= 10
    by_cel = [json.loads(line) for line in compiled.stdout.splitlines()]
    by_engine = [json.loads(line) for line in engine.stdout.splitlines()]
    # placement (issue 33) is each face's own word on the pools it assumed: the CEL sees no
    # Node, and says so on every GPU pod it decides; the rest is the same, field for field
    for row in by_cel:
        assert row.pop("placement") == (COMPILED_PLACEMENT
                                        if row["gpu"] and not row["exempt"] else "")
    for row in by_engine:
        said = row.pop("placement")
        assert said.startswith(ASSUMED) or not row["gpu"] or row["exempt"], said
    assert by_cel == by_engine
    assert "compiled: rule dra-reference-unknown stays with the webhook" in compiled.stderr


def test_evaluate_compiled_yaml_has_the_same_mutated_objects() -> None:
    args = ["evaluate", "-o", "yaml", "-f", str(DATA / "workloads.yaml")]
    by_cel = list(yaml.safe_load_all(CliRunner().invoke(main, [*args, "--compiled"]).stdout))
    by_engine = list(yaml.safe_load_all(CliRunner().invoke(main, args).stdout))
    assert len(by_engine) >= 3 and any(doc.get("mutated") for doc in by_engine)
    for doc in (*by_cel, *by_engine):  # each face's own word on the pools (issue 33)
        doc.pop("placement", None)
    assert by_cel == by_engine


def _comparable(hook: dict[str, Any]) -> dict[str, Any]:
    """A webhook without its clientConfig (caBundle is added at install) and with pod
    matchConditions dropped (the partial ones are scoped); CEL compared without the trailing
    newline of a YAML block scalar."""
    out = {k: v for k, v in hook.items() if k not in ("clientConfig", "matchConditions")}
    if "pods" not in hook["rules"][0]["resources"]:
        out["matchConditions"] = [{**c, "expression": c["expression"].strip()}
                                  for c in hook["matchConditions"]]
    return out


def test_partial_webhook_side_is_the_base_install_scoped(partial_output: str) -> None:
    """Applied over a kustomize or Helm install, the webhook configurations replace the
    base's: every webhook of the base must be there with the same settings (an omitted one,
    like the ResourceClaim webhook, would be dropped by the apply); only the pod webhooks'
    matchConditions differ (scoped to what the webhook keeps)."""
    base = {(d["kind"], w["name"]): w for d in render("default")
            if d["kind"].endswith("WebhookConfiguration") for w in d["webhooks"]}
    partial = {(d["kind"], w["name"]): w for d in docs(partial_output)
               if d["kind"].endswith("WebhookConfiguration") for w in d["webhooks"]}
    assert partial.keys() == base.keys()
    for key, hook in base.items():
        assert _comparable(partial[key]) == _comparable(hook), key
        assert partial[key]["clientConfig"]["service"] == hook["clientConfig"]["service"]
        if "pods" in hook["rules"][0]["resources"]:
            assert [c["name"] for c in partial[key]["matchConditions"]] == [
                "kept-by-the-webhook"]
