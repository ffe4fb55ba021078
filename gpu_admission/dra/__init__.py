"""Dynamic Resource Allocation (``resource.k8s.io/v1``): GPU pods whose GPU comes from a
ResourceClaim instead of ``nvidia.com/gpu`` (issue 15, docs/dra.md).

Two modules:

* :mod:`gpu_admission.dra.model`: the read-only snapshot of DeviceClasses, templates, claims
  and claim users the decision reads (plain dicts as the API serves them);
* :mod:`gpu_admission.dra.analysis`: pure functions pod + snapshot -> :class:`DraPod`, and
  the sharing findings of ResourceClaims/ResourceClaimTemplates themselves.

Both are pure and sit below the rules (the pod facts storey). Around them: the second rule
set, for claims and templates at their own CREATE, is :mod:`gpu_admission.admission.claims`;
the same snapshot built from files for ``evaluate`` is :mod:`gpu_admission.evaluate.dra`; the
watch-backed cache the server keeps, the only DRA I/O, is :mod:`gpu_admission.kube.dra`.
"""
