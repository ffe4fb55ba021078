"""The admission core: a pod's facts gathered once, then the rules, then the patch
(``engine``), and the second rule set for ResourceClaims and their templates (``claims``).
Pure: the faces (webhook server, ``evaluate``, compiler, extender) call it, never the other way."""
