"""From ladder flags to a loaded :class:`~pyramid_gguf.Pyramid`: presets, tuned configs, plans.

:func:`resolve_ladder` finds the files (a preset, fetched if missing, or the given paths) and
the base :class:`~pyramid_gguf.config.SpecConfig` (what ``tune`` saved for this ladder, else
the preset's recommendation, else ``auto``); :func:`load_pyramid` loads them,
applying a ``--vram`` memory plan when asked.
"""

from __future__ import annotations

from dataclasses import dataclass

import click

from ..config import LoadConfig, SpecConfig
from ..ladder import LadderPaths
from ..modes import check_mode
from ..serving.api import Pyramid
from .options import LadderArgs


@dataclass(frozen=True)
class Resolved:
    """A ladder's files, its base spec and its display name."""

    name: str
    paths: LadderPaths
    spec: SpecConfig


def resolve_ladder(args: LadderArgs) -> Resolved:
    """The files and base spec the ladder flags name (the default preset when none)."""
    from ..bench.tune import load_tuned

    if args.paths is None:
        from ..models.presets import DEFAULT_PRESET, resolve_preset

        r = resolve_preset(args.preset or DEFAULT_PRESET)
        resolved = Resolved(r.name, r.paths, r.spec)
    else:
        paths = args.paths
        resolved = Resolved(paths.target.stem, paths, SpecConfig())
    tuned = load_tuned(resolved.paths)
    return resolved if tuned is None else Resolved(resolved.name, resolved.paths, tuned)


def load_pyramid(
    args: LadderArgs,
    resolved: Resolved,
    spec: SpecConfig,
    *,
    calibrate: bool | None = None,
    share_ngrams: bool = False,
) -> Pyramid:
    """Load ``resolved`` with the load flags of ``args`` and decode with ``spec``.

    ``calibrate`` (default: when ``spec`` is ``auto`` or ``--strict-identity`` is on) reads or
    measures the tiers' cost curves now, saying so on stderr when it measures, so that no
    generation pays for it. A mode that needs a tier the ladder lacks fails before any model
    is loaded.
    """
    paths = resolved.paths
    check_mode(
        spec.mode, has_draft=paths.draft is not None, has_qualifier=paths.qualifier is not None
    )
    pyramid = Pyramid.load(
        paths,
        load=args.load,
        spec=spec,
        name=resolved.name,
        tier_loads=_planned_loads(args.vram, args.load, paths),
        share_ngrams=share_ngrams,
    )
    if calibrate or (calibrate is None and (spec.info.auto or args.load.strict_identity)):
        try:
            pyramid.calibrate(say=lambda m: click.echo(m, err=True))
        except BaseException:
            pyramid.close()
            raise
    return pyramid


def _planned_loads(
    vram: str | None, load: LoadConfig, paths: LadderPaths
) -> dict[str, LoadConfig] | None:
    """Per-tier load configs from the memory planner when ``--vram`` is given."""
    if vram is None:
        return None
    from ..models.planner import plan_ladder, resolve_budget, tier_load_config

    plan = plan_ladder(resolve_budget(vram), paths, load)
    return {tier: tier_load_config(plan, tier, load) for tier in plan.tier_names}
