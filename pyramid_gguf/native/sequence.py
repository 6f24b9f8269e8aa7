"""One sequence of a loaded model, as decoding sees it: :class:`ModelSequence`.

Decoding reads and extends one sequence of a model's KV cache: it evaluates tokens after what
the sequence holds (asking for logits rows), rolls it back to a prefix, and clears it. A
:class:`~.model.NativeModel` is that for its sequence 0 (one request, calibration, tests). A
:class:`SequenceView` is that for sequence ``seq`` of a context shared by parallel slots: it
owns nothing native; its evaluations go to an :data:`Evaluate` function (the slots' batcher,
which evaluates every slot's tokens of a tier in one batch) and its rollbacks run under the
batcher's lock, since no two native calls may touch one context at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..core.load import LoadConfig
from .model import EvalTimer, NativeModel, Part
from .vocab import Vocab


class ModelSequence(Protocol):
    """What decoding uses of one model: one sequence of its context, and the model's facts."""

    cfg: LoadConfig
    path: Path
    vocab: Vocab
    n_vocab: int
    #: Tokens the sequence may hold.
    n_ctx: int
    #: Time and tokens this sequence has spent inside llama.cpp.
    timer: EvalTimer

    @property
    def tokens(self) -> list[int]:
        """The tokens the sequence's cache holds, in order (do not change the list)."""
        ...

    @property
    def n_past(self) -> int: ...

    def eval(
        self, tokens: Sequence[int], logits_at: Sequence[int] = (), *, chunk: int = 0
    ) -> np.ndarray:
        """Append ``tokens`` and return the logits rows ``[len(logits_at), V]`` at those
        indices of ``tokens`` (``chunk > 0``: at most that many tokens per ``llama_decode``)."""
        ...

    def rollback(self, n_past: int) -> None:
        """Hold exactly the first ``n_past`` tokens."""
        ...

    def clear(self) -> None:
        """Hold nothing."""
        ...


#: Evaluate ``part`` on a loaded model with at most ``chunk`` tokens per ``llama_decode`` (0:
#: ``n_batch``), charging the time to ``timer``: ``(model, part, chunk, timer) -> rows``.
Evaluate = Callable[[NativeModel, Part, int, EvalTimer], np.ndarray]


class SequenceView:
    """Sequence ``seq`` of the loaded ``model``, evaluated through ``evaluate``.

    Everything but the sequence is the model's (weights, context, vocabulary, facts); the view
    keeps its own :class:`EvalTimer`, so a slot's statistics count its share of the batches it
    rode in. ``lock`` guards the context while the view rolls its sequence back or clears it.
    """

    def __init__(
        self,
        model: NativeModel,
        seq: int,
        evaluate: Evaluate,
        lock: AbstractContextManager[Any],
    ) -> None:
        if not 0 <= seq < model.n_seq:
            raise ValueError(f"{model.path.name} holds sequences 0..{model.n_seq - 1}, not {seq}")
        self.model = model
        self.seq = seq
        self._evaluate = evaluate
        self._lock = lock
        self.cfg = model.cfg
        self.path = model.path
        self.vocab = model.vocab
        self.n_vocab = model.n_vocab
        self.n_ctx = model.n_ctx
        self.timer = EvalTimer()

    @property
    def tokens(self) -> list[int]:
        return self.model.held(self.seq)

    @property
    def n_past(self) -> int:
        return len(self.model.held(self.seq))

    def eval(
        self, tokens: Sequence[int], logits_at: Sequence[int] = (), *, chunk: int = 0
    ) -> np.ndarray:
        """Append ``tokens`` to this sequence in the next batch of its model."""
        return self._evaluate(self.model, Part(self.seq, tokens, logits_at), chunk, self.timer)

    def rollback(self, n_past: int) -> None:
        with self._lock:
            self.model.rollback(n_past, self.seq)

    def clear(self) -> None:
        with self._lock:
            self.model.clear(self.seq)
