"""``gpu-admission images scan`` against a real registry (Debian's ``docker-registry``) into
which the tests push small images through the registry API: with and without CUDA in their
environment, a Docker v2 and an OCI manifest, an OCI index and a Docker manifest list with two
platforms, and registries behind basic (htpasswd) and bearer-token authentication.

The command runs as a user runs it (``python -m gpu_admission images scan ...``, its own
``DOCKER_CONFIG``), and its output is checked exactly and then loaded into the real policy
model and used by the engine, so "the printed entries route the image" is what is tested.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_admission.admission.engine import evaluate
from gpu_admission.core.decision import RequestFacts
from gpu_admission.policy.model import default_policy_text, policy_from_dict
from tests.builders import make_container, make_pod
from tests.registry_support import Pusher, Registry, running_registry
from tests.server_support import free_port

CUDA_ENV = ["PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/bin:/bin",
            "NVARCH=x86_64", "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471",
            "NV_CUDA_CUDART_VERSION=12.4.127-1", "CUDA_VERSION=12.4.1",
            "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
HEADER = ("# spec.cudaRouting.images entries (gpu-admission images scan; CUDA read from each "
          "image's config.Env)")


def scan(*args: str, docker_config: Path, stdin: str | None = None
         ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DOCKER_CONFIG": str(docker_config)}
    return subprocess.run([sys.executable, "-m", "gpu_admission", "images", "scan", *args],
                          capture_output=True, text=True, env=env, input=stdin, timeout=60,
                          check=False)


def docker_config(directory: Path, auths: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"auths": auths}))
    return directory


def routed_cuda(entries_yaml: str, image: str) -> str | None:
    """The CUDA the engine derives for a GPU pod running ``image`` under a policy holding the
    printed entries (the default policy plus them)."""
    doc = yaml.safe_load(default_policy_text())
    doc["spec"]["cudaRouting"]["images"] = yaml.safe_load(entries_yaml)
    policy = policy_from_dict(doc)
    pod = make_pod(containers=[make_container(image=image)])
    return evaluate(pod, RequestFacts(namespace="team-a"), policy).cuda_version


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Registry, dict[str, Any]]]:
    """One anonymous registry with every image the anonymous tests read."""
    with running_registry(tmp_path_factory.mktemp("anon")) as reg:
        push = Pusher(reg)
        pushed: dict[str, Any] = {
            "cuda": push.image("team/cuda-app", "1.0", CUDA_ENV)[0],
            "plain": push.image("team/plain", "1.0", ["PATH=/usr/bin:/bin"], docker=True)[0],
            "nv-only": push.image("team/nv-only", "2.0", [
                "NV_CUDA_LIB_VERSION=11.8.0-1", "NV_CUDA_CUDART_VERSION=11.8.89-1"])[0],
            "require-only": push.image("team/require-only", "3.0", [
                "NVIDIA_REQUIRE_CUDA=cuda>=12.1 brand=tesla,driver>=470,driver<471"])[0]}
        for docker in (False, True):
            name = "team/multi-docker" if docker else "team/multi"
            amd = push.image(name, None, CUDA_ENV, docker=docker)
            arm = push.image(name, None, ["CUDA_VERSION=12.6.0"], arch="arm64", docker=docker)
            pushed[name] = (push.index(name, "v1", {"linux/amd64": amd, "linux/arm64": arm},
                                       docker=docker), amd[0], arm[0])
        yield reg, pushed


@pytest.fixture
def no_auth(tmp_path: Path) -> Path:
    return tmp_path / "docker-empty"  # no config.json: anonymous


def test_cuda_and_plain_images(registry: tuple[Registry, dict[str, Any]], no_auth: Path) -> None:
    reg, pushed = registry
    cuda_image, plain_image = f"{reg.host}/team/cuda-app:1.0", f"{reg.host}/team/plain:1.0"
    proc = scan("--insecure", cuda_image, plain_image, docker_config=no_auth)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == "\n".join([
        HEADER,
        f"# {cuda_image}: CUDA_VERSION=12.4.1",
        f'- repository: "{reg.host}/team/cuda-app"',
        '  tags: "1.0"',
        f'  digests: ["{pushed["cuda"]}"]',
        '  cudaVersion: "12.4"',
        f"# {plain_image}: no CUDA_VERSION, NV_CUDA_* or NVIDIA_REQUIRE_CUDA in the image "
        "environment: not a CUDA image, no entry", ""])
    # the entries are a valid cudaRouting.images list, and route tag- and digest-pinned pods
    assert routed_cuda(proc.stdout, cuda_image) == "12.4"
    assert routed_cuda(proc.stdout, f"{reg.host}/team/cuda-app@{pushed['cuda']}") == "12.4"
    assert routed_cuda(proc.stdout, plain_image) is None


@pytest.mark.parametrize(("repo", "tag", "evidence", "version"), [
    ("team/nv-only", "2.0", "NV_CUDA_LIB_VERSION=11.8.0-1", "11.8"),
    ("team/require-only", "3.0", "NVIDIA_REQUIRE_CUDA cuda>=12.1", "12.1"),
], ids=["nv-cuda-lib-version", "nvidia-require-cuda"])
def test_cuda_from_other_variables(registry: tuple[Registry, dict[str, Any]], no_auth: Path,
                                   repo: str, tag: str, evidence: str, version: str) -> None:
    reg, _ = registry
    proc = scan("--insecure", f"{reg.host}/{repo}:{tag}", docker_config=no_auth)
    assert proc.returncode == 0, proc.stderr
    assert f"# {reg.host}/{repo}:{tag}: {evidence}\n" in proc.stdout
    assert yaml.safe_load(proc.stdout)[0]["cudaVersion"] == version


@pytest.mark.parametrize("repo", ["team/multi", "team/multi-docker"],
                         ids=["oci-index", "docker-manifest-list"])
@pytest.mark.parametrize(("platform", "version"), [("linux/amd64", "12.4"),
                                                   ("linux/arm64", "12.6")])
def test_index_with_two_platforms(registry: tuple[Registry, dict[str, Any]], no_auth: Path,
                                  repo: str, platform: str, version: str) -> None:
    reg, pushed = registry
    index, amd, arm = pushed[repo]
    image = f"{reg.host}/{repo}:v1"
    proc = scan("--insecure", "--platform", platform, image, docker_config=no_auth)
    assert proc.returncode == 0, proc.stderr
    chosen = amd if platform == "linux/amd64" else arm
    assert proc.stdout.splitlines()[1:] == [
        f"# {image}: CUDA_VERSION={'12.4.1' if version == '12.4' else '12.6.0'} "
        f"({platform}; index lists linux/amd64, linux/arm64)",
        f'- repository: "{reg.host}/{repo}"', '  tags: "v1"',
        f'  digests: ["{index}", "{chosen}"]', f'  cudaVersion: "{version}"']
    # a pod pinned to the index digest (what `docker pull` reports) is routed
    assert routed_cuda(proc.stdout, f"{reg.host}/{repo}@{index}") == version


def test_platform_missing_from_the_index(registry: tuple[Registry, dict[str, Any]],
                                         no_auth: Path) -> None:
    reg, pushed = registry
    index = pushed["team/multi"][0]
    image = f"{reg.host}/team/multi@{index}"
    proc = scan("--insecure", "--platform", "linux/s390x", image, docker_config=no_auth)
    assert proc.returncode == 1
    assert proc.stdout == HEADER + "\n"
    assert proc.stderr == ("error: no linux/s390x image in the index (it lists: linux/amd64, "
                           "linux/arm64); choose one with --platform\n")


def test_missing_image_and_good_image_together(registry: tuple[Registry, dict[str, Any]],
                                               no_auth: Path) -> None:
    reg, _ = registry
    proc = scan("--insecure", f"{reg.host}/team/cuda-app:1.0", f"{reg.host}/team/nope:1",
                docker_config=no_auth)
    assert proc.returncode == 1
    assert yaml.safe_load(proc.stdout)[0]["cudaVersion"] == "12.4"  # the good one is printed
    assert proc.stderr == f"error: {reg.host}/team/nope:1: not found on {reg.host} (team/nope)\n"


def test_images_from_manifests_file(registry: tuple[Registry, dict[str, Any]], no_auth: Path,
                                    tmp_path: Path) -> None:
    """-f: the GPU containers' images of Pods and workloads; a CPU sidecar is not scanned."""
    reg, pushed = registry
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "llm", "namespace": "ml"},
                  "spec": {"template": {"spec": {"containers": [
                      make_container("model", f"{reg.host}/team/cuda-app@{pushed['cuda']}"),
                      make_container("proxy", f"{reg.host}/team/plain:1.0", gpu=None)]}}}}
    manifests = tmp_path / "app.yaml"
    manifests.write_text(yaml.safe_dump(deployment))
    proc = scan("--insecure", "-f", str(manifests), docker_config=no_auth)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout) == [{"repository": f"{reg.host}/team/cuda-app",
                                            "digests": [pushed["cuda"]], "cudaVersion": "12.4"}]


