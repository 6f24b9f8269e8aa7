"""A ladder loaded for :meth:`Pyramid.load <pyramid_gguf.api.Pyramid.load>`: the placement the
planner ranks first under a VRAM budget, or each tier's layers on llama.cpp RPC servers, then
every model file loaded and checked (:func:`~pyramid_gguf.decoding.runtime.tiers.load_ladder`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..core.ladder import LadderPaths
from ..core.load import LoadConfig
from ..core.remote import RpcConfig
from ..core.spec import SpecConfig
from ..decoding.runtime.tiers import Ladder, load_ladder


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
    (:class:`~pyramid_gguf.core.remote.RpcConfig`)."""
    paths.shape.check(spec.mode)
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
