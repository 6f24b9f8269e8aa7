"""The sampling warp shared by every tier, and sampling from a warped distribution.

Pure numpy: no ``llama_cpp`` here. ``warp`` is built once per generation from a
:class:`~pyramid_gguf.core.sampling.SamplingConfig` and applied identically at every tier, so the
proposer's ``q`` and the verifier's ``p`` are comparable (mlx-lm's ``make_sampler`` habit).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ...core.sampling import SamplingConfig
from . import warps


def softmax(logits: np.ndarray) -> np.ndarray:
    """Temperature-1 softmax over the last axis, float64. ``[..., V] -> [..., V]``."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - np.max(z, axis=-1, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=-1, keepdims=True)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Temperature-1 log-probabilities, float64. ``[..., V] -> [..., V]``."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - np.max(z, axis=-1, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def top_ids(values: np.ndarray, n: int) -> np.ndarray:
    """The ids of the ``n`` largest of ``values`` ``[V]``, largest first (lowest id on ties)."""
    n = min(max(n, 0), len(values))
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    cand = np.argpartition(-values, n - 1)[:n]
    return cand[np.lexsort((cand, -values[cand]))]


def warp(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """Warped distributions of raw logits after an empty history: llama.cpp's chain
    (``logit_bias``, then ``cfg.samplers``: :mod:`.warps`), renormalised.

    ``logits``: ``[n, V]`` (or ``[V]``). Returns float64 probabilities of the same shape.
    Temperature 0 gives one-hot rows on the argmax (lowest id on ties).
    """
    z = np.asarray(logits, dtype=np.float64)
    out = warps.finish(warps.adjust(z, cfg), cfg)
    return out[0] if z.ndim == 1 else out


class BreakerVocab(Protocol):
    """What DRY's breaker table reads of a vocabulary (:class:`~pyramid_gguf.native.Vocab`)."""

    def pieces(self) -> Sequence[bytes]:
        """Each token detokenized alone, special text included. ``[V]``."""
        ...

    def tokenize_bytes(self, data: bytes) -> list[int]:
        """Token ids of raw bytes, without BOS, special tokens not parsed."""
        ...


_TABLES: weakref.WeakKeyDictionary[BreakerVocab, dict[tuple[str, ...], warps.Breakers]] = (
    weakref.WeakKeyDictionary()
)
_TABLES_LOCK = threading.Lock()


def breakers_of(vocab: BreakerVocab, texts: tuple[str, ...]) -> warps.Breakers:
    """DRY's breaker table of ``texts`` in ``vocab`` (:func:`.warps.breaker_table`), built once
    per vocabulary and breaker set (it reads every token)."""
    with _TABLES_LOCK:
        tables = _TABLES.setdefault(vocab, {})
        if texts not in tables:
            tables[texts] = warps.breaker_table(vocab.pieces(), vocab.tokenize_bytes, texts)
        return tables[texts]


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token id from a distribution ``[V]`` (need not be normalised; must have mass)."""
    cdf = np.cumsum(probs)
    total = cdf[-1]
    if not total > 0:
        raise ValueError("cannot sample from a distribution with no mass")
    idx = int(np.searchsorted(cdf, rng.random() * total, side="right"))
    return min(idx, len(cdf) - 1)


class Sampler:
    """The warp and the random stream of one generation, built once and shared by every tier.

    Seeded from ``cfg.seed`` (None: fresh entropy), so a seeded generation is reproducible.
    A row is warped in two steps: :meth:`prepare` where its prefix is known (``logit_bias``
    and the samplers that read the prefix, the repetition penalties and DRY), then
    :meth:`warp` (the samplers of the row alone). Every tier prepares each row with that row's
    own prefix, the proposed tokens before it included, so ``p`` and ``q`` stay comparable.
    DRY's sequence breakers are found in ``vocab`` (the target's), which DRY with breakers
    needs.
    """

    def __init__(
        self,
        cfg: SamplingConfig,
        rng: np.random.Generator | None = None,
        vocab: BreakerVocab | None = None,
    ) -> None:
        self.cfg = cfg
        self.rng = rng if rng is not None else np.random.default_rng(cfg.seed)
        self.breakers: warps.Breakers = {}
        if warps.dry_on(cfg) and cfg.dry_sequence_breakers:
            if vocab is None:
                raise ValueError("DRY's sequence breakers need the vocabulary")
            self.breakers = breakers_of(vocab, cfg.dry_sequence_breakers)
        self._greedy = warps.is_greedy(cfg)
        self._adjusts = bool(cfg.logit_bias) or warps.split(cfg) > 0

    @property
    def greedy(self) -> bool:
        """Every choice is the argmax of the prepared row (lowest id on ties)."""
        return self._greedy

    def prepare(
        self, context: Sequence[int], logits: np.ndarray, drafted: Sequence[int] = ()
    ) -> np.ndarray:
        """Rows ``[n, V]`` (or one ``[V]``) after ``logit_bias`` and the samplers that read the
        prefix; row ``i`` follows ``context + drafted[:i]`` (the shape of a verification:
        ``[last, y_1..y_k]`` scored after ``context``). Returned as given when none is on."""
        if not self._adjusts:
            return logits
        z = np.asarray(logits)
        rows = np.atleast_2d(z)
        base = list(context)
        histories = [base + list(drafted[:i]) for i in range(len(rows))]
        out = warps.adjust(rows, self.cfg, histories, self.breakers)
        return out[0] if z.ndim == 1 else out

    def pick(self, logits: np.ndarray) -> int:
        """The next token from one prepared row ``[V]`` (argmax when greedy)."""
        if self.greedy:
            return int(np.argmax(logits))
        return sample(self.warp(logits), self.rng)

    def warp(self, logits: np.ndarray) -> np.ndarray:
        """Probabilities of prepared rows: the rest of the chain. ``[n, V] -> [n, V]`` (or
        ``[V]``)."""
        z = np.asarray(logits, dtype=np.float64)
        out = warps.finish(np.atleast_2d(z), self.cfg)
        return out[0] if z.ndim == 1 else out

    def sample(self, probs: np.ndarray) -> int:
        """One token id from a warped distribution ``[V]``."""
        return sample(probs, self.rng)
