"""The proposer protocol: anything that offers ``k`` tokens with their distributions.

A model draft, an n-gram lookup and a qualified stage (a proposer checked by a mid-size model)
all implement :class:`Proposer`, so a ladder of any height is one loop (transformers'
candidate-generator idea).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


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


class Proposer(Protocol):
    """Offers up to ``max_tokens`` continuations of ``context``."""

    name: str

    def propose(self, context: Sequence[int], max_tokens: int) -> Block: ...

    def sync(self, committed: Sequence[int]) -> None:
        """Forget everything past ``committed`` (KV rollback for model-backed proposers)."""
        ...
