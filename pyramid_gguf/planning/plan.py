"""Setting up a plan: the one function every caller uses to spend a VRAM budget on a ladder.

``run --vram``, ``serve --vram``, ``plan`` and :meth:`pyramid_gguf.Pyramid.load` all call
:func:`plan_ladder`: it reads the tiers' GGUF headers (:mod:`.memory`), resolves the budget
(:mod:`.vram`), takes the device profiles and acceptance traces (:mod:`.sources`), and ranks
every placement by the speed ``auto`` is predicted to reach (:mod:`.rank`). :func:`load_plan`
turns the winner into the tiers to load and each one's load config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.ladder import LadderPaths
from ..core.load import LoadConfig
from ..core.spec import SpecConfig
from . import sources
from .memory import model_memory
from .rank import Ranking, placements, rank
from .vram import KvQuant, resolve_budget, tier_load_config


@dataclass(frozen=True)
class PlanInputs:
    """What a plan is predicted from, beyond the ladder and the budget.

    ``traces``: an acceptance trace file (None: the ladder's own, else the shipped ones),
    ``sets`` of it only (empty: all). ``cpu`` / ``gpu``: device profile files (None: the
    user's, else the shipped ones). ``gpu_offload``: price GPU layers at all (None: when this
    llama.cpp build can offload). ``kv_quant`` / ``margin``: the memory planner's options.
    """

    traces: Path | None = None
    sets: tuple[str, ...] = ()
    cpu: Path | None = None
    gpu: Path | None = None
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
    inputs = inputs or PlanInputs()
    spec = spec or SpecConfig(mode="auto")
    budget = vram if isinstance(vram, int) else resolve_budget(vram)
    models = {tier: model_memory(p) for tier, p in paths.model_files().items()}
    traces = sources.traces_for(name or paths.target.stem, inputs.traces)
    if inputs.sets:
        traces = traces.select(list(inputs.sets))
    offload = inputs.gpu_offload
    if offload is None:
        from ..native import supports_gpu_offload  # lazy: native imports llama_cpp

        offload = supports_gpu_offload()
    gpu = sources.gpu_profile(inputs.gpu) if offload else None
    options = [
        p
        for p in placements(models, budget, load, kv_quant=inputs.kv_quant, margin=inputs.margin)
        if spec.info.auto or p.shape.runs(spec.mode)
    ]
    cpu = sources.cpu_profile(inputs.cpu)
    return Ranking(tuple(rank(options, models, traces, cpu, gpu, spec=spec)), traces, cpu, gpu)


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
    return (
        f"--vram {vram}: {best.placement.name} (GPU layers: {layers}); predicted "
        f"{best.tps:.1f} tok/s, {best.speedup:.2f}x the best plain decoding, from traces of "
        f"{ranking.traces.ladder} and the {profiles} profiles (pyramid-gguf plan shows the "
        "ranking)"
    )
