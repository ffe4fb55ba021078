"""gpu-admission: a Kubernetes admission webhook that makes GPU sharing safe.

Layers (no I/O in the middle):

* wire   -- :mod:`gpu_admission.server`: AdmissionReview decode/encode, HTTP, TLS.
* policy -- :mod:`gpu_admission.engine` and :mod:`gpu_admission.rules`: pure functions
  ``pod dict + RequestFacts + Policy -> Decision``.
* patch  -- :mod:`gpu_admission.patch`: the decision's changes as RFC 6902 operations.
"""

__version__ = "0.1.0"
