"""``gpu-admission report``: GPU waste from dcgm-exporter series in Prometheus (issue 10).

Layers: ``query`` (Prometheus HTTP API, chunked, I/O), ``compute`` and ``sharing`` (pure),
``render`` and ``html`` (output), ``cli`` (the command). Docs: docs/report.md.
"""
