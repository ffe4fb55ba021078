"""gpu-admission: a Kubernetes admission webhook that makes GPU sharing safe.

The floor plan, lowest first (a package imports only its own storey or below; the README's
"How it is built", held by tests/test_layers.py):

* vocabulary -- :mod:`~gpu_admission.core` (names, the decision, CUDA, quantities, the patch
  builder, time ranges), :mod:`~gpu_admission.policy` (the policy model);
* pod facts -- :mod:`~gpu_admission.dra`, :mod:`~gpu_admission.facts` (fractional plan, other
  sharing systems, node pools, serving engines), :mod:`~gpu_admission.workloads`;
* admission core -- :mod:`~gpu_admission.rules`, :mod:`~gpu_admission.admission` (the pod's
  facts gathered once, the rules, the patch, the decision);
* clients -- :mod:`~gpu_admission.kube`, :mod:`~gpu_admission.usage` (Prometheus);
* faces -- the command line, the webhook server, the compiler, evaluate, placement and the
  extender, simulate, report, reclaim, audit, images, certificates.
"""

__version__ = "0.1.0"
