"""The CUDA version a container image was built for, read from well-known image names.

Why: time-sliced pods with different CUDA versions on one GPU give driver errors (seed article,
pitfall 1), so the policy routes each pod to the node pool of its CUDA version. Kubernetes only
sees the image *name*, so we read the conventions image publishers use (sources: see
``shared/reference/gpu-facts.md`` sections 1 and 2):

* ``nvidia/cuda:<X.Y.Z>-[cudnn…-]<base|runtime|devel>-<os>``
  (gitlab.com/nvidia/container-images/cuda)
* ``pytorch/pytorch:<torch>-cuda<X.Y>-cudnn<N>-<runtime|devel>`` (pytorch ``docker.Makefile``)
* NGC ``nvcr.io/nvidia/<container>:<YY.MM>-…`` via NVIDIA's release-note tables
  (``gpu_admission/data/ngc-cuda.yaml``)
* ``tensorflow/tensorflow:<X.Y.Z>-gpu`` via TensorFlow's tested-build table
* any tag with a ``cu<XY>``/``cu<XYZ>`` token (``cu121`` = 12.1) or ``cuda<X.Y>``.

Results are ``"<major>.<minor>"`` strings. Pure functions; lookups are cached per image name.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any

import yaml

_CUDA_LABEL_RE = re.compile(r"^(\d{1,3})\.(\d{1,3})$")
_NVIDIA_CUDA_TAG = re.compile(r"^(\d+)\.(\d+)(?:\.\d+)?(?:-|$)")
_PYTORCH_TAG = re.compile(r"-cuda(\d+)\.(\d+)(?:-|$)")
_NGC_TAG = re.compile(r"^(\d{2}\.\d{2})(?:[-.]|$)")
_TF_GPU_TAG = re.compile(r"^(\d+)\.(\d+)(?:\.\d+)?(?:rc\d+)?-gpu")
_CU_TOKEN = re.compile(r"(?:^|[-_.+])cu(\d{2,3})(?=$|[-_.+])")
_CUDA_TOKEN = re.compile(r"(?:^|[-_.+])cuda-?(\d{1,2})\.(\d{1,2})(?=$|[-_.+]|\.\d)")


@functools.cache
def _tables() -> dict[str, Any]:
    text = (resources.files("gpu_admission") / "data" / "ngc-cuda.yaml").read_text("utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def normalize_version(value: str) -> str | None:
    """``"12.1"`` -> ``"12.1"``, ``"12.01"`` -> ``"12.1"``; anything else -> None."""
    match = _CUDA_LABEL_RE.match(value.strip()) if isinstance(value, str) else None
    if match is None:
        return None
    return f"{int(match.group(1))}.{int(match.group(2))}"


def split_image(image: str) -> tuple[str, str, str]:
    """``registry``, ``repository`` and ``tag`` of an image reference (digest dropped).

    ``registry`` is ``""`` for Docker Hub short names (``docker.io`` and ``index.docker.io``
    are normalized to ``""`` too), so ``nvidia/cuda`` and ``docker.io/nvidia/cuda`` compare equal.
    """
    ref = image.split("@", 1)[0]
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    tag = ""
    if colon > slash:
        ref, tag = ref[:colon], ref[colon + 1:]
    registry = ""
    first, sep, rest = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        registry, ref = first, rest
    if registry in {"docker.io", "index.docker.io", "registry-1.docker.io"}:
        registry = ""
    if registry == "" and ref.startswith("library/"):
        ref = ref[len("library/"):]
    return registry, ref, tag


def _cu_token(digits: str) -> str:
    # PyTorch wheel convention: last digit is the minor (cu121 = 12.1, cu92 = 9.2).
    return f"{int(digits[:-1])}.{int(digits[-1])}"


@functools.lru_cache(maxsize=4096)
def cuda_from_image(image: str) -> str | None:
    """The CUDA ``"<major>.<minor>"`` an image was built for, or None when the name says nothing."""
    if not isinstance(image, str) or not image:
        return None
    registry, repo, tag = split_image(image)
    if not tag:
        return None
    tables = _tables()
    if repo == "nvidia/cuda" or repo.endswith("/nvidia/cuda"):
        match = _NVIDIA_CUDA_TAG.match(tag)
        return f"{int(match.group(1))}.{int(match.group(2))}" if match else None
    if repo == "pytorch/pytorch":
        match = _PYTORCH_TAG.search(tag)
        return f"{int(match.group(1))}.{int(match.group(2))}" if match else None
    if registry == "nvcr.io" and repo.startswith("nvidia/"):
        match = _NGC_TAG.match(tag)
        if match:
            release = match.group(1)
            container = repo.rsplit("/", 1)[-1]
            override = tables.get("overrides", {}).get(container, {}).get(release)
            found = override or tables.get("monthly", {}).get(release)
            if found:
                return str(found)
    if repo == "tensorflow/tensorflow":
        match = _TF_GPU_TAG.match(tag)
        if match:
            found = tables.get("tensorflow_gpu", {}).get(f"{match.group(1)}.{match.group(2)}")
            return str(found) if found else None
    match = _CU_TOKEN.search(tag)
    if match:
        return _cu_token(match.group(1))
    match = _CUDA_TOKEN.search(tag)
    if match:
        return f"{int(match.group(1))}.{int(match.group(2))}"
    return None


def version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)
