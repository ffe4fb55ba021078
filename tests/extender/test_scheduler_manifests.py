"""Proof 5: the shipped gpu-aware-scheduler install (webhook-manifests/base/scheduler-*.yaml).

* Built-in kinds validate against the Kubernetes OpenAPI schemas (``kubernetes-validate``,
  strict), like the rest of the base.
* The KubeSchedulerConfiguration has no schema there: it is checked structurally against the
  fields of kube-scheduler's config/v1 types (``k8s.io/kube-scheduler/config/v1/types.go``,
  ``types_pluginargs.go``) and the rules of ``pkg/scheduler/apis/config/validation``
  (prioritize needs weight > 0, managedResources are extended-resource names).
* Cross-references go to the real code: the extender URL (host, port, prefix, verbs) must be
  routes of the real extender app built from the sidecar's own args, the profile name the
  policy's ``schedulerName``, the lease the one its Role allows; the sidecar's args start the
  real ``gpu-admission extender``, which then answers the probes and a filter call.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from gpu_admission.extender.app import ExtenderConfig, create_app, create_probe_app
from gpu_admission.extender.cli import extender as extender_command
from gpu_admission.policy.model import load_policy
from gpu_admission.server.wire import parse_go_duration
from tests.builders import make_pod
from tests.extender_support import args_with_names, get, post, wait_for
from tests.install.test_manifests import (
    BUILTIN_GROUPS,
    K8S_VERSIONS,
    flag,
    known_options,
    one,
    render,
)
from tests.kube_api_support import api_in_thread
from tests.server_support import free_port, sigterm_and_collect

NS = "gpu-admission"
SCHEDULER = "gpu-aware-scheduler"

# k8s.io/kube-scheduler/config/v1/types.go (KubeSchedulerConfiguration, KubeSchedulerProfile,
# Plugins/PluginSet/Plugin, PluginConfig, Extender, ExtenderManagedResource, ExtenderTLSConfig)
# and component-base config/v1alpha1 LeaderElectionConfiguration.
TOP_KEYS = {"apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
            "healthzBindAddress", "metricsBindAddress", "enableProfiling",
            "enableContentionProfiling", "percentageOfNodesToScore",
            "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles", "extenders",
            "delayCacheUntilActive"}
LEADER_KEYS = {"leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock",
               "resourceName", "resourceNamespace"}
PROFILE_KEYS = {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"}
EXTENSION_POINTS = {"preEnqueue", "queueSort", "preFilter", "filter", "postFilter", "preScore",
                    "score", "reserve", "permit", "preBind", "bind", "postBind", "multiPoint"}
EXTENDER_KEYS = {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight",
                 "bindVerb", "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable",
                 "managedResources", "ignorable"}
# types_pluginargs.go NodeResourcesFitArgs / ScoringStrategy / ResourceSpec
FIT_ARGS = {"ignoredResources", "ignoredResourceGroups", "scoringStrategy"}
STRATEGY_KEYS = {"type", "resources", "requestedToCapacityRatio"}
STRATEGIES = {"LeastAllocated", "MostAllocated", "RequestedToCapacityRatio"}
# in-tree score plugins (pkg/scheduler/framework/plugins/names)
SCORE_PLUGINS = {"NodeResourcesBalancedAllocation", "NodeResourcesFit", "ImageLocality",
                 "InterPodAffinity", "NodeAffinity", "PodTopologySpread", "TaintToleration",
                 "VolumeBinding"}
# apimachinery: an extended resource is a qualified name with a domain, not kubernetes.io
EXTENDED = re.compile(r"^(?!(?:[^/]*\.)?kubernetes\.io/)[a-z0-9.-]+\.[a-z]+/[A-Za-z0-9._-]+$")


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return render("base")


def scheduler_objects(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs
            if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "scheduler"]


def config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    cm = one(docs, "ConfigMap", "gpu-aware-scheduler-config")
    (doc,) = [d for d in yaml.safe_load_all(cm["data"]["config.yaml"]) if d]
    return doc  # type: ignore[no-any-return]


def containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    spec = one(docs, "Deployment", SCHEDULER)["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec["containers"]}


def sidecar_args(docs: list[dict[str, Any]]) -> list[str]:
    args = list(containers(docs)["extender"]["args"])
    assert args[0] == "extender"
    return args[1:]


def extender_config(args: list[str], policy: Path | None = None) -> ExtenderConfig:
    """The ExtenderConfig the CLI builds from these args (through its own click parser);
    ``--policy`` (an in-container path) is replaced by ``policy``."""
    args = list(args)
    if "--policy" in args:
        i = args.index("--policy")
        del args[i:i + 2]
    ctx = extender_command.make_context("extender", args, resilient_parsing=False)
    p = ctx.params
    return ExtenderConfig(prometheus_url=p["prometheus"], interval_seconds=p["interval"],
                          window=p["window"], node_label=p["node_label"],
                          stale_after_intervals=p["stale_after"], policy_path=policy,
                          prefix=p["prefix"])


# --------------------------------------------------------------------------- schemas
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_scheduler_objects_match_the_openapi_schema(docs: list[dict[str, Any]],
                                                    version: str) -> None:
    objects = scheduler_objects(docs)
    assert sorted(f"{d['kind']}/{d['metadata']['name']}" for d in objects) == sorted([
        "ServiceAccount/gpu-aware-scheduler", "ConfigMap/gpu-aware-scheduler-config",
        "ClusterRoleBinding/gpu-aware-scheduler-as-kube-scheduler",
        "ClusterRoleBinding/gpu-aware-scheduler-as-volume-scheduler",
        "RoleBinding/gpu-aware-scheduler-extension-apiserver-authentication-reader",
        "Role/gpu-aware-scheduler-lease", "RoleBinding/gpu-aware-scheduler-lease",
        "Deployment/gpu-aware-scheduler", "PodDisruptionBudget/gpu-aware-scheduler",
        # fractional GPU pools
        "ClusterRole/gpu-aware-scheduler-fractional",
        "ClusterRoleBinding/gpu-aware-scheduler-fractional",
        "Role/gpu-aware-scheduler-reservations", "RoleBinding/gpu-aware-scheduler-reservations",
    ])
    reservation = [d for d in docs if d["metadata"].get("labels", {}).get(
        "app.kubernetes.io/component") == "gpu-reservation"]
    assert sorted(f"{d['kind']}/{d['metadata']['name']}" for d in reservation) == [
        "Role/gpu-admission-reservation", "RoleBinding/gpu-admission-reservation",
        "ServiceAccount/gpu-admission-reservation"]
    objects += reservation
    for doc in objects:
        assert doc["apiVersion"] in BUILTIN_GROUPS
        kubernetes_validate.validate(doc, version, strict=True)


def test_kube_scheduler_configuration_fields(docs: list[dict[str, Any]]) -> None:
    cfg = config(docs)
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"  # stable since 1.25
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    assert set(cfg) <= TOP_KEYS
    assert set(cfg["leaderElection"]) <= LEADER_KEYS
    for profile in cfg["profiles"]:
        assert set(profile) <= PROFILE_KEYS
        assert set(profile.get("plugins", {})) <= EXTENSION_POINTS
        for point in profile.get("plugins", {}).values():
            assert set(point) <= {"enabled", "disabled"}
            for plugin in point.get("enabled", []) + point.get("disabled", []):
                assert set(plugin) <= {"name", "weight"}
                assert plugin["name"] in SCORE_PLUGINS | {"*"}
        for plugin_config in profile.get("pluginConfig", []):
            assert set(plugin_config) == {"name", "args"}
    for ext in cfg["extenders"]:
        assert set(ext) <= EXTENDER_KEYS
        assert set(ext.get("tlsConfig", {})) <= {"insecure", "serverName", "certFile", "keyFile",
                                                 "caFile", "certData", "keyData", "caData"}
        for resource in ext.get("managedResources", []):
            assert set(resource) == {"name", "ignoredByScheduler"}
            assert EXTENDED.match(resource["name"]), resource["name"]
    names = [r["name"] for e in cfg["extenders"] for r in e.get("managedResources", [])]
    assert len(names) == len(set(names)), "managedResources must not repeat"


def test_profile_packs_gpus_with_most_allocated(docs: list[dict[str, Any]]) -> None:
    (profile,) = config(docs)["profiles"]
    args = {p["name"]: p["args"] for p in profile["pluginConfig"]}
    fit = args["NodeResourcesFit"]
    assert set(fit) <= FIT_ARGS
    strategy = fit["scoringStrategy"]
    assert set(strategy) <= STRATEGY_KEYS and strategy["type"] == "MostAllocated"
    assert strategy["type"] in STRATEGIES
    weights = {r["name"]: r["weight"] for r in strategy["resources"]}
    assert weights["nvidia.com/gpu"] == weights["nvidia.com/gpu.shared"] == 5
    assert weights["nvidia.com/gpu"] > max(weights["cpu"], weights["memory"])
    assert {"name": "NodeResourcesBalancedAllocation"} in profile["plugins"]["multiPoint"][
        "disabled"]
    assert profile["percentageOfNodesToScore"] == 100  # pack over every feasible node


def test_profile_name_is_the_policys_scheduler_name(docs: list[dict[str, Any]],
                                                    tmp_path: Path) -> None:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(one(docs, "ConfigMap", "gpu-admission-policy")["data"]["policy.yaml"])
    (profile,) = config(docs)["profiles"]
    assert profile["schedulerName"] == load_policy(policy_file).spec.scheduler_name == SCHEDULER


def test_extender_entry_matches_the_real_extender(docs: list[dict[str, Any]]) -> None:
    """urlPrefix host/port/path = the sidecar's --host/--port/--prefix; urlPrefix + "/" +
    verb (pkg/scheduler/extender.go send) are routes of the real app built from the args."""
    ext, _ = config(docs)["extenders"]
    args = sidecar_args(docs)
    known_options(extender_command, args)
    url = urlsplit(ext["urlPrefix"])
    assert url.scheme == "http" and not ext.get("enableHTTPS")  # loopback: see docs
    assert url.hostname == flag(args, "--host") == "127.0.0.1"
    assert url.port == int(flag(args, "--port"))
    assert url.path == flag(args, "--prefix")
    app = create_app(extender_config(args))
    routes = {(r.method, r.resource.canonical) for r in app.router.routes()
              if r.resource is not None}
    for verb_key in ("filterVerb", "prioritizeVerb"):
        assert ("POST", url.path.rstrip("/") + "/" + ext[verb_key]) in routes, verb_key
    assert not ext.get("bindVerb") and not ext.get("preemptVerb")  # kube-scheduler binds
    assert ext["weight"] > 0  # validation: a prioritizeVerb needs a positive weight
    assert ext["ignorable"] is True
    assert ext["nodeCacheCapable"] is True
    timeout = parse_go_duration(ext["httpTimeout"])
    assert timeout is not None and 0 < timeout <= 5
    # no managedResources: kube-scheduler sends this entry every pod of the profile, CPU
    # pods included (HTTPExtender.IsInterested is true when the list is empty); fractional
    # pods get a neutral answer on its verbs (the binding entry decides them)
    assert "managedResources" not in ext
    assert ext["filterVerb"].endswith("-nonfractional")
    assert ext["weight"] * 10 > 1200  # one level above every in-tree score plugin together


def test_fractional_extender_entry_binds(docs: list[dict[str, Any]]) -> None:
    """The second entry (same sidecar) filters, scores and binds the pods requesting
    gpu-admission.io/gpu-memory: bindVerb is a route of the real app, it is the only binder
    (kube-scheduler's validation: at most one extender may bind), and its httpTimeout covers
    the sidecar's --reservation-timeout (bind waits for a reservation pod's UUID)."""
    whole, frac = config(docs)["extenders"]
    assert frac["bindVerb"] == "bind"
    assert [e.get("bindVerb") for e in config(docs)["extenders"]].count(None) == 1
    assert frac["urlPrefix"] == whole["urlPrefix"]
    args = sidecar_args(docs)
    app = create_app(extender_config(args))
    routes = {(r.method, r.resource.canonical) for r in app.router.routes()
              if r.resource is not None}
    path = urlsplit(frac["urlPrefix"]).path.rstrip("/")
    for verb in ("filterVerb", "prioritizeVerb", "bindVerb"):
        assert ("POST", f"{path}/{frac[verb]}") in routes, verb
    assert frac["managedResources"] == [{"name": "gpu-admission.io/gpu-memory",
                                         "ignoredByScheduler": False}]
    assert frac["ignorable"] is False and frac["nodeCacheCapable"] is True
    timeout = parse_go_duration(frac["httpTimeout"])
    reservation = parse_go_duration(flag(args, "--reservation-timeout"))
    assert timeout is not None and reservation is not None and timeout > reservation + 5
    assert flag(args, "--kubeconfig") == "in-cluster" and flag(args, "--namespace") == NS
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
           for e in containers(docs)["extender"]["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}


def rules_of(docs: list[dict[str, Any]], sa: str, namespace: str) -> set[tuple[str, str, str]]:
    """(namespace or "*", resource, verb) granted to ServiceAccount ``sa`` by this install's
    own Roles and ClusterRoles."""
    out = set()
    for b in docs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding") or not any(
                s["name"] == sa and s["namespace"] == namespace for s in b["subjects"]):
            continue
        found = [d for d in docs if d["kind"] == b["roleRef"]["kind"]
                 and d["metadata"]["name"] == b["roleRef"]["name"]]
        for role in found:
            where = role["metadata"].get("namespace", "*")
            for rule in role["rules"]:
                if rule["apiGroups"] == [""]:
                    out |= {(where, r, v) for r in rule["resources"] for v in rule["verbs"]}
    return out


def test_fractional_rbac(docs: list[dict[str, Any]]) -> None:
    """What bind and the ledger call (gpu_admission/extender/binder.py), and what
    `gpu-admission reserve` calls, granted exactly where needed."""
    granted = rules_of(docs, SCHEDULER, NS)
    needed = {("*", "pods", "list"), ("*", "pods", "watch"), ("*", "pods", "get"),
              ("*", "nodes", "list"), ("*", "nodes", "watch"), ("*", "pods/binding", "create"),
              ("*", "configmaps", "create"), ("*", "configmaps", "get"),
              ("*", "configmaps", "delete"), ("*", "configmaps", "list"),
              ("*", "configmaps", "watch"), ("*", "nodes/status", "patch"),
              (NS, "pods", "create"), (NS, "pods", "delete"), (NS, "pods", "patch")}
    assert needed <= granted, needed - granted
    assert ("*", "pods", "create") not in granted  # reservation pods: install namespace only
    reserve = rules_of(docs, "gpu-admission-reservation", NS)
    assert reserve == {(NS, "pods", "get"), (NS, "pods", "patch")}
    one(docs, "ServiceAccount", "gpu-admission-reservation")


def test_leader_election_lease_and_rbac(docs: list[dict[str, Any]]) -> None:
    leader = config(docs)["leaderElection"]
    assert leader["leaderElect"] is True and leader["resourceLock"] == "leases"
    assert leader["resourceName"] != "kube-scheduler"  # not the default scheduler's lock
    role = one(docs, "Role", "gpu-aware-scheduler-lease")
    assert role["metadata"]["namespace"] == leader["resourceNamespace"] == NS
    assert sorted((tuple(r["verbs"]), tuple(r.get("resourceNames", ())))
                  for r in role["rules"]) == [(("create",), ()),
                                              (("get", "update"), (leader["resourceName"],))]
    assert all(r["apiGroups"] == ["coordination.k8s.io"] and r["resources"] == ["leases"]
               for r in role["rules"])
    sa = one(docs, "Deployment", SCHEDULER)["spec"]["template"]["spec"]["serviceAccountName"]
    bound = {(b["kind"], b["metadata"].get("namespace"), b["roleRef"]["kind"],
              b["roleRef"]["name"]) for b in docs
             if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
             and any(s["name"] == sa and s["namespace"] == NS for s in b["subjects"])}
    assert bound == {
        ("ClusterRoleBinding", None, "ClusterRole", "system:kube-scheduler"),
        ("ClusterRoleBinding", None, "ClusterRole", "system:volume-scheduler"),
        ("RoleBinding", "kube-system", "Role", "extension-apiserver-authentication-reader"),
        ("RoleBinding", NS, "Role", "gpu-aware-scheduler-lease"),
        ("ClusterRoleBinding", None, "ClusterRole", "gpu-aware-scheduler-fractional"),
        ("RoleBinding", NS, "Role", "gpu-aware-scheduler-reservations")}


def test_deployment_layout(docs: list[dict[str, Any]]) -> None:
    deployment = one(docs, "Deployment", SCHEDULER)
    assert deployment["spec"]["replicas"] == 2
    template = deployment["spec"]["template"]
    labels = template["metadata"]["labels"]
    pdb = one(docs, "PodDisruptionBudget", SCHEDULER)
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # the webhook's selector must not pick the scheduler pods (and the reverse)
    webhook = one(docs, "Deployment", "gpu-admission")["spec"]["selector"]["matchLabels"]
    assert not webhook.items() <= labels.items()
    spec = template["spec"]
    by_name = containers(docs)
    scheduler = by_name["kube-scheduler"]
    assert re.fullmatch(r"registry\.k8s\.io/kube-scheduler:v1\.36\.\d+", scheduler["image"])
    config_path = Path(next(a.split("=", 1)[1] for a in scheduler["command"]
                            if a.startswith("--config=")))
    mounts = {m["mountPath"]: m for m in scheduler["volumeMounts"]}
    volume = {v["name"]: v for v in spec["volumes"]}[mounts[str(config_path.parent)]["name"]]
    assert volume["configMap"]["name"] == "gpu-aware-scheduler-config"
    assert config_path.name in one(docs, "ConfigMap", "gpu-aware-scheduler-config")["data"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get_ = scheduler[probe]["httpGet"]
        assert (get_["path"], get_["scheme"]) == ("/healthz", "HTTPS")
        assert {p["name"]: p["containerPort"] for p in scheduler["ports"]}[get_["port"]] == 10259
    # the sidecar reads the webhook's own policy ConfigMap (one policy), as a directory
    sidecar = by_name["extender"]
    policy = Path(flag(sidecar["args"], "--policy"))
    mount = {m["mountPath"]: m for m in sidecar["volumeMounts"]}[str(policy.parent)]
    assert "subPath" not in mount
    assert {v["name"]: v for v in spec["volumes"]}[mount["name"]]["configMap"]["name"] == \
        "gpu-admission-policy"
    # probes go to the --metrics-port, where the probe app has those routes
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert list(ports.values()) == [int(flag(sidecar["args"], "--metrics-port"))]
    probe_routes = {r.resource.canonical for r in create_probe_app(
        create_app(extender_config(sidecar_args(docs)))).router.routes()
        if r.resource is not None}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get_ = sidecar[probe]["httpGet"]
        assert ports[get_["port"]] == int(flag(sidecar["args"], "--metrics-port"))
        assert get_["path"] in probe_routes
    # hardened like the webhook
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert {"cpu", "memory"} <= set(c["resources"]["limits"])


def test_sidecar_args_start_the_real_extender(docs: list[dict[str, Any]],
                                              tmp_path: Path) -> None:
    """``gpu-admission extender`` with the sidecar's args (policy path, Prometheus and ports
    mapped to this machine): probes answer on the metrics port, the verbs only on loopback,
    a filter call answers (neutrally: no Prometheus here), and SIGTERM exits 0."""
    args = sidecar_args(docs)
    policy = tmp_path / "policy.yaml"
    policy.write_text(one(docs, "ConfigMap", "gpu-admission-policy")["data"]["policy.yaml"])
    port, metrics_port = free_port(), free_port()
    api = api_in_thread(tmp_path)
    kubeconfig = api.__enter__()  # the fake API server stands in for in-cluster
    mapping = {flag(args, "--policy"): str(policy),
               flag(args, "--prometheus"): f"http://127.0.0.1:{free_port()}",
               flag(args, "--port"): str(port), flag(args, "--metrics-port"): str(metrics_port),
               flag(args, "--kubeconfig"): str(kubeconfig)}
    local = [mapping.get(a, a) for a in args]
    proc = subprocess.Popen([sys.executable, "-m", "gpu_admission", "extender", *local],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def probes_up() -> bool:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                return get(f"http://127.0.0.1:{metrics_port}/readyz")[0] == 200
            except OSError:
                return False
        wait_for(probes_up, 30, "the sidecar's /readyz")
        assert get(f"http://127.0.0.1:{metrics_port}/healthz")[0] == 200
        prefix = flag(args, "--prefix")
        body = args_with_names(make_pod(), ["gpu-1"])
        assert post(f"http://127.0.0.1:{metrics_port}{prefix}/filter", body)[0] == 404
        code, reply = post(f"http://127.0.0.1:{port}{prefix}/filter", body)
        assert (code, reply["NodeNames"], reply["FailedNodes"]) == (200, ["gpu-1"], {})
        # the bind verb answers ExtenderBindingResult (the pod is not in this API: an Error)
        code, reply = post(f"http://127.0.0.1:{port}{prefix}/bind", {
            "PodName": "p", "PodNamespace": "t", "PodUID": "u", "Node": "gpu-1"})
        assert code == 200 and reply["Error"].startswith("binding t/p to gpu-1: HTTP 404")
    finally:
        err = sigterm_and_collect(proc)
        api.__exit__(None, None, None)
    assert proc.returncode == 0, err
