"""``gpu-admission extender`` refuses bad options with click's message and a non-zero exit
(through the real command group, as a user types it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpu_admission.cli import main


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["--interval", "soon"], "Invalid value for '--interval': expected a positive "
                 "duration like 15s, 1m or 500ms, got 'soon'", id="interval"),
    pytest.param(["--interval", "0s"], "Invalid value for '--interval'", id="interval-zero"),
    pytest.param(["--window", "1 minute"], "Invalid value for '--window': expected a PromQL "
                 "duration like 1m or 90s, got '1 minute'", id="window"),
    pytest.param(["--prometheus", "prometheus:9090"], "Invalid value for '--prometheus': "
                 "expected an http(s):// URL of Prometheus, got 'prometheus:9090'", id="url"),
    pytest.param(["--prefix", "scheduler/"], "Invalid value for '--prefix': expected a URL "
                 "path like /scheduler, got 'scheduler/'", id="prefix"),
    pytest.param(["--stale-after", "0"], "Invalid value for '--stale-after'", id="stale"),
    pytest.param(["--policy", "/nonexistent/policy.yaml"], "does not exist", id="no-policy"),
])
def test_bad_options(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["extender", *args])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_invalid_policy_names_the_field(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: gpu-admission.io/v1alpha1\nkind: GPUSharingPolicy\n"
                      "spec:\n  placement:\n    memoryFit: some\n")
    result = CliRunner().invoke(main, ["extender", "--policy", str(policy)])
    assert result.exit_code == 1
    assert ("spec.placement.memoryFit: expected 'any', 'every' or 'predicted', got \"some\""
            in result.output)
