"""The wire layer: AdmissionReview over HTTPS (aiohttp), probes, metrics, hot reload.

Entry points: :func:`gpu_admission.server.app.create_app` (the aiohttp application for a
:class:`gpu_admission.server.config.ServerConfig`), :mod:`gpu_admission.server.run` (listen,
graceful stop) and the ``gpu-admission serve`` command in :mod:`gpu_admission.server.cli`.
User documentation: ``docs/server.md``.
"""
