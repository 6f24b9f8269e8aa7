"""KV-cache rollback of one sequence: drop a suffix, or restore a saved state.

Most caches drop a suffix with ``llama_memory_seq_rm``. Sliding-window, recurrent and hybrid
caches cannot (after a sliding window has moved, removal leaves wrong logits), so for them
:class:`SequenceRollback` restores the newest saved sequence state at or before the target
length and has the gap re-evaluated; a state is saved at every such rollback point.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import llama_cpp

_SEQ = 0
#: Saved sequence states kept per model (newest last).
MAX_SNAPSHOTS = 8

Reeval = Callable[[Sequence[int]], object]


class SequenceRollback:
    """Brings one context's sequence back to a prefix of the tokens it holds.

    ``reason``: why suffix removal is not trusted (``sliding-window``, ``recurrent``,
    ``hybrid``, ``forced``), or None when it is.
    """

    def __init__(self, ctx: Any, memory: Any, reason: str | None, name: str) -> None:
        self._ctx = ctx
        self._mem = memory
        self.reason = reason
        self._name = name
        self._snapshots: list[tuple[int, bytes]] = []

    def truncate(self, tokens: list[int], n_past: int, reeval: Reeval) -> None:
        """Make the cache (and ``tokens``, in place) hold exactly ``tokens[:n_past]``.

        ``reeval(gap)`` evaluates tokens appended after a restored state (it must extend
        ``tokens``).
        """
        if self.reason is None:
            if llama_cpp.llama_memory_seq_rm(self._mem, _SEQ, n_past, -1):
                del tokens[n_past:]
                return
            self.reason = "partial removal refused"
        kept = tokens[:n_past]
        while self._snapshots and self._snapshots[-1][0] > n_past:
            self._snapshots.pop()
        llama_cpp.llama_memory_seq_rm(self._mem, _SEQ, -1, -1)
        tokens.clear()
        if self._snapshots:
            pos, state = self._snapshots[-1]
            buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
            if llama_cpp.llama_state_seq_set_data(self._ctx, buf, len(state), _SEQ) == 0:
                raise RuntimeError(f"could not restore a saved state of {self._name}")
            tokens.extend(kept[:pos])
        if len(tokens) < n_past:
            reeval(kept[len(tokens) : n_past])
        self._save(n_past)

    def _save(self, n_past: int) -> None:
        if self._snapshots and self._snapshots[-1][0] == n_past:
            return
        size = llama_cpp.llama_state_seq_get_size(self._ctx, _SEQ)
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx, buf, size, _SEQ)
        self._snapshots.append((n_past, bytes(buf[:written])))
        del self._snapshots[:-MAX_SNAPSHOTS]

    def clear(self) -> None:
        """Empty the whole cache and forget saved states."""
        llama_cpp.llama_memory_clear(self._mem, True)
        self._snapshots = []
