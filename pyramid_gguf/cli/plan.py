"""``plan`` (placeholder until the memory planner lands)."""

import click


@click.command()
def plan() -> None:
    """Plan GPU offload for a ladder."""
    raise click.ClickException("plan is not implemented yet")
