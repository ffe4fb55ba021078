"""The ``gpu-aware-scheduler`` extender: kube-scheduler's extender/v1 protocol, GPU placement
from dcgm-exporter metrics read through Prometheus (``gpu-admission extender``).

Layers: :mod:`.gpustate` (Prometheus poller and parsing), :mod:`.placement` (pure decisions),
:mod:`.app` (HTTP wire), :mod:`.cli` (command line). See docs/extender.md.
"""
