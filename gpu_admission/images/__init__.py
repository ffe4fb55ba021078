"""``gpu-admission images scan``: read each image's CUDA from its registry and print the
``spec.cudaRouting.images`` entries that route it (see ``docs/images.md``).

Three layers: :mod:`~gpu_admission.images.registry` speaks the OCI distribution API (HTTP,
auth), :mod:`~gpu_admission.images.scan` is the pure logic (references, manifests, platform
choice, CUDA from the image environment, rendering), :mod:`~gpu_admission.images.cli` is the
command. The webhook itself never calls a registry.
"""
