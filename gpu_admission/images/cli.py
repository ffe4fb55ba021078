"""``gpu-admission images scan IMAGE... | -f manifests.yaml``.

Prints ``spec.cudaRouting.images`` entries (YAML) on stdout, one per image whose environment
names a CUDA version; why an image has none, or could not be read, on stderr. Exit codes: 0
every image read, 1 some image could not be read (the others are still printed), 2 unusable
input (no image, bad reference, unreadable file).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import aiohttp
import click

from gpu_admission.images.registry import Credentials, RegistryClient, load_docker_credentials
from gpu_admission.images.scan import (
    INDEX_TYPES,
    MANIFEST_TYPES,
    ImageRef,
    ScanError,
    ScanResult,
    config_digest,
    cuda_from_env,
    load_json,
    parse_image,
    render_entries,
    select_platform,
)


class InputError(click.ClickException):
    exit_code = 2


def _media_type(doc: dict[str, Any], header: str) -> str:
    """The manifest's own ``mediaType`` (required for Docker, optional in OCI), else the
    ``Content-Type`` the registry sent."""
    media = doc.get("mediaType")
    return media if isinstance(media, str) else header


async def scan_one(client: RegistryClient, ref: ImageRef, platform: str) -> ScanResult:
    """Manifest (or index -> the platform's manifest) -> config blob -> CUDA from its Env."""
    media, digest, body = await client.manifest(ref.host, ref.name, ref.reference)
    doc = load_json(body, f"{ref.image}: manifest")
    media = _media_type(doc, media)
    digests = [digest]
    chosen, listed = "", list[str]()
    if media in INDEX_TYPES or (not media and "manifests" in doc):
        chosen_digest, listed = select_platform(doc, platform)
        chosen = platform
        media, digest, body = await client.manifest(ref.host, ref.name, chosen_digest)
        doc = load_json(body, f"{ref.image}: {platform} manifest")
        media = _media_type(doc, media)
        digests.append(digest)
    if media and media not in MANIFEST_TYPES:
        raise ScanError(f"{ref.image}: unsupported manifest media type {media!r}")
    config = load_json(await client.blob(ref.host, ref.name, config_digest(doc)),
                       f"{ref.image}: image config")
    inner = config.get("config")
    env: Any = inner.get("Env") if isinstance(inner, dict) else None
    return ScanResult(ref=ref, digests=tuple(digests),
                      cuda=cuda_from_env(env if isinstance(env, list) else []),
                      platform=chosen, platforms=tuple(listed))


async def scan_all(refs: list[ImageRef], *, platform: str, insecure: bool, seconds: float,
                   credentials: dict[str, Credentials]
                   ) -> list[ScanResult | ScanError]:
    """Scan every image concurrently (one HTTP session); errors are returned, not raised.
    ``seconds`` bounds every request (aiohttp's total timeout per request)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=seconds)) as session:
        client = RegistryClient(session, insecure=insecure, credentials=credentials)

        async def one(ref: ImageRef) -> ScanResult | ScanError:
            try:
                return await scan_one(client, ref, platform)
            except ScanError as exc:
                return exc
            except TimeoutError:
                return ScanError(f"{ref.image}: no answer from {ref.host} within {seconds:g} s")

        return list(await asyncio.gather(*(one(r) for r in refs)))


def images_in_files(filenames: tuple[str, ...]) -> list[str]:
    """Images of the GPU containers of every Pod / pod template in the files (the images
    whose CUDA the webhook routes on), in order, without repeats."""
    from gpu_admission.admission.pod import gpu_containers  # noqa: PLC0415 - only with -f
    from gpu_admission.workloads.files import read_documents  # noqa: PLC0415
    from gpu_admission.workloads.kinds import WorkloadError, pod_templates  # noqa: PLC0415

    found: dict[str, None] = {}
    for name in filenames:
        for index, doc in enumerate(read_documents(name), start=1):
            try:
                templates = pod_templates(doc)
            except WorkloadError as exc:
                raise InputError(f"{name}: document {index}: {exc}") from None
            for tpl in templates:
                for gc in gpu_containers(tpl.pod["spec"]):
                    image = gc.container.get("image")
                    if isinstance(image, str) and image:
                        found[image] = None
    return list(found)


@click.group(name="images", short_help="Find the CUDA version images were built for.")
def images() -> None:
    """Container images and the CUDA they were built for."""


@images.command(name="scan", short_help="Read images' CUDA from their registries.")
@click.argument("image_args", metavar="IMAGE...", nargs=-1)
@click.option("-f", "--filename", "filenames", multiple=True, metavar="FILE",
              help="Also scan the GPU containers' images of the Pods/workloads in FILE "
                   "(YAML/JSON, multi-document; '-' reads stdin).")
@click.option("--platform", default="linux/amd64", show_default=True,
              help="Platform to read from a multi-platform image index (os/arch[/variant]).")
@click.option("--insecure", is_flag=True,
              help="Plain HTTP to the registry (a local registry); default HTTPS.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Seconds each registry request may take.")
def scan(*, image_args: tuple[str, ...], filenames: tuple[str, ...], platform: str,
         insecure: bool, timeout: float) -> None:
    """Read each IMAGE's CUDA from its registry and print spec.cudaRouting.images entries.

    The CUDA comes from the image config's environment (CUDA_VERSION, NV_CUDA_*,
    NVIDIA_REQUIRE_CUDA); credentials from the docker config (DOCKER_CONFIG or
    ~/.docker/config.json). Exit 0 when every image was read, 1 when some could not be,
    2 for unusable input.
    """
    if platform.count("/") not in (1, 2) or " " in platform:
        raise InputError(f"--platform: expected os/arch[/variant] like linux/amd64, "
                         f"got {platform!r}")
    names = list(dict.fromkeys([*image_args, *images_in_files(filenames)]))
    if not names:
        raise InputError("no image: give IMAGE arguments or -f with GPU pods")
    try:
        refs = [parse_image(name) for name in names]
        credentials = load_docker_credentials()
    except ScanError as exc:
        raise InputError(str(exc)) from None
    outcomes = asyncio.run(scan_all(refs, platform=platform, insecure=insecure,
                                    seconds=timeout, credentials=credentials))
    results = [o for o in outcomes if isinstance(o, ScanResult)]
    failures = [o for o in outcomes if isinstance(o, ScanError)]
    click.echo(render_entries(results), nl=False)
    for failure in failures:
        click.echo(f"error: {failure}", err=True)
    sys.exit(1 if failures else 0)
