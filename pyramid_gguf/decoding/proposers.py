"""Proposers: a model draft, an n-gram (prompt lookup) draft, and a qualified stage.

All three implement :class:`~pyramid_gguf.protocol.Proposer`. A :class:`QualifiedProposer`
wraps a lower proposer and a verifier model: it repeats "lower proposes, verifier checks in one
batch" until it holds ``block_len`` qualified tokens, and offers them upward with the verifier's
distributions as ``q``. That is the pyramid's middle tier, and nothing else knows it exists.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .protocol import Block, Proposer
from .sampling import Sampler, softmax
from .stage import StageRule, verify
from .stats import StageStats
from .tiers import ModelTier


class DraftProposer:
    """A small model drafting autoregressively with the shared sampler.

    Stops early at end-of-generation, or when ``p_min > 0`` and the draft's top probability
    (temperature-1 softmax) falls under it.
    """

    def __init__(
        self,
        tier: ModelTier,
        length: int,
        sampler: Sampler,
        *,
        p_min: float = 0.0,
    ) -> None:
        self.name = tier.name
        self.tier = tier
        self.length = length
        self.sampler = sampler
        self.p_min = p_min

    def propose(self, context: Sequence[int], max_tokens: int) -> Block:
        k = min(self.length, max_tokens)
        if k <= 0:
            return Block([], None, None)
        tokens: list[int] = []
        qs: list[np.ndarray] = []
        zs: list[np.ndarray] = []
        z = self.tier.score(context, [])[0]
        while True:
            if self.p_min > 0 and softmax(z).max() < self.p_min:
                break
            q = self.sampler.warp(z)
            y = self.sampler.sample(q)
            tokens.append(y)
            qs.append(q)
            zs.append(z)
            if len(tokens) == k or self.tier.is_eog(y):
                break
            z = self.tier.step(y)
        if not tokens:
            return Block([], None, None)
        return Block(tokens, np.stack(qs), np.stack(zs))

    def sync(self, committed: Sequence[int]) -> None:
        self.tier.sync(committed)


class NGramProposer:
    """Prompt lookup: find the latest earlier occurrence of the context's last n-gram and
    propose what followed it. Costs no model evaluation; proposals are deterministic.
    """

    name = "ngram"

    def __init__(self, length: int, *, max_ngram: int = 4, min_ngram: int = 1) -> None:
        self.length = length
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose(self, context: Sequence[int], max_tokens: int) -> Block:
        k = min(self.length, max_tokens)
        return Block(lookup(context, k, self.max_ngram, self.min_ngram), None, None)

    def sync(self, committed: Sequence[int]) -> None:
        return None


def lookup(context: Sequence[int], k: int, max_ngram: int = 4, min_ngram: int = 1) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier match of ``context``'s suffix.

    Tries the longest suffix n-gram first (``max_ngram`` down to ``min_ngram``).
    """
    if k <= 0:
        return []
    seq = np.asarray(context, dtype=np.int64)
    n_ctx = len(seq)
    for n in range(min(max_ngram, n_ctx - 1), min_ngram - 1, -1):
        pattern = seq[n_ctx - n :]
        windows = np.lib.stride_tricks.sliding_window_view(seq[: n_ctx - 1], n)
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return [int(t) for t in seq[start : start + k]]
    return []


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
    ) -> None:
        self.name = verifier.name
        self.lower = lower
        self.verifier = verifier
        self.rule = rule
        self.block_len = block_len
        self.sampler = sampler
        self.stats = stats

    def propose(self, context: Sequence[int], max_tokens: int) -> Block:
        want = min(self.block_len, max_tokens)
        tokens: list[int] = []
        ps: list[np.ndarray] = []
        zs: list[np.ndarray] = []
        ctx = list(context)
        while len(tokens) < want:
            block = self.lower.propose(ctx, want - len(tokens))
            v = verify(self.verifier, ctx, block, self.rule, self.sampler, self.stats)
            tokens += v.tokens
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
        return Block(tokens[:n], np.concatenate(ps)[:n], np.concatenate(zs)[:n])

    def sync(self, committed: Sequence[int]) -> None:
        self.lower.sync(committed)
        self.verifier.sync(committed)
