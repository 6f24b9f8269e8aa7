"""``bench`` and ``tune`` (placeholder until the benchmark work lands)."""

import click


@click.command()
def bench() -> None:
    """Benchmark decoding modes."""
    raise click.ClickException("bench is not implemented yet")


@click.command()
def tune() -> None:
    """Tune speculative knobs."""
    raise click.ClickException("tune is not implemented yet")
