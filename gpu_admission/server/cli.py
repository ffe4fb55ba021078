"""Placeholder: replaced by the module's owner."""

import click


@click.command(name="serve")
def serve() -> None:
    """Not implemented yet."""
    raise click.ClickException("not implemented yet")
