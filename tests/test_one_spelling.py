"""One spelling across every command (issue 33), through the real command line in a
subprocess: ``--kubeconfig`` for every command that talks to a cluster, ``--out FILE`` for
files, ``-o/--output`` for formats; the old spellings are hidden aliases for one release that
print one deprecation line; both spellings at once is a usage error; ``--help`` summaries
are never cut; where no ``--kubeconfig`` is given, ``$KUBECONFIG``, then ``~/.kube/config``,
then the pod's ServiceAccount.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_admission.certs.bundle import write_bundle
from gpu_admission.cli.options import NoClusterError, resolve_kubeconfig
from tests.server_support import new_bundle

DATA = Path(__file__).parent / "data"
POD = """apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ml}
spec:
  containers: [{name: c, image: pytorch/pytorch, resources: {limits: {nvidia.com/gpu: 1}}}]
"""
DECISION = ('{"schemaVersion": 1, "time": "2026-12-01T10:00:00Z", "uid": "u1", '
            '"decision": "allowed"}\n')


def gpu_admission(*args: str, cwd: Path | None = None,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("COLUMNS", "KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    environ.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "gpu_admission", *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=120, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def deprecation(old: str, new: str) -> str:
    return f"warning: {old} is deprecated and goes in the next release; use {new}"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    write_bundle(new_bundle(), tmp_path / "certs")
    (tmp_path / "pod.yaml").write_text(POD)
    (tmp_path / "decisions.log").write_text(DECISION)
    return tmp_path


#: (command before the cluster flag, old flag, exit code, the error after the flag's name)
CLUSTER_COMMANDS = [
    pytest.param(["evaluate", "-f", "pod.yaml"], "--cluster", 2, id="evaluate"),
    pytest.param(["serve", "--cert-dir", "certs", "--port", "0", "--metrics-port", "0"],
                 "--dra-watch", 1, id="serve"),
    pytest.param(["extender", "--port", "0"], "--kube", 1, id="extender"),
]


@pytest.mark.parametrize(("command", "old", "code"), CLUSTER_COMMANDS)
def test_kubeconfig_and_its_deprecated_alias_do_the_same(workdir: Path, command: list[str],
                                                         old: str, code: int) -> None:
    missing = str(workdir / "no-such-kubeconfig")
    error = (f"Error: --kubeconfig: cannot load the kubeconfig {missing}: Invalid kube-config "
             "file. No configuration found.")
    new = gpu_admission(*command, "--kubeconfig", missing, cwd=workdir)
    assert (new.returncode, new.stderr.splitlines()[-1]) == (code, error)
    assert "deprecated" not in new.stderr
    aliased = gpu_admission(*command, old, missing, cwd=workdir)
    assert (aliased.returncode, aliased.stderr.splitlines()[-1]) == (code, error)
    assert deprecation(old, "--kubeconfig") in aliased.stderr.splitlines()
    both = gpu_admission(*command, old, missing, "--kubeconfig", missing, cwd=workdir)
    assert both.returncode == 2
    assert f"Error: {old} is the old spelling of --kubeconfig: give one" in both.stderr
    shown = gpu_admission(command[0], "--help").stdout
    assert "--kubeconfig FILE|in-cluster" in shown and f"{old} " not in shown


def test_reserve_takes_kubeconfig_and_the_old_kube(workdir: Path) -> None:
    """``reserve`` reads the GPU first (no NVIDIA driver here): both spellings parse."""
    env = {"POD_NAME": "r", "POD_NAMESPACE": "gpu-admission"}
    for flag in ("--kubeconfig", "--kube"):
        proc = gpu_admission("reserve", flag, "x", cwd=workdir, env=env)
        assert proc.returncode == 1
        assert proc.stderr.splitlines()[-1].startswith("Error: NVML")
        assert (deprecation("--kube", "--kubeconfig") in proc.stderr) == (flag == "--kube")


@pytest.mark.parametrize(("command", "old"), [
    pytest.param(["compile", "--guard"], "-o", id="compile-o"),
    pytest.param(["compile", "--guard"], "--output", id="compile-output"),
    pytest.param(["audit", "report", "decisions.log"], "--html", id="audit-report-html"),
])
def test_out_file_and_its_deprecated_aliases(workdir: Path, command: list[str],
                                             old: str) -> None:
    new = gpu_admission(*command, "--out", "new.out", cwd=workdir)
    assert new.returncode == 0, new.stderr
    assert "deprecated" not in new.stderr
    aliased = gpu_admission(*command, old, "old.out", cwd=workdir)
    assert aliased.returncode == new.returncode, aliased.stderr
    assert deprecation(old, "--out") in aliased.stderr.splitlines()
    written = (workdir / "new.out").read_text()
    assert written and (workdir / "old.out").read_text() == written
    both = gpu_admission(*command, old, "a", "--out", "b", cwd=workdir)
    assert both.returncode == 2
    assert f"{old} is the old spelling of --out: give one" in both.stderr


@pytest.mark.parametrize("command", [
    pytest.param(["audit", "summary", "decisions.log"], id="audit"),
    pytest.param(["evaluate", "-f", "pod.yaml"], id="evaluate"),
])
def test_output_is_a_format(workdir: Path, command: list[str]) -> None:
    for flag in ("-o", "--output"):
        proc = gpu_admission(*command, flag, "json", cwd=workdir)
        assert proc.returncode in (0, 1), proc.stderr
        assert proc.stdout.lstrip().startswith("{")
    wrong = gpu_admission(*command, "-o", "out.txt", cwd=workdir)
    assert wrong.returncode == 2 and "Invalid value for '-o' / '--output'" in wrong.stderr


@pytest.mark.parametrize("group", [
    pytest.param([], id="gpu-admission"),
    pytest.param(["audit"], id="audit"),
    pytest.param(["certs"], id="certs"),
    pytest.param(["images"], id="images"),
    pytest.param(["reclaim"], id="reclaim"),
])
def test_help_summaries_are_not_cut(group: list[str]) -> None:
    shown = gpu_admission(*group, "--help").stdout
    commands = shown.split("Commands:\n", 1)[1].splitlines()
    assert commands and all(len(line.split(None, 1)) == 2 for line in commands), shown
    assert "..." not in shown.split("Commands:", 1)[1] and "…" not in shown


# --- where the cluster comes from --------------------------------------------------------

@pytest.mark.parametrize(("value", "env", "home_config", "want"), [
    pytest.param("given.yaml", {"KUBECONFIG": "env.yaml"}, True, "given.yaml", id="flag"),
    pytest.param(None, {"KUBECONFIG": "a.yaml:b.yaml", "KUBERNETES_SERVICE_HOST": "10.0.0.1"},
                 True, "a.yaml:b.yaml", id="env-list"),
    pytest.param(None, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, True, "HOME", id="home"),
    pytest.param(None, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, False, "in-cluster",
                 id="in-a-pod"),
    pytest.param(None, {"KUBECONFIG": ""}, False, None, id="nothing"),
])
def test_resolve_kubeconfig(tmp_path: Path, value: str | None, env: dict[str, str],
                            home_config: bool, want: str | None) -> None:
    if home_config:
        (tmp_path / ".kube").mkdir()
        (tmp_path / ".kube" / "config").write_text("{}")
    if want is None:
        with pytest.raises(NoClusterError, match="pass --kubeconfig FILE, set KUBECONFIG"):
            resolve_kubeconfig(value, environ=env, home=tmp_path)
        return
    expected = str(tmp_path / ".kube" / "config") if want == "HOME" else want
    assert resolve_kubeconfig(value, environ=env, home=tmp_path) == expected


def test_reclaim_without_any_cluster_is_a_clear_usage_error(tmp_path: Path) -> None:
    proc = gpu_admission("reclaim", "--prometheus", "http://127.0.0.1:9", "--dry-run",
                         env={"HOME": str(tmp_path)})
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        "Error: no cluster to talk to: pass --kubeconfig FILE, set KUBECONFIG, create "
        "~/.kube/config, or run in a pod (its ServiceAccount)")
