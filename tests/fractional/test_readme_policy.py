"""docs/fractional.md's admission policy that closes the residual ConfigMap risk of
fractional GPUs: valid against the Kubernetes OpenAPI schema, and its CEL (evaluated with the
compiler's cel-python evaluator, as the compile tests do) lets only the scheduler write
``gpu-admission-gpu-*`` ConfigMaps."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import celpy.adapter
import kubernetes_validate
import pytest
import yaml

from gpu_admission.compile.evaluator import run
from gpu_admission.core.vocab import GPU_CONFIGMAP_PREFIX

README = Path(__file__).parents[2] / "docs" / "fractional.md"
SCHEDULER = "system:serviceaccount:gpu-admission:gpu-aware-scheduler"


def policy_docs() -> list[dict[str, Any]]:
    text = README.read_text()
    section = text[text.index("# Fractional GPUs"):]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    (block,) = [b for b in blocks if "ValidatingAdmissionPolicy" in b]
    return [d for d in yaml.safe_load_all(block) if d]


@pytest.mark.parametrize("version", ["1.30", "1.36.0"])
def test_readme_policy_is_valid_kubernetes(version: str) -> None:
    docs = policy_docs()
    assert [d["kind"] for d in docs] == ["ValidatingAdmissionPolicy",
                                         "ValidatingAdmissionPolicyBinding"]
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize(("user", "name", "allowed"), [
    (SCHEDULER, GPU_CONFIGMAP_PREFIX + "0b9f2c1e", True),
    ("alice@example.com", GPU_CONFIGMAP_PREFIX + "0b9f2c1e", False),
    ("system:serviceaccount:ml-serving:default", GPU_CONFIGMAP_PREFIX + "x", False),
    ("alice@example.com", "app-config", True),
], ids=["scheduler", "tenant-prefixed", "tenant-sa-prefixed", "tenant-other"])
def test_readme_policy_lets_only_the_scheduler_write_gpu_configmaps(
        user: str, name: str, allowed: bool) -> None:
    (validation,) = policy_docs()[0]["spec"]["validations"]
    activation = {"request": {"userInfo": {"username": user}, "operation": "CREATE"},
                  "object": {"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": name, "namespace": "ml-serving"},
                             "data": {"NVIDIA_VISIBLE_DEVICES": "GPU-1"}}}
    assert bool(run(validation["expression"],
                    celpy.adapter.json_to_cel(activation))) is allowed  # type: ignore[arg-type]
