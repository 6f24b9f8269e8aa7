"""Entry point: the ``pyramid-gguf`` click group and its user-error handling.

Every :class:`~pyramid_gguf.errors.UserError` raised below a command becomes one line on stderr
(``Error: ...``) and exit status 1, never a traceback. Ctrl-C exits 130 quietly.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from ..errors import UserError


class PyramidGroup(click.Group):
    """A click group that turns user errors into one-line messages."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as e:
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


@click.group(cls=PyramidGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pyramid-gguf")
def main() -> None:
    """Pyramid speculative decoding for GGUF models: draft -> qualifier -> target."""


def _register() -> None:
    from . import bench, models, plan, run, serve

    main.add_command(run.run)
    main.add_command(models.models)
    main.add_command(models.pull)
    main.add_command(models.derive)
    main.add_command(plan.plan)
    main.add_command(bench.bench)
    main.add_command(bench.tune)
    main.add_command(serve.serve)


_register()
