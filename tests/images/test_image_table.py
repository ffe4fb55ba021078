"""``spec.cudaRouting.images`` (validation, matching, precedence) and the built-in serving
table ``gpu_admission/data/serving-cuda.yaml``, through the policy model and the engine."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_admission.admission.engine import evaluate
from gpu_admission.core.cuda import cuda_from_image, serving_rules
from gpu_admission.core.decision import RequestFacts
from gpu_admission.policy.model import PolicyError, policy_from_dict
from tests.builders import make_container, make_pod

D1 = "sha256:" + "a1" * 32
D2 = "sha256:" + "b2" * 32


def policy(images: list[dict[str, Any]]) -> Any:
    return policy_from_dict({"apiVersion": "gpu-admission.io/v1alpha1",
                             "kind": "GPUSharingPolicy",
                             "spec": {"cudaRouting": {"images": images}}})


BAD = [
    ("bad-glob", [{"repository": "a/b", "tags": "v[0", "cudaVersion": "12.4"}],
     "spec.cudaRouting.images[0].tags: unclosed '[' (a set is written [abc] or [0-9]), "
     'got "v[0"'),
    ("glob-bad-chars", [{"repository": "a/b", "tags": "v 1", "cudaVersion": "12.4"}],
     "spec.cudaRouting.images[0].tags: expected a tag glob of 1-128 characters: letters, "
     "digits, '_', '.', '-' and the wildcards '*', '?', '[...]', got \"v 1\""),
    ("bad-version", [{"repository": "a/b", "cudaVersion": 12.4}],
     "spec.cudaRouting.images[0].cudaVersion: expected a quoted \"<major>.<minor>\" string like "
     '"12.1", got 12.4'),
    ("upper-case-repository", [{"repository": "Vllm/vllm-openai", "cudaVersion": "12.4"}],
     "spec.cudaRouting.images[0].repository: expected lower-case path components (a-z, 0-9, "
     "'.', '_', '-') separated by '/', like vllm/vllm-openai, got \"Vllm/vllm-openai\""),
    ("tag-in-repository", [{"repository": "a/b:v1", "cudaVersion": "12.4"}],
     'spec.cudaRouting.images[0].repository: a repository has no tag (put it in tags), '
     'got "a/b:v1"'),
    ("bad-digest", [{"repository": "a/b", "digests": ["sha256:12"], "cudaVersion": "12.4"}],
     "spec.cudaRouting.images[0].digests: expected sha256:<64 lower-case hex digits> (or "
     'sha512:<128>), got "sha256:12"'),
    ("duplicate-after-normalising", [
        {"repository": "docker.io/library/python", "tags": "3.*", "cudaVersion": "12.4"},
        {"repository": "a/b", "cudaVersion": "12.4"},
        {"repository": "python", "tags": "3.*", "cudaVersion": "12.1"}],
     'spec.cudaRouting.images: entry [2] duplicates entry [0] (repository "python", same tags '
     "and digests): remove one"),
    ("unknown-field", [{"repository": "a/b", "tag": "v1", "cudaVersion": "12.4"}],
     "spec.cudaRouting.images[0].tag: unknown field (check the spelling; see "
     "docs/policy.md)"),
    ("missing-version", [{"repository": "a/b"}],
     "spec.cudaRouting.images[0].cudaVersion: required field is missing"),
]


@pytest.mark.parametrize(("images", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_invalid_entries_name_entry_and_field(images: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(PolicyError) as info:
        policy(images)
    assert str(info.value) == message


TABLE: list[dict[str, Any]] = [
    {"repository": "docker.io/vllm/vllm-openai", "tags": "v0.6.*", "digests": [D1],
     "cudaVersion": "12.4"},
    {"repository": "vllm/vllm-openai", "cudaVersion": "12.1"},  # every other reference
    {"repository": "ghcr.io/huggingface/text-generation-inference", "tags": "2.4.*",
     "cudaVersion": "12.4"},
    {"repository": "kserve/huggingfaceserver", "tags": "v0.14.?-gpu", "cudaVersion": "12.4"},
    {"repository": "nvidia/cuda", "digests": [D2], "cudaVersion": "11.8"},
    {"repository": "docker.io/library/python", "tags": "3.12-cuda", "cudaVersion": "12.2"},
]
MATCHES = [
    ("tag-glob", "vllm/vllm-openai:v0.6.3", "12.4"),
    ("digest-only", f"vllm/vllm-openai@{D1}", "12.4"),
    ("tag-and-listed-digest", f"vllm/vllm-openai:latest@{D1}", "12.4"),
    ("first-match-wins-fallthrough", "vllm/vllm-openai:v0.7.0", "12.1"),
    ("unlisted-digest-falls-through", f"vllm/vllm-openai@{D2}", "12.1"),
    ("docker-io-library-normalised", "docker.io/vllm/vllm-openai:v0.6.1", "12.4"),
    ("mirror-prefix", "mirror.corp:5000/dockerhub/vllm/vllm-openai:v0.6.3", "12.4"),
    ("host-entry-exact-host", "ghcr.io/huggingface/text-generation-inference:2.4.0", "12.4"),
    ("host-entry-other-host", "quay.io/huggingface/text-generation-inference:2.4.0", None),
    ("glob-single-char", "kserve/huggingfaceserver:v0.14.0-gpu", "12.4"),
    ("glob-no-match", "kserve/huggingfaceserver:v0.14.0", None),
    ("user-table-before-built-in", f"nvidia/cuda:12.4.1-base-ubuntu22.04@{D2}", "11.8"),
    ("built-in-after-table", "nvidia/cuda:12.4.1-base-ubuntu22.04", "12.4"),
    ("unrelated", "python:3.12", None),
    ("official-image", "python:3.12-cuda", "12.2"),
    ("official-image-via-mirror", "mirror.corp/dockerhub/library/python:3.12-cuda", "12.2"),
    ("other-org-same-name", "myorg/python:3.12-cuda", None),
    ("other-registry-same-name", "quay.io/myorg/python:3.12-cuda", None),
]


@pytest.mark.parametrize(("image", "version"), [m[1:] for m in MATCHES],
                         ids=[m[0] for m in MATCHES])
def test_matching(image: str, version: str | None) -> None:
    compiled = policy(TABLE).compiled
    assert compiled.image_cuda(image) == version
    assert compiled.image_cuda(image) == version  # memoised answer is the same
    decision = evaluate(make_pod(containers=[make_container(image=image)]),
                        RequestFacts(namespace="team-a"), policy(TABLE))
    assert decision.cuda_version == version


def test_table_is_compiled_once_per_policy_and_empty_table_costs_nothing() -> None:
    assert policy([]).compiled.image_cuda is cuda_from_image
    p = policy(TABLE)
    assert p.compiled.image_cuda is p.compiled.image_cuda


SERVING = [
    ("vllm-v0.5.0", "vllm/vllm-openai:v0.5.0", "12.4"),
    ("vllm-v0.6.3-unconfirmed", "vllm/vllm-openai:v0.6.3", None),
    ("vllm-digest-unknown", f"vllm/vllm-openai@{D1}", None),
    ("tgi-1.3.4", "ghcr.io/huggingface/text-generation-inference:1.3.4", "12.1"),
    ("tgi-2.4.0-unconfirmed", "ghcr.io/huggingface/text-generation-inference:2.4.0", None),
    ("ray-ml-2.9-gpu", "rayproject/ray-ml:2.9.0-py310-gpu", "11.8"),
    ("ray-2.9-cu121-tag-wins", "rayproject/ray:2.9.0-py310-cu121", "12.1"),
    ("ray-2.47-gpu", "rayproject/ray:2.47.1-py310-gpu", "12.1"),
    ("kserve-unconfirmed", "kserve/huggingfaceserver:v0.14.0-gpu", None),
    ("sglang-cu-token", "lmsysorg/sglang:v0.4.1-cu124", "12.4"),
    ("triton-ngc-table", "nvcr.io/nvidia/tritonserver:24.05-py3", "12.4"),
]


@pytest.mark.parametrize(("image", "version"), [s[1:] for s in SERVING],
                         ids=[s[0] for s in SERVING])
def test_built_in_serving_rows(image: str, version: str | None) -> None:
    assert cuda_from_image(image) == version


def test_serving_table_rows_are_valid_entries() -> None:
    """Every built-in row would also be a valid user entry (same validation)."""
    rows = serving_rules()
    assert rows
    for rule in rows:
        entry = {"repository": (f"{rule.registry}/" if rule.registry else "") + rule.repository,
                 "cudaVersion": rule.cuda_version}
        policy([entry])
