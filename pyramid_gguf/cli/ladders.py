"""From ladder flags to a loaded :class:`~pyramid_gguf.Pyramid`: presets, tuned configs, plans.

:func:`resolve_ladder` finds the files (a preset, fetched if missing, or the given paths) and
the base :class:`~pyramid_gguf.core.spec.SpecConfig` (what ``tune`` saved for this ladder, else
the preset's recommendation, else ``auto``); :func:`load_pyramid` loads them,
applying a ``--vram`` memory plan when asked.
"""

from __future__ import annotations

import click

from ..api import Pyramid
from ..core.spec import SpecConfig
from ..models.resolve import Resolved
from ..models.resolve import resolve_ladder as resolve
from .options import LadderArgs


def resolve_ladder(args: LadderArgs) -> Resolved:
    """The files and base spec the ladder flags name (the default preset when none)."""
    return resolve(args.preset, args.paths)


def load_pyramid(
    args: LadderArgs,
    resolved: Resolved,
    spec: SpecConfig,
    *,
    calibrate: bool | None = None,
    share_ngrams: bool = False,
) -> Pyramid:
    """Load ``resolved`` with the load flags of ``args`` and decode with ``spec``.

    ``calibrate`` (default: when ``spec`` is ``auto``, ``--strict-identity`` is on or several
    slots share batches, which the curves pad) reads or measures the tiers' cost curves now,
    saying so on stderr when it measures, so that no generation pays for it. A mode that needs
    a tier the ladder lacks fails before any model is loaded.
    """
    pyramid = Pyramid.load(
        resolved.paths,
        load=args.load,
        spec=spec,
        name=resolved.name,
        vram=args.vram,
        ram=None if args.ram == "auto" else args.ram,
        rpc=args.rpc,
        share_ngrams=share_ngrams,
        say=lambda m: click.echo(m, err=True),
    )
    wanted = spec.info.auto or args.load.strict_identity or args.load.parallel > 1
    if calibrate or (calibrate is None and wanted):
        try:
            pyramid.calibrate(say=lambda m: click.echo(m, err=True))
        except BaseException:
            pyramid.close()
            raise
    return pyramid
