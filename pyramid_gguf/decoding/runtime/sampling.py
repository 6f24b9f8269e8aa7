"""The sampling warp shared by every tier, and sampling from a warped distribution.

Pure numpy: no ``llama_cpp`` here. ``warp`` is built once per generation from a
:class:`~pyramid_gguf.core.sampling.SamplingConfig` and applied identically at every tier, so the
proposer's ``q`` and the verifier's ``p`` are comparable (mlx-lm's ``make_sampler`` habit).
"""

from __future__ import annotations

import numpy as np

from ...core.sampling import SamplingConfig


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
    """Warped distributions of raw logits: temperature, top-k, top-p, min-p, renormalised.

    ``logits``: ``[n, V]`` (or ``[V]``). Returns float64 probabilities of the same shape.
    Temperature 0 gives one-hot rows on the argmax (lowest id on ties).
    """
    z = np.asarray(logits, dtype=np.float64)
    squeeze = z.ndim == 1
    z = np.atleast_2d(z)
    n, vocab = z.shape
    out = np.zeros_like(z)
    if cfg.temperature == 0:
        out[np.arange(n), np.argmax(z, axis=-1)] = 1.0
        return out[0] if squeeze else out
    z = z / cfg.temperature
    k = cfg.top_k if 0 < cfg.top_k < vocab else vocab
    needs_order = k < vocab or cfg.top_p < 1.0
    if not needs_order:
        probs = softmax(z)
        if cfg.min_p > 0:
            probs = _min_p(probs, cfg.min_p)
        return probs[0] if squeeze else probs
    if k < vocab:
        cand = np.argpartition(-z, k - 1, axis=-1)[:, :k]  # [n, k], unordered
    else:
        cand = np.broadcast_to(np.arange(vocab), (n, vocab))
    vals = np.take_along_axis(z, cand, axis=-1)
    # Descending by value, ascending id on ties: deterministic at every tier.
    order = np.lexsort((cand, -vals), axis=-1)
    cand = np.take_along_axis(cand, order, axis=-1)
    probs = softmax(np.take_along_axis(vals, order, axis=-1))  # [n, k], sorted descending
    if cfg.top_p < 1.0:
        # Keep the smallest prefix whose mass reaches top_p (a relative epsilon absorbs
        # rounding, so a prefix summing to exactly top_p is not extended by one token).
        before = np.cumsum(probs, axis=-1) - probs  # mass strictly above each candidate
        probs = np.where(before < cfg.top_p * (1 - 1e-9), probs, 0.0)
    probs = _min_p(probs, cfg.min_p) if cfg.min_p > 0 else probs / probs.sum(-1, keepdims=True)
    np.put_along_axis(out, cand, probs, axis=-1)
    return out[0] if squeeze else out


def _min_p(probs: np.ndarray, min_p: float) -> np.ndarray:
    """Drop tokens under ``min_p`` times the row's top probability, renormalise. ``[n, *]``."""
    keep = probs >= min_p * probs.max(axis=-1, keepdims=True)
    kept = np.where(keep, probs, 0.0)
    return kept / kept.sum(axis=-1, keepdims=True)


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
    """

    def __init__(self, cfg: SamplingConfig, rng: np.random.Generator | None = None) -> None:
        self.cfg = cfg
        self.rng = rng if rng is not None else np.random.default_rng(cfg.seed)

    @property
    def greedy(self) -> bool:
        """Temperature 0: every choice is the argmax (lowest id on ties)."""
        return self.cfg.temperature == 0

    def pick(self, logits: np.ndarray) -> int:
        """The next token from one row of raw logits ``[V]`` (argmax when greedy)."""
        if self.greedy:
            return int(np.argmax(logits))
        return sample(warp(logits, self.cfg), self.rng)

    def warp(self, logits: np.ndarray) -> np.ndarray:
        """:func:`warp` with this generation's config. ``[n, V] -> [n, V]`` (or ``[V]``)."""
        return warp(logits, self.cfg)

    def sample(self, probs: np.ndarray) -> int:
        """One token id from a warped distribution ``[V]``."""
        return sample(probs, self.rng)
