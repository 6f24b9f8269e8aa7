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


class Proposer(Protocol):
    """Offers up to ``max_tokens`` continuations of ``context``."""

    name: str

    def propose(self, context: Sequence[int], max_tokens: int) -> Block: ...

    def sync(self, committed: Sequence[int]) -> None:
        """Forget everything past ``committed`` (KV rollback for model-backed proposers)."""
        ...