def test_basic_auth_registry(tmp_path: Path) -> None:
    with running_registry(tmp_path, htpasswd={"alice": "s3cret"}) as reg:
        digest = Pusher(reg).image("private/app", "1.0", CUDA_ENV)[0]
        image = f"{reg.host}/private/app:1.0"
        anonymous = scan("--insecure", image, docker_config=tmp_path / "none")
        wrong = scan("--insecure", image, docker_config=docker_config(tmp_path / "wrong", {
            reg.host: {"auth": base64.b64encode(b"alice:nope").decode()}}))
        good = scan("--insecure", image, docker_config=docker_config(tmp_path / "good", {
            f"http://{reg.host}": {"auth": base64.b64encode(b"alice:s3cret").decode()}}))
    assert anonymous.returncode == 1
    assert anonymous.stderr == (f"error: {reg.host}: authentication required (basic) and no "
                                f"credentials for {reg.host} in the docker config\n")
    assert wrong.returncode == 1
    assert wrong.stderr == (f"error: {reg.host}: access to private/app denied with the "
                            "credentials given (docker login, ~/.docker/config.json)\n")
    assert good.returncode == 0, good.stderr
    assert yaml.safe_load(good.stdout) == [{"repository": f"{reg.host}/private/app",
                                            "tags": "1.0", "digests": [digest],
                                            "cudaVersion": "12.4"}]


