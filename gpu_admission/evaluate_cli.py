"""Placeholder: replaced by the module's owner."""

import click


@click.command(name="evaluate")
def evaluate() -> None:
    """Not implemented yet."""
    raise click.ClickException("not implemented yet")
