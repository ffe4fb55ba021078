"""Placeholder contract (owner: policy engine). Replaced by the real policy model."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel


class PolicyError(ValueError):
    """A policy file that cannot be used; the message names the field path."""


class Policy(BaseModel):
    """The GPUSharingPolicy document."""

    @property
    def digest(self) -> str:
        """Short stable hash of the policy content, for audit records."""
        raise NotImplementedError


def default_policy() -> Policy:
    raise NotImplementedError


def load_policy(path: Path) -> Policy:
    """Read and validate a policy file; raise PolicyError naming the field on bad input."""
    raise NotImplementedError
