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
* serving images whose tags carry no CUDA (vLLM, TGI, Ray, ...): rows read from the projects'
  own Dockerfiles, release notes or maintainers' statements
  (``gpu_admission/data/serving-cuda.yaml``)
* any tag with a ``cu<XY>``/``cu<XYZ>`` token (``cu121`` = 12.1) or ``cuda<X.Y>``;
* else a ``cu<XY>``/``cu<XYZ>`` token in the image's name (its last path component), also
  when there is no tag (``…/huggingface-text-generation-inference-cu124.2-3.ubuntu2204.py311``).

Before all of these, the policy's own table ``spec.cudaRouting.images`` (:class:`ImageRule`,
compiled once per policy by :func:`image_lookup`) is consulted: first match wins. Its entries
(and the serving table's) match a reference the way the built-in rules do:

* the repository is normalised (``docker.io/library/x`` = ``x``); an entry without a registry
  host matches that Docker Hub path, and the same path under a registry mirror's prefix
  (``mirror.corp/hub/vllm/vllm-openai`` matches ``vllm/vllm-openai``, like ``.../nvidia/cuda``
  above; an official image ``x`` only as ``<mirror>/.../library/x``); an entry with a host
  matches only that host;
* ``repo@sha256:<hex>`` and ``repo:tag@sha256:<hex>`` are understood: an entry matches when the
  reference's digest is in its ``digests``, or its tag matches the ``tags`` glob
  (``fnmatch`` syntax: ``*``, ``?``, ``[...]``), or the entry has neither (any reference).

Results are ``"<major>.<minor>"`` strings. Pure functions; lookups are cached per image name.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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


# distribution/reference grammar (github.com/distribution/reference, regexp.go): a host
# (with optional port) and lower-case path components separated by "/".
_HOST_RE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                      r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9a-fA-F:]+\])"
                      r"(?::[0-9]+)?$")
_PATH_COMPONENT_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_DIGEST_RE = re.compile(r"^(?:sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128})$")
_GLOB_CHARS_RE = re.compile(r"^[A-Za-z0-9_.\-*?\[\]!]{1,128}$")


