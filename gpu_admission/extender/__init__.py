"""The ``gpu-aware-scheduler`` extender: kube-scheduler's extender/v1 protocol, GPU placement
from dcgm-exporter metrics read through Prometheus (``gpu-admission extender``).

Layers: :mod:`.gpustate` (Prometheus poller and parsing), :mod:`.binder` (the fractional GPUs'
watch and bind), :mod:`.app` (HTTP wire), :mod:`.cli` (command line); the pure decisions they
serve are :mod:`gpu_admission.placement`. See docs/extender.md.
"""
