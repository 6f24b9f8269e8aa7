"""A ladder loaded for :meth:`Pyramid.load <pyramid_gguf.api.Pyramid.load>`: the placement the
planner ranks first under a VRAM budget, or each tier's layers on llama.cpp RPC servers, then
every model file loaded and checked (:func:`~pyramid_gguf.decoding.runtime.tiers.load_ladder`),
with as many recurrent-state snapshots as the mode can drop in one rollback
(:func:`rollback_depth`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from ..core.ladder import LadderPaths
from ..core.load import LoadConfig
from ..core.remote import RpcConfig
from ..core.spec import SpecConfig
from ..decoding.runtime.tiers import Ladder, load_ladder

#: Recurrent-state snapshots ``auto`` keeps on a hybrid target, so its blocks (capped at this
#: many tokens there, decoding/runtime/auto.py) always roll back natively. Each snapshot costs
#: every evaluation (llama.cpp writes the conv states once per snapshot, per recurrent layer):
#: plain decoding on the synthetic hybrid, interleaved against none, cost 0% at 4 snapshots,
#: 2% at 8, 9% at 16 (docs/BENCHMARKS.md). llama.cpp's ``draft-mtp`` keeps its ``--draft-max``,
#: 3 by default.
AUTO_DEPTH = 4


def rollback_depth(spec: SpecConfig) -> int:
    """The most tokens one rollback of ``spec``'s mode drops from a single evaluation: what a
    hybrid target needs of llama.cpp's recurrent-state snapshots (``n_rs_seq``) so that every
    rejected round rolls back natively (native/rollback.py). Plain decoding never rolls back
    (0: no snapshot is written at every token); a fixed chain drops at most its blocks
    (``l_d``, and ``l_q`` under a qualifier); ``auto`` at most :data:`AUTO_DEPTH` (its blocks
    on such a target are no longer). A longer drop, or a mode run on a context loaded for
    another, still rolls back exactly, through a saved state."""
    info = spec.info
    if info.auto:
        return min(spec.max_block, AUTO_DEPTH)
    if info.n_tiers <= 1:
        return 0
    return max(spec.l_d, spec.l_q) if info.n_tiers >= 3 else spec.l_d


def load_for(
    paths: LadderPaths,
    base: LoadConfig,
    spec: SpecConfig,
    *,
    name: str | None = None,
    vram: str | int | None = None,
    ram: str | int | None = None,
    tier_loads: Mapping[str, LoadConfig] | None = None,
    rpc: RpcConfig | None = None,
    say: Callable[[str], None] | None = None,
) -> Ladder:
    """Load ``paths`` for ``spec``'s mode (checked first, before planning or loading anything).

    ``vram`` (a ``--vram`` value such as ``"6GiB"``, or bytes): the placement
    :func:`~pyramid_gguf.planning.plan.plan_ladder` ranks first for that budget among those
    that fit ``ram`` (a ``--ram`` value, or bytes; None: this machine's RAM), told to ``say``.
    ``tier_loads`` overrides ``base`` per tier instead. ``rpc`` puts its tiers on RPC servers
    (:class:`~pyramid_gguf.core.remote.RpcConfig`). ``base.n_rs_seq`` is a cap: the contexts
    keep at most :func:`rollback_depth` snapshots of ``spec``."""
    paths.shape.check(spec.mode)
    depth = rollback_depth(spec)
    base = replace(base, n_rs_seq=min(base.n_rs_seq, depth))
    if tier_loads is not None:
        tier_loads = {t: replace(c, n_rs_seq=min(c.n_rs_seq, depth)) for t, c in tier_loads.items()}
    if vram is not None:
        from ..planning.plan import PlanInputs, describe, load_plan, plan_ladder

        inputs = PlanInputs(ram=ram)
        ranking = plan_ladder(paths, vram, base, name=name, spec=spec, inputs=inputs)
        if say is not None:
            say(describe(ranking, vram))
        paths, tier_loads = load_plan(paths, ranking, base)
    if rpc is not None:
        tier_loads = rpc.place(paths.model_files(), base, tier_loads)
    return load_ladder(paths, base, tier_loads)
