"""The decoding loop: prompt processing, the first token, then rounds until a stop.

Every mode of docs/ALGORITHMS.md is a :class:`~.rounds.Rounds`: plain decoding, a fixed chain
(a proposer, then the target verifying its block in one batch), or ``auto``, which picks a
chain and a block size each round from the cost model. :func:`decode` runs any of them; the
caller stops pulling to end a generation early (stop strings, cancellation).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence

import numpy as np

from ..config import SamplingConfig, SpecConfig
from ..errors import ContextOverflow, UserError
from .costs import CostCurve
from .ngram import NGramPool
from .rounds import Rounds, fixed_rounds
from .sampling import Sampler
from .stats import GenerationStats, TierStats
from .tiers import Ladder, ModelTier


def make_rounds(
    ladder: Ladder,
    spec: SpecConfig,
    sampler: Sampler,
    stats: GenerationStats,
    *,
    costs: dict[str, CostCurve] | None = None,
    pool: NGramPool | None = None,
) -> tuple[Rounds, list[ModelTier]]:
    """The rounds of ``spec.mode`` and the tiers to prefill with the prompt.

    ``auto`` needs ``costs`` (each tier's :class:`CostCurve`, by tier name); ``pool`` lets
    the n-gram drafter search earlier requests.
    """
    if spec.info.auto:
        from .auto import AutoRounds

        if costs is None:
            raise ValueError("mode auto needs the tiers' cost curves")
        auto = AutoRounds(ladder, spec, sampler, stats, costs, pool)
        return auto, [ladder.target]
    return fixed_rounds(ladder, spec, sampler, stats, pool)


def decode(
    ladder: Ladder,
    prompt: Sequence[int],
    rounds: Rounds,
    prefill: Sequence[ModelTier],
    sampler: Sampler,
    stats: GenerationStats,
    rows: list[np.ndarray] | None = None,
) -> Generator[int, None, None]:
    """Yield generated token ids one at a time, filling ``stats`` as it goes.

    The target evaluates the whole prompt in one batch (``prefill`` lists every tier that does
    so now; the others catch up when first used) and the first token is sampled from its last
    row, as llama.cpp does; ``rounds`` then commit the rest. Ends after ``max_tokens`` tokens,
    at an end-of-generation token (not yielded, unless ``ignore_eos``), or when the context is
    full. Prompt processing happens before the first token and is timed separately.

    ``rows``: when given, receives the target's raw logits row ``[V]`` of every committed
    token, in order (the distribution it was chosen from; row ``i`` belongs to the ``i``-th
    yielded token), for log-probabilities.
    """
    target = ladder.target
    sampling: SamplingConfig = sampler.cfg
    n_ctx = min(m.n_ctx for m in ladder.models)
    if not prompt:
        raise UserError("the prompt is empty")
    if len(prompt) >= n_ctx:
        raise ContextOverflow(
            f"prompt of {len(prompt)} tokens does not fit the context of {n_ctx} tokens "
            "(raise --ctx-size or shorten the prompt)"
        )
    tiers = ladder.models
    before = {m.name: m.timer.snapshot() for m in tiers}
    stats.prompt_tokens = len(prompt)

    t0 = time.perf_counter()
    row = target.prefill(prompt, logits=True)
    for model in prefill:
        if model is not target:
            model.prefill(prompt)
    stats.prompt_seconds = time.perf_counter() - t0
    after_prompt = {m.name: m.timer.snapshot() for m in tiers}
    stats.prompt_evaluated = after_prompt["target"][1] - before["target"][1]

    committed = list(prompt)
    t_gen = time.perf_counter()
    try:
        assert row is not None
        new = [sampler.pick(row)]
        if rows is not None:  # the target's row of every committed token, in order
            rounds.runner.keep_rows = True
            rows.append(row)
        while True:
            for token in new[: sampling.max_tokens - stats.generated_tokens]:
                committed.append(token)
                stats.generation_seconds = time.perf_counter() - t_gen
                if target.is_eog(token) and not sampling.ignore_eos:
                    stats.finish_reason = "stop"
                    return
                stats.generated_tokens += 1
                yield token
            room = min(sampling.max_tokens - stats.generated_tokens, n_ctx - len(committed))
            if room <= 0:
                stats.finish_reason = "length"
                return
            rounds.sync(committed)
            new = rounds.run(committed, room)[:room]
            if rows is not None:
                rows += rounds.runner.take_rows()[: len(new)]
    finally:
        stats.generation_seconds = time.perf_counter() - t_gen
        stats.tiers = [
            _tier_stats(m, before[m.name], after_prompt[m.name])
            for m in tiers
            if m.timer.snapshot() != before[m.name]
        ]


def _tier_stats(
    tier: ModelTier, before: tuple[int, int, float], prefill: tuple[int, int, float]
) -> TierStats:
    """Work since ``before``; prompt processing is counted in tokens but not in evals."""
    n_evals, n_tokens, seconds = tier.timer.snapshot()
    return TierStats(
        tier.name,
        n_evals=n_evals - prefill[0],
        n_tokens=n_tokens - before[1],
        seconds=seconds - before[2],
    )
