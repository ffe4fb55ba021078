"""``gpu-admission reserve`` (issue 20, proof 3): NVML absent or failing is a clear error and
a non-zero exit; with NVML answering, the UUID lands on the pod through the real
``kubernetes`` client against the fake API server. No GPU here: NVML's answers are made up by
replacing pynvml's functions; the real NVML path runs only on a GPU node (docs/extender.md).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest
from click.testing import CliRunner

from gpu_admission.cli import main
from gpu_admission.core.vocab import GPU_UUID_ANNOTATION
from tests.kube_api_support import api_in_thread
from tests.server_support import subprocess_env

POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "gpu-admission-reserve-x", "namespace": "gpu-admission"},
       "spec": {"nodeName": "n1", "containers": [{"name": "reserve", "image": "x"}]}}
ENV = {"POD_NAME": "gpu-admission-reserve-x", "POD_NAMESPACE": "gpu-admission"}


def test_without_a_gpu_nvml_fails_clearly_in_a_real_process() -> None:
    """This machine has no NVIDIA driver: the real pynvml fails to load libnvidia-ml."""
    proc = subprocess.run([sys.executable, "-m", "gpu_admission", "reserve", "--kubeconfig",
                           "/nonexistent"], check=False, capture_output=True, text=True,
                          timeout=60,
                          env={**subprocess_env(), **ENV})
    assert proc.returncode == 1
    assert proc.stderr.startswith("Error: NVML initialisation failed: ")
    assert "libnvidia-ml.so.1 mounted?" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_nvml_bindings_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    result = CliRunner().invoke(main, ["reserve"], env=ENV)
    assert result.exit_code == 1
    assert result.output.startswith("Error: NVML bindings not installed (Python package "
                                    "nvidia-ml-py, module pynvml): ")


def _fail(code: int) -> Any:
    def fail(*args: Any) -> Any:
        raise pynvml.NVMLError(code)
    return fail


@pytest.mark.parametrize("patches, expected", [
    ({"nvmlInit": _fail(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)},
     "Error: NVML initialisation failed: Driver Not Loaded"),
    ({"nvmlInit": lambda: None, "nvmlShutdown": lambda: None,
      "nvmlDeviceGetCount": lambda: 2},
     "Error: NVML sees 2 GPUs, expected exactly the 1 the device plugin gave this pod"),
    ({"nvmlInit": lambda: None, "nvmlShutdown": lambda: None,
      "nvmlDeviceGetCount": lambda: 1, "nvmlDeviceGetHandleByIndex": lambda i: object(),
      "nvmlDeviceGetUUID": _fail(pynvml.NVML_ERROR_GPU_IS_LOST)},
     "Error: NVML could not read the GPU's UUID: GPU is lost"),
], ids=["driver-not-loaded", "two-gpus", "gpu-lost"])
def test_nvml_failing(monkeypatch: pytest.MonkeyPatch, patches: dict[str, Any],
                      expected: str) -> None:
    for name, fn in patches.items():
        monkeypatch.setattr(pynvml, name, fn)
    result = CliRunner().invoke(main, ["reserve"], env=ENV)
    assert result.exit_code == 1
    assert result.output.startswith(expected), result.output


def test_missing_downward_api_env() -> None:
    result = CliRunner().invoke(main, ["reserve"], env={"POD_NAME": "", "POD_NAMESPACE": ""})
    assert result.exit_code == 1
    assert result.output == ("Error: POD_NAME, POD_NAMESPACE not set: expected the pod's name "
                             "and namespace from the downward API (fieldRef metadata.name / "
                             "metadata.namespace)\n")


def test_the_uuid_is_published_on_the_pod(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    uuid = "GPU-5f1c7b2e-0a3d-4c59-9a55-1b2f3e4d5c6b"
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: object())
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: uuid)
    seen: list[Any] = []
    with api_in_thread(tmp_path, POD, on_write=seen) as kubeconfig:
        result = CliRunner().invoke(main, ["reserve", "--kubeconfig", str(kubeconfig),
                                           "--no-hold"], env=ENV)
        assert result.exit_code == 0, result.output
    assert seen == [("PATCH", "/api/v1/namespaces/gpu-admission/pods/gpu-admission-reserve-x",
                     {"metadata": {"annotations": {GPU_UUID_ANNOTATION: uuid}}},
                     {GPU_UUID_ANNOTATION: uuid})]
