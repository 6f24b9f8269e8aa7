"""The click group of ``pyramid-gguf`` (and of its ``models`` noun group)."""

from __future__ import annotations

import sys
from typing import Any

import click

from .interrupts import interrupts_outside_callbacks
from .options import OneLineUsage, one_line


class PyramidGroup(OneLineUsage, click.Group):
    """A click group: bad command lines are one ``Error:`` line (exit 1), Ctrl-C exits 130."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as e:  # "No such command 'runn'. Did you mean 'run'?"
            raise one_line(e, ctx.command_path) from None

    def invoke(self, ctx: click.Context) -> Any:
        if ctx.parent is not None:  # a nested group: the top one handles Ctrl-C
            return super().invoke(ctx)
        try:
            with interrupts_outside_callbacks():
                return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
