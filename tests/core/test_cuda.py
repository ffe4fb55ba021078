"""CUDA version from image names (gpu-facts.md sections 1 and 2)."""

from __future__ import annotations

import pytest

from gpu_admission.core.cuda import cuda_from_image, normalize_version, split_image

IMAGES = [
    ("nvidia/cuda:12.2.0-base-ubuntu22.04", "12.2"),
    ("docker.io/nvidia/cuda:11.8.0-cudnn8-runtime-ubuntu20.04", "11.8"),
    ("nvcr.io/nvidia/cuda:12.6.0-cudnn-runtime-ubuntu24.04", "12.6"),
    ("nvidia/cuda:10.2-cudnn7-devel-ubuntu18.04", "10.2"),
    ("registry.local:5000/mirror/nvidia/cuda:12.1.1-devel-ubuntu22.04", "12.1"),
    ("nvidia/cuda:12.4.1-base-ubuntu22.04@sha256:" + "a" * 64, "12.4"),
    ("pytorch/pytorch:2.2.2-cuda12.1-cudnn8-runtime", "12.1"),
    ("pytorch/pytorch:2.7.0-cuda12.8-cudnn9-devel", "12.8"),
    ("pytorch/pytorch:2.5.1-runtime", None),
    ("nvcr.io/nvidia/pytorch:24.01-py3", "12.3"),
    ("nvcr.io/nvidia/tritonserver:24.05-py3", "12.4"),
    ("nvcr.io/nvidia/tritonserver:24.01-py3-sdk", "12.3"),
    ("nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3", None),  # notes not read
    ("nvcr.io/nvidia/tensorflow:21.04-tf2-py3", "11.3"),  # container-specific override
    ("nvcr.io/nvidia/mxnet:24.06-py3", "12.4"),  # override differs from Triton's 12.5
    ("nvcr.io/nvidia/pytorch:25.12-py3", "13.1"),
    ("nvcr.io/nvidia/pytorch:23.01-py3", None),
    ("tensorflow/tensorflow:2.15.0-gpu", "12.2"),
    ("tensorflow/tensorflow:2.15.0", None),
    ("lmsysorg/sglang:v0.4.6-cu124", "12.4"),
    ("example.com/app:1.0-cu121-py311", "12.1"),
    ("example.com/app:cu92", "9.2"),
    ("example.com/app:1.0-cuda12.4", "12.4"),
    ("vllm/vllm-openai:latest", None),
    ("vllm/vllm-openai:latest-cu129", "12.9"),
    ("python:3.11", None),
    ("ubuntu", None),
    ("example.com/cuda-tools:1.0", None),
    ("", None),
]


@pytest.mark.parametrize(("image", "version"), IMAGES, ids=[i or "empty" for i, _ in IMAGES])
def test_cuda_from_image(image: str, version: str | None) -> None:
    assert cuda_from_image(image) == version


@pytest.mark.parametrize(("image", "parts"), [
    ("nvidia/cuda:12.2.0-base", ("", "nvidia/cuda", "12.2.0-base")),
    ("docker.io/library/python:3.11", ("", "python", "3.11")),
    ("localhost:5000/x/y", ("localhost:5000", "x/y", "")),
    ("nvcr.io/nvidia/pytorch:24.01-py3@sha256:abc", ("nvcr.io", "nvidia/pytorch", "24.01-py3")),
], ids=["hub-short", "hub-library", "registry-port-no-tag", "digest"])
def test_split_image(image: str, parts: tuple[str, str, str]) -> None:
    assert split_image(image) == parts


@pytest.mark.parametrize(("value", "expected"), [
    ("12.1", "12.1"), ("12.01", "12.1"), (" 11.8 ", "11.8"), ("12", None), ("12.1.0", None),
    ("v12.1", None), ("", None),
])
def test_normalize_version(value: str, expected: str | None) -> None:
    assert normalize_version(value) == expected
