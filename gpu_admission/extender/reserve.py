"""``gpu-admission reserve``: the process of a reservation pod (fractional GPU pools).

The extender's bind creates a reservation pod holding one whole ``nvidia.com/gpu`` on a
node; the device plugin hands it one card and the NVIDIA runtime makes that card the only one
the container sees. This command asks NVML which card that is (its UUID, ``GPU-...``), writes
it on its own pod as the annotation :data:`~gpu_admission.core.vocab.GPU_UUID_ANNOTATION` (merge
patch; pod name and namespace from the downward API, env ``POD_NAME``/``POD_NAMESPACE``), and
then sleeps until SIGTERM so the pod keeps the card. KAI-Scheduler does the same
(``pkg/resourcereservation/discovery/discovery.go``).

NVML comes from ``nvidia-ml-py`` (import name ``pynvml``), which loads ``libnvidia-ml.so.1``
that the NVIDIA container runtime mounts into GPU containers. Without it, or when NVML fails,
the command exits non-zero with the reason: the bind waiting for the UUID then times out with
a clear error and deletes this pod. The real NVML path runs only on a GPU node (CI has no GPU;
docs/extender.md says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

import click

from gpu_admission.cli.options import kubeconfig_option, resolve_kubeconfig
from gpu_admission.core.vocab import GPU_UUID_ANNOTATION


class ReserveError(RuntimeError):
    """NVML absent or failing, or the container sees other than one GPU."""


def gpu_uuid() -> str:
    """The UUID of the one GPU this container was given, read through NVML."""
    try:
        import pynvml  # noqa: PLC0415 - only this command needs NVML
    except ImportError as exc:
        raise ReserveError(f"NVML bindings not installed (Python package nvidia-ml-py, "
                           f"module pynvml): {exc}") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise ReserveError(f"NVML initialisation failed: {exc} (is this container run by "
                           f"the NVIDIA runtime with a GPU, i.e. libnvidia-ml.so.1 mounted?)"
                           ) from None
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count != 1:
            raise ReserveError(f"NVML sees {count} GPUs, expected exactly the 1 the device "
                               f"plugin gave this pod (nvidia.com/gpu: 1)")
        uuid: Any = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    except pynvml.NVMLError as exc:
        raise ReserveError(f"NVML could not read the GPU's UUID: {exc}") from None
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    value = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    if not value.startswith(("GPU-", "MIG-")):
        raise ReserveError(f"NVML returned {value!r}, not a GPU UUID (GPU-...)")
    return value


def publish(source: str, namespace: str, name: str, uuid: str) -> None:
    """Annotate our own pod with the UUID (JSON merge patch). Blocking."""
    from gpu_admission.kube import client as kube  # noqa: PLC0415 - kubernetes: slow import

    api = kube.api_client(source, pool_size=1)
    try:
        kube.request(api, "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}",
                     body={"metadata": {"annotations": {GPU_UUID_ANNOTATION: uuid}}},
                     content_type=kube.MERGE_PATCH)
    finally:
        api.close()  # type: ignore[no-untyped-call]


async def _hold() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


@click.command(name="reserve", short_help="Hold a GPU for a reservation pod.")
@kubeconfig_option("--kube", help="How to reach the API server: a kubeconfig file or "
                   "in-cluster. Default: $KUBECONFIG, ~/.kube/config, then in-cluster.")
@click.option("--hold/--no-hold", default=True, show_default=True,
              help="After publishing, sleep until SIGTERM (keeps the GPU reserved).")
def reserve(kubeconfig: str | None, hold: bool) -> None:
    """Publish the UUID of this reservation pod's GPU on the pod, then hold the GPU."""
    missing = [v for v in ("POD_NAME", "POD_NAMESPACE") if not os.environ.get(v)]
    if missing:
        raise click.ClickException(f"{', '.join(missing)} not set: expected the pod's name "
                                   f"and namespace from the downward API (fieldRef "
                                   f"metadata.name / metadata.namespace)")
    name, namespace = os.environ["POD_NAME"], os.environ["POD_NAMESPACE"]
    try:
        uuid = gpu_uuid()
    except ReserveError as exc:
        raise click.ClickException(str(exc)) from None
    source = resolve_kubeconfig(kubeconfig)
    try:
        publish(source, namespace, name, uuid)
    except Exception as exc:
        raise click.ClickException(f"cannot annotate pod {namespace}/{name} with "
                                   f"{GPU_UUID_ANNOTATION}={uuid}: {exc}") from None
    click.echo(f"gpu-admission reserve: {namespace}/{name} holds {uuid}", err=True)
    if hold:
        asyncio.run(_hold())
