"""The proposers: whatever offers the next tokens of a round, with what it knew about them.

A :class:`Proposer` offers up to ``k`` continuations of a context as a
:class:`~.verification.Block`. Three implement it, so a ladder of any height is one loop
(transformers' candidate-generator idea):

- :class:`DraftProposer`: a small model drafting token by token with the shared sampler;
- :class:`NGramProposer`: the n-gram drafter, proposing what followed the longest earlier
  match of the context's suffix (prompt lookup; the index is :mod:`.ngram`);
- :class:`QualifiedProposer`: a stage, a lower proposer checked by a verifier model (the
  pyramid's qualifier): it repeats "lower proposes, verifier checks in one batch" until it
  holds ``block_len`` qualified tokens, and offers them upward with the verifier's
  distributions as ``q``. Nothing else knows the qualifier exists.

:meth:`~.rounds.RoundRunner.build_proposer` stacks them into the proposer of any chain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from ...core.ladder import NGRAM
from ..pricing.chains import StageRule
from .guide import Guide
from .ngram import KEY, Match, NGramLookup, NGramPool
from .sampling import Sampler
from .stats import StageStats
from .tiers import ModelTier
from .verification import EMPTY, Block, verify


class Proposer(Protocol):
    """Offers up to ``max_tokens`` continuations of ``context``."""

    name: str

    def propose(self, context: Sequence[int], max_tokens: int) -> Block: ...

    def sync(self, committed: Sequence[int]) -> None:
        """Forget everything past ``committed`` (KV rollback for model-backed proposers)."""
        ...


#: Decides whether the next drafted token joins the block, from the draft's top
#: probabilities (temperature-1 softmax) of the block so far, the candidate's last.
Admit = Callable[[list[float]], bool]
#: Hears each check of a qualified stage: tokens proposed to its verifier, tokens kept.
Observe = Callable[[int, int], None]


def top_probability(logits: np.ndarray) -> float:
    """The largest temperature-1 softmax probability of one row ``[V]``."""
    z = np.asarray(logits, dtype=np.float64)
    return float(1.0 / np.exp(z - z.max()).sum())


class DraftProposer:
    """A small model drafting autoregressively with the shared sampler.

    Stops early at end-of-generation, or when ``admit`` refuses the next token: by default
    when ``p_min > 0`` and the draft's top probability (temperature-1 softmax) falls under it;
    ``auto`` passes a cost-aware rule. The decision depends on the draft alone, so the
    verification stays lossless.
    """

    def __init__(
        self,
        tier: ModelTier,
        length: int,
        sampler: Sampler,
        *,
        p_min: float = 0.0,
        admit: Admit | None = None,
        guide: Guide | None = None,
    ) -> None:
        self.name = tier.name
        self.guide = guide
        self.tier = tier
        self.length = length
        self.sampler = sampler
        self.admit: Admit = admit or (lambda tops: tops[-1] >= p_min)
        #: The draft's top probability is only computed when something decides by it.
        self.needs_tops = admit is not None or p_min > 0
        #: Top probabilities of the last proposed block, ``[k]``.
        self.top_probs: list[float] = []

    def propose(self, context: Sequence[int], max_tokens: int) -> Block:
        k = min(self.length, max_tokens)
        if k <= 0:
            return EMPTY
        tokens: list[int] = []
        qs: list[np.ndarray] = []
        zs: list[np.ndarray] = []
        tops: list[float] = []
        z = self._masked(context, [], self.tier.score(context, [])[0])
        while True:
            if self.needs_tops:
                tops.append(top_probability(z))
                if not self.admit(tops):
                    tops.pop()
                    break
            w = self.sampler.prepare([*context, *tokens], z)  # bias, penalties: this prefix
            if self.sampler.greedy:
                y = int(np.argmax(w))  # q is one-hot: the block is deterministic
            else:
                q = self.sampler.warp(w)
                y = self.sampler.sample(q)
                qs.append(q)
            tokens.append(y)
            zs.append(z)
            if len(tokens) == k or self.tier.is_eog(y):
                break
            z = self._masked(context, tokens, self.tier.step(y))
        self.top_probs = tops
        if not tokens:
            return EMPTY
        return Block(tokens, np.stack(qs) if qs else None, np.stack(zs))

    def _masked(self, context: Sequence[int], drafted: list[int], z: np.ndarray) -> np.ndarray:
        """The draft's row ``[V]`` after ``context + drafted``, masked by the grammar: the
        draft proposes from its own distribution under the grammar, so its block is valid and
        its ``q`` is what the verification's rule must see."""
        return z if self.guide is None else self.guide.mask([*context, *drafted], z)

    def sync(self, committed: Sequence[int]) -> None:
        self.tier.sync(committed)


