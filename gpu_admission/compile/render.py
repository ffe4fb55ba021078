"""Deterministic YAML for the compiled objects: same policy, same bytes.

Multi-line CEL is written as literal blocks (``|``) so it reads as code; every document gets a
header comment (YAML allows comments only outside scalars; the CEL itself carries ``//``
comments). Keys keep the compiler's order (no sorting: ``apiVersion, kind, metadata, spec``
reads naturally) and the compiler builds every mapping in a fixed order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from gpu_admission.policy.model import Policy

from .rules import WebhookOnly


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value or len(value) > 80:  # CEL: a literal block reads as code, never folded
        text = "\n".join(line.rstrip() for line in value.splitlines())
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _str)


def dump(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100,
                     default_flow_style=False)


def render(policy: Policy, objects: Sequence[dict[str, Any]], comments: Sequence[str],
           stays: dict[str, WebhookOnly] | None = None) -> str:
    """The YAML stream ``gpu-admission compile`` writes."""
    head = [f"# Compiled by `gpu-admission compile` from GPUSharingPolicy "
            f"{policy.metadata.name!r} ({policy.digest}).",
            "# Do not edit: change the policy and compile again (docs/compile.md).",
            "# Requires Kubernetes >= 1.36 (admissionregistration.k8s.io/v1 "
            "MutatingAdmissionPolicy)."]
    if stays:
        head.append("# Rules that stay with the webhook (--partial):")
        head += [f"#   {rule}: {s.field}: {s.why}" for rule, s in stays.items()]
    parts = []
    for index, (obj, comment) in enumerate(zip(objects, comments, strict=True)):
        lines = [f"# {line}" for line in _wrap(comment)]
        text = dump(obj)
        parts.append(("\n".join(head) + "\n" if index == 0 else "") + "\n".join(lines)
                     + "\n" + text)
    return "---\n".join(parts)


def _wrap(text: str, width: int = 96) -> list[str]:
    out: list[str] = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        out.append(line)
    return out
