"""KV-cache rollback of one sequence: drop a suffix, or restore a saved state.

Most caches drop a suffix with ``llama_memory_seq_rm``. Sliding-window, recurrent and hybrid
caches cannot (after a sliding window has moved, removal leaves wrong logits), so for them
:class:`SequenceRollback` restores the newest saved sequence state at or before the target
length and has the gap re-evaluated; a state is saved at every such rollback point.

Where llama.cpp keeps per-sequence recurrent-state snapshots (``n_rs_seq > 0``: hybrid and
recurrent architectures it allows, such as qwen35 and nemotron_h), a rollback of ``j`` tokens
that all came from the sequence's last evaluation, with ``j <= n_rs_seq``, goes through
``llama_memory_seq_rm`` like a plain KV cache (llama.cpp's own rollback, #28123): no state is
copied and nothing is evaluated again. Anything else (a longer rollback, or tokens from several
evaluations, as a draft's one-token steps) takes the snapshot path above.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import llama_cpp

#: Saved sequence states kept per model (newest last).
MAX_SNAPSHOTS = 8

Reeval = Callable[[Sequence[int]], object]


class SequenceRollback:
    """Brings sequence ``seq`` of one context back to a prefix of the tokens it holds.

    ``reason``: why suffix removal is not trusted (``sliding-window``, ``recurrent``,
    ``hybrid``, ``forced``), or None when it is.
    """

    def __init__(
        self, ctx: Any, memory: Any, reason: str | None, name: str, seq: int = 0, n_rs_seq: int = 0
    ) -> None:
        self._ctx = ctx
        self._mem = memory
        self.seq = seq
        self.reason = reason
        self._name = name
        self._snapshots: list[tuple[int, bytes]] = []
        #: llama.cpp's recurrent-state snapshots per sequence (0: none).
        self.n_rs_seq = n_rs_seq
        #: Tokens of this sequence in its last ``llama_decode`` (what native rollback may drop).
        self._last_decode = 0
        #: Rollbacks done natively and through a saved state (counters, for measurements).
        self.native_rollbacks = 0
        self.state_rollbacks = 0

    def decoded(self, n_tokens: int) -> None:
        """Note that one ``llama_decode`` appended ``n_tokens`` tokens to this sequence."""
        self._last_decode = n_tokens

    def _native(self, tokens: list[int], n_past: int) -> bool:
        """Drop the suffix through llama.cpp's recurrent-state snapshots, if they cover it."""
        drop = len(tokens) - n_past
        if not 0 < drop < self._last_decode or drop > self.n_rs_seq:
            return False
        if not llama_cpp.llama_memory_seq_rm(self._mem, self.seq, n_past, -1):
            return False
        del tokens[n_past:]
        self._last_decode = 0  # one pending rollback at a time (llama.cpp's rule)
        while self._snapshots and self._snapshots[-1][0] > n_past:
            self._snapshots.pop()
        self.native_rollbacks += 1
        return True

    def truncate(self, tokens: list[int], n_past: int, reeval: Reeval) -> None:
        """Make the cache (and ``tokens``, in place) hold exactly ``tokens[:n_past]``.

        ``reeval(gap)`` evaluates tokens appended after a restored state (it must extend
        ``tokens``).
        """
        if self.reason is None:
            if llama_cpp.llama_memory_seq_rm(self._mem, self.seq, n_past, -1):
                del tokens[n_past:]
                return
            self.reason = "partial removal refused"
        if self.n_rs_seq and self._native(tokens, n_past):
            return
        self.state_rollbacks += 1
        self._last_decode = 0
        kept = tokens[:n_past]
        while self._snapshots and self._snapshots[-1][0] > n_past:
            self._snapshots.pop()
        llama_cpp.llama_memory_seq_rm(self._mem, self.seq, -1, -1)
        tokens.clear()
        if self._snapshots:
            pos, state = self._snapshots[-1]
            buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
            if llama_cpp.llama_state_seq_set_data(self._ctx, buf, len(state), self.seq) == 0:
                raise RuntimeError(f"could not restore a saved state of {self._name}")
            tokens.extend(kept[:pos])
        if len(tokens) < n_past:
            reeval(kept[len(tokens) : n_past])
        self._save(n_past)

    def _save(self, n_past: int) -> None:
        if self._snapshots and self._snapshots[-1][0] == n_past:
            return
        size = llama_cpp.llama_state_seq_get_size(self._ctx, self.seq)
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx, buf, size, self.seq)
        self._snapshots.append((n_past, bytes(buf[:written])))
        del self._snapshots[:-MAX_SNAPSHOTS]

    def clear(self) -> None:
        """Empty the sequence and forget its saved states."""
        llama_cpp.llama_memory_seq_rm(self._mem, self.seq, -1, -1)
        self._snapshots = []
        self._last_decode = 0