def test_bearer_token_registry(tmp_path: Path) -> None:
    """The distribution token flow: 401 + Bearer challenge -> token service (basic auth from
    the docker config) -> JWT -> retry; the registry itself verifies the JWT."""
    with running_registry(tmp_path, token_users={"bob": "t0ken-pw"}) as reg:
        assert reg.token_server is not None
        digest = Pusher(reg).image("secure/app", "2.0", CUDA_ENV)[0]
        image = f"{reg.host}/secure/app:2.0"
        good = scan("--insecure", image, docker_config=docker_config(tmp_path / "good", {
            reg.host: {"username": "bob", "password": "t0ken-pw"}}))
        anonymous = scan("--insecure", image, docker_config=tmp_path / "none")
        requests = list(reg.token_server.requests)
    assert good.returncode == 0, good.stderr
    assert yaml.safe_load(good.stdout)[0]["digests"] == [digest]
    assert {"path": "/token", "user": "bob", "query": {
        "scope": "repository:secure/app:pull", "service": "test-registry"}} in requests
    assert anonymous.returncode == 1
    assert anonymous.stderr == (f"error: {reg.host}: token service {reg.token_server.realm} "
                                "answered HTTP 401 (no credentials in the docker config)\n")


@pytest.mark.parametrize(("args", "message"), [
    ((), "Error: no image: give IMAGE arguments or -f with GPU pods\n"),
    (("Team/App:1",), "Error: Team/App:1: repository must be lower-case path components\n"),
    (("app@sha256:abc",), "Error: app@sha256:abc: digest must be sha256:<64 lower-case hex "
                          "digits>\n"),
    (("--platform", "amd64", "x"), "Error: --platform: expected os/arch[/variant] like "
                                   "linux/amd64, got 'amd64'\n"),
    (("-f", "/nonexistent/pods.yaml"), "Error: /nonexistent/pods.yaml: no such file\n"),
], ids=["no-image", "upper-case", "bad-digest", "bad-platform", "missing-file"])
def test_unusable_input_exit_2(args: tuple[str, ...], message: str, no_auth: Path) -> None:
    proc = scan(*args, docker_config=no_auth)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", message)


def test_bad_docker_config_exit_2(tmp_path: Path) -> None:
    config = docker_config(tmp_path / "bad", {"r.example": {"auth": "%%%"}})
    proc = scan("r.example/x:1", docker_config=config)
    assert proc.returncode == 2
    assert proc.stderr == (f"Error: {config / 'config.json'}: auths.r.example.auth is not "
                           "base64 of user:password\n")


def test_unreachable_registry(no_auth: Path) -> None:
    host = f"127.0.0.1:{free_port()}"  # nothing listens there
    proc = scan("--insecure", "--timeout", "5", f"{host}/x/y:1", docker_config=no_auth)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"error: {host}: cannot reach the registry (http): ")
