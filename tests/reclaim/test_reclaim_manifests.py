"""The shipped reclaim install (kustomize base and chart): its RBAC is exactly what the
controller's real requests need (every request of a full notice / scale-down / clear /
restore / Lease run, mapped to its RBAC verb and resource, against the rules), its args parse
with the real command, its probes hit real routes. OpenAPI validation of the objects runs
with the rest of the base (tests/install/test_manifests.py)."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from gpu_admission.cli import main
from gpu_admission.policy.model import default_policy
from gpu_admission.reclaim.cli import reclaim
from gpu_admission.reclaim.controller import Controller, RecordLog
from gpu_admission.reclaim.kube import KubeSource
from gpu_admission.reclaim.lease import LeaseElector
from gpu_admission.server.logs import make_logger
from gpu_admission.usage.prom import PrometheusClient
from tests.chart_support import render_chart
from tests.install.test_manifests import flag, known_options, one, render
from tests.prometheus_support import PrometheusProcess
from tests.reclaim.fake_api import FakeKube, fake_kube
from tests.reclaim.scenario import (
    T0,
    T1,
    deployment_pod,
    namespace,
    notebook_pod,
    statefulset_pod,
)
from tests.server_support import free_port

VERBS = {"GET": "get", "POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}
_PATH = re.compile(r"^/(?:api/v1|apis/(?P<group>[^/]+)/v1)(?:/namespaces/[^/]+)?/"
                   r"(?P<resource>[a-z]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>scale))?$")


def rbac_needs(fake: FakeKube) -> set[tuple[str, str, str]]:
    """(API group, resource[/subresource], verb) of every request the fake saw."""
    needs = set()
    for r in fake.requests:
        if r.path.startswith("/api/v1/namespaces") and r.path.count("/") <= 4:
            resource, group, named = "namespaces", "", r.path.count("/") == 4
        else:
            match = _PATH.match(r.path)
            assert match is not None, r.path
            group = match.group("group") or ""
            resource = match.group("resource") + (f"/{match.group('sub')}"
                                                  if match.group("sub") else "")
            named = match.group("name") is not None
        verb = "list" if r.method == "GET" and not named else VERBS[r.method]
        needs.add((group, resource, verb))
    return needs


def granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, res, v) for rule in rules for g in rule["apiGroups"]
            for res in rule["resources"] for v in rule["verbs"]}


def test_rbac_is_exactly_what_the_requests_need(prom: PrometheusProcess,
                                                tmp_path: Path) -> None:
    world = [namespace("ml", scale_down=True), *deployment_pod("ml", "jupyter-alice"),
             *deployment_pod("ml", "dave"), *notebook_pod("ml", "carol"),
             *statefulset_pod("ml", "llm")]
    with fake_kube(tmp_path, *world) as (fake, kubeconfig):
        kube = KubeSource(str(kubeconfig)).open()
        controller = Controller(policy=default_policy(), prom=PrometheusClient(prom.url),
                                kube=kube, records=RecordLog(str(tmp_path / "log")),
                                log=make_logger("error"))
        controller.run_once(T0)  # notices
        controller.run_once(T1)  # scale-downs, and dave's notice cleared
        for target in ("deployment/jupyter-alice", "statefulset/llm", "notebook/carol"):
            restored = CliRunner().invoke(main, [
                "reclaim", "--kubeconfig", str(kubeconfig), "--audit-log",
                str(tmp_path / "log"), "restore", target, "-n", "ml"])
            assert restored.exit_code == 0, restored.output
        sts = fake.get("StatefulSet", "ml", "llm")
        assert sts is not None
        assert sts["spec"]["replicas"] == 2
        elector = LeaseElector(kube, "gpu-admission", "gpu-admission-reclaim", "pod-a")
        assert elector.try_acquire_or_renew(T0)  # create
        assert elector.try_acquire_or_renew(T0 + 5)  # get + update
        other = LeaseElector(kube, "gpu-admission", "gpu-admission-reclaim", "pod-b")
        assert not other.try_acquire_or_renew(T0 + 10)  # held: a live lease is kept
        assert other.try_acquire_or_renew(T0 + 60)  # expired: taken over
        assert not elector.try_acquire_or_renew(T0 + 61)
        controller.records.close()
        kube.close()
    lease = fake.get("Lease", "gpu-admission", "gpu-admission-reclaim")
    assert lease is not None
    assert (lease["spec"]["holderIdentity"], lease["spec"]["leaseTransitions"]) == ("pod-b", 1)
    needs = rbac_needs(fake)
    docs = render("base")
    cluster = granted(one(docs, "ClusterRole", "gpu-admission-reclaim")["rules"])
    role = granted(one(docs, "Role", "gpu-admission-reclaim-lease")["rules"])
    assert needs == cluster | role, (
        f"granted but never used: {sorted((cluster | role) - needs)}; "
        f"used but not granted: {sorted(needs - (cluster | role))}")
    lease_rule = next(r for r in one(docs, "Role", "gpu-admission-reclaim-lease")["rules"]
                      if "resourceNames" in r)
    assert lease_rule["resourceNames"] == ["gpu-admission-reclaim"]


def test_deployment_args_parse_and_probes_answer(tmp_path: Path) -> None:
    docs = render("base")
    deployment = one(docs, "Deployment", "gpu-admission-reclaim")
    spec = deployment["spec"]["template"]["spec"]
    container = spec["containers"][0]
    args = container["args"]
    assert args[0] == "reclaim"
    parsed = known_options(reclaim, args[1:])
    namespace_, _, lease_name = str(parsed["--lease"]).partition("/")
    assert (namespace_, lease_name) == (deployment["metadata"]["namespace"],
                                        "gpu-admission-reclaim")
    assert lease_name in one(docs, "Role", "gpu-admission-reclaim-lease")["rules"][1][
        "resourceNames"]
    assert spec["serviceAccountName"] == "gpu-admission-reclaim"
    mount = container["volumeMounts"][0]
    assert str(parsed["--policy"]).startswith(mount["mountPath"] + "/")
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert one(docs, "ConfigMap", volume["configMap"]["name"])
    assert container["ports"][0]["containerPort"] == int(flag(args, "--metrics-port"))
    # the probe paths answer on the real command's probe server
    port = free_port()
    with fake_kube(tmp_path, namespace("ml", scale_down=True)) as (fake, kubeconfig):
        import subprocess  # noqa: PLC0415
        import sys  # noqa: PLC0415
        import time  # noqa: PLC0415

        process = subprocess.Popen(
            [sys.executable, "-m", "gpu_admission", "reclaim", "--prometheus",
             f"http://127.0.0.1:{free_port()}", "--kubeconfig", str(kubeconfig),
             "--interval", "1h", "--metrics-port", str(port), "--audit-log",
             str(tmp_path / "log"), "--lease", str(parsed["--lease"])],
            stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 30
            answers: dict[str, int] = {}
            while time.monotonic() < deadline and len(answers) < 3:
                for probe in ("livenessProbe", "readinessProbe"):
                    path = container[probe]["httpGet"]["path"]
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}",
                                                    timeout=2) as response:
                            answers[path] = response.status
                    except OSError:
                        time.sleep(0.2)
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                timeout=2) as response:
                        text = response.read().decode()
                        if ("gpu_admission_reclaim_paused 1.0" in text
                                and "gpu_admission_reclaim_leader 1.0" in text):
                            answers["/metrics"] = response.status
                except OSError:
                    time.sleep(0.2)
        finally:
            process.terminate()
            _, stderr = process.communicate(timeout=10)
    assert answers == {"/healthz": 200, "/readyz": 200, "/metrics": 200}
    lease = fake.get("Lease", namespace_, lease_name)
    assert lease is not None
    assert lease["spec"]["leaseDurationSeconds"] == 15
    # Prometheus unreachable: paused, and said once
    assert stderr.decode().count("reclaim_paused") == 1, stderr.decode()
    assert process.returncode in (0, -15)


def test_chart_switch() -> None:
    on = render_chart()
    assert one(on, "Deployment", "gpu-admission-reclaim")
    off = render_chart({"reclaim": {"enabled": False}})
    assert not [d for d in off
                if d["metadata"].get("labels", {}).get("app.kubernetes.io/component")
                == "reclaim"]
