"""Target-anchored quality of emitted text: how the target itself scores each emitted token.

After a benchmark run, the target evaluates each answer teacher-forced (the prompt, then the
answer, in batches of :data:`ROWS_PER_BATCH` rows; the engine is not involved) and every
emitted token ``y_i`` gets, from the target's raw logits ``z_i`` at its position (``[V]``,
temperature 1, no top-k / top-p):

- its negative log-probability ``-log softmax(z_i)[y_i]`` in nats, which is
  ``KL(onehot(y_i) || p_T)``, the cross-entropy of the emitted text under the target;
- whether it is the target's argmax there (lowest id on ties, as greedy decoding picks).

Under greedy decoding the target's own answer is its argmax at every position (up to
floating-point near-ties between batched and one-token kernels), so a lossy mode's mean
negative log-probability above ``target``'s, and its argmax share below it, measure what its
fuzzy acceptances cost, on any text (prose included), without a task-specific grader.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..decoding.runtime.tiers import ModelTier

#: Answer rows read per teacher-forced batch (each row is ``n_vocab`` float32).
ROWS_PER_BATCH = 32


@dataclass
class TokenQuality:
    """Emitted tokens scored under the target: how many, their summed negative
    log-probability (nats) and how many were the target's argmax."""

    tokens: int = 0
    nll: float = 0.0
    argmax: int = 0

    def add(self, other: TokenQuality) -> None:
        self.tokens += other.tokens
        self.nll += other.nll
        self.argmax += other.argmax

    @classmethod
    def pooled(cls, parts: Iterable[TokenQuality]) -> TokenQuality:
        """The sum of ``parts`` (no tokens when there are none)."""
        out = cls()
        for q in parts:
            out.add(q)
        return out

    @property
    def mean_nll(self) -> float:
        """Nats per emitted token (0 without tokens)."""
        return self.nll / self.tokens if self.tokens else 0.0

    @property
    def argmax_share(self) -> float:
        """Share of emitted tokens that were the target's argmax (1 without tokens)."""
        return self.argmax / self.tokens if self.tokens else 1.0


def score_rows(logits: np.ndarray, tokens: Sequence[int]) -> TokenQuality:
    """Score ``tokens`` (``[n]`` ids) against the raw logits predicting them (``[n, V]``)."""
    z = np.asarray(logits, dtype=np.float64)
    ids = np.asarray(tokens, dtype=np.int64)
    if len(ids) == 0:
        return TokenQuality()
    top = z.max(axis=-1)
    lse = top + np.log(np.exp(z - top[:, None]).sum(axis=-1))
    picked = z[np.arange(len(ids)), ids]
    return TokenQuality(
        len(ids), float(np.sum(lse - picked)), int(np.sum(z.argmax(axis=-1) == ids))
    )


@contextmanager
def _prompt_held(tier: ModelTier, prompt: Sequence[int]) -> Iterator[None]:
    """The tier's cache holds exactly ``prompt[:-1]`` inside, evaluated afresh; empty before
    and after."""
    tier.model.clear()
    try:
        tier.model.eval(prompt[:-1])
        yield
    finally:
        tier.model.clear()


def _answer_chunks(
    tier: ModelTier, prompt: Sequence[int], answer: Sequence[int]
) -> Iterator[tuple[np.ndarray, list[int]]]:
    """The forced rows of ``answer`` from a cache holding ``prompt[:-1]``, which is rolled
    back to that prefix afterwards (same tokens in the same batches each time, so every
    answer's rows are what a fresh prompt would give)."""
    try:
        feed = [prompt[-1], *answer[:-1]]
        for i in range(0, len(feed), ROWS_PER_BATCH):
            chunk = feed[i : i + ROWS_PER_BATCH]
            yield tier.model.eval(chunk, range(len(chunk))), list(answer[i : i + len(chunk)])
    finally:
        tier.model.rollback(len(prompt) - 1)


def forced_chunks(
    tier: ModelTier, prompt: Sequence[int], answer: Sequence[int]
) -> Iterator[tuple[np.ndarray, list[int]]]:
    """``tier``'s raw logits predicting each answer token, teacher-forced, a batch at a time:
    ``([c, V] float32, the c answer tokens they predict)``. The cache is emptied before and
    after."""
    with _prompt_held(tier, prompt):
        yield from _answer_chunks(tier, prompt, answer)


def score_answer(tier: ModelTier, prompt: Sequence[int], answer: Sequence[int]) -> TokenQuality:
    """``answer`` (emitted after ``prompt``, which must not be empty) scored under ``tier``."""
    return score_answers(tier, prompt, [answer])[0]


def score_answers(
    tier: ModelTier, prompt: Sequence[int], answers: Sequence[Sequence[int]]
) -> list[TokenQuality]:
    """Each of ``answers`` (all emitted after the same non-empty ``prompt``) scored under
    ``tier``, as :func:`score_answer` would score it alone, with the prompt evaluated once."""
    with _prompt_held(tier, prompt):
        return [
            TokenQuality.pooled(score_rows(r, t) for r, t in _answer_chunks(tier, prompt, a))
            if a
            else TokenQuality()
            for a in answers
        ]
