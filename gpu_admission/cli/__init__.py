"""The ``gpu-admission`` command line: one group, one module per sub-command.

Sub-commands are imported only when invoked (click's documented lazy-group pattern,
https://click.palletsprojects.com/en/stable/complex/#lazily-loading-subcommands), so
``gpu-admission audit`` does not pay for importing the server and the kubernetes client.
"""

from __future__ import annotations

import importlib

import click

from gpu_admission import __version__

# command name -> "module:object"
SUBCOMMANDS = {
    "evaluate": "gpu_admission.evaluate.cli:evaluate",
    "serve": "gpu_admission.server.cli:serve",
    "certs": "gpu_admission.certs.bundle:certs",
    "install-certs": "gpu_admission.certs.install:install_certs",
    "audit": "gpu_admission.auditlog.cli:audit",
    "images": "gpu_admission.images.cli:images",
    "extender": "gpu_admission.extender.cli:extender",
    "report": "gpu_admission.report.cli:report",
    "compile": "gpu_admission.compile.cli:compile_command",
    "reclaim": "gpu_admission.reclaim.cli:reclaim",
    "reserve": "gpu_admission.extender.reserve:reserve",
    "simulate": "gpu_admission.simulate.cli:simulate_command",
}


class LazyGroup(click.Group):
    """A group whose sub-commands are named up front and imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, name = target.partition(":")
        command = getattr(importlib.import_module(module), name)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpu-admission")
def main() -> None:
    """Admission webhook that makes GPU sharing on Kubernetes safe and automatic."""
