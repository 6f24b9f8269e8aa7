"""A model tier: a loaded model that scores a context plus new tokens in one batch.

:class:`ModelTier` keeps no logits between calls. Its cache always holds some prefix of what
it was last asked about; :meth:`score` rolls back to the part of ``context[:-1]`` it already
holds and evaluates ``[unseen context..., last_committed, y_1..y_k]`` in one ``llama_decode``,
asking only for the ``k + 1`` rows it needs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .native import NativeModel


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ModelTier:
    """One rung of the ladder (``name`` is ``draft``, ``qualifier`` or ``target``)."""

    def __init__(self, name: str, model: NativeModel) -> None:
        self.name = name
        self.model = model

    @property
    def n_vocab(self) -> int:
        return self.model.n_vocab

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    def sync(self, committed: Sequence[int]) -> None:
        """Roll the cache back to the longest prefix of ``committed[:-1]`` it holds."""
        self.model.rollback(common_prefix(self.model.tokens, committed[:-1]))

    def score(self, context: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """Raw logits after ``context`` and after each of ``tokens``: ``[len(tokens) + 1, V]``.

        Row ``i`` is the distribution of the token following ``context + tokens[:i]``.
        ``context`` must not be empty.
        """
        self.sync(context)
        held = self.model.n_past
        feed = [*context[held:], *tokens]
        first = len(context) - 1 - held
        return self.model.eval(feed, range(first, len(feed)), chunk=self.model.cfg.verify_batch)

    def step(self, token: int) -> np.ndarray:
        """Append one token the tier has just been scored up to; return the next row ``[V]``."""
        return self.model.eval([token], [0], chunk=self.model.cfg.verify_batch)[0]

    def prefill(self, prompt: Sequence[int]) -> None:
        """Evaluate ``prompt[:-1]`` without asking for logits (prompt processing)."""
        self.sync(prompt)
        held = self.model.n_past
        if held < len(prompt) - 1:
            self.model.eval(prompt[held:-1])

    def is_eog(self, token: int) -> bool:
        return self.model.is_eog(token)
