"""What a pod is and asks for, read the same way by every face: a fractional GPU's plan
(``fractional``), other GPU-sharing systems' pods (``other_systems``), the node pools from
GPU Feature Discovery's labels (``nodepools``), serving engines' memory settings
(``serving_engines``). Pure, below the rules."""
