"""``auto``: each round, run the chain and block size with the most expected tokens per second.

:class:`AutoRounds` scores every chain the ladder offers with :mod:`.policy` (the tiers' cost
curves and the online acceptance estimates of :mod:`.estimates`), runs the best one with the
same proposers and verification as the fixed modes, and learns from the outcome:

- ``target``: plain decoding (also whenever nothing else pays);
- ``ngram``: the n-gram drafter's continuation, sized by its match length;
- ``draft`` / ``qualifier``: that model drafts for the target (``sd``), stopping early when
  its confidence no longer pays for the verification;
- ``pyramid``: draft -> qualifier -> target (``psd-exact``).

Each round's :class:`~.policy.Budget` limits what it may lose to what the speculative rounds so
far saved over plain decoding (:attr:`.stats.AutoStats.savings`, priced by the same cost
curves), plus one token's time for a confident bet. When plain decoding runs although the
n-gram drafter had a block worth proposing, that block becomes a :class:`Shadow`: once the
target's own tokens show how much of it would have been kept, it teaches the n-gram estimates
and credits the budget (:data:`~.policy.SHADOW_CREDIT`), at no cost. Text that copies thus
earns its first bets while decoding plainly; text that only echoes a phrase does not.

Chains are lossless (exact rules) unless ``allow_lossy``, which makes the model chains use the
fuzzy rules (``fsd``, ``psd-f`` with ``tau_t`` / ``tau_q``). Tiers other than the target are
never prefilled: a model catches up on the committed text only if and when it is chosen.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..config import SpecConfig
from . import policy
from .costs import CostCurve
from .estimates import ChainAcceptance, NGramAcceptance
from .ngram import Match, NGramDrafter, NGramPool
from .policy import Option
from .proposers import Admit, DraftProposer, QualifiedProposer
from .protocol import Block
from .sampling import Sampler
from .stage import StageRule, verify
from .stats import AutoStats, GenerationStats
from .tiers import Ladder, ModelTier, common_prefix

#: Python time per round outside llama.cpp, in seconds (warping, acceptance, bookkeeping).
#: A constant, not a measurement, so that decisions (and with them a seeded run's samples)
#: depend only on the cached cost curves and the tokens, never on timing noise.
ROUND_OVERHEAD = 4e-4

#: A model chain as :class:`AutoRounds` prices it: its name, its stages' keep rates and the
#: tiers whose lag behind the committed text it pays for.
ModelChain = tuple[str, tuple[float, ...], tuple[ModelTier, ...]]


@dataclass(frozen=True)
class Shadow:
    """An n-gram block not proposed (plain decoding ran instead), to be settled against the
    tokens committed from position ``at`` on. ``option``: its price and promise then."""

    at: int
    match: Match
    option: Option

    @property
    def block(self) -> list[int]:
        return self.match.continuation[: self.option.k]


class AutoRounds:
    """The ``auto`` scheduler of one generation (see the module docstring)."""

    def __init__(
        self,
        ladder: Ladder,
        spec: SpecConfig,
        sampler: Sampler,
        stats: GenerationStats,
        costs: Mapping[str, CostCurve],
        pool: NGramPool | None = None,
    ) -> None:
        self.ladder = ladder
        self.spec = spec
        self.sampler = sampler
        self.stats = stats
        self.costs = costs
        self.target = ladder.target
        self.drafter = NGramDrafter(pool)
        self.ngram_keep = NGramAcceptance()
        self.chain_keep = ChainAcceptance()
        self.exact = StageRule(spec.exact_rule)
        lossy = spec.allow_lossy
        fuzzy = (spec.divergence, spec.fuzzy_variant)
        self.top_rule = StageRule("fuzzy", spec.tau_t, *fuzzy) if lossy else self.exact
        self.stage1_rule = StageRule("fuzzy", spec.tau_q, *fuzzy) if lossy else self.exact
        #: Model tiers that can draft for the target, smallest first.
        self.drafters = [t for t in (ladder.draft, ladder.qualifier) if isinstance(t, ModelTier)]
        self.overhead = ROUND_OVERHEAD
        self.auto = stats.auto = AutoStats()
        #: Where the answer starts in the committed tokens (set by the first round): n-gram
        #: matches before it quote the prompt.
        self.answer_start: int | None = None
        self.shadows: list[Shadow] = []
        self._bounds: dict[tuple[str, tuple[float, ...], int], Option | None] = {}

    # --- choosing --------------------------------------------------------------------------

    def options(
        self, committed: Sequence[int], max_k: int, match: Match | None, budget: policy.Budget
    ) -> list[Option]:
        """Every chain at its best block size within ``budget``. A model chain whose bound
        (:meth:`_bound`) cannot beat plain decoding is not priced: it could not be chosen."""
        out = []
        if match is not None:  # any length: the estimates say what a match length is worth
            first, after = self.ngram_keep.estimate(match.length, quoted=match.quoted)
            n = len(match.continuation)
            c_t = self.costs["target"]
            option = policy.ngram(c_t, first, after, n, max_k, self.overhead, budget)
            out += [option] if option else []
        for chain, keeps, tiers in self._model_chains():
            bound = self._bound(chain, keeps, max_k)
            if bound is None or bound.rate < policy.MIN_GAIN * budget.base.rate:
                if bound is not None:
                    budget.best[chain] = bound
                continue
            lags = tuple(t.lag(committed) for t in tiers)
            option = self._price(chain, keeps, max_k, lags, budget)
            out += [option] if option else []
        return out

    def _model_chains(self) -> list[ModelChain]:
        """``(chain, keep rates, tiers that may lag)`` of every model chain of the ladder."""
        out: list[ModelChain] = []
        for m in self.drafters:
            out.append((m.name, (self.chain_keep.rate(self._stage(m.name, "target")),), (m,)))
        d, q = self.ladder.draft, self.ladder.qualifier
        if isinstance(d, ModelTier) and q is not None:
            keeps = (
                self.chain_keep.rate(self._stage("draft", "qualifier")),
                self.chain_keep.rate(self._stage("qualifier", "target")),
            )
            out.append(("pyramid", keeps, (d, q)))
        return out

    def _price(
        self,
        chain: str,
        keeps: tuple[float, ...],
        max_k: int,
        lags: tuple[int, ...],
        budget: policy.Budget | None,
    ) -> Option | None:
        c_t = self.costs["target"]
        if chain == "pyramid":
            c_q, c_d = self.costs["qualifier"], self.costs["draft"]
            keep_dq, keep_qt = keeps
            lag_pair = (lags[0], lags[1])
            return policy.pyramid(
                c_t, c_q, c_d, keep_dq, keep_qt, max_k, lag_pair, self.overhead, budget
            )
        c_m = self.costs[chain]
        return policy.draft(chain, c_t, c_m, keeps[0], max_k, lags[0], self.overhead, budget)

    def _bound(self, chain: str, keeps: tuple[float, ...], max_k: int) -> Option | None:
        """The best option of a model chain at these keep rates, caught up and without a
        budget: the most it can promise until its keep rates change (which takes a round of
        it), cached."""
        key = (chain, keeps, max_k)
        if key not in self._bounds:
            self._bounds[key] = self._price(chain, keeps, max_k, (0, 0), None)
        return self._bounds[key]

    def _stage(self, lower: str, upper: str) -> str:
        rule = self.top_rule if upper == "target" else self.stage1_rule
        return f"{lower}{'~>' if rule.kind == 'fuzzy' else '->'}{upper}"

    # --- running ---------------------------------------------------------------------------

    def run(self, committed: list[int], room: int) -> list[int]:
        if self.answer_start is None:
            self.answer_start = len(committed)
        max_k = min(self.spec.max_block, room - 1) if room > 1 else 0
        match = self.drafter.lookup(committed, max_k, self.answer_start) if max_k > 0 else None
        base = policy.plain(self.costs["target"], self.overhead)
        self._settle(committed, base)
        # An answer copying its prompt bets as llama.cpp does, bounded by its estimates alone.
        copying = match is not None and match.copying
        budget = policy.Budget(
            base, math.inf if copying else self.auto.savings + self.auto.shadow_credit
        )
        options = self.options(committed, max_k, match, budget) if max_k > 0 else []
        choice = policy.choose(base, options)
        if choice is base and budget.refused:
            self.auto.unfunded += 1
        shadow = budget.best.get("ngram")
        if choice is base and match is not None and shadow is not None:
            self._shadow(committed, match, shadow, base)
        for chain, best in budget.best.items():
            self.auto.outlook[chain] = best.rate / base.rate
        new, proposed = self._execute(choice, committed, match)
        self.auto.record(choice.chain, proposed, len(new))
        if choice is not base:  # what this round saved (or lost) against plain decoding
            self.auto.savings += len(new) * base.seconds - choice.seconds
        return new

    def _shadow(self, committed: Sequence[int], match: Match, option: Option, base: Option) -> None:
        """Keep the n-gram block this plain round did not propose (``option``: its best block
        without a budget), when it was worth it."""
        if option.rate >= policy.MIN_GAIN * base.rate:
            self.shadows.append(Shadow(len(committed), match, option))

    def _settle(self, committed: Sequence[int], base: Option) -> None:
        """Settle the shadows the committed tokens now decide: the target kept (or sampled)
        their first ``kept`` tokens, exactly what verifying them would have kept under greedy
        decoding, and as likely under sampling."""
        pending = []
        for s in self.shadows:
            block = s.block
            seen = committed[s.at : s.at + len(block)]
            kept = common_prefix(block, seen)
            if kept == len(seen) < len(block):
                pending.append(s)  # not decided yet
                continue
            self.ngram_keep.record(s.match.length, len(block), kept, quoted=s.match.quoted)
            gain = (kept + 1) * base.seconds - s.option.seconds
            self.auto.shadow_credit += gain * policy.SHADOW_CREDIT if gain > 0 else gain
            self.auto.shadows += 1
        self.shadows = pending

    def _execute(
        self, choice: Option, committed: list[int], match: Match | None
    ) -> tuple[list[int], int]:
        """Run ``choice``; the committed tokens and how many were proposed."""
        if choice.chain == "target":
            row = self.target.score(committed, [])[0]
            return [self.sampler.pick(row)], 0
        if choice.chain == "ngram":
            assert match is not None
            block = Block(match.continuation[: choice.k], None, None)
            v = verify(
                self.target,
                committed,
                block,
                self.exact,
                self.sampler,
                self.stats.stage("ngram->target"),
            )
            self.ngram_keep.record(match.length, len(block), v.n_accepted, quoted=match.quoted)
            return v.tokens, len(block)
        if choice.chain == "pyramid":
            return self._pyramid(choice, committed)
        tier = next(m for m in self.drafters if m.name == choice.chain)
        proposer = DraftProposer(tier, choice.k, self.sampler, admit=self._admit(choice))
        return self._verify_model_block(proposer, self._stage(tier.name, "target"), committed)

    def _pyramid(self, choice: Option, committed: list[int]) -> tuple[list[int], int]:
        draft, qualifier = self.ladder.draft, self.ladder.qualifier
        assert isinstance(draft, ModelTier) and qualifier is not None
        stage1 = self._stage("draft", "qualifier")

        def observe(proposed: int, kept: int) -> None:
            self.chain_keep.record(stage1, proposed, kept)

        bottom = DraftProposer(draft, choice.l_d, self.sampler)
        proposer = QualifiedProposer(
            bottom,
            qualifier,
            self.stage1_rule,
            choice.k,
            self.sampler,
            self.stats.stage(stage1),
            observe=observe,
        )
        return self._verify_model_block(proposer, self._stage("qualifier", "target"), committed)

    def _verify_model_block(
        self, proposer: DraftProposer | QualifiedProposer, stage: str, committed: list[int]
    ) -> tuple[list[int], int]:
        block = proposer.propose(committed, self.spec.max_block)
        v = verify(
            self.target, committed, block, self.top_rule, self.sampler, self.stats.stage(stage)
        )
        self.chain_keep.record(stage, len(block), v.n_accepted)
        if isinstance(proposer, DraftProposer) and proposer.top_probs:
            self.chain_keep.record_confidence(proposer.top_probs, v.n_accepted)
        return v.tokens, len(block)

    def _admit(self, choice: Option) -> Admit:
        """Propose one more drafted token while the expected tokens it adds (the chance that
        it and every one before it are kept) pay for its share of the verification at the
        rate the round was chosen for."""
        c_t = self.costs["target"]
        rate = choice.rate

        def admit(tops: list[float]) -> bool:
            n = len(tops)
            reach = 1.0
            for p in tops:
                reach *= self.chain_keep.token(p)
            return reach >= rate * (c_t(n + 1) - c_t(n))

        return admit

    def sync(self, committed: Sequence[int]) -> None:
        """Nothing to do: each tier rolls back to the committed text when next used."""
