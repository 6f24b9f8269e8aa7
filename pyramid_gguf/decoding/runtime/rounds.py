"""One round of decoding, on any chain: the one place a round touches the target.

A :class:`RoundRunner` holds one generation's ladder, sampler, grammar and statistics and runs
one round of any :class:`~.chains.Chain`:

- :meth:`RoundRunner.plain`: plain decoding, one target evaluation and one token;
- :meth:`RoundRunner.speculate`: the chain's proposer offers a block (after any tokens the
  grammar forces), the target verifies it in one batch with the chain's top rule
  (:func:`~.verification.verify`), and the kept prefix plus the target's own token are the
  round's tokens (:class:`RoundResult`);
- :meth:`RoundRunner.build_proposer`: the proposer of a chain's lower stages (the draft model
  or a drafter with no model, such as the n-gram drafter, at the bottom, each qualifier
  wrapping it as a stage).

Which chain runs is a :class:`Scheduler`'s choice: a fixed mode is a :class:`FixedScheduler`,
its one chain every round; ``auto`` is :class:`~.auto.AutoScheduler`, the best chain each
round. The :class:`~.engine.Generation` commits the tokens and, before the next round, calls
:meth:`Scheduler.sync`: what a tier evaluated past the committed text is rolled back (each
:class:`~.tiers.ModelTier` rolls back to the committed prefix when next used).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ...core.spec import SpecConfig
from ..pricing.chains import Chain, mode_chain
from . import drafters
from .guide import Guide
from .ngram import NGramPool
from .proposers import Admit, DraftProposer, Observe, Proposer, QualifiedProposer
from .sampling import Sampler
from .stats import GenerationStats
from .tiers import Ladder, ModelTier
from .verification import Block, verify


class Scheduler(Protocol):
    """What runs a generation's rounds: each call of :meth:`run` chooses a chain (a fixed mode
    always the same one) and runs one round of it, committing the target's next tokens."""

    runner: RoundRunner

    def run(self, committed: list[int], room: int) -> list[int]:
        """Tokens to commit after ``committed``, at least one (at most ``room`` are used)."""
        ...

    def sync(self, committed: Sequence[int]) -> None:
        """Forget what was evaluated past ``committed``."""
        ...


@dataclass(frozen=True)
class RoundResult:
    """What one speculative round did: ``tokens`` to commit (the kept proposals, then the
    target's own token), ``proposed`` drafted tokens the target checked and ``kept`` of them
    (a grammar's forced tokens counted in neither)."""

    tokens: list[int]
    proposed: int
    kept: int


def with_forced(forced: Sequence[int], block: Block, n_vocab: int) -> Block:
    """``forced`` tokens (a grammar allows nothing else) then ``block``, as one block: the forced
    rows are one-hot ``q`` and logits whose softmax is one-hot (a deterministic proposer)."""
    if not forced:
        return block
    tokens = [*forced, *block.tokens]
    if block.q is None and block.logits is None:
        return Block(tokens, None, None)
    n = len(forced)
    q = logits = None
    if block.q is not None:
        q = np.zeros((n, n_vocab))
        q[np.arange(n), forced] = 1.0
        q = np.concatenate([q, block.q])
    if block.logits is not None:
        z = np.full((n, block.logits.shape[-1]), -np.inf, dtype=block.logits.dtype)
        z[np.arange(n), forced] = 0.0
        logits = np.concatenate([z, block.logits])
    return Block(tokens, q, logits)


