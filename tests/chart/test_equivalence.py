"""One source of truth: the Helm chart installs exactly what ``kubectl apply -k`` installs.

Both installs are rendered for real (Helm v4 via helm-python-sdk, kustomize via ``kubectl
kustomize``) and compared object by object after dropping only Helm's own labels
(tests/chart_support.py: HELM_LABELS); any other difference fails with a YAML diff. When
webhook-manifests/ changes (a new object, a new matchCondition, the gpu-aware-scheduler), these
tests fail until charts/gpu-admission/ follows.

Then the decisions: for every namespace and pod in the table, each install's webhook
configurations decide whether the API server calls the webhook (namespaceSelector evaluated as
the API server does, matchConditions compiled and evaluated with cel-python), and the call goes
to the real server (TLS, the configuration's path) started with that install's own ConfigMap
policy. The chart and the kustomize install must give the same answer for every case.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy.adapter
import pytest

from gpu_admission.compile.evaluator import selector_matches
from gpu_admission.core import vocab
from tests.builders import make_container, make_pod, make_review
from tests.chart_support import (
    component,
    drift,
    policy_configmap,
    render_chart,
    without_helm_metadata,
)
from tests.install.test_manifests import CEL_CASES, cel_program, one, render, webhooks
from tests.server_support import SecretDir, make_config, new_bundle, running_server

Docs = list[dict[str, Any]]


# --------------------------------------------------------------------------- objects
CREATE_NAMESPACE = {"namespace": {"create": True}}


def test_chart_defaults_install_what_the_kustomize_base_installs() -> None:
    """With its defaults the chart leaves the Namespace to `helm install --create-namespace`
    (the contract's command): every other object of the base, identical."""
    report = drift(render_chart(), render("default"))
    assert report == "only in kustomize: v1 Namespace gpu-admission", \
        "charts/gpu-admission (defaults) and `kubectl kustomize webhook-manifests` differ " \
        "beyond the Namespace; bring the chart in line:\n" + report


def test_chart_with_its_namespace_installs_exactly_what_the_kustomize_base_installs() -> None:
    report = drift(render_chart(CREATE_NAMESPACE), render("default"))
    assert report == "", "charts/gpu-admission (namespace.create) and `kubectl kustomize " \
        "webhook-manifests` differ; bring the chart in line:\n" + report


def test_chart_cert_manager_mode_installs_what_the_overlay_installs() -> None:
    report = drift(render_chart({"certificates": {"mode": "certManager"}, **CREATE_NAMESPACE}),
                   render("cert-manager"))
    assert report == "", "charts/gpu-admission (certificates.mode=certManager) and " \
        "webhook-manifests/overlays/cert-manager differ:\n" + report


def test_the_drift_check_reports_every_kind_of_difference() -> None:
    """Guard against a comparison that accepts anything (chart against altered copies of
    itself, so this holds whatever webhook-manifests/ currently contains)."""
    chart = render_chart()
    kust = [without_helm_metadata(d) for d in chart]
    assert drift(chart, kust) == ""
    changed = copy.deepcopy(kust)
    webhook = component(changed, "Deployment", "webhook")["spec"]["template"]["spec"]
    args = webhook["containers"][0]["args"]
    args[args.index("--metrics-port") + 1] = "9090"
    report = drift(chart, changed)
    assert report.startswith("differs: apps/v1 Deployment gpu-admission/gpu-admission")
    assert "-        - '9090'\n+        - '8080'" in report
    # only Helm's own labels are ignored: any other label is a difference
    labelled = copy.deepcopy(kust)
    one(labelled, "Service")["metadata"]["labels"]["team"] = "gpu"
    assert "differs: v1 Service gpu-admission/gpu-admission" in drift(chart, labelled)
    # a ConfigMap policy is compared as data, not as text
    policy = copy.deepcopy(kust)
    data = policy_configmap(policy)["data"]
    data["policy.yaml"] = "# a comment\n" + data["policy.yaml"]
    assert drift(chart, policy) == ""
    data["policy.yaml"] = data["policy.yaml"].replace("defaultFraction: 0.2",
                                                      "defaultFraction: 0.25")
    assert "defaultFraction: 0.25" in drift(chart, policy)
    # multi-line strings (CEL) are diffed line by line
    hooks = copy.deepcopy(kust)
    condition = one(hooks, "MutatingWebhookConfiguration")["webhooks"][0]["matchConditions"][0]
    condition["expression"] = condition["expression"].replace("has(object.spec) && (",
                                                              "has(object.spec) || (", 1)
    report = drift(chart, hooks)
    assert "-      has(object.spec) || (\n+      has(object.spec) && (" in report, report
    missing = [d for d in kust if (d["kind"], d["metadata"]["name"]) !=
               ("PodDisruptionBudget", "gpu-admission")]
    assert drift(chart, missing) == \
        "only in the chart: policy/v1 PodDisruptionBudget gpu-admission/gpu-admission"
    assert drift(missing, kust) == \
        "only in kustomize: policy/v1 PodDisruptionBudget gpu-admission/gpu-admission"


# --------------------------------------------------------------------------- decisions
def called(hook: dict[str, Any], namespace_labels: dict[str, str], pod: dict[str, Any],
           operation: str) -> bool:
    """Would the API server call this webhook for a Pod ``operation``? (rules, then
    namespaceSelector, then every matchCondition)"""
    ops = {op for rule in hook["rules"] if "" in rule["apiGroups"] and "pods" in rule["resources"]
           for op in rule["operations"]}
    if operation not in ops or not selector_matches(hook["namespaceSelector"], namespace_labels):
        return False
    activation = celpy.adapter.json_to_cel({
        "object": pod, "oldObject": pod if operation == "UPDATE" else None,
        "request": {"operation": operation,
                    "kind": {"group": "", "version": "v1", "kind": "Pod"}}})
    return all(bool(cel_program(c["expression"]).evaluate(activation))
               for c in hook.get("matchConditions", []))


def namespace(name: str, **labels: str) -> tuple[str, dict[str, str]]:
    # the API server labels every namespace with its name (NamespaceDefaultLabelName, 1.22+)
    return name, {"kubernetes.io/metadata.name": name, **labels}


OPT_IN = {vocab.NAMESPACE_OPT_IN_LABEL: "true"}
NAMESPACES = {
    "opted-in": namespace("team-a", **OPT_IN),
    "not-labelled": namespace("team-b"),
    "label-false": namespace("team-c", **{vocab.NAMESPACE_OPT_IN_LABEL: "false"}),
    "kube-system-labelled": namespace("kube-system", **OPT_IN),
    "own-namespace-labelled": namespace("gpu-admission", **OPT_IN),
}
TRAIN_ON_SHARED = make_pod(labels={vocab.WORKLOAD_LABEL: "training"}, containers=[
    make_container(image="nvcr.io/nvidia/pytorch:24.05-py3", resource="nvidia.com/gpu.shared")])
PODS = {**{c[0]: c[1] for c in CEL_CASES}, "training-on-shared-gpu": TRAIN_ON_SHARED}


def server_files(docs: Docs, root: Path) -> tuple[Path, SecretDir]:
    """The install's ConfigMap policy and a serving certificate, as the pod mounts them."""
    root.mkdir()
    policy = root / "policy.yaml"
    policy.write_text(policy_configmap(docs)["data"]["policy.yaml"])
    return policy, SecretDir(root / "certs", new_bundle())


async def decisions(docs: Docs, tmp_path: Path) -> dict[str, Any]:
    """case -> what the API server would get: not called, or the real server's response."""
    policy, secret = server_files(docs, tmp_path)
    out: dict[str, Any] = {}
    async with running_server(make_config(secret, policy_path=policy),
                              secret.bundles[0].ca_pem) as srv:
        for _, hook in webhooks(docs):
            path = hook["clientConfig"]["service"]["path"]
            for ns_id, (ns, labels) in NAMESPACES.items():
                for pod_id, pod in PODS.items():
                    for operation in ("CREATE", "UPDATE"):
                        case = f"{hook['name']} {ns_id} {pod_id} {operation}"
                        if not called(hook, labels, pod, operation):
                            out[case] = "not called"
                            continue
                        obj = {**pod, "metadata": {**pod.get("metadata", {}), "namespace": ns}}
                        review = make_review(obj, operation=operation, namespace=ns,
                                             uid=f"uid-{len(out)}",
                                             old=obj if operation == "UPDATE" else None)
                        status, body, _ = await srv.post(path, review)
                        assert status == 200, f"{case}: HTTP {status} {body}"
                        out[case] = body["response"]
    return out


@pytest.mark.parametrize(("values", "target"), [({}, "default"),
                                                ({"certificates": {"mode": "certManager"}},
                                                 "cert-manager")],
                         ids=["self-managed", "cert-manager"])
async def test_chart_webhooks_decide_like_the_kustomize_install(
        values: dict[str, Any], target: str, tmp_path: Path) -> None:
    chart_docs, kust_docs = render_chart(values), render(target)
    assert [(k, h["name"]) for k, h in webhooks(chart_docs)] == \
        [(k, h["name"]) for k, h in webhooks(kust_docs)]
    for (_, a), (_, b) in zip(webhooks(chart_docs), webhooks(kust_docs), strict=True):
        for field in ("clientConfig", "rules", "namespaceSelector", "matchConditions",
                      "failurePolicy", "timeoutSeconds", "matchPolicy", "sideEffects"):
            assert a.get(field) == b.get(field), field
    chart = await decisions(chart_docs, tmp_path / "chart")
    kust = await decisions(kust_docs, tmp_path / "kustomize")
    assert chart == kust
    # the table exercises every outcome: skipped by namespace or CEL, allowed, denied
    results = list(chart.values())
    assert "not called" in results
    responses = [r for r in results if r != "not called"]
    assert any(r["allowed"] and "patch" in r for r in responses)
    assert any(not r["allowed"] for r in responses)
    assert chart["mutate.gpu-admission.io opted-in gpu-limit UPDATE"] == "not called"
    assert chart["validate.gpu-admission.io not-labelled gpu-limit CREATE"] == "not called"
    assert chart["mutate.gpu-admission.io kube-system-labelled gpu-limit CREATE"] == \
        "not called"
    assert chart["mutate.gpu-admission.io opted-in gpu-limit CREATE"]["allowed"] is True
    assert chart["validate.gpu-admission.io opted-in training-on-shared-gpu CREATE"][
        "allowed"] is False
