"""The ``gpu-admission`` command line: one group, one module per sub-command."""

from __future__ import annotations

import click

from gpu_admission import __version__
from gpu_admission.auditlog.cli import audit
from gpu_admission.certs import certs
from gpu_admission.evaluate_cli import evaluate
from gpu_admission.install_certs import install_certs
from gpu_admission.server.cli import serve


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpu-admission")
def main() -> None:
    """Admission webhook that makes GPU sharing on Kubernetes safe and automatic."""


main.add_command(evaluate)
main.add_command(serve)
main.add_command(certs)
main.add_command(install_certs)
main.add_command(audit)
