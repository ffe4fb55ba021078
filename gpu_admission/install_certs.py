"""Placeholder: replaced by the module's owner."""

import click


@click.command(name="install-certs")
def install_certs() -> None:
    """Not implemented yet."""
    raise click.ClickException("not implemented yet")
