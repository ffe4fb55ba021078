"""Pure logic of ``images scan``: no I/O here.

* :func:`parse_image` -- an image reference to the registry API's coordinates (host,
  repository name, tag or digest) and to the normalised ``repository`` a
  ``cudaRouting.images`` entry uses (:func:`gpu_admission.core.cuda.split_reference`, so the entry
  matches the reference the way the webhook will).
* :func:`select_platform` -- the manifest of one platform out of an image index (OCI
  ``application/vnd.oci.image.index.v1+json``) or a Docker manifest list
  (``application/vnd.docker.distribution.manifest.list.v2+json``). Default ``linux/amd64``:
  the nodes that run NVIDIA GPUs are almost all amd64; ``--platform linux/arm64`` reads the
  Grace-Hopper build instead. The platforms the index lists are reported next to the entry.
* :func:`cuda_from_env` -- the CUDA ``"<major>.<minor>"`` from the image config's
  ``config.Env`` (OCI image spec ``config.md``): ``CUDA_VERSION`` (``12.4.1``, set by every
  nvidia/cuda base image), else ``NV_CUDA_LIB_VERSION`` / ``NV_CUDA_CUDART_VERSION``
  (``12.4.127-1``), else the ``cuda>=X.Y`` term of ``NVIDIA_REQUIRE_CUDA`` (the same order of
  evidence the NVIDIA container toolkit uses: ``internal/config/image/cuda_image.go``).
* :func:`render_entries` -- YAML list items for ``spec.cudaRouting.images``, digests included.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gpu_admission.core.cuda import split_reference

DOCKER_HUB_API: Final = "registry-1.docker.io"

OCI_INDEX: Final = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST: Final = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST: Final = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST: Final = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES: Final = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFEST_TYPES: Final = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})

_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST_RE = re.compile(r"^sha256:[a-f0-9]{64}$")
_VERSION_RE = re.compile(r"^\s*(\d{1,3})\.(\d{1,3})")
_REQUIRE_RE = re.compile(r"(?:^|\s)cuda>=(\d{1,3})\.(\d{1,3})")
#: Environment variables read, in order (the first one present with a version wins).
CUDA_ENV: Final = ("CUDA_VERSION", "NV_CUDA_LIB_VERSION", "NV_CUDA_CUDART_VERSION")


class ScanError(Exception):
    """An image that could not be scanned; the message says why (no traceback)."""


@dataclass(frozen=True, slots=True)
class ImageRef:
    """Where an image lives in the registry API and how a policy entry names it."""

    image: str  # as given
    host: str  # API host[:port], e.g. registry-1.docker.io
    name: str  # API repository name, e.g. library/python
    tag: str  # "" when only a digest was given
    digest: str  # "" unless pinned
    repository: str  # the normalised cudaRouting.images repository, e.g. python

    @property
    def reference(self) -> str:
        """What to ask ``/v2/<name>/manifests/<reference>`` for (the digest wins)."""
        return self.digest or self.tag


def parse_image(image: str) -> ImageRef:
    """``[host[:port]/]path[:tag][@sha256:...]`` -> :class:`ImageRef` (tag ``latest`` when
    neither a tag nor a digest is given, as ``docker pull`` does)."""
    text = image.strip()
    if not text or any(ch.isspace() for ch in text):
        raise ScanError(f"{image!r}: not an image reference")
    registry, repository, tag, digest = split_reference(text)
    if digest and not _DIGEST_RE.match(digest):
        raise ScanError(f"{image}: digest must be sha256:<64 lower-case hex digits>")
    if tag and not _TAG_RE.match(tag):
        raise ScanError(f"{image}: invalid tag {tag!r}")
    if not repository or repository != repository.lower() or "//" in repository:
        raise ScanError(f"{image}: repository must be lower-case path components")
    if not tag and not digest:
        tag = "latest"
    host = registry or DOCKER_HUB_API
    name = repository if registry or "/" in repository else f"library/{repository}"
    return ImageRef(image=text, host=host, name=name, tag=tag, digest=digest,
                    repository=f"{registry}/{repository}" if registry else repository)


def load_json(body: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ScanError(f"{what} is not JSON") from None
    if not isinstance(doc, dict):
        raise ScanError(f"{what} is not a JSON object")
    return doc


def platform_of(descriptor: Mapping[str, Any]) -> str:
    """``os/architecture[/variant]`` of an index entry (``unknown/unknown`` for attestations)."""
    plat = descriptor.get("platform")
    if not isinstance(plat, dict):
        return "unknown/unknown"
    text = f"{plat.get('os', 'unknown')}/{plat.get('architecture', 'unknown')}"
    return text + (f"/{plat['variant']}" if plat.get("variant") else "")


def select_platform(index: Mapping[str, Any], platform: str) -> tuple[str, list[str]]:
    """The digest of ``platform``'s manifest in an index, and every platform it lists."""
    manifests = index.get("manifests")
    if not isinstance(manifests, list):
        raise ScanError("image index has no manifests list")
    listed = [platform_of(m) for m in manifests if isinstance(m, dict)]
    for entry, plat in zip((m for m in manifests if isinstance(m, dict)), listed, strict=True):
        if plat == platform or (plat.startswith(platform + "/") and platform.count("/") == 1):
            digest = entry.get("digest")
            if not isinstance(digest, str) or not _DIGEST_RE.match(digest):
                raise ScanError(f"index entry for {plat} has no valid digest")
            return digest, listed
    raise ScanError(f"no {platform} image in the index (it lists: {', '.join(listed)}); "
                    "choose one with --platform")


