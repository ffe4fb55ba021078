"""Dynamic Resource Allocation (``resource.k8s.io/v1``): GPU pods whose GPU comes from a
ResourceClaim instead of ``nvidia.com/gpu`` (issue 15, docs/dra.md).

Three layers, as everywhere in gpu-admission:

* :mod:`gpu_admission.dra.model`: the read-only snapshot of DeviceClasses, templates, claims
  and claim users the decision reads (plain dicts as the API serves them);
* :mod:`gpu_admission.dra.analysis`: pure functions pod + snapshot -> :class:`DraPod`, and
  the second rule set for ResourceClaims/ResourceClaimTemplates themselves;
* :mod:`gpu_admission.dra.offline`: the same snapshot built from files for ``evaluate``.

All of it is pure (floor 1, docs/architecture.md); the watch-backed cache the server
keeps, the only DRA I/O, is :mod:`gpu_admission.kube.dra`.
"""
