"""Running chains on a loaded ladder: the one place a round touches the target.

A :class:`Runner` holds one generation's ladder, sampler and statistics and runs any
:class:`~.chains.Chain`: plain decoding (:meth:`Runner.plain`, written once), the proposers of
a chain's lower stages (:meth:`Runner.proposer`), and the target's verification of a block in
one batch (:meth:`Runner.verify`). A fixed mode is :class:`ChainRounds`, its constant chain
every round; ``auto`` (:mod:`.auto`) chooses a chain per round and runs it through the same
runner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ...core.spec import SpecConfig
from ..pricing.chains import NGRAM_TIER, Chain, Stage, mode_chain
from .guide import Guide
from .ngram import NGramPool, NGramProposer
from .proposers import Admit, DraftProposer, Observe, QualifiedProposer
from .protocol import Block, Proposer, with_forced
from .sampling import Sampler
from .stage import Verified, verify
from .stats import GenerationStats
from .tiers import Ladder, ModelTier


class Rounds(Protocol):
    """One generation's rounds: each commits the target's next tokens (at least one)."""

    runner: Runner

    def run(self, committed: list[int], room: int) -> list[int]:
        """Tokens to commit after ``committed`` (at most ``room`` are used)."""
        ...

    def sync(self, committed: Sequence[int]) -> None:
        """Forget what was evaluated past ``committed``."""
        ...


class Runner:
    """Runs chains for one generation on ``ladder`` with ``sampler``, counting into ``stats``.

    With ``keep_rows`` it also keeps the target's raw logits row of every token it commits
    (``[V]`` each, the distribution the token was chosen from), for :meth:`take_rows`.
    """

    def __init__(
        self,
        ladder: Ladder,
        sampler: Sampler,
        stats: GenerationStats,
        guide: Guide | None = None,
    ) -> None:
        self.ladder = ladder
        self.target = ladder.target
        self.sampler = sampler
        self.stats = stats
        #: The generation's grammar (None: unconstrained): every tier's rows are masked by it.
        self.guide = guide
        self.keep_rows = False
        self._rows: list[np.ndarray] = []

    def plain(self, committed: Sequence[int]) -> list[int]:
        """Plain decoding: one target evaluation, one token (under the grammar, if any)."""
        row = self.target.score(committed, [])[0]
        if self.guide is not None:
            row = self.guide.mask(committed, row)
        if self.keep_rows:
            self._rows.append(row)
        return [self.sampler.pick(row)]

    def forced(self, committed: Sequence[int], room: int) -> list[int]:
        """The tokens the grammar forces after ``committed`` (at most ``room``): free drafts."""
        if self.guide is None or room <= 0:
            return []
        return self.guide.forced(committed)[:room]

    def verify(
        self, stage: Stage, committed: Sequence[int], block: Block, forced: int = 0
    ) -> Verified:
        """The target scores ``block`` after ``committed`` in one batch; ``stage``'s rule keeps
        a prefix of it and adds one token of the target's. Its first ``forced`` tokens are the
        grammar's (:meth:`forced`), counted apart (``forced_n``)."""
        v = verify(
            self.target,
            committed,
            block,
            stage.rule,
            self.sampler,
            self.stats.stage(stage.name),
            self.guide,
            forced,
        )
        if forced:
            self.stats.forced_n += min(forced, len(block))
            self.stats.forced_n_accepted += min(forced, v.n_accepted)
        if self.keep_rows:
            self._rows.extend(v.logits)
        return v

    def propose(
        self, proposer: Proposer, committed: Sequence[int], forced: Sequence[int], k: int
    ) -> Block:
        """``forced`` tokens, then up to ``k - len(forced)`` of ``proposer``'s after them."""
        if not forced:
            return proposer.propose(committed, k)
        rest = proposer.propose([*committed, *forced], k - len(forced))
        return with_forced(forced, rest, self.target.n_vocab)

    def take_rows(self) -> list[np.ndarray]:
        """The rows kept since the last call, one per committed token, in order."""
        rows, self._rows = self._rows, []
        return rows

    def proposer(
        self,
        chain: Chain,
        *,
        k: int,
        l_d: int,
        p_min: float = 0.0,
        admit: Admit | None = None,
        ngram: Proposer | None = None,
        observe: Observe | None = None,
    ) -> Proposer:
        """The proposer of ``chain``'s lower stages, offering up to ``k`` tokens to the target.

        The bottom is ``ngram`` (the n-gram drafter) or the chain's draft model, drafting
        ``l_d`` tokens per check in a pyramid (``k`` when it proposes to the target itself),
        stopping by ``p_min`` or ``admit``. Each middle tier wraps it as a qualified stage
        that fills a buffer of ``k`` tokens (``observe`` hears each of its checks).
        """
        stages = chain.stages
        if chain.bottom == NGRAM_TIER:
            if ngram is None:
                raise ValueError("an n-gram chain needs the n-gram proposer")
            proposer: Proposer = ngram
        else:
            length = l_d if len(stages) > 1 else k
            tier = self.ladder.tier(chain.bottom)
            proposer = DraftProposer(
                tier, length, self.sampler, p_min=p_min, admit=admit, guide=self.guide
            )
        for stage in stages[:-1]:
            proposer = QualifiedProposer(
                proposer,
                self.ladder.tier(stage.upper),
                stage.rule,
                k,
                self.sampler,
                self.stats.stage(stage.name),
                observe=observe,
                guide=self.guide,
            )
        return proposer

    def tiers(self, chain: Chain) -> list[ModelTier]:
        """The loaded models ``chain`` evaluates, smallest first."""
        return [self.ladder.tier(t) for t in chain.models]