class RoundRunner:
    """Runs rounds of any chain for one generation on ``ladder`` with ``sampler``, counting into
    ``stats``.

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
        return [self.sampler.pick(self.sampler.prepare(committed, row))]

    def forced_tokens(self, committed: Sequence[int], room: int) -> list[int]:
        """The tokens the grammar forces after ``committed`` (at most ``room``): free drafts."""
        if self.guide is None or room <= 0:
            return []
        return self.guide.forced(committed)[:room]

    def speculate(
        self,
        chain: Chain,
        proposer: Proposer,
        committed: Sequence[int],
        forced: Sequence[int],
        k: int,
    ) -> RoundResult:
        """One speculative round of ``chain``: the grammar's ``forced`` tokens, then up to ``k``
        of ``proposer``'s after them, verified by the target in one batch under the rule of
        the chain's top stage, which keeps a prefix and adds one token of the target's."""
        if forced:
            drafted = proposer.propose([*committed, *forced], k)
            block = with_forced(forced, drafted, self.target.n_vocab)
        else:
            block = proposer.propose(committed, k)
        stage = chain.top
        f = len(forced)
        v = verify(
            self.target,
            committed,
            block,
            stage.rule,
            self.sampler,
            self.stats.stage(stage.name),
            self.guide,
            f,
        )
        if f:
            self.stats.forced_n += min(f, len(block))
            self.stats.forced_n_accepted += min(f, v.n_accepted)
        if self.keep_rows:
            self._rows.extend(v.logits)
        return RoundResult(v.tokens, len(block) - f, max(v.n_accepted - f, 0))

    def take_rows(self) -> list[np.ndarray]:
        """The rows kept since the last call, one per committed token, in order."""
        rows, self._rows = self._rows, []
        return rows

    def build_proposer(
        self,
        chain: Chain,
        *,
        k: int,
        l_d: int,
        p_min: float = 0.0,
        admit: Admit | None = None,
        lookup: Proposer | None = None,
        observe: Observe | None = None,
    ) -> Proposer:
        """The proposer of ``chain``'s lower stages, offering up to ``k`` tokens to the target.

        The bottom is ``lookup`` (the proposer of a drafter with no model, such as the n-gram
        drafter, when the chain's bottom is one) or the chain's draft model, drafting
        ``l_d`` tokens per check in a pyramid (``k`` when it proposes to the target itself),
        stopping by ``p_min`` or ``admit``. Each middle tier wraps it as a qualified stage
        that fills a buffer of ``k`` tokens (``observe`` hears each of its checks).
        """
        stages = chain.stages
        if chain.lookup:
            if lookup is None:
                raise ValueError(f"chain {chain.name} needs the proposer of {chain.bottom}")
            proposer: Proposer = lookup
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


class FixedScheduler:
    """A fixed mode: every round, its one chain. Plain decoding has no proposer; any other
    chain's proposer offers up to ``block`` tokens and the target verifies them in one batch."""

    def __init__(
        self, runner: RoundRunner, chain: Chain, proposer: Proposer | None = None, block: int = 1
    ) -> None:
        self.runner = runner
        self.chain = chain
        self.proposer = proposer
        self.block = block

    def run(self, committed: list[int], room: int) -> list[int]:
        if self.proposer is None:
            return self.runner.plain(committed)
        k = min(self.block, room)
        forced = self.runner.forced_tokens(committed, k)
        return self.runner.speculate(
            self.chain, self.proposer, committed, forced, k - len(forced)
        ).tokens

    def sync(self, committed: Sequence[int]) -> None:
        if self.proposer is not None:
            self.proposer.sync(committed)
            self.runner.target.sync(committed)


def fixed_scheduler(
    ladder: Ladder,
    spec: SpecConfig,
    sampler: Sampler,
    stats: GenerationStats,
    pool: NGramPool | None = None,
    guide: Guide | None = None,
) -> tuple[FixedScheduler, list[ModelTier]]:
    """The scheduler of fixed mode ``spec.mode`` and the tiers it prefills with the prompt (a
    one-line UserError when the ladder lacks a tier the mode needs).

    The knobs: ``l_d`` tokens drafted per check, ``l_q`` qualified tokens per target check in a
    pyramid, ``p_min`` for a draft model; a drafter with no model (:mod:`.drafters`) reads its
    own (``ngram_min`` for the n-gram drafter).
    """
    chain = mode_chain(spec, ladder.shape)
    runner = RoundRunner(ladder, sampler, stats, guide)
    if chain.plain:
        return FixedScheduler(runner, chain), runner.tiers(chain)
    lookup = None
    if chain.lookup:
        lookup = drafters.lookup(chain.bottom, drafters.DraftSetup(spec.l_d, spec, pool)).proposer
    block = spec.l_q if len(chain.stages) > 1 else spec.l_d
    proposer = runner.build_proposer(chain, k=block, l_d=spec.l_d, p_min=spec.p_min, lookup=lookup)
    return FixedScheduler(runner, chain, proposer, block), runner.tiers(chain)
