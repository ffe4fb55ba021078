"""Placeholder: replaced by the module's owner."""

import click


@click.group(name="audit")
def audit() -> None:
    """Not implemented yet."""
    raise click.ClickException("not implemented yet")
