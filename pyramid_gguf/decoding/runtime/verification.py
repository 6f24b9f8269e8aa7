"""One verification: a verifier scores a proposed :class:`Block` in one batch, and a rule keeps
a prefix of it and adds one token of its own (docs/ALGORITHMS.md, "One stage").

:func:`verify` is what both the qualifier (inside a :class:`~.proposers.QualifiedProposer`) and
the target (:meth:`~.rounds.RoundRunner.speculate`) run, so the qualifier is not special-cased
anywhere. The rules below it are pure numpy, on the naming of Leviathan et al. 2023: the
proposer offered ``k`` tokens ``y`` with its warped distributions ``q`` (``[k, V]``) and raw
logits; the verifier scored ``[last_committed, y_1..y_k]`` in one batch, giving warped
distributions ``p`` (``[k+1, V]``) and raw logits. ``p`` is always the verifier, ``q`` the
proposer.

- :func:`exact`: speculative sampling; :func:`greedy` is what it (and every lossless rule)
  reduces to at temperature 0: token matching;
- :func:`fuzzy`: fuzzy speculative decoding, ``reducible`` or ``pure``, on a divergence of
  :data:`DIVERGENCE_FNS` (:func:`js`, :func:`kl`, :func:`tv`);
- :func:`greedy_match`: llama.cpp's rule.

Every rule returns a :class:`StageOutcome`: how many proposals were accepted and the one token
the verifier adds after them (the residual sample at the first rejection, or the bonus token
from ``p[k]`` when all were accepted). Randomness comes only from the ``Generator`` passed in,
drawn in a fixed order, so ``fuzzy`` with ``tau < 0`` consumes it exactly like ``exact``.

Pure: no ``llama_cpp`` import (the verifier and the grammar are only types here).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..pricing.chains import StageRule
from .sampling import Sampler, sample, softmax
from .stats import StageStats

if TYPE_CHECKING:
    from .guide import Guide
    from .tiers import ModelTier


@dataclass(frozen=True)
class Block:
    """Proposed tokens with what the proposer knew about them.

    ``tokens``: ``[k]`` ids. ``q``: ``[k, V]`` the proposer's warped distributions they were
    sampled from, or None for a deterministic proposer (treated as one-hot). ``logits``:
    ``[k, V]`` the proposer's raw logits (for fuzzy rules), or None when it has none.
    """

    tokens: list[int]
    q: np.ndarray | None
    logits: np.ndarray | None

    def __len__(self) -> int:
        return len(self.tokens)

    def cut(self, n: int) -> Block:
        """The first ``n`` proposals (with their rows)."""
        if n >= len(self.tokens):
            return self
        q = None if self.q is None else self.q[:n]
        logits = None if self.logits is None else self.logits[:n]
        return Block(self.tokens[:n], q, logits)


#: A proposer's answer when it has nothing to offer.
EMPTY = Block([], None, None)


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
    grammar's (:func:`~.rounds.with_forced`): they are verified like any proposal but counted
    apart from the drafted ones.
    """
    rng = sampler.rng
    if guide is not None:
        block = block.cut(guide.valid(context, block.tokens))
        forced = min(forced, len(block))
    z = verifier.score(context, block.tokens)  # [k + 1, V]
    if guide is not None:
        z = guide.mask(context, z, block.tokens)
    warped = sampler.prepare(context, z, block.tokens)  # each row after its own prefix
    tokens = np.asarray(block.tokens, dtype=np.int64)
    if sampler.greedy and rule.kind != "fuzzy":  # every lossless rule is token matching
        outcome = greedy(tokens, warped)
        n = outcome.n_accepted
        _record(stats, len(block.tokens), n, forced)
        return Verified([*block.tokens[:n], outcome.token], None, z[: n + 1], n)
    p = sampler.warp(warped)
    q = block.q  # None: a deterministic proposer (one-hot)
    if rule.kind == "greedy-match":
        outcome = greedy_match(tokens, p, rng)
    elif rule.kind == "fuzzy":
        outcome = fuzzy(
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
        outcome = exact(tokens, p, q, rng)
    n = outcome.n_accepted
    _record(stats, len(block.tokens), n, forced)
    return Verified([*block.tokens[:n], outcome.token], p[: n + 1], z[: n + 1], n)


def _record(stats: StageStats, proposed: int, accepted: int, forced: int) -> None:
    """Count the drafted part of a verified block (a block of forced tokens only is none)."""
    if proposed > forced:
        stats.record(proposed - forced, max(accepted - forced, 0))


# --- the rules, pure numpy --------------------------------------------------------------------


@dataclass(frozen=True)
class StageOutcome:
    """``n_accepted`` of the ``k`` proposals, then ``token`` (correction or bonus)."""

    n_accepted: int
    token: int


# --- divergences on temperature-1 softmax of raw logits ---------------------------------------


_LOG_FLOOR = -1e30


def _dist(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Temperature-1 softmax and log-softmax with one ``exp``. ``[k, V] -> [k, V] x2``.

    Masked (``-inf``) logits get a log-probability of ``-1e30``, not ``-inf``, so that
    ``0 * log 0`` terms vanish; a KL that was infinite stays above any threshold.
    """
    z = np.asarray(logits, dtype=np.float64)
    z = np.maximum(z - np.max(z, axis=-1, keepdims=True), _LOG_FLOOR)
    e = np.exp(z)
    total = np.sum(e, axis=-1, keepdims=True)
    return e / total, z - np.log(total)


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise ``sum a * b``. ``[k, V] x2 -> [k]``."""
    return np.einsum("ij,ij->i", a, b)


def js(verifier_logits: np.ndarray, proposer_logits: np.ndarray) -> np.ndarray:
    """Jensen-Shannon divergence (natural log, at most ln 2) per row. ``[k, V] x2 -> [k]``.

    ``(sum p log p + sum q log q) / 2 - sum m log m`` with ``m = (p + q) / 2``: two ``exp``
    and one ``log`` over the vocabulary (the scheduler's largest cost in the fuzzy modes).
    """
    p, lp = _dist(np.atleast_2d(verifier_logits))
    q, lq = _dist(np.atleast_2d(proposer_logits))
    m = 0.5 * (p + q)
    lm = np.log(m, out=np.zeros_like(m), where=m > 0)
    return np.clip(0.5 * (_dot(p, lp) + _dot(q, lq)) - _dot(m, lm), 0.0, np.log(2.0))


def kl(verifier_logits: np.ndarray, proposer_logits: np.ndarray) -> np.ndarray:
    """KL(p || q) per row, p the verifier. ``[k, V] x2 -> [k]``."""
    p, lp = _dist(np.atleast_2d(verifier_logits))
    _, lq = _dist(np.atleast_2d(proposer_logits))
    return np.maximum(_dot(p, lp - lq), 0.0)


def tv(verifier_logits: np.ndarray, proposer_logits: np.ndarray) -> np.ndarray:
    """Total variation distance per row. ``[k, V] x2 -> [k]``."""
    p = softmax(np.atleast_2d(verifier_logits))
    q = softmax(np.atleast_2d(proposer_logits))
    return 0.5 * np.sum(np.abs(p - q), axis=-1)


DIVERGENCE_FNS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "js": js,
    "kl": kl,
    "tv": tv,
}


# --- the three stage rules, and greedy: what the lossless ones are at temperature 0 ----------


def _proposal_probs(dist: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """``dist[i, tokens[i]]`` for each row. ``[k, V], [k] -> [k]``."""
    return dist[np.arange(len(tokens)), tokens]


def _residual_or_bonus(
    n: int, tokens: np.ndarray, p: np.ndarray, q: np.ndarray | None, rng: np.random.Generator
) -> int:
    """Bonus from ``p[k]`` if all ``k`` were accepted, else a sample of norm(max(0, p_n - q_n))
    (``q`` None: one-hot proposals, so the residual is ``p_n`` without the refused token)."""
    if n == len(tokens):
        return sample(p[n], rng)
    if q is None:
        residual = p[n].copy()
        residual[tokens[n]] = 0.0
    else:
        residual = np.maximum(p[n] - q[n], 0.0)
    if residual.sum() <= 0:  # p_n == q_n: a rejection has probability 0; keep the sampler total
        residual = p[n]
    return sample(residual, rng)


def greedy(tokens: np.ndarray, logits: np.ndarray) -> StageOutcome:
    """Temperature 0, where every lossless rule is token matching: keep ``y_i`` while it is
    the verifier's argmax (lowest id on ties), then emit the argmax. ``logits``: ``[k+1, V]``.
    """
    best = np.argmax(logits, axis=-1)
    n = _first_false(best[: len(tokens)] == np.asarray(tokens, dtype=np.int64))
    return StageOutcome(n, int(best[n]))


def exact(
    tokens: np.ndarray, p: np.ndarray, q: np.ndarray | None, rng: np.random.Generator
) -> StageOutcome:
    """Speculative sampling (Leviathan Alg. 1): accept ``y_i`` w.p. ``min(1, p_i(y_i)/q_i(y_i))``.

    ``tokens``: ``[k]`` ids; ``p``: ``[k+1, V]`` verifier; ``q``: ``[k, V]`` proposer, or None
    for a deterministic proposer (one-hot ``q``). The emitted tokens are distributed exactly
    as the verifier's own samples.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    k = len(tokens)
    u = rng.random(k)
    accept = _exact_accepts(tokens, p, q, u)
    n = _first_false(accept)
    return StageOutcome(n, _residual_or_bonus(n, tokens, p, q, rng))


def fuzzy(
    tokens: np.ndarray,
    p: np.ndarray,
    q: np.ndarray | None,
    verifier_logits: np.ndarray,
    proposer_logits: np.ndarray | None,
    rng: np.random.Generator,
    *,
    tau: float,
    divergence: str = "js",
    variant: str = "reducible",
) -> StageOutcome:
    """Fuzzy speculative decoding (FSD): accept ``y_i`` when ``Div <= tau``.

    ``reducible`` (default): a position failing the threshold still gets the exact test, and
    the first position failing both is replaced by a residual sample, so ``tau < 0`` is exactly
    :func:`exact`. ``pure``: accept iff ``Div <= tau``; the first failure is replaced by a
    sample of ``p_i``. ``Div`` is computed on the temperature-1 softmax of raw logits
    (``[k+1, V]`` verifier, ``[k, V]`` proposer); a proposer with no logits (n-gram) has
    infinite divergence, so only the exact test can accept its tokens.

    ``Div`` is computed one row at a time and only where it decides the outcome (``reducible``:
    positions the exact test refuses, up to the first refusal it does not overturn; ``pure``:
    up to the first position over the threshold): about one vocabulary pass per verification
    instead of ``k``, with the outcome of computing every row.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    k = len(tokens)
    u = rng.random(k)
    fn = DIVERGENCE_FNS[divergence]

    def close(i: int) -> bool:
        if tau < 0 or proposer_logits is None:
            return False
        return bool(fn(verifier_logits[i : i + 1], proposer_logits[i : i + 1])[0] <= tau)

    if variant == "pure":
        n = next((i for i in range(k) if not close(i)), k)
        return StageOutcome(n, sample(p[n], rng))
    exact_ok = _exact_accepts(tokens, p, q, u)
    n = next((i for i in range(k) if not exact_ok[i] and not close(i)), k)
    return StageOutcome(n, _residual_or_bonus(n, tokens, p, q, rng))


def greedy_match(tokens: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> StageOutcome:
    """llama.cpp's rule: sample the verifier at each position, accept while it equals ``y_i``.

    ``tokens``: ``[k]``; ``p``: ``[k+1, V]``. Lossless and needs no ``q``.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    for i, y in enumerate(tokens):
        t = sample(p[i], rng)
        if t != int(y):
            return StageOutcome(i, t)
    return StageOutcome(len(tokens), sample(p[len(tokens)], rng))


def _exact_accepts(
    tokens: np.ndarray, p: np.ndarray, q: np.ndarray | None, u: np.ndarray
) -> np.ndarray:
    """``u_i < p_i(y_i) / q_i(y_i)`` per position, written without a division (``q`` None:
    ``q_i(y_i) = 1``). ``-> [k] bool``."""
    py = _proposal_probs(p[: len(tokens)], tokens)
    qy = 1.0 if q is None else _proposal_probs(q, tokens)
    return u * qy < py


def _first_false(flags: np.ndarray) -> int:
    """Index of the first False, or ``len(flags)`` if there is none."""
    misses = np.flatnonzero(~flags)
    return int(misses[0]) if len(misses) else len(flags)
