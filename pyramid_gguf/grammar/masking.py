"""Applying allowed-token masks to logits (pure numpy).

Masks are boolean ``[..., V]`` arrays (True: the grammar allows the token), as
:class:`~pyramid_gguf.grammar.Constraint` returns them; logits rows are float ``[..., V]``.
A masked row fed to any softmax or warp is the target's distribution restricted to the allowed
tokens and renormalised, which is what a lossless constrained decoder must preserve.
"""

from __future__ import annotations

import numpy as np


def mask_logits(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """``logits`` with every disallowed token set to ``-inf``: ``[n, V], [n, V] -> [n, V]``
    (any shapes that broadcast; a ``[V]`` mask applies to every row). Returns a new array of
    ``logits``' dtype (floating)."""
    logits = np.asarray(logits)
    return np.where(allowed, logits, np.array(-np.inf, dtype=logits.dtype))


def masked_argmax(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Greedy tokens under the masks: ``[n, V], [n, V] -> [n]`` int64, the lowest id on ties,
    ``-1`` for a row that allows nothing (after a refused draft token)."""
    best = np.argmax(mask_logits(logits, allowed), axis=-1)
    return np.where(np.any(allowed, axis=-1), best, -1)
