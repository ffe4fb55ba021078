"""``gpu-admission reclaim``: act on the idle GPUs the report finds, safely (docs/reclaim.md).

``idle`` and ``plan`` are pure (data in, frozen plan out); ``kube`` and ``controller`` do the
I/O (Prometheus, the Kubernetes API, the decision log, the loop); ``cli`` is the command.
"""
