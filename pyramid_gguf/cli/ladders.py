"""From ladder flags to a loaded :class:`~pyramid_gguf.Pyramid`: presets, tuned configs, plans.

:func:`resolve_ladder` finds the files (a preset, fetched if missing, or the given paths) and
the base :class:`~pyramid_gguf.config.SpecConfig` (what ``tune`` saved for this ladder, else
the preset's recommendation, else ``auto``); :func:`load_pyramid` loads them,
applying a ``--vram`` memory plan when asked.
"""

from __future__ import annotations

from dataclasses import dataclass

import click

from ..api import Pyramid
from ..config import LoadConfig, SpecConfig
from ..ladder import LadderPaths
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
    resolved.paths.shape.check(spec.mode)  # before planning or loading anything
    paths, tier_loads = resolved.paths, None
    if args.vram is not None:
        paths, tier_loads = planned_ladder(args.vram, args.load, resolved, spec)
    pyramid = Pyramid.load(
        paths,
        load=args.load,
        spec=spec,
        name=resolved.name,
        tier_loads=tier_loads,
        share_ngrams=share_ngrams,
    )
    if calibrate or (calibrate is None and (spec.info.auto or args.load.strict_identity)):
        try:
            pyramid.calibrate(say=lambda m: click.echo(m, err=True))
        except BaseException:
            pyramid.close()
            raise
    return pyramid


def planned_ladder(
    vram: str, load: LoadConfig, resolved: Resolved, spec: SpecConfig
) -> tuple[LadderPaths, dict[str, LoadConfig]]:
    """The placement ``pyramid-gguf plan`` ranks first for ``--vram`` (a fixed mode keeps the
    tiers it needs): the tiers to load and each one's load config. Says on stderr what was
    chosen and what that was predicted from."""
    from ..models.memory import model_memory
    from ..models.planner import resolve_budget
    from ..native import supports_gpu_offload
    from ..planning import sources
    from ..planning.rank import load_plan, rank_ladder

    budget = resolve_budget(vram)
    models = {t: model_memory(p) for t, p in resolved.paths.model_files().items()}
    gpu = sources.gpu_profile() if supports_gpu_offload() else None
    traces = sources.traces_for(resolved.name)
    ranking = rank_ladder(models, budget, load, traces, sources.cpu_profile(), gpu, spec=spec)
    best = ranking.best
    layers = ", ".join(f"{t} {best.placement.n_gpu_layers(t)}" for t in best.placement.tiers)
    click.echo(
        f"--vram {vram}: {best.placement.name} (GPU layers: {layers}); predicted "
        f"{best.tps:.1f} tok/s, {best.speedup:.2f}x the best plain decoding, from traces of "
        f"{traces.ladder} and the {ranking.cpu.name}"
        + (f" / {ranking.gpu.name}" if ranking.gpu else "")
        + " profiles (pyramid-gguf plan shows the ranking)",
        err=True,
    )
    return load_plan(resolved.paths, ranking, load)
