"""``gpu-admission evaluate``: decide pods and workloads from files offline, exactly as the
webhook would (``cli``), with the DRA objects found in the same files (``dra``)."""
