"""Kubernetes I/O shared by every face that talks to the API server: the client built from a
kubeconfig or the pod's ServiceAccount (:mod:`.client`) and the one list/watch cache machinery
(:mod:`.watch`) that the webhook's DRA cache (:mod:`.dra`) and the extender's GPU ledger both
use."""
