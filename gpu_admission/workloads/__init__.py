"""Reading workloads: the pod templates of every kind ``evaluate`` understands (``kinds``,
pure) and the ``-f`` files and directories they come from (``files``, I/O)."""
