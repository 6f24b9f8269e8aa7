"""Entry point: the ``pyramid-gguf`` click group.

Every command is a :class:`~.options.PyramidCommand`: a
:class:`~pyramid_gguf.errors.UserError` becomes one line on stderr (``Error: ...``) and exit
status 1, never a traceback. The group turns Ctrl-C into a quiet exit 130.
"""

from __future__ import annotations

import sys
from typing import Any

import click


class PyramidGroup(click.Group):
    """A click group that exits quietly (130) on Ctrl-C."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


@click.group(cls=PyramidGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pyramid-gguf")
def main() -> None:
    """Pyramid speculative decoding for GGUF models: draft -> qualifier -> target."""


def _register() -> None:
    from . import bench, calibrate, models, plan, run, serve, traces, tune

    main.add_command(run.run)
    main.add_command(models.models)
    main.add_command(models.pull)
    main.add_command(models.derive)
    main.add_command(plan.plan)
    main.add_command(bench.bench)
    main.add_command(tune.tune)
    main.add_command(calibrate.calibrate)
    main.add_command(traces.traces)
    main.add_command(serve.serve)


_register()
