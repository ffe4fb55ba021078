"""`helm upgrade` with a changed policy, end to end: the chart relies on the server's hot reload
(no checksum annotation, so the pods are not rolled).

The chart is rendered for the install and for the upgrade; the upgrade must leave the
Deployment untouched. The ConfigMap's data is then published the way the kubelet updates a
mounted ConfigMap volume (a new ``..<version>`` directory and an atomic swap of the ``..data``
symlink; kubelet ``atomic_writer.go``) at the path the Deployment mounts, and the real server,
started with the Deployment's ``--policy`` file, must serve the new policy without a restart.
A policy that passes the chart's type schema but not the server's validation is refused at
reload and the last good policy keeps serving.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.builders import make_pod, make_review, patch_ops
from tests.chart_support import component, render_chart
from tests.install.test_manifests import flag, one
from tests.server_support import SecretDir, make_config, new_bundle, poll_until, running_server


class ConfigMapVolume:
    """A directory laid out like a mounted ConfigMap: ``<key>`` -> ``..data/<key>``,
    ``..data`` -> ``..v<N>``; :meth:`publish` writes a version and swaps ``..data``."""

    def __init__(self, root: Path, data: dict[str, str]) -> None:
        self.root = root
        self.version = 0
        root.mkdir(parents=True)
        self.publish(data)
        for key in data:
            (root / key).symlink_to(Path("..data") / key)

    def publish(self, data: dict[str, str]) -> None:
        self.version += 1
        version_dir = self.root / f"..v{self.version}"
        version_dir.mkdir()
        for key, text in data.items():
            (version_dir / key).write_text(text)
        tmp_link = self.root / "..data_tmp"
        tmp_link.symlink_to(version_dir.name)
        tmp_link.replace(self.root / "..data")  # rename(2): atomic, like the kubelet


def memory_limit(response: dict[str, Any]) -> str:
    ops = patch_ops(response)
    env = next(op["value"] for op in ops if op["path"] == "/spec/containers/0/env")
    return str(next(e["value"] for e in env if e["name"] == "NVIDIA_MEM_LIMIT_MB"))


def memory(mib: int, fraction: float = 0.2) -> dict[str, Any]:
    return {"policy": {"spec": {"memoryLimits": {"defaultMemoryMiB": mib,
                                                 "defaultFraction": fraction}}}}


async def test_helm_upgrade_policy_change_is_hot_reloaded_without_a_rollout(
        tmp_path: Path) -> None:
    install = render_chart()
    upgrade = render_chart(memory(8000))
    broken = render_chart(memory(8000, fraction=1.5))  # a valid number, not a valid fraction
    def deployments(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [d for d in docs if d["kind"] == "Deployment"]  # webhook and scheduler+extender

    assert deployments(upgrade) == deployments(install) == deployments(broken)

    spec = component(install, "Deployment", "webhook")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    policy_arg = Path(flag(container["args"], "--policy"))
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(policy_arg.parent)]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    configmap = volume["configMap"]["name"]

    # the mount, relocated under tmp_path; the server gets the Deployment's file name in it
    mounted = ConfigMapVolume(tmp_path / mount["mountPath"].lstrip("/"),
                              one(install, "ConfigMap", configmap)["data"])
    secret = SecretDir(tmp_path / "certs", new_bundle())
    config = make_config(secret, policy_path=mounted.root / policy_arg.name)
    pod = make_pod(labels={"gpu-admission.io/workload": "inference"})
    async with running_server(config, secret.bundles[0].ca_pem) as srv:
        _, body, _ = await srv.post("/mutate", make_review(pod))
        assert memory_limit(body["response"]) == "16000"
        first = srv.state.policy_digest

        mounted.publish(one(upgrade, "ConfigMap", configmap)["data"])
        await poll_until(lambda: srv.state.policy_digest != first)
        _, body, _ = await srv.post("/mutate", make_review(pod))
        assert memory_limit(body["response"]) == "8000"
        good = srv.state.policy_digest

        mounted.publish(one(broken, "ConfigMap", configmap)["data"])
        await poll_until(lambda: srv.state.metrics.policy_reloads.labels("failure")
                         ._value.get() == 1)
        assert srv.state.policy_digest == good
        _, body, _ = await srv.post("/mutate", make_review(pod))
        assert memory_limit(body["response"]) == "8000"
        failed = [x for x in srv.log_lines() if x["event"] == "policy_reload_failed"]
        assert len(failed) == 1 and "defaultFraction" in failed[0]["error"]
