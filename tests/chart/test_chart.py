"""charts/gpu-admission rendered by real Helm (helm-python-sdk: Helm v4's Go SDK as a library).

- ``helm lint --strict`` is clean for the defaults and every documented value combination;
- every combination renders, its built-in objects validate strictly against the Kubernetes
  1.30 and 1.37 OpenAPI schemas (kubernetes-validate, as tests/install/test_manifests.py does
  for the kustomize output), its CRD objects have the fields their projects define, and the objects
  refer to each other correctly (names, ports, Secret, install-certs arguments);
- a wrong value type is refused by values.schema.json with the value's path, and the schema's
  ``policy`` part is the pydantic model's own JSON schema;
- the policy reaches the ConfigMap the server reads, and ``helm upgrade`` with a new policy
  does not touch the pod template (hot reload, exercised end to end in test_hot_reload.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import click
import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from gpu_admission.certs.bundle import service_dns_names
from gpu_admission.certs.install import install_certs
from gpu_admission.extender.cli import extender
from gpu_admission.policy.model import default_policy, load_policy
from gpu_admission.server.cli import serve
from tests.chart.policy_schema import SCHEMA_FILE, updated
from tests.chart_support import (
    CHART,
    NAMESPACE,
    RELEASE,
    component,
    notes,
    policy_configmap,
    render_chart,
)
from tests.install.test_manifests import (
    BUILTIN_GROUPS,
    K8S_VERSIONS,
    flag,
    known_options,
    one,
    pod_templates,
    webhooks,
)

Docs = list[dict[str, Any]]

EXAMPLE_POOLS = [  # README "The policy file"; large MiB values must survive toYaml as integers
    {"name": "inference-shared", "nodeSelector": {"gpu-admission.io/pool": "inference-shared"},
     "sharing": "time-slicing", "replicasPerGPU": 4, "memoryMiB": 81920, "cudaVersion": "12.4"},
    {"name": "training-big", "nodeSelector": {"gpu-admission.io/pool": "training-big"},
     "memoryMiB": 1048576, "cudaVersion": "12.10"},
]


def policy_of(docs: Docs, tmp_path: Path) -> Any:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_configmap(docs)["data"]["policy.yaml"])
    return load_policy(path)


def not_in(docs: Docs) -> list[str]:
    """The namespaces every webhook excludes by name (all webhooks must agree)."""
    found = []
    for _, hook in webhooks(docs):
        (expr,) = [e for e in hook["namespaceSelector"]["matchExpressions"]
                   if e["key"] == "kubernetes.io/metadata.name"]
        assert expr["operator"] == "NotIn"
        found.append(expr["values"])
    assert len(found) >= 2 and all(f == found[0] for f in found)
    return list(found[0])


# --------------------------------------------------------------------------- checks per case
def check_defaults(docs: Docs, tmp_path: Path) -> None:
    assert component(docs, "Deployment", "webhook")["spec"]["replicas"] == 2
    assert policy_of(docs, tmp_path).digest == default_policy().digest
    assert not_in(docs) == ["kube-system", NAMESPACE]
    assert not [d for d in docs if d["apiVersion"] not in BUILTIN_GROUPS]
    # `helm install --create-namespace` makes the namespace: rendering it too would fail
    assert not [d for d in docs if d["kind"] == "Namespace"]


def check_cert_manager(docs: Docs, tmp_path: Path) -> None:
    assert not [d for d in docs if "install-certs" in d["metadata"]["name"]]
    issuers = {d["metadata"]["name"] for d in docs if d["kind"] == "Issuer"}
    assert issuers == {"gpu-admission-selfsigned", "gpu-admission-ca"}
    serving = one(docs, "Certificate", "gpu-admission-tls")["spec"]
    assert serving["issuerRef"] == {"group": "cert-manager.io", "kind": "Issuer",
                                    "name": "gpu-admission-ca"}
    assert (serving["duration"], serving["renewBefore"]) == ("8760h", "720h")


def check_cert_manager_issuer(docs: Docs, tmp_path: Path) -> None:
    assert not [d for d in docs if d["kind"] == "Issuer"]  # the user's ClusterIssuer is used
    (cert,) = [d for d in docs if d["kind"] == "Certificate"]
    assert cert["spec"]["issuerRef"] == {"group": "cert-manager.io", "kind": "ClusterIssuer",
                                         "name": "corp-ca"}
    assert (cert["spec"]["duration"], cert["spec"]["renewBefore"]) == ("2160h", "360h")


def check_service_monitor(docs: Docs, tmp_path: Path) -> None:
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics",
                                             "scheme": "http", "interval": "15s",
                                             "scrapeTimeout": "5s"}]


def check_namespace(docs: Docs, tmp_path: Path) -> None:
    (ns,) = [d for d in docs if d["kind"] == "Namespace"]
    assert ns["metadata"]["name"] == NAMESPACE
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def check_release_name(docs: Docs, tmp_path: Path) -> None:
    names = {f"{d['kind']}/{d['metadata']['name']}" for d in docs}
    assert "Deployment/ga-gpu-admission" in names
    assert "ClusterRole/ga-gpu-admission-install-certs" in names
    assert "MutatingWebhookConfiguration/ga-gpu-admission" in names
    elsewhere = {f"{d['kind']}/{d['metadata']['name']}" for d in docs
                 if d["metadata"].get("namespace") not in (None, "platform")}
    # kube-system holds only the scheduler's reader binding (the Role lives there)
    assert elsewhere == {"RoleBinding/gpu-aware-scheduler-extension-apiserver-authentication-"
                         "reader"}
    assert not_in(docs) == ["kube-system", "platform"]


def check_exemptions(docs: Docs, tmp_path: Path) -> None:
    assert not_in(docs) == ["kube-system", NAMESPACE, "ci-runners", "batch"]
    exempt = policy_of(docs, tmp_path).spec.exemptions
    assert exempt.namespaces == ["kube-system", "ci-runners", "batch"]
    assert exempt.users == ["system:serviceaccount:argo:argo-server"]
    assert exempt.groups == ["platform-admins"]


def check_exemptions_merge(docs: Docs, tmp_path: Path) -> None:
    """A policy without spec.exemptions keeps the model's default namespace (kube-system)
    when extras are added, and keeps its own lists otherwise."""
    exempt = policy_of(docs, tmp_path).spec.exemptions
    assert exempt.namespaces == ["kube-system", "batch"]
    assert exempt.users == []
    assert exempt.groups == ["g1", "g2"]


def check_fail_open(docs: Docs, tmp_path: Path) -> None:
    for _, hook in webhooks(docs):
        assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Ignore", 10)


def check_image(docs: Docs, tmp_path: Path) -> None:
    for name, template in pod_templates(docs):
        spec = template["spec"]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}], name
        for c in spec["containers"]:
            if c["name"] == "kube-scheduler":  # upstream image, scheduler.image
                assert c["image"] == "registry.k8s.io/kube-scheduler:v1.35.1", name
                continue
            assert c["image"] == "registry.example.com/gpu-admission:0.2.0", name
            assert c["imagePullPolicy"] == "Always", name


def check_sizing(docs: Docs, tmp_path: Path) -> None:
    deployment = component(docs, "Deployment", "webhook")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"cpu": "2", "memory": "512Mi"}}
    job_args = one(docs, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert (flag(job_args, "--days"), flag(job_args, "--renew-before")) == ("90", "20")
    assert one(docs, "CronJob")["spec"]["schedule"] == "0 4 * * *"


def check_opt_in_label(docs: Docs, tmp_path: Path) -> None:
    for _, hook in webhooks(docs):
        assert hook["namespaceSelector"]["matchExpressions"][0] == {
            "key": "example.com/gpu-sharing", "operator": "In", "values": ["on"]}


def check_node_pools(docs: Docs, tmp_path: Path) -> None:
    pools = {p.name: p for p in policy_of(docs, tmp_path).spec.node_pools}
    assert pools["training-big"].memory_mib == 1048576
    assert pools["training-big"].cuda_version == "12.10"
    assert pools["inference-shared"].replicas_per_gpu == 4
    assert policy_of(docs, tmp_path).spec.scheduler_name == ""  # rule scheduler-name off


def test_null_in_values_deletes_the_key_so_disable_the_scheduler_rule_with_empty_string(
        tmp_path: Path) -> None:
    """Helm merges values and drops a key whose override is null, so `schedulerName: null`
    (the policy file's way to switch rule scheduler-name off) silently keeps the default in a
    values file; docs/helm.md says to write "" instead (the rule treats both as off)."""
    docs = render_chart({"policy": {"spec": {"schedulerName": None}}})
    assert policy_of(docs, tmp_path).spec.scheduler_name == "gpu-aware-scheduler"


def check_scheduler_disabled(docs: Docs, tmp_path: Path) -> None:
    assert not [d for d in docs
                if d["metadata"].get("labels", {}).get("app.kubernetes.io/component")
                == "scheduler"]
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"] == \
        ["gpu-admission", "gpu-admission-reclaim"]  # reclaim: its own value


def check_extender_disabled(docs: Docs, tmp_path: Path) -> None:
    spec = component(docs, "Deployment", "scheduler")["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["kube-scheduler"]
    config = yaml.safe_load(one(docs, "ConfigMap", "gpu-aware-scheduler-config")["data"][
        "config.yaml"])
    assert "extenders" not in config


def check_scheduler_renamed(docs: Docs, tmp_path: Path) -> None:
    deployment = one(docs, "Deployment", "gpu-packer")
    assert deployment["spec"]["replicas"] == 3
    config = yaml.safe_load(one(docs, "ConfigMap", "gpu-packer-config")["data"]["config.yaml"])
    assert config["profiles"][0]["schedulerName"] == "gpu-packer"
    assert config["leaderElection"]["resourceName"] == "gpu-packer"
    assert config["extenders"][0]["urlPrefix"] == "http://127.0.0.1:9999/x"
    assert config["extenders"][0]["weight"] == 2
    args = deployment["spec"]["template"]["spec"]["containers"][1]["args"]
    assert flag(args, "--prometheus") == "https://prom.example.com:9091"
    assert one(docs, "ClusterRoleBinding", "gpu-packer-as-kube-scheduler")


# id -> (values, release name, namespace, check)
CASES: dict[str, tuple[dict[str, Any], str, str, Callable[[Docs, Path], None]]] = {
    "defaults": ({}, RELEASE, NAMESPACE, check_defaults),
    "cert-manager": ({"certificates": {"mode": "certManager"}}, RELEASE, NAMESPACE,
                     check_cert_manager),
    "cert-manager-own-issuer": ({"certificates": {"mode": "certManager", "certManager": {
        "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"},
        "duration": "2160h", "renewBefore": "360h"}}}, RELEASE, NAMESPACE,
        check_cert_manager_issuer),
    "service-monitor": ({"metrics": {"serviceMonitor": {
        "enabled": True, "interval": "15s", "scrapeTimeout": "5s",
        "labels": {"release": "kube-prometheus-stack"}}}}, RELEASE, NAMESPACE,
        check_service_monitor),
    "namespace-created": ({"namespace": {"create": True}}, RELEASE, NAMESPACE,
                          check_namespace),
    "other-release-and-namespace": ({}, "ga", "platform", check_release_name),
    "extra-exemptions": ({"exemptions": {
        "namespaces": ["ci-runners", "batch", "kube-system"],
        "users": ["system:serviceaccount:argo:argo-server"], "groups": ["platform-admins"]}},
        RELEASE, NAMESPACE, check_exemptions),
    # Helm deletes a default key whose override is null: this policy has no spec.exemptions
    "exemptions-into-minimal-policy": ({
        "exemptions": {"namespaces": ["batch"], "groups": ["g1", "g2"]},
        "policy": {"spec": {"exemptions": None}},
    }, RELEASE, NAMESPACE, check_exemptions_merge),
    "fail-open": ({"webhook": {"failurePolicy": "Ignore", "timeoutSeconds": 10}}, RELEASE,
                  NAMESPACE, check_fail_open),
    "image-and-pull-secret": ({"image": {"repository": "registry.example.com/gpu-admission",
                                         "tag": "0.2.0", "pullPolicy": "Always"},
                               "imagePullSecrets": [{"name": "regcred"}],
                               "scheduler": {"image": {"tag": "v1.35.1"}}}, RELEASE, NAMESPACE,
                              check_image),
    "sizing-and-renewal": ({"replicas": 3, "resources": {
        "requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"cpu": "2", "memory": "512Mi"}},
        "certificates": {"selfManaged": {"days": 90, "renewBefore": 20,
                                         "schedule": "0 4 * * *"}}}, RELEASE, NAMESPACE,
        check_sizing),
    "custom-opt-in-label": ({"webhook": {"namespaceOptInLabel": {
        "key": "example.com/gpu-sharing", "value": "on"}}}, RELEASE, NAMESPACE,
        check_opt_in_label),
    "scheduler-disabled": ({"scheduler": {"enabled": False}}, RELEASE, NAMESPACE,
                           check_scheduler_disabled),
    "extender-disabled": ({"scheduler": {"extender": {"enabled": False}}}, RELEASE, NAMESPACE,
                          check_extender_disabled),
    "scheduler-renamed-and-prometheus": ({
        "scheduler": {"name": "gpu-packer", "replicas": 3, "extender": {
            "prometheusUrl": "https://prom.example.com:9091", "weight": 2, "port": 9999,
            "prefix": "/x"}},
        "policy": {"spec": {"schedulerName": "gpu-packer"}}}, RELEASE, NAMESPACE,
        check_scheduler_renamed),
    "policy-node-pools": ({"policy": {"spec": {"schedulerName": "",
                                               "nodePools": EXAMPLE_POOLS}}},
                          RELEASE, NAMESPACE, check_node_pools),
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, Docs]:
    return {case: render_chart(values, name=name, namespace=ns)
            for case, (values, name, ns, _) in CASES.items()}


# --------------------------------------------------------------------------- lint
@pytest.mark.parametrize("case", list(CASES))
def test_lint_strict_is_clean(case: str) -> None:
    values, _, ns, _ = CASES[case]
    report = helm.lint(CHART, values or None, strict=True, namespace=ns,
                       kube_version="v1.30.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # warning, error
    assert report["errors"] == [] and problems == [], json.dumps(report, indent=1)
    # only Helm's info-level "icon is recommended" (the project has no icon)
    assert [m["error"] for m in report["messages"]] == ["icon is recommended"]


def test_lint_reports_a_broken_chart(tmp_path: Path) -> None:
    """The lint call is not a rubber stamp: a template error is reported."""
    broken = tmp_path / "gpu-admission"
    with helm.Chart.load(CHART) as chart:
        chart.save_dir(tmp_path)
    (broken / "templates" / "service.yaml").write_text("kind: Service\n{{ .Values.nope.x }}\n")
    report = helm.lint(broken, strict=True)
    assert report["errors"], report


# --------------------------------------------------------------------------- schemas
@cache
def openapi_error(doc_json: str, version: str) -> str | None:
    """kubernetes-validate's verdict on one object (most objects are the same in every
    combination: each distinct one is validated once per version)."""
    try:
        kubernetes_validate.validate(json.loads(doc_json), version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return f"{exc.message} at {list(exc.path)}"
    return None


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("case", list(CASES))
def test_builtin_kinds_match_kubernetes_openapi_schema(case: str, version: str,
                                                       rendered: dict[str, Docs]) -> None:
    for doc in rendered[case]:
        if doc["apiVersion"] not in BUILTIN_GROUPS:
            continue
        # the compiled guard is rendered only for API servers serving MAP v1 (1.36+)
        at = (max(version, "1.36.0", key=lambda v: tuple(map(int, v.split("."))))
              if "AdmissionPolicy" in doc["kind"] else version)
        error = openapi_error(json.dumps(doc, sort_keys=True), at)
        assert error is None, f"{case}: {doc['kind']}/{doc['metadata']['name']} invalid " \
            f"for {version}: {error}"
    others = {d["kind"] for d in rendered[case] if d["apiVersion"] not in BUILTIN_GROUPS}
    assert others <= {"Certificate", "Issuer", "ServiceMonitor"}, others


def test_openapi_check_catches_a_typo(rendered: dict[str, Docs]) -> None:
    """Guard against a validator that accepts anything: a misspelt field must fail."""
    deployment = json.loads(json.dumps(component(rendered["defaults"], "Deployment",
                                                 "scheduler")))
    deployment["spec"]["template"]["spec"]["containers"][1]["readinessprobe"] = {}
    assert openapi_error(json.dumps(deployment), K8S_VERSIONS[-1]) is not None


# ServiceMonitor (prometheus-operator monitoring.coreos.com/v1 API reference): spec.selector is
# required; endpoints[] keys used here; namespaceSelector {any | matchNames}.
SERVICE_MONITOR_SPEC = {"selector", "endpoints", "namespaceSelector", "jobLabel",
                        "targetLabels", "podTargetLabels", "sampleLimit"}
SERVICE_MONITOR_ENDPOINT = {"port", "targetPort", "path", "scheme", "interval", "scrapeTimeout",
                            "honorLabels", "relabelings", "metricRelabelings", "tlsConfig"}
# cert-manager.io/v1 Certificate.spec / Issuer.spec fields the chart uses
CERTIFICATE_SPEC = {"secretName", "commonName", "dnsNames", "duration", "renewBefore", "usages",
                    "privateKey", "issuerRef", "isCA"}


def check_webhook_refs(docs: Docs, ns: str) -> tuple[str, set[str]]:
    """Service, Deployment, PDB, ConfigMap and webhooks agree; returns (TLS Secret name,
    webhook configuration names)."""
    service = one(docs, "Service")
    deployment = component(docs, "Deployment", "webhook")
    template = deployment["spec"]["template"]
    pod_labels = template["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert component(docs, "PodDisruptionBudget", "webhook")["spec"]["selector"][
        "matchLabels"].items() <= pod_labels.items()
    server_sa = one(docs, "ServiceAccount", template["spec"]["serviceAccountName"])
    assert server_sa["automountServiceAccountToken"] is False
    container = template["spec"]["containers"][0]
    known_options(serve, container["args"][1:])
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert policy_configmap(docs)["data"].keys() == {"policy.yaml"}
    for _, hook in webhooks(docs):
        ref = hook["clientConfig"]["service"]
        assert (ref["name"], ref["namespace"], ref["port"]) == (
            service["metadata"]["name"], ns, 443)
    assert not_in(docs)[:2] == ["kube-system", ns]
    names = {d["metadata"]["name"] for d in docs if d["kind"].endswith("WebhookConfiguration")}
    assert len(names) == 1
    return volumes["certs"]["secret"]["secretName"], names


def check_certificate_refs(docs: Docs, ns: str, secret: str, names: set[str]) -> None:
    service = one(docs, "Service")
    if [d for d in docs if d["kind"] == "Certificate"]:  # cert-manager mode
        serving = one(docs, "Certificate", secret)["spec"]
        assert set(serving) <= CERTIFICATE_SPEC
        assert serving["secretName"] == secret
        assert serving["dnsNames"] == service_dns_names(service["metadata"]["name"], ns)
        for d in docs:
            if d["kind"].endswith("WebhookConfiguration"):
                assert d["metadata"]["annotations"] == {
                    "cert-manager.io/inject-ca-from": f"{ns}/{secret}"}
        assert not [d for d in docs if d["kind"] in ("Job", "CronJob")]
        return
    # self-managed: the Job and CronJob write this Secret and patch these webhooks
    jobs = [t for t in pod_templates(docs) if not t[0].startswith("Deployment/")]
    assert sorted(n.split("/")[0] for n, _ in jobs) == ["CronJob", "Job"]
    for _, job in jobs:
        args = job["spec"]["containers"][0]["args"]
        with click.Context(install_certs) as ctx:
            assert install_certs.parse_args(ctx, list(args[1:])) == []
        assert ctx.params["namespace"] == ns
        assert ctx.params["service"] == service["metadata"]["name"]
        assert ctx.params["secret"] == secret
        assert set(ctx.params["webhook_configs"]) == names
        sa = job["spec"]["serviceAccountName"]
        bound = [b for b in docs if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
                 and b["metadata"]["labels"]["app.kubernetes.io/component"] == "install-certs"]
        assert {s["name"] for b in bound for s in b["subjects"]} == {sa}
    role = component(docs, "Role", "install-certs")
    assert [r.get("resourceNames") for r in role["rules"]] == [[secret], None]
    assert component(docs, "ClusterRole", "install-certs")["rules"][0]["resourceNames"] == \
        sorted(names)
    assert not [d for d in docs if d["kind"] in ("Certificate", "Issuer")]


def check_scheduler_refs(docs: Docs, ns: str, tmp_path: Path) -> None:
    """The scheduler's config, lease RBAC, sidecar and policy fit together."""
    deployment = component(docs, "Deployment", "scheduler")
    spec = deployment["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    scheduler = containers["kube-scheduler"]
    (config_arg,) = [a for a in scheduler["command"] if a.startswith("--config=")]
    config_path = Path(config_arg.split("=", 1)[1])
    (mount,) = [m for m in scheduler["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
    cm = one(docs, "ConfigMap", volumes[mount["name"]]["configMap"]["name"])
    config = yaml.safe_load(cm["data"][config_path.name])
    assert config["kind"] == "KubeSchedulerConfiguration"
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == deployment["metadata"]["name"]
    assert policy_of(docs, tmp_path).spec.scheduler_name in ("", profile["schedulerName"])
    lease = config["leaderElection"]
    assert lease["resourceNamespace"] == ns and lease["resourceName"] != "kube-scheduler"
    (role,) = [d for d in docs if d["kind"] == "Role"
               and d["metadata"]["name"] == f"{lease['resourceName']}-lease"]
    assert [r.get("resourceNames") for r in role["rules"]] == [None, [lease["resourceName"]]]
    sa = spec["serviceAccountName"]
    bound = [b for b in docs if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
             and b["metadata"]["labels"]["app.kubernetes.io/component"] == "scheduler"]
    assert {s["name"] for b in bound for s in b["subjects"]} == {sa}
    assert {b["roleRef"]["name"] for b in bound} == {
        "system:kube-scheduler", "system:volume-scheduler",
        "extension-apiserver-authentication-reader", role["metadata"]["name"],
        # fractional GPU pools: the ledger and bind, reservation pods
        f"{lease['resourceName']}-fractional", f"{lease['resourceName']}-reservations"}
    extenders = config.get("extenders", [])
    if "extender" not in containers:
        assert extenders == [] and "policy" not in volumes
        return
    ext, frac = extenders
    assert frac["urlPrefix"] == ext["urlPrefix"] and frac["bindVerb"] == "bind"
    assert flag(containers["extender"]["args"], "--namespace") == ns  # reservation pods
    args = containers["extender"]["args"]
    assert args[0] == "extender"
    known_options(extender, args[1:])
    assert ext["urlPrefix"] == (f"http://{flag(args, '--host')}:{flag(args, '--port')}"
                                f"{flag(args, '--prefix')}")
    assert flag(args, "--host") == "127.0.0.1"  # loopback: only kube-scheduler reaches it
    assert ext["ignorable"] is True and ext["weight"] > 0
    policy_mount = next(m for m in containers["extender"]["volumeMounts"]
                        if m["mountPath"] == str(Path(flag(args, "--policy")).parent))
    assert volumes[policy_mount["name"]]["configMap"]["name"] == \
        policy_configmap(docs)["metadata"]["name"]
    ports = {p["name"]: p["containerPort"] for p in containers["extender"]["ports"]}
    assert ports["metrics"] == int(flag(args, "--metrics-port"))


@pytest.mark.parametrize("case", list(CASES))
def test_objects_refer_to_each_other(case: str, rendered: dict[str, Docs],
                                     tmp_path: Path) -> None:
    """Cross-references that must hold for every value combination, not just the defaults."""
    docs = rendered[case]
    _, _, ns, _ = CASES[case]
    secret, names = check_webhook_refs(docs, ns)
    check_certificate_refs(docs, ns, secret, names)
    if [d for d in docs if d["kind"] == "Deployment" and d is not
            component(docs, "Deployment", "webhook")
            and d["metadata"]["labels"].get("app.kubernetes.io/component") != "reclaim"]:
        check_scheduler_refs(docs, ns, tmp_path)
    service = one(docs, "Service")
    for monitor in (d for d in docs if d["kind"] == "ServiceMonitor"):
        spec = monitor["spec"]
        assert set(spec) <= SERVICE_MONITOR_SPEC
        assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert spec["namespaceSelector"] == {"matchNames": [ns]}
        ports = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in spec["endpoints"]:
            assert set(endpoint) <= SERVICE_MONITOR_ENDPOINT
            assert endpoint["port"] in ports


@pytest.mark.parametrize("case", list(CASES))
def test_each_combination_does_what_its_values_say(case: str, rendered: dict[str, Docs],
                                                   tmp_path: Path) -> None:
    docs = rendered[case]
    policy_of(docs, tmp_path)  # the server accepts the rendered policy
    CASES[case][3](docs, tmp_path)


# --------------------------------------------------------------------------- values schema
BAD_VALUES = [
    ("replicas-string", {"replicas": "3"}, "/replicas", "got string, want integer"),
    ("failure-policy-typo", {"webhook": {"failurePolicy": "fail"}}, "/webhook/failurePolicy",
     "value must be one of"),
    ("timeout-too-long", {"webhook": {"timeoutSeconds": 31}}, "/webhook/timeoutSeconds",
     "maximum"),
    ("unknown-top-level-key", {"replica": 3}, "at ''", "'replica' not allowed"),
    ("cert-mode-typo", {"certificates": {"mode": "cert-manager"}}, "/certificates/mode",
     "value must be one of"),
    ("exempt-namespace-not-string", {"exemptions": {"namespaces": [1]}},
     "/exemptions/namespaces/0", "got number, want string"),
    ("service-monitor-bool-string", {"metrics": {"serviceMonitor": {"enabled": "yes"}}},
     "/metrics/serviceMonitor/enabled", "got string, want boolean"),
    ("duration-not-go", {"certificates": {"certManager": {"duration": "1 year"}}},
     "/certificates/certManager/duration", "does not match pattern"),
    ("policy-memory-string", {"policy": {"spec": {"memoryLimits": {"defaultMemoryMiB": "16G"}}}},
     "/policy/spec/memoryLimits/defaultMemoryMiB", "got string, want integer"),
    ("policy-cuda-unquoted", {"policy": {"spec": {"nodePools": [
        {"name": "a", "nodeSelector": {"k": "v"}, "memoryMiB": 1, "cudaVersion": 12.4}]}}},
     "/policy/spec/nodePools/0/cudaVersion", "got number, want string"),
    ("policy-unknown-field", {"policy": {"spec": {"memoryLimit": {}}}}, "/policy/spec",
     "'memoryLimit' not allowed"),
    ("policy-rule-mode", {"policy": {"spec": {"rules": {"memory-limit": "deny"}}}},
     "/policy/spec/rules/memory-limit", "value must be one of"),
    ("policy-wrong-kind", {"policy": {"kind": "Policy"}}, "/policy/kind", "value must be"),
    ("scheduler-enabled-string", {"scheduler": {"enabled": "false"}}, "/scheduler/enabled",
     "got string, want boolean"),
    ("prometheus-url-no-scheme", {"scheduler": {"extender": {"prometheusUrl": "prom:9090"}}},
     "/scheduler/extender/prometheusUrl", "does not match pattern"),
    ("scheduler-name-not-dns", {"scheduler": {"name": "GPU_Scheduler"}}, "/scheduler/name",
     "does not match pattern"),
]


def test_scheduler_name_must_match_the_policy() -> None:
    """GPU pods get the policy's schedulerName; a scheduler under another name would leave
    them Pending, so the chart refuses to render (a template `fail`, before anything is
    applied)."""
    with pytest.raises(helm.HelmRenderError) as err:
        render_chart({"scheduler": {"name": "gpu-packer"}})
    assert "scheduler.name (gpu-packer) must equal policy.spec.schedulerName " \
        "(gpu-aware-scheduler)" in str(err.value)
    # the rule switched off, or the scheduler not installed: nothing to match
    render_chart({"scheduler": {"name": "gpu-packer"},
                  "policy": {"spec": {"schedulerName": ""}}})
    render_chart({"scheduler": {"enabled": False, "name": "gpu-packer"}})


@pytest.mark.parametrize(("values", "path", "message"), [b[1:] for b in BAD_VALUES],
                         ids=[b[0] for b in BAD_VALUES])
def test_wrong_value_type_is_refused_with_its_path(values: dict[str, Any], path: str,
                                                   message: str) -> None:
    with pytest.raises(helm.HelmValuesError) as err:
        render_chart(values)
    text = str(err.value)
    located = f"at '{path}'" if path.startswith("/") else path
    assert located in text, text
    assert message in text, text


def test_values_schema_policy_part_is_the_model_schema() -> None:
    """Regenerate with ``python -m tests.chart.policy_schema`` after a model change."""
    current = json.loads(SCHEMA_FILE.read_text())
    assert current == updated(current), "values.schema.json is stale: run " \
        "python -m tests.chart.policy_schema"


def test_default_values_pass_the_schema_and_the_policy_is_the_builtin_default(
        tmp_path: Path) -> None:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(chart.values)
        policy = tmp_path / "policy.yaml"
        policy.write_text(yaml.safe_dump(chart.values["policy"]))
    assert load_policy(policy).digest == default_policy().digest


# --------------------------------------------------------------------------- upgrade behaviour
def test_upgrade_with_a_new_policy_changes_only_the_configmap(tmp_path: Path) -> None:
    """Decision: hot reload, no checksum annotation. A `helm upgrade` that only changes the
    policy changes only the ConfigMap; the Deployment (pod template included) is identical, so
    Kubernetes does not roll the pods, and the server picks the file up itself."""
    before = render_chart()
    after = render_chart({"policy": {"spec": {"memoryLimits": {"defaultMemoryMiB": 8000}}}})
    changed = {f"{a['kind']}/{a['metadata']['name']}" for a, b in zip(before, after, strict=True)
               if a != b}
    assert changed == {"ConfigMap/gpu-admission-policy"}
    assert policy_of(after, tmp_path).spec.memory_limits.default_memory_mib == 8000
    template = component(after, "Deployment", "webhook")["spec"]["template"]
    assert "annotations" not in template["metadata"]


def test_policy_configmap_is_mounted_where_the_server_watches() -> None:
    docs = render_chart()
    spec = component(docs, "Deployment", "webhook")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    policy_path = Path(flag(container["args"], "--policy"))
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(policy_path.parent)]
    assert "subPath" not in mount  # a subPath mount never sees ConfigMap updates
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == "gpu-admission-policy"  # plain name, no hash suffix
    assert policy_path.name in one(docs, "ConfigMap", volume["configMap"]["name"])["data"]


# --------------------------------------------------------------------------- NOTES.txt
def test_notes_tell_how_to_opt_in_and_dry_run() -> None:
    text = notes()
    assert "kubectl label namespace team-a gpu-admission.io/enabled=true" in text
    assert "kubectl apply --dry-run=server -o yaml -f -" in text
    assert "job/gpu-admission-install-certs" in text
    custom = notes({"webhook": {"namespaceOptInLabel": {"key": "example.com/gpu", "value": "on"}},
                    "certificates": {"mode": "certManager"}}, name="ga", namespace="platform")
    assert "kubectl label namespace team-a example.com/gpu=on" in custom
    assert "certificate/ga-gpu-admission-tls" in custom
    assert "deployment/ga-gpu-admission" in custom


def test_notes_dry_run_pod_is_the_readme_walkthrough_pod() -> None:
    """The pod NOTES.txt tells users to dry-run is docs/install.md's, and a valid Pod."""
    text = notes()
    body = text.split("<<'POD' | kubectl apply --dry-run=server -o yaml -f -\n")[1]
    body = body.split("     POD\n")[0]
    pod = yaml.safe_load("\n".join(line[5:] for line in body.splitlines()))
    kubernetes_validate.validate(pod, K8S_VERSIONS[-1], strict=True)
    readme = (CHART.parents[1] / "docs" / "install.md").read_text()
    walkthrough = readme.split("kubectl apply --dry-run=server -o yaml -f -\n")[1]
    assert yaml.safe_load(walkthrough.split("EOF")[0]) == pod
