"""Setting up a plan: the one function every caller uses to spend a VRAM budget on a ladder.

``run --vram``, ``serve --vram``, ``plan`` and :meth:`pyramid_gguf.Pyramid.load` all call
:func:`plan_ladder`: it reads the tiers' GGUF headers (:mod:`.memory`), resolves the budget
(:mod:`.vram`), takes the device profiles and acceptance traces (:mod:`.sources`), and ranks
every placement that fits the machine's RAM (:mod:`.ram`) by the speed ``auto`` is predicted to
reach (:mod:`.rank`); when none fits, one :class:`UserError` line says what is missing, before
anything is loaded. A preset is planned before download by :func:`plan_preset`, the same set-up
over each tier's file, shipped shape or hub header (:mod:`.tiers`). :func:`load_plan` turns the
winner into the tiers to load and each one's load config.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..core.errors import UserError
from ..core.ladder import LadderPaths
from ..core.load import LoadConfig
from ..core.spec import SpecConfig
from ..models.registry import get_preset
from . import sources
from .compose import DeviceProfile
from .links import WEIGHTS, Weights, card_pcie
from .memory import GiB, MiB, ModelMemory, model_memory
from .moe import ExpertUnion, load_routes, tier_curve, union_of
from .ram import RamBudget, overflow_bytes, resolve_ram, ssd_tps
from .rank import Placement, Ranking, Unfit, placements, rank, replay_plain, with_weights
from .tiers import preset_memory
from .vram import KvQuant, make_plan, resolve_budget, tier_load_config


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
    ram: str | int | None = None
    #: A mixture-of-experts target's recorded routes (``.npy``, ``native/routing.py``): the
    #: union of experts a block reads is measured on them, else random routing is assumed.
    routes: Path | None = None


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
    pcie = None
    if gpu_profile is not None:
        pcie = card_pcie(load.pcie, gpu_profile.pcie, gpu_profile.name)
        allowed = weights_allowed(load)
        if inputs.gpu_offload is None and "repacked" in allowed and len(allowed) > 1:
            from ..native.buffers import build_has_amx_kernels  # lazy: imports llama_cpp

            if build_has_amx_kernels():  # --no-host would load into the AMX buffer: refused
                allowed = tuple(w for w in allowed if w != "repacked")
        options = with_weights(options, allowed)
    ram = resolve_ram(inputs.ram)
    fits, unfit = options, []
    if ram is not None and options:
        fits = [p for p in options if host_need(p, offload) <= ram.usable_bytes]
        unfit = [
            _unfit(p, models, ram, offload, cpu.profile, gpu_profile)
            for p in options
            if p not in fits
        ]
        if not fits:
            raise UserError(_no_fit(name, options, models, ram, offload, load, budget, inputs))
    unions, experts = _unions(models["target"], inputs.routes)
    ranked = rank(
        fits, models, traces, cpu.profile, gpu_profile, spec=spec, unions=unions, pcie=pcie
    )
    return Ranking(
        tuple(ranked),
        traces,
        cpu.profile,
        gpu_profile,
        ladder=name,
        cpu_how=cpu.how,
        gpu_how=gpu.how if gpu else "",
        models=notes,
        ram=ram,
        unfit=tuple(unfit),
        experts=experts,
        pcie=pcie,
    )


def weights_allowed(load: LoadConfig) -> tuple[Weights, ...]:
    """The placements of CPU weights to rank: the one ``--no-host`` / ``--no-mmap`` names,
    else all three (:mod:`.links`)."""
    if load.no_host:
        return ("repacked",)
    if not load.use_mmap:
        return ("pinned",)
    return WEIGHTS


def _unions(target: ModelMemory, routes: Path | None) -> tuple[dict[str, ExpertUnion], str]:
    """The target's union of experts (measured on ``routes``, else random routing) and a line
    saying where it came from; nothing for a dense target."""
    if target.experts is None:
        if routes is not None:
            raise UserError(f"--routes: the target {target.path} is not a mixture of experts")
        return {}, ""
    unions: dict[str, ExpertUnion] = {}
    if routes is not None:
        measured = ExpertUnion.from_routes(load_routes(routes), target.experts.n_expert)
        unions["target"] = union_of(
            target, replace(measured, source=f"{routes}: {measured.source}")
        )
    u = unions.get("target") or union_of(target)
    line = (
        f"the target reads, per block, the attention and shared weights and the union of the "
        f"experts its tokens route to ({u.n_used} of {u.n_expert}), from {u.source}: "
        f"{u.ratio(4):.1f}x one token's expert bytes at 4 tokens, {u.ratio(8):.1f}x at 8"
    )
    return unions, line


def host_need(placement: Placement, offload: bool = True) -> int:
    """Host memory ``placement`` needs: its plan's host bytes (everything, GPU share included,
    when this build cannot offload)."""
    plan = placement.plan
    return plan.host_bytes + (0 if offload else plan.gpu_bytes)


def _unfit(
    p: Placement,
    models: Mapping[str, ModelMemory],
    ram: RamBudget,
    offload: bool,
    cpu: DeviceProfile,
    gpu: DeviceProfile | None,
) -> Unfit:
    need = host_need(p, offload)
    over = overflow_bytes(need, ram)
    target = p.plan.tier("target")
    curve = tier_curve(models["target"], p.n_gpu_layers("target"), p.n_cpu_moe("target"), cpu, gpu)
    plain = replay_plain(curve)
    cpu_weights = sum(t.cpu_weight_bytes for t in p.plan.tiers) + (
        0 if offload else target.gpu_weight_bytes
    )
    if p.weights != "mapped":  # pinned or repacked copies are not re-read from the file
        return Unfit(p, need, over, plain, 0.0)
    return Unfit(p, need, over, plain, ssd_tps(1.0 / plain, min(over, max(cpu_weights, 1))))


def _no_fit(
    name: str,
    options: Sequence[Placement],
    models: Mapping[str, ModelMemory],
    ram: RamBudget,
    offload: bool,
    load: LoadConfig,
    budget: int,
    inputs: PlanInputs,
) -> str:
    """The one line that says what is missing when no placement fits the RAM."""
    least = min(options, key=lambda p: host_need(p, offload))
    need = host_need(least, offload)
    line = (
        f"no placement of {name} fits the RAM: {ram.describe()}; the least any needs is "
        f"{need / GiB:.1f} GiB ({least.name}): {(need - ram.usable_bytes) / GiB:.1f} GiB more RAM"
    )
    if not offload:
        return line + " (this llama.cpp build cannot offload layers to a GPU)"
    vram = _vram_for(models["target"], ram, load, budget, inputs)
    if vram is None:
        return line + " (a bigger --vram cannot help: the target's CPU share alone is more)"
    return line + f", or --vram {vram} (where the target alone fits, more of it on the GPU)"


def _vram_for(
    target: ModelMemory, ram: RamBudget, load: LoadConfig, budget: int, inputs: PlanInputs
) -> str | None:
    """The smallest ``--vram`` (in steps of 512 MiB) at which the target alone fits ``ram``,
    or None when no budget does."""

    def need(vram: int) -> int:
        plan = make_plan([("target", target)], vram, load, kv_quant=inputs.kv_quant,
                         margin_bytes=inputs.margin)  # fmt: skip
        return plan.host_bytes

    step = 512 * MiB
    lo, hi = budget // step, -(-(2 * target.weight_bytes + 8 * GiB) // step)
    if need(hi * step) > ram.usable_bytes:
        return None
    while lo + 1 < hi:  # need(lo) too much, need(hi) fits
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if need(mid * step) <= ram.usable_bytes else (mid, hi)
    gib = hi * step / GiB
    return f"{gib:g}GiB"


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
    if ranking.pcie is not None:  # ranked with the weights' placements: load the winner's
        flags = placement.load_flags
        loads = {
            t: replace(c, use_mmap=flags["use_mmap"], no_host=flags["no_host"])
            for t, c in loads.items()
        }
    return LadderPaths(paths.target, qualifier, draft), loads


def describe(ranking: Ranking, vram: str | int) -> str:
    """One line: the placement chosen for ``vram``, its layers, its predicted speed and what
    that was predicted from."""
    best = ranking.best
    layers = ", ".join(f"{t} {best.placement.n_gpu_layers(t)}" for t in best.placement.tiers)
    profiles = ranking.cpu.name + (f" / {ranking.gpu.name}" if ranking.gpu else "")
    weights = ""
    if best.placement.weights != "mapped":
        flag = "--no-mmap" if best.placement.weights == "pinned" else "--no-host"
        weights = f", CPU weights {best.placement.weights} ({flag})"
    line = (
        f"--vram {vram}: {best.placement.name} (GPU layers: {layers}{weights}); predicted "
        f"{best.tps:.1f} tok/s, {best.speedup:.2f}x the best plain decoding, from traces of "
        f"{ranking.traces.ladder} and the {profiles} profiles (pyramid-gguf plan shows the "
        "ranking)"
    )
    if ranking.ram is not None:
        need = best.placement.plan.host_bytes
        line += f"; host RAM {need / GiB:.1f} of {ranking.ram.usable_bytes / GiB:.1f} GiB usable"
    if ranking.gpu is not None and ranking.gpu_how.startswith("default"):
        line += f"; GPU profile {ranking.gpu_how}"
    return line
