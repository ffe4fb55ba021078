"""Where a GPU pod goes: pure placement decisions the ``gpu-aware-scheduler`` extender
(:mod:`gpu_admission.extender`, the I/O and HTTP face) serves (docs/extender.md).

* :mod:`.gpus`: the GPU snapshot values (what a poll of dcgm-exporter saw);
* :mod:`.score`: filter and score nodes for a pod from the policy and the snapshot;
* :mod:`.ledger`: the fractional GPUs' accounting (which share holds which card);
* :mod:`.fractional`: the card a fractional share goes to.

No I/O here (floor 1, docs/architecture.md).
"""
