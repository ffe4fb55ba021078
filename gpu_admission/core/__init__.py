"""The policy's vocabulary and small pure helpers every floor reads: label and resource names
(``vocab``), the decision value (``decision``), CUDA versions from image names (``cuda``),
quantities, the RFC 6902 patch builder (``patch``), time ranges and working hours
(``timeframe``). Imports nothing else of gpu_admission; no I/O."""
