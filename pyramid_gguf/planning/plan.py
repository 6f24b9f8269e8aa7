"""Setting up a plan: the one function every caller uses to spend a VRAM budget on a ladder.

``run --vram``, ``serve --vram``, ``plan`` and :meth:`pyramid_gguf.Pyramid.load` all call
:func:`plan_ladder`: it reads the tiers' GGUF headers (:mod:`.memory`), resolves the budget
(:mod:`.vram`), takes the device profiles and acceptance traces (:mod:`.sources`), and ranks
every placement by the speed ``auto`` is predicted to reach (:mod:`.rank`). A preset is
planned before download by :func:`plan_preset`, the same set-up over each tier's file, shipped
shape or hub header (:mod:`.tiers`). :func:`load_plan` turns the winner into the tiers to load
and each one's load config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..core.ladder import LadderPaths
from ..core.load import LoadConfig
from ..core.spec import SpecConfig
from ..models.registry import get_preset
from . import sources
from .memory import ModelMemory, model_memory
from .rank import Ranking, placements, rank
from .tiers import preset_memory
from .vram import KvQuant, resolve_budget, tier_load_config


@dataclass(frozen=True)
class PlanInputs:
    """What a plan is predicted from, beyond the ladder and the budget.

    ``traces``: an acceptance trace file (None: the ladder's own, else the shipped ones),
    ``sets`` of it only (empty: all). ``cpu`` / ``gpu``: a shipped device profile's name or a
    profile file (None: the user's measured one, else for the GPU the detected card's, else a
    default consumer card and desktop CPU; :mod:`.sources`). ``detect``: ask llama.cpp which
    GPU this is. ``gpu_offload``: price GPU layers at all (None: when this llama.cpp build can
    offload). ``kv_quant`` / ``margin``: the memory planner's options.
    """

    traces: Path | None = None
    sets: tuple[str, ...] = ()
    cpu: str | Path | None = None
    gpu: str | Path | None = None
    detect: bool = True
    gpu_offload: bool | None = None
    kv_quant: KvQuant = "off"
    margin: int | None = None


def plan_ladder(
    paths: LadderPaths,
    vram: str | int,
    load: LoadConfig,
    *,
    name: str | None = None,
    spec: SpecConfig | None = None,
    inputs: PlanInputs | None = None,
) -> Ranking:
    """Rank every placement of ``paths`` in ``vram`` (a ``--vram`` value, or bytes) that can run
    ``spec``'s mode (any, for ``auto``): a fixed mode keeps the tiers it needs. ``name`` picks
    the ladder's own traces (default: the target file's stem)."""
    models = {tier: model_memory(p) for tier, p in paths.model_files().items()}
    return _plan(models, (), vram, load, name or paths.target.stem, spec, inputs)


def plan_preset(
    preset: str,
    vram: str | int,
    load: LoadConfig,
    *,
    spec: SpecConfig | None = None,
    inputs: PlanInputs | None = None,
    hub: bool = False,
) -> Ranking:
    """:func:`plan_ladder` for a ``models.toml`` preset, with or without its files: each
    tier's memory facts from its file, else its shipped shape, else its header on the hub
    (``hub``: the hub before the shape; :mod:`.tiers`)."""
    facts = preset_memory(get_preset(preset), hub=hub)
    return _plan(facts.models, facts.notes, vram, load, preset, spec, inputs)


def _plan(
    models: Mapping[str, ModelMemory],
    notes: tuple[str, ...],
    vram: str | int,
    load: LoadConfig,
    name: str,
    spec: SpecConfig | None,
    inputs: PlanInputs | None,
) -> Ranking:
    inputs = inputs or PlanInputs()
    spec = spec or SpecConfig(mode="auto")
    budget = vram if isinstance(vram, int) else resolve_budget(vram)
    traces = sources.traces_for(name, inputs.traces)
    if inputs.sets:
        traces = traces.select(list(inputs.sets))
    offload = inputs.gpu_offload
    if offload is None:
        from ..native import supports_gpu_offload  # lazy: native imports llama_cpp

        offload = supports_gpu_offload()
    gpu = sources.gpu_profile(inputs.gpu, detect=inputs.detect) if offload else None
    options = [
        p
        for p in placements(models, budget, load, kv_quant=inputs.kv_quant, margin=inputs.margin)
        if spec.info.auto or p.shape.runs(spec.mode)
    ]
    cpu = sources.cpu_profile(inputs.cpu)
    gpu_profile = gpu.profile if gpu else None
    ranked = rank(options, models, traces, cpu.profile, gpu_profile, spec=spec)
    return Ranking(
        tuple(ranked),
        traces,
        cpu.profile,
        gpu_profile,
        ladder=name,
        cpu_how=cpu.how,
        gpu_how=gpu.how if gpu else "",
        models=notes,
    )


def load_plan(
    paths: LadderPaths, ranking: Ranking, base: LoadConfig
) -> tuple[LadderPaths, dict[str, LoadConfig]]:
    """The ladder to load for ``ranking``'s best placement: ``paths`` without the tiers it
    drops (an n-gram draft stays) and each kept tier's load config (its GPU layers, op offload
    and KV cache types from the placement's plan)."""
    placement = ranking.best.placement
    kept = placement.tiers
    draft = paths.draft if paths.ngram or "draft" in kept else None
    qualifier = paths.qualifier if "qualifier" in kept else None
    loads = {t: tier_load_config(placement.plan, t, base) for t in kept}
    return LadderPaths(paths.target, qualifier, draft), loads


def describe(ranking: Ranking, vram: str | int) -> str:
    """One line: the placement chosen for ``vram``, its layers, its predicted speed and what
    that was predicted from."""
    best = ranking.best
    layers = ", ".join(f"{t} {best.placement.n_gpu_layers(t)}" for t in best.placement.tiers)
    profiles = ranking.cpu.name + (f" / {ranking.gpu.name}" if ranking.gpu else "")
    line = (
        f"--vram {vram}: {best.placement.name} (GPU layers: {layers}); predicted "
        f"{best.tps:.1f} tok/s, {best.speedup:.2f}x the best plain decoding, from traces of "
        f"{ranking.traces.ladder} and the {profiles} profiles (pyramid-gguf plan shows the "
        "ranking)"
    )
    if ranking.gpu is not None and ranking.gpu_how.startswith("default"):
        line += f"; GPU profile {ranking.gpu_how}"
    return line