class QualifiedProposer:
    """A stage: ``lower`` proposes, ``verifier`` checks each block in one batch with ``rule``;
    the accepted tokens plus the verifier's correction/bonus token fill a buffer of
    ``block_len`` tokens, offered upward with the verifier's distributions as ``q``.
    """

    def __init__(
        self,
        lower: Proposer,
        verifier: ModelTier,
        rule: StageRule,
        block_len: int,
        sampler: Sampler,
        stats: StageStats,
        *,
        observe: Observe | None = None,
        guide: Guide | None = None,
    ) -> None:
        self.observe = observe
        self.guide = guide
        self.name = verifier.name
        self.lower = lower
        self.verifier = verifier
        self.rule = rule
        self.block_len = block_len
        self.sampler = sampler
        self.stats = stats

    def propose(self, context: Sequence[int], max_tokens: int) -> Block:
        want = min(self.block_len, max_tokens)
        if want <= 0:
            return EMPTY
        tokens: list[int] = []
        ps: list[np.ndarray] = []
        zs: list[np.ndarray] = []
        ctx = list(context)
        while len(tokens) < want:
            block = self.lower.propose(ctx, want - len(tokens))
            v = verify(self.verifier, ctx, block, self.rule, self.sampler, self.stats, self.guide)
            if self.observe is not None:
                self.observe(len(block), v.n_accepted)
            tokens += v.tokens
            if v.p is not None:
                ps.append(v.p)
            zs.append(v.logits)
            ctx += v.tokens
            self.lower.sync(ctx)
            eog = next((i for i, t in enumerate(v.tokens) if self.verifier.is_eog(t)), None)
            if eog is not None:
                cut = len(tokens) - len(v.tokens) + eog + 1
                tokens = tokens[:cut]
                break
        n = min(len(tokens), max_tokens)
        q = np.concatenate(ps)[:n] if ps else None  # None at temperature 0: deterministic
        return Block(tokens[:n], q, np.concatenate(zs)[:n])

    def sync(self, committed: Sequence[int]) -> None:
        self.lower.sync(committed)
        self.verifier.sync(committed)


class NGramProposer:
    """The n-gram drafter: proposes up to ``length`` tokens that followed the longest earlier
    match of the context's suffix, in the context itself or in the shared ``pool``, when the
    match is at least ``min_match`` tokens long. Deterministic: its blocks have no ``q``.

    ``auto`` reads the match first (:meth:`match`: its length and source price the block),
    then proposes it: :meth:`propose` at the context of the last :meth:`match` offers that
    same match's continuation. ``answer_start``: where the answer starts in the contexts it is
    given; matches before it (and in the pool) are :attr:`~.ngram.Match.quoted`.
    """

    name = NGRAM.name

    def __init__(self, length: int, *, min_match: int = KEY, pool: NGramPool | None = None):
        self.length = length
        self.min_match = max(min_match, KEY)
        self.matcher = NGramLookup(pool)
        self.answer_start = 0
        #: The last :meth:`match`: its context, its ``max_tokens`` and what it found.
        self._last: tuple[list[int], int, Match | None] | None = None

    def match(self, context: Sequence[int], max_tokens: int) -> Match | None:
        """The longest match of ``context``'s suffix (any length), with up to ``max_tokens``
        tokens of what followed it; None when there is none."""
        found = self.matcher.lookup(context, max_tokens, self.answer_start)
        self._last = (list(context), max_tokens, found)
        return found

    def propose(self, context: Sequence[int], max_tokens: int) -> Block:
        k = min(self.length, max_tokens)
        if k <= 0:
            return EMPTY
        last = self._last
        if last is not None and k <= last[1] and last[0] == list(context):
            found = last[2]  # the match auto priced
        else:
            found = self.match(context, k)
        if found is None or found.length < self.min_match:
            return EMPTY
        return Block(found.continuation[:k], None, None)

    def sync(self, committed: Sequence[int]) -> None:
        return None
