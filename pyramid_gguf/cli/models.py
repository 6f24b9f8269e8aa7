"""``models list``, ``pull`` and ``derive`` (placeholder until the model-ladder work lands)."""

import click


@click.group()
def models() -> None:
    """Model ladder presets."""


@click.command()
def pull() -> None:
    """Download a preset's models."""
    raise click.ClickException("pull is not implemented yet")


@click.command()
def derive() -> None:
    """Derive a tier from a GGUF."""
    raise click.ClickException("derive is not implemented yet")
