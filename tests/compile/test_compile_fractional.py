"""`gpu-admission compile` refuses a policy with fractional pools (they need the webhook):
the error names ``spec.nodePools[i].sharing``, with and without ``--partial``, and
``evaluate --compiled`` refuses the same policy instead of deciding its pods differently."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpu_admission.cli import main
from tests.fractional.support import POLICY_FILE, vllm_pod

MESSAGE = ("Error: cannot compile a policy with fractional node pools (spec.nodePools[0].sharing"
           ": fractional): fractional GPUs need the gpu-admission webhook (it rewrites each "
           "pod's GPU request and writes its ConfigMap reference); use the webhook, or change "
           "the pool's sharing\n")


@pytest.mark.parametrize("extra", [[], ["--partial"], ["--strict"]],
                         ids=["plain", "partial", "strict"])
def test_compile_refuses_fractional_pools(extra: list[str]) -> None:
    result = CliRunner().invoke(main, ["compile", "--policy", str(POLICY_FILE), *extra])
    assert (result.exit_code, result.stdout, result.stderr) == (1, "", MESSAGE)


def test_compile_still_works_once_the_pool_is_not_fractional(tmp_path: Path) -> None:
    doc = yaml.safe_load(POLICY_FILE.read_text())
    doc["spec"]["nodePools"][0]["sharing"] = "none"
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(main, ["compile", "--partial", "--policy", str(path)])
    assert result.exit_code == 0, result.output


def test_evaluate_compiled_refuses_fractional_pools(tmp_path: Path) -> None:
    pods = tmp_path / "pod.yaml"
    pods.write_text(yaml.safe_dump(vllm_pod()))
    result = CliRunner().invoke(main, ["evaluate", "-f", str(pods), "--policy",
                                       str(POLICY_FILE), "--compiled"])
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == MESSAGE.replace("Error: ", "Error: --compiled: ")