@functools.cache
def _tables() -> dict[str, Any]:
    text = (resources.files("gpu_admission") / "data" / "ngc-cuda.yaml").read_text("utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    return data


@dataclass(frozen=True, slots=True)
class ImageRule:
    """One ``cudaRouting.images`` entry (or serving-table row), ready to match."""

    registry: str  # "" = any registry / mirror (the entry named no host, or docker.io)
    repository: str  # normalised path, e.g. "vllm/vllm-openai"
    tags: re.Pattern[str] | None  # compiled glob, None = no tag condition
    digests: frozenset[str]
    cuda_version: str  # "<major>.<minor>"

    @property
    def _mirror_suffix(self) -> str:
        # A mirror keeps the Docker Hub path under a prefix; official images keep "library/".
        return ("/" if "/" in self.repository else "/library/") + self.repository

    def matches(self, registry: str, repository: str, tag: str, digest: str) -> bool:
        if self.registry:
            if registry != self.registry or repository != self.repository:
                return False
        elif repository != self.repository and not (
                registry and repository.endswith(self._mirror_suffix)):
            return False
        if self.tags is None and not self.digests:
            return True
        if digest and digest in self.digests:
            return True
        return bool(tag) and self.tags is not None and self.tags.match(tag) is not None


def split_reference(image: str) -> tuple[str, str, str, str]:
    """``(registry, repository, tag, digest)``; registry/repository as :func:`split_image`."""
    ref, _, digest = image.partition("@")
    registry, repository, tag = split_image(ref)
    return registry, repository, tag, digest


def parse_repository(value: str) -> tuple[str, str]:
    """Validate and normalise an entry's ``repository``; raise ValueError saying what is wrong.

    ``docker.io/library/nginx`` -> ``("", "nginx")``, ``ghcr.io/org/x`` -> ``("ghcr.io",
    "org/x")``. A tag or digest is not allowed here (they have their own fields).
    """
    if "@" in value:
        raise ValueError("a repository has no digest (put it in digests)")
    registry, repository, tag = split_image(value)
    if tag:
        raise ValueError("a repository has no tag (put it in tags)")
    if registry and not _HOST_RE.match(registry):
        raise ValueError(f"registry host {registry!r} is not a valid host[:port]")
    parts = repository.split("/")
    if not repository or not all(_PATH_COMPONENT_RE.match(p) for p in parts):
        raise ValueError("expected lower-case path components (a-z, 0-9, '.', '_', '-') "
                         "separated by '/', like vllm/vllm-openai")
    return registry, repository


def compile_tag_glob(glob: str) -> re.Pattern[str]:
    """An ``fnmatch`` glob over tags, compiled; raise ValueError for a malformed glob."""
    if not _GLOB_CHARS_RE.match(glob):
        raise ValueError("expected a tag glob of 1-128 characters: letters, digits, '_', '.', "
                         "'-' and the wildcards '*', '?', '[...]'")
    depth = 0
    for char in glob:
        if char == "[":
            if depth:
                raise ValueError("'[' inside a '[...]' set")
            depth = 1
        elif char == "]" and depth:
            depth = 0
    if depth:
        raise ValueError("unclosed '[' (a set is written [abc] or [0-9])")
    if "[]" in glob or "[!]" in glob:
        raise ValueError("empty '[]' set")
    return re.compile(fnmatch.translate(glob))


def check_digest(value: str) -> str:
    if not _DIGEST_RE.match(value):
        raise ValueError("expected sha256:<64 lower-case hex digits> (or sha512:<128>)")
    return value


def _first_match(rules: Sequence[ImageRule], image: str) -> str | None:
    registry, repository, tag, digest = split_reference(image)
    for rule in rules:
        if rule.matches(registry, repository, tag, digest):
            return rule.cuda_version
    return None


@functools.cache
def serving_rules() -> tuple[ImageRule, ...]:
    """The built-in serving-image table (``data/serving-cuda.yaml``), in file order."""
    text = (resources.files("gpu_admission") / "data" / "serving-cuda.yaml").read_text("utf-8")
    data = yaml.safe_load(text) or {}
    rules = []
    for row in data.get("images", []):
        registry, repository = parse_repository(row["repository"])
        globs = row.get("tags") or []
        for glob in globs if isinstance(globs, list) else [globs]:
            rules.append(ImageRule(registry, repository, compile_tag_glob(glob), frozenset(),
                                   str(row["cudaVersion"])))
    return tuple(rules)


def image_lookup(rules: Sequence[ImageRule]) -> Callable[[str], str | None]:
    """``image -> CUDA`` for one policy: its own ``rules`` first, then :func:`cuda_from_image`.

    Without rules this *is* :func:`cuda_from_image` (no extra call on the hot path); with
    rules, a per-policy memo keeps repeated images a dict lookup.
    """
    if not rules:
        return cuda_from_image
    table = tuple(rules)
    memo: dict[str, str | None] = {}

    def lookup(image: str) -> str | None:
        if image in memo:
            return memo[image]
        version = _first_match(table, image) if image else None
        if version is None:
            version = cuda_from_image(image)
        if len(memo) >= 4096:
            memo.clear()
        memo[image] = version
        return version

    return lookup


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
    found = _first_match(serving_rules(), image)
    if found is not None:
        return found
    registry, repo, tag = split_image(image)
    if not tag:
        return _name_token(repo)
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
    return _name_token(repo)


def _name_token(repo: str) -> str | None:
    """A ``cu<XY>``/``cu<XYZ>`` token in the image's own name (last path component), for
    images that say their CUDA in the name rather than the tag, e.g. Google's Deep Learning
    Containers ``huggingface-text-generation-inference-cu124.2-3.ubuntu2204.py311``."""
    match = _CU_TOKEN.search(repo.rsplit("/", 1)[-1])
    return _cu_token(match.group(1)) if match else None


def version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)
