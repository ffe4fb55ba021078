"""The webhook's certificates: a private CA and its serving certificate (``bundle``, with the
``gpu-admission certs`` command) and the ``install-certs`` job that keeps the cluster's Secret
and webhook configurations in step (``install``)."""
