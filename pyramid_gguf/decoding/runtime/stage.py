"""One verification: a verifier scores a proposed block in one batch and a rule decides.

This is the piece both the qualifier stage and the final target stage run, so the qualifier is
not special-cased anywhere: it is a :class:`~.proposers.QualifiedProposer` whose verification
is this same function.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..pricing.chains import StageRule
from . import acceptance
from .guide import Guide
from .protocol import Block
from .sampling import Sampler
from .stats import StageStats
from .tiers import ModelTier


@dataclass(frozen=True)
class Verified:
    """Outcome of one verification.

    ``tokens``: the ``n_accepted`` accepted proposals then the verifier's token, ``[n + 1]``.
    ``p``: the verifier's warped distributions at those positions, ``[n + 1, V]``, or None
    at temperature 0 (one-hot on ``tokens``: the verified tokens are deterministic).
    ``logits``: the verifier's raw logits at those positions, ``[n + 1, V]``.
    """

    tokens: list[int]
    p: np.ndarray | None
    logits: np.ndarray
    n_accepted: int


def verify(
    verifier: ModelTier,
    context: Sequence[int],
    block: Block,
    rule: StageRule,
    sampler: Sampler,
    stats: StageStats,
    guide: Guide | None = None,
    forced: int = 0,
) -> Verified:
    """Score ``[last, y_1..y_k]`` in one batch and apply ``rule``; record into ``stats``.

    With a ``guide`` the block is first cut at the first token the grammar refuses (an n-gram
    block, say) and every row is masked to the grammar's allowed tokens, so ``p`` is the
    verifier's distribution under the grammar. The first ``forced`` tokens of the block are the
    grammar's (:func:`~.protocol.with_forced`): they are verified like any proposal but counted
    apart from the drafted ones.
    """
    rng = sampler.rng
    if guide is not None:
        block = block.cut(guide.valid(context, block.tokens))
        forced = min(forced, len(block))
    z = verifier.score(context, block.tokens)  # [k + 1, V]
    if guide is not None:
        z = guide.mask(context, z, block.tokens)
    tokens = np.asarray(block.tokens, dtype=np.int64)
    if sampler.greedy and rule.kind != "fuzzy":  # every lossless rule is token matching
        outcome = acceptance.greedy(tokens, z)
        n = outcome.n_accepted
        _record(stats, len(block.tokens), n, forced)
        return Verified([*block.tokens[:n], outcome.token], None, z[: n + 1], n)
    p = sampler.warp(z)
    q = block.q  # None: a deterministic proposer (one-hot)
    if rule.kind == "greedy-match":
        outcome = acceptance.greedy_match(tokens, p, rng)
    elif rule.kind == "fuzzy":
        outcome = acceptance.fuzzy(
            tokens,
            p,
            q,
            z,
            block.logits,
            rng,
            tau=rule.tau,
            divergence=rule.divergence,
            variant=rule.variant,
        )
    else:
        outcome = acceptance.exact(tokens, p, q, rng)
    n = outcome.n_accepted
    _record(stats, len(block.tokens), n, forced)
    return Verified([*block.tokens[:n], outcome.token], p[: n + 1], z[: n + 1], n)


def _record(stats: StageStats, proposed: int, accepted: int, forced: int) -> None:
    """Count the drafted part of a verified block (a block of forced tokens only is none)."""
    if proposed > forced:
        stats.record(proposed - forced, max(accepted - forced, 0))