class ChainRounds:
    """A fixed mode: every round, its constant chain. Plain decoding has no proposer; any other
    chain's proposer offers up to ``block`` tokens and the target verifies them in one batch."""

    def __init__(
        self, runner: Runner, chain: Chain, proposer: Proposer | None = None, block: int = 1
    ) -> None:
        self.runner = runner
        self.chain = chain
        self.proposer = proposer
        self.block = block

    def run(self, committed: list[int], room: int) -> list[int]:
        if self.proposer is None:
            return self.runner.plain(committed)
        k = min(self.block, room)
        forced = self.runner.forced(committed, k)
        block = self.runner.propose(self.proposer, committed, forced, k)
        return self.runner.verify(self.chain.top, committed, block, len(forced)).tokens

    def sync(self, committed: Sequence[int]) -> None:
        if self.proposer is not None:
            self.proposer.sync(committed)
            self.runner.target.sync(committed)


def fixed_rounds(
    ladder: Ladder,
    spec: SpecConfig,
    sampler: Sampler,
    stats: GenerationStats,
    pool: NGramPool | None = None,
    guide: Guide | None = None,
) -> tuple[Rounds, list[ModelTier]]:
    """The rounds of fixed mode ``spec.mode`` and the tiers it prefills with the prompt (a
    one-line UserError when the ladder lacks a tier the mode needs).

    The knobs: ``l_d`` tokens drafted per check, ``l_q`` qualified tokens per target check in a
    pyramid, ``p_min`` for a draft model, ``ngram_min`` for the n-gram drafter.
    """
    chain = mode_chain(spec, ladder.shape)
    runner = Runner(ladder, sampler, stats, guide)
    if chain.plain:
        return ChainRounds(runner, chain), runner.tiers(chain)
    ngram = None
    if chain.bottom == NGRAM_TIER:
        ngram = NGramProposer(spec.l_d, min_match=spec.ngram_min, pool=pool)
    block = spec.l_q if len(chain.stages) > 1 else spec.l_d
    proposer = runner.proposer(chain, k=block, l_d=spec.l_d, p_min=spec.p_min, ngram=ngram)
    return ChainRounds(runner, chain, proposer, block), runner.tiers(chain)
