"""Rendering charts/gpu-admission with real Helm (the helm-python-sdk package embeds Helm v4's
Go SDK as a library: no helm binary) and comparing its objects with the kustomize install.

Shared by tests/chart/ and by anyone who changes webhook-manifests/ and wants to see the chart
diff (``python -c "from tests.chart_support import *; print(drift(...))"``).
"""

from __future__ import annotations

import copy
import difflib
import json
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "gpu-admission"
RELEASE = "gpu-admission"  # the documented release name: object names equal the base's
NAMESPACE = "gpu-admission"

# Labels Helm charts add by convention (https://helm.sh/docs/chart_best_practices/labels/);
# the kustomize base has none of them. Nothing else is ignored by the equivalence check.
HELM_LABELS = frozenset({"app.kubernetes.io/instance", "app.kubernetes.io/managed-by",
                         "app.kubernetes.io/version", "helm.sh/chart"})
HELM_ANNOTATION_PREFIXES = ("helm.sh/", "meta.helm.sh/")


#: What a 1.36+ API server adds to Helm's capabilities (``helm install`` asks the cluster;
#: ``helm template --api-versions``): the compiled guard is rendered (docs/compile.md).
MAP_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
API_1_36 = (MAP_API, "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")
#: The cluster version Helm renders for (``helm template --kube-version``; ``helm install``
#: asks the cluster): the kustomize base pins kube-scheduler v1.36.2, the chart follows it.
KUBE_VERSION = "v1.36.2"


def render_files(values: dict[str, Any] | None = None, *, name: str = RELEASE,
                 namespace: str = NAMESPACE, api_versions: tuple[str, ...] = API_1_36,
                 kube_version: str = KUBE_VERSION) -> dict[str, str]:
    """Template path -> rendered text, as ``helm template`` / ``helm install`` render it
    (the chart's values.schema.json is applied; a schema violation raises HelmValuesError).
    ``api_versions``: ``helm template --api-versions`` (default: a 1.36+ API server; ``()``:
    Helm's built-in set, which has no MutatingAdmissionPolicy). ``kube_version``: ``helm
    template --kube-version`` (what ``.Capabilities.KubeVersion`` says)."""
    with helm.Chart.load(CHART) as chart:
        # helm-python-sdk's render() exposes neither --api-versions nor --kube-version; its
        # native call takes both (helm-c-sdk wrapper options: "api_versions", "kube_version")
        from helm_python import _native  # noqa: PLC0415
        from helm_python.chart import _dumps  # noqa: PLC0415

        options: dict[str, Any] = {"name": name, "namespace": namespace, "is_install": True,
                                   "kube_version": kube_version}
        if api_versions:
            options["api_versions"] = list(api_versions)
        rendered: dict[str, str] = json.loads(_native.call_string(
            "helm_render", chart._raw(), _dumps(values), json.dumps(options)))
        return rendered


def render_chart(values: dict[str, Any] | None = None, *, name: str = RELEASE,
                 namespace: str = NAMESPACE, api_versions: tuple[str, ...] = API_1_36,
                 kube_version: str = KUBE_VERSION) -> list[dict[str, Any]]:
    """The Kubernetes objects the chart installs (NOTES.txt excluded), in template order."""
    docs: list[dict[str, Any]] = []
    for path, text in sorted(render_files(values, name=name, namespace=namespace,
                                          api_versions=api_versions,
                                          kube_version=kube_version).items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def notes(values: dict[str, Any] | None = None, *, name: str = RELEASE,
          namespace: str = NAMESPACE) -> str:
    files = render_files(values, name=name, namespace=namespace)
    return files[f"{CHART.name}/templates/NOTES.txt"]


def without_helm_metadata(doc: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``doc`` without Helm's own labels and annotations (top-level metadata only:
    the chart puts none on pod templates)."""
    out = copy.deepcopy(doc)
    meta = out["metadata"]
    if "labels" in meta:
        meta["labels"] = {k: v for k, v in meta["labels"].items() if k not in HELM_LABELS}
    if "annotations" in meta:
        meta["annotations"] = {k: v for k, v in meta["annotations"].items()
                               if not k.startswith(HELM_ANNOTATION_PREFIXES)}
    for key in ("labels", "annotations"):
        if key in meta and not meta[key]:
            del meta[key]
    return out


def comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` as the equivalence check sees it: Helm metadata dropped, and ConfigMap entries
    that are YAML documents (``*.yaml``) parsed, because the kustomize base keeps comments in
    them and Helm's ``toYaml`` sorts keys; the server reads the parsed document either way."""
    out = without_helm_metadata(doc)
    if out["kind"] == "ConfigMap":
        out["data"] = {k: yaml.safe_load(v) if k.endswith((".yaml", ".yml")) else v
                       for k, v in out.get("data", {}).items()}
    return out


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (CEL expressions, embedded YAML) as ``|`` blocks, so a diff shows
    the changed line instead of one escaped line."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def _dump(doc: dict[str, Any]) -> list[str]:
    return yaml.dump(doc, Dumper=_BlockDumper, sort_keys=True, width=120).splitlines()


def object_key(doc: dict[str, Any]) -> str:
    meta = doc["metadata"]
    ns = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{doc['apiVersion']} {doc['kind']} {ns}{meta['name']}"


def drift(chart_docs: list[dict[str, Any]], kustomize_docs: list[dict[str, Any]]) -> str:
    """A readable report of every difference ("" when none): objects only one side installs,
    then a unified YAML diff per object both install."""
    chart = {object_key(d): comparable(d) for d in chart_docs}
    kust = {object_key(d): comparable(d) for d in kustomize_docs}
    assert len(chart) == len(chart_docs), "the chart renders an object twice"
    assert len(kust) == len(kustomize_docs), "kustomize renders an object twice"
    lines: list[str] = []
    lines += [f"only in kustomize: {k}" for k in sorted(kust.keys() - chart.keys())]
    lines += [f"only in the chart: {k}" for k in sorted(chart.keys() - kust.keys())]
    for key in sorted(chart.keys() & kust.keys()):
        if chart[key] == kust[key]:
            continue
        a, b = _dump(kust[key]), _dump(chart[key])
        lines.append(f"differs: {key}")
        lines += difflib.unified_diff(a, b, "kustomize", "chart", lineterm="", n=2)
    return "\n".join(lines)


def component(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one object of ``kind`` labelled ``app.kubernetes.io/component: name``."""
    found = [d for d in docs if d["kind"] == kind and
             d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == name]
    assert len(found) == 1, f"expected one {kind} of component {name}, found {len(found)}"
    return found[0]


def policy_configmap(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The ConfigMap the webhook Deployment mounts as its policy directory."""
    spec = component(docs, "Deployment", "webhook")["spec"]["template"]["spec"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "policy"]
    name = volume["configMap"]["name"]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name]
    return cm
