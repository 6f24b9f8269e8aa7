"""What one round of a fixed mode runs: plain decoding, or a proposer chain and the target.

:func:`build_chain` turns a :class:`SpecConfig` and the loaded tiers into a proposer (``None``
for plain target decoding) and the rule of the final stage; :class:`ChainRounds` runs it: the
chain proposes a block and the target verifies it in one batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..config import SpecConfig
from ..ladder import NGram
from ..modes import ModeInfo, check_mode, mode_info
from .ngram import NGramPool, NGramProposer
from .proposers import DraftProposer, QualifiedProposer
from .protocol import Proposer
from .sampling import Sampler
from .stage import StageRule, verify
from .stats import GenerationStats
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
    ladder: Ladder,
    spec: SpecConfig,
    sampler: Sampler,
    stats: GenerationStats,
    pool: NGramPool | None = None,
) -> Chain:
    """The proposer chain of ``spec.mode`` over ``ladder`` (UserError if a tier is missing)."""
    check_ladder(spec, ladder)
    mode = mode_info(spec.mode)
    if mode.n_tiers == 1:
        return Chain(None, StageRule(), 1, "target")
    bottom: Proposer
    if isinstance(ladder.draft, NGram):
        bottom = NGramProposer(spec.l_d, min_match=spec.ngram_min, pool=pool)
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


class Rounds(Protocol):
    """One generation's rounds: each commits the target's next tokens (at least one)."""

    def run(self, committed: list[int], room: int) -> list[int]:
        """Tokens to commit after ``committed`` (at most ``room`` are used)."""
        ...

    def sync(self, committed: Sequence[int]) -> None:
        """Forget what was evaluated past ``committed``."""
        ...


class PlainRounds:
    """Plain decoding: one target evaluation, one token."""

    def __init__(self, target: ModelTier, sampler: Sampler) -> None:
        self.target = target
        self.sampler = sampler

    def run(self, committed: list[int], room: int) -> list[int]:
        return [self.sampler.pick(self.target.score(committed, [])[0])]

    def sync(self, committed: Sequence[int]) -> None:
        return None


class ChainRounds:
    """A fixed chain: the proposer offers a block, the target verifies it in one batch."""

    def __init__(
        self, target: ModelTier, chain: Chain, sampler: Sampler, stats: GenerationStats
    ) -> None:
        assert chain.proposer is not None
        self.target = target
        self.chain = chain
        self.proposer: Proposer = chain.proposer
        self.sampler = sampler
        self.top = stats.stage(chain.top_stage)

    def run(self, committed: list[int], room: int) -> list[int]:
        block = self.proposer.propose(committed, min(self.chain.top_len, room))
        return verify(self.target, committed, block, self.chain.rule, self.sampler, self.top).tokens

    def sync(self, committed: Sequence[int]) -> None:
        self.proposer.sync(committed)
        self.target.sync(committed)


def fixed_rounds(
    ladder: Ladder,
    spec: SpecConfig,
    sampler: Sampler,
    stats: GenerationStats,
    pool: NGramPool | None = None,
) -> tuple[Rounds, list[ModelTier]]:
    """The rounds of a fixed mode and the tiers it prefills with the prompt."""
    chain = build_chain(ladder, spec, sampler, stats, pool)
    used = used_tiers(ladder, mode_info(spec.mode))
    if chain.proposer is None:
        return PlainRounds(ladder.target, sampler), used
    return ChainRounds(ladder.target, chain, sampler, stats), used
