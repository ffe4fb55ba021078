"""Compile the GPU sharing policy into Kubernetes' in-process admission: a
MutatingAdmissionPolicy and ValidatingAdmissionPolicies (``gpu-admission compile``), and
evaluate them offline (``gpu-admission evaluate --compiled``). See docs/compile.md."""
