"""One spelling across the commands (issue 33): ``-o/--output FORMAT`` for formats,
``--out FILE`` for files, ``--kubeconfig FILE`` for every command that talks to a cluster.

Old spellings stay for one release as hidden aliases (:func:`aliases`): they still work,
print one deprecation line on stderr, and clash with the new spelling when both are given.

Where a command's cluster comes from (:func:`resolve_kubeconfig`): ``--kubeconfig FILE`` (or
``in-cluster``), else ``$KUBECONFIG``, else ``~/.kube/config`` when it exists, else the pod's
ServiceAccount when running in a pod (``KUBERNETES_SERVICE_HOST`` is set). This module imports
no Kubernetes client: the lazily loaded commands stay quick to start.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

import click

from gpu_admission.core.vocab import IN_CLUSTER

KUBECONFIG_ENV: Final = "KUBECONFIG"
DEFAULT_KUBECONFIG: Final = Path("~/.kube/config")
IN_POD_ENV: Final = "KUBERNETES_SERVICE_HOST"  # set by the kubelet in every container

F = TypeVar("F", bound=Callable[..., Any])


class NoClusterError(click.UsageError):
    """No --kubeconfig, no $KUBECONFIG, no ~/.kube/config and not in a pod."""


def resolve_kubeconfig(value: str | None, *, environ: Mapping[str, str] | None = None,
                       home: Path | None = None) -> str:
    """The cluster source for ``--kubeconfig VALUE``: VALUE when given (a file or
    ``in-cluster``), else ``$KUBECONFIG`` (one path or a ``:``-separated list, as kubectl
    reads it), else ``~/.kube/config`` when it exists, else ``in-cluster`` inside a pod.
    Raises :class:`NoClusterError` (a usage error naming the four ways) otherwise."""
    env = os.environ if environ is None else environ
    if value:
        return value
    if env.get(KUBECONFIG_ENV):
        return env[KUBECONFIG_ENV]
    default = (home / ".kube" / "config") if home is not None else \
        DEFAULT_KUBECONFIG.expanduser()
    if default.is_file():
        return str(default)
    if env.get(IN_POD_ENV):
        return IN_CLUSTER
    raise NoClusterError(
        "no cluster to talk to: pass --kubeconfig FILE, set KUBECONFIG, create "
        "~/.kube/config, or run in a pod (its ServiceAccount)")


def _dest(flag: str) -> str:
    return "alias_" + flag.lstrip("-").replace("-", "_")


def aliases(dest: str, new: str, *old: str, **option: Any) -> Callable[[F], F]:
    """Hidden deprecated spellings ``old`` of the option ``new`` (whose parameter is
    ``dest``), for one release: the value given under an old spelling becomes ``dest``'s,
    with ``warning: OLD is deprecated; use NEW`` on stderr. Giving both is a usage error.
    Put it above the option ``new`` (and above ``click.pass_context``); ``option``: more
    keyword arguments of the hidden options (``type``, as the new option's)."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = click.get_current_context()
            for flag in old:
                value = kwargs.pop(_dest(flag))
                if value is None:
                    continue
                source = ctx.get_parameter_source(dest)
                if source is click.core.ParameterSource.COMMANDLINE:
                    raise click.UsageError(f"{flag} is the old spelling of {new}: give one")
                click.echo(f"warning: {flag} is deprecated and goes in the next release; "
                           f"use {new}", err=True)
                kwargs[dest] = value
            return func(*args, **kwargs)

        for flag in old:
            wrapper = click.option(flag, _dest(flag), default=None, hidden=True,
                                   help=f"Deprecated spelling of {new}.", **option)(wrapper)
        return wrapper  # type: ignore[return-value]

    return decorate


def kubeconfig_option(*old: str, help: str) -> Callable[[F], F]:
    """``--kubeconfig FILE|in-cluster`` (parameter ``kubeconfig``, default None: the command
    resolves it with :func:`resolve_kubeconfig` when it needs a cluster) and the old
    spellings ``old`` as deprecated aliases."""

    def decorate(func: F) -> F:
        func = aliases("kubeconfig", "--kubeconfig", *old)(func)
        return click.option("--kubeconfig", "kubeconfig", default=None,
                            metavar="FILE|in-cluster", help=help)(func)

    return decorate
