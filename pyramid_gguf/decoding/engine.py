"""The decoding loop: every mode of docs/ALGORITHMS.md is "a proposer chain, then the target".

:func:`build_chain` turns a :class:`SpecConfig` and the loaded tiers into a proposer (``None``
for plain target decoding) and the rule of the final stage. :func:`decode` runs rounds: the
chain proposes a block, the target verifies it in one batch, the accepted tokens plus the
target's own token are committed and yielded one by one, and every tier rolls its cache back
to the committed prefix. The caller stops pulling to end generation early (stop strings,
cancellation).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass

from ..config import SamplingConfig, SpecConfig
from ..errors import ContextOverflow, UserError
from ..ladder import NGram
from ..modes import ModeInfo, check_mode, mode_info
from .proposers import DraftProposer, NGramProposer, QualifiedProposer
from .protocol import Proposer
from .sampling import Sampler
from .stage import StageRule, verify
from .stats import GenerationStats, TierStats
from .tiers import Ladder, ModelTier


@dataclass(frozen=True)
class Chain:
    """What one generation runs: a proposer (None: target only) and the final stage's rule."""

    proposer: Proposer | None
    rule: StageRule
    top_len: int
    top_stage: str


def _rule(family: str | None, tau: float, spec: SpecConfig) -> StageRule:
    if family == "fuzzy":
        return StageRule("fuzzy", tau, spec.divergence, spec.fuzzy_variant)
    return StageRule(spec.exact_rule)


def used_tiers(ladder: Ladder, mode: ModeInfo) -> list[ModelTier]:
    """The model tiers ``mode`` runs, smallest first (a 3-model ladder in ``sd`` skips the
    qualifier)."""
    tiers = [ladder.draft] if mode.n_tiers >= 2 else []
    tiers += [ladder.qualifier] if mode.n_tiers == 3 else []
    return [t for t in (*tiers, ladder.target) if isinstance(t, ModelTier)]


def check_ladder(spec: SpecConfig, ladder: Ladder) -> None:
    """A one-line :class:`UserError` when ``spec.mode`` needs a tier ``ladder`` lacks."""
    check_mode(
        spec.mode, has_draft=ladder.draft is not None, has_qualifier=ladder.qualifier is not None
    )


def build_chain(
    ladder: Ladder, spec: SpecConfig, sampler: Sampler, stats: GenerationStats
) -> Chain:
    """The proposer chain of ``spec.mode`` over ``ladder`` (UserError if a tier is missing)."""
    check_ladder(spec, ladder)
    mode = mode_info(spec.mode)
    if mode.n_tiers == 1:
        return Chain(None, StageRule(), 1, "target")
    bottom: Proposer
    if isinstance(ladder.draft, NGram):
        bottom = NGramProposer(spec.l_d)
    else:
        assert isinstance(ladder.draft, ModelTier)
        bottom = DraftProposer(ladder.draft, spec.l_d, sampler, p_min=spec.p_min)
    top_rule = _rule(mode.top, spec.tau_t, spec)
    if mode.n_tiers == 2:
        return Chain(bottom, top_rule, spec.l_d, f"{bottom.name}->target")
    assert ladder.qualifier is not None
    stage1 = stats.stage(f"{bottom.name}->qualifier")
    qualified = QualifiedProposer(
        bottom, ladder.qualifier, _rule(mode.stage1, spec.tau_q, spec), spec.l_q, sampler, stage1
    )
    return Chain(qualified, top_rule, spec.l_q, "qualifier->target")


def decode(
    ladder: Ladder,
    prompt: Sequence[int],
    spec: SpecConfig,
    sampler: Sampler,
    stats: GenerationStats,
) -> Generator[int, None, None]:
    """Yield generated token ids one at a time, filling ``stats`` as it goes.

    Ends after ``sampling.max_tokens`` tokens, at an end-of-generation token (yielded, unless
    ``ignore_eos``), or when the context is full. Prompt processing happens before the first
    token is yielded and is timed separately.
    """
    target = ladder.target
    sampling: SamplingConfig = sampler.cfg
    used = used_tiers(ladder, mode_info(spec.mode))
    n_ctx = min(m.n_ctx for m in used)
    if not prompt:
        raise UserError("the prompt is empty")
    if len(prompt) >= n_ctx:
        raise ContextOverflow(
            f"prompt of {len(prompt)} tokens does not fit the context of {n_ctx} tokens "
            "(raise --ctx-size or shorten the prompt)"
        )
    chain = build_chain(ladder, spec, sampler, stats)
    top = stats.stage(chain.top_stage) if chain.proposer is not None else None
    before = {m.name: m.timer.snapshot() for m in used}
    stats.prompt_tokens = len(prompt)

    t0 = time.perf_counter()
    for model in used:
        model.prefill(prompt)
    stats.prompt_seconds = time.perf_counter() - t0
    prefill = {m.name: m.timer.snapshot() for m in used}
    stats.prompt_evaluated = prefill["target"][1] - before["target"][1]

    committed = list(prompt)
    t_gen = time.perf_counter()
    try:
        while stats.generated_tokens < sampling.max_tokens:
            room = min(sampling.max_tokens - stats.generated_tokens, n_ctx - len(committed))
            if room <= 0:
                stats.finish_reason = "length"
                return
            if chain.proposer is None:
                new = [sampler.sample(sampler.warp(target.score(committed, [])[0]))]
            else:
                block = chain.proposer.propose(committed, min(chain.top_len, room))
                assert top is not None
                new = verify(target, committed, block, chain.rule, sampler, top).tokens
            for token in new[:room]:
                committed.append(token)
                stats.generation_seconds = time.perf_counter() - t_gen
                if target.is_eog(token) and not sampling.ignore_eos:
                    stats.finish_reason = "stop"
                    return
                stats.generated_tokens += 1
                yield token
            if chain.proposer is not None:
                chain.proposer.sync(committed)
            target.sync(committed)
        stats.finish_reason = "length"
    finally:
        stats.generation_seconds = time.perf_counter() - t_gen
        stats.tiers = [_tier_stats(m, before[m.name], prefill[m.name]) for m in used]


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
