"""GPU usage from dcgm-exporter series in Prometheus, read by ``report`` and ``reclaim``: the
Prometheus HTTP client (``prom``), the fetched values (``data``), the chunked queries
(``query``, I/O), utilisation, waste and idle runs (``compute``, ``sharing``, pure)."""
