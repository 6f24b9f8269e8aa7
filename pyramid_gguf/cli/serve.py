"""``serve`` (placeholder until the server work lands)."""

import click


@click.command()
def serve() -> None:
    """OpenAI-compatible server."""
    raise click.ClickException("serve is not implemented yet")