def config_digest(manifest: Mapping[str, Any]) -> str:
    config = manifest.get("config")
    digest = config.get("digest") if isinstance(config, dict) else None
    if not isinstance(digest, str) or not _DIGEST_RE.match(digest):
        raise ScanError("image manifest has no valid config.digest")
    return digest


def cuda_from_env(env: Iterable[Any]) -> tuple[str, str] | None:
    """``("<major>.<minor>", "NAME=value")`` from an image config's ``Env`` list, or None."""
    values: dict[str, str] = {}
    for item in env:
        if isinstance(item, str) and "=" in item:
            name, _, value = item.partition("=")
            values[name] = value
    for name in CUDA_ENV:
        match = _VERSION_RE.match(values.get(name, ""))
        if match:
            return f"{int(match.group(1))}.{int(match.group(2))}", f"{name}={values[name]}"
    require = values.get("NVIDIA_REQUIRE_CUDA", "")
    match = _REQUIRE_RE.search(require)
    if match:
        return (f"{int(match.group(1))}.{int(match.group(2))}",
                f"NVIDIA_REQUIRE_CUDA {match.group(0).strip()}")
    return None


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What one image's registry said."""

    ref: ImageRef
    digests: tuple[str, ...]  # the manifest (or index, then platform manifest) digests
    cuda: tuple[str, str] | None  # (version, evidence) or None: no CUDA in the environment
    platform: str = ""  # the platform read ("" for a single-platform image)
    platforms: tuple[str, ...] = field(default=())  # every platform of an index


def _q(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid YAML scalar, quoted


def render_entries(results: Sequence[ScanResult]) -> str:
    """YAML for ``spec.cudaRouting.images`` (a list), one entry per image with CUDA; images
    without CUDA in their environment are listed as comments only (never guessed)."""
    lines = ["# spec.cudaRouting.images entries (gpu-admission images scan; "
             "CUDA read from each image's config.Env)"]
    for result in results:
        ref = result.ref
        where = f" ({result.platform}; index lists {', '.join(result.platforms)})" \
            if result.platform else ""
        if result.cuda is None:
            lines.append(f"# {ref.image}: no CUDA_VERSION, NV_CUDA_* or NVIDIA_REQUIRE_CUDA in "
                         f"the image environment{where}: not a CUDA image, no entry")
            continue
        version, evidence = result.cuda
        lines.append(f"# {ref.image}: {evidence}{where}")
        lines.append(f"- repository: {_q(ref.repository)}")
        if ref.tag and not ref.digest:
            lines.append(f"  tags: {_q(ref.tag)}")
        lines.append(f"  digests: [{', '.join(_q(d) for d in result.digests)}]")
        lines.append(f"  cudaVersion: {_q(version)}")
    return "\n".join(lines) + "\n"
