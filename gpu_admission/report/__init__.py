"""``gpu-admission report``: GPU waste from dcgm-exporter series in Prometheus (issue 10).

The face over :mod:`gpu_admission.usage` (queries, computation, shared with ``reclaim``):
``render`` and ``html`` (output), ``cli`` (the command, with ``reclaim``'s preview).
Docs: docs/report.md.
"""
