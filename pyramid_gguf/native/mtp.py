"""The target's own MTP (NextN) head, drafting beside it: llama.cpp's ``draft-mtp``.

A GGUF with NextN layers (``llama_model_n_layer_nextn > 0``, loaded with
``LoadConfig.load_mtp``) gets a second context of the same model, of type
``LLAMA_CONTEXT_TYPE_MTP`` with ``ctx_other`` the target's, whose graph is the NextN block
alone. Its input at position ``p`` is the token ``x_p`` with a hidden state ``h_{p-1}``: the
target's last hidden state after position ``p - 1`` (its "NextN embeddings", read after every
target evaluation), or, past what the target has evaluated, the head's own output state at
``p - 1`` (a drafted token's). Its output row is the head's logits for ``x_{p+1}``
(common/speculative.cpp, ``common_speculative_impl_draft_mtp``). The head's cache is a plain
attention cache (even on a hybrid target), rolled back by ``llama_memory_seq_rm``.

:class:`MtpSequence` is that head as decoding sees a model (the
:class:`~.sequence.ModelSequence` protocol, and the few :class:`~.model.NativeModel` members the
batcher and calibration read): ``eval`` appends tokens, pairing each with the best state
there is; :attr:`MtpSequence.tokens` ends before the first entry that was paired with the
head's own (or no) state where the target has since evaluated that position, so the next sync
evaluates it again with the target's state, as llama.cpp does after each verification. So a
``ModelTier`` over it is a draft tier: ``DraftProposer`` drafts with it, ``calibrate`` measures
it, a qualifier can sit above it. One sequence (``parallel = 1``) only.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp_ext

from ..core.errors import UserError
from ..core.load import LoadConfig
from . import compute
from .handles import copy_floats, read_floats
from .model import EvalTimer, NativeModel, Part
from .vocab import Vocab

#: How a cache entry's input state was chosen.
_TARGET, _OWN, _NONE = 0, 1, 2


def n_layer_nextn(model: NativeModel) -> int:
    """NextN layers the model's file declares (0: no MTP head)."""
    return int(llama_cpp.llama_model_n_layer_nextn(model._model.ptr))


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


class MtpSequence:
    """The NextN head of ``target`` (a :class:`NativeModel` loaded with ``load_mtp``), one
    sequence, evaluated in its own MTP context."""

    #: What calibration keys its cost curve by, beside the file (the target's).
    kind = "mtp"
    n_seq = 1
    #: One sequence: nothing to share a prefix with (:attr:`NativeModel.can_share`).
    can_share = False

    def __init__(self, target: NativeModel) -> None:
        if not target.cfg.load_mtp or n_layer_nextn(target) == 0:
            raise UserError(f"{target.path.name} has no MTP (NextN) layers: --draft mtp needs them")
        if target.n_seq != 1:
            raise UserError("--draft mtp drafts for one sequence (--parallel 1)")
        self.target = target
        self.cfg: LoadConfig = target.cfg
        self.path: Path = target.path
        self.vocab: Vocab = target.vocab
        self.n_vocab = target.n_vocab
        self.n_ctx = target.n_ctx
        self.n_batch = target.n_batch
        self.placement = target.placement
        self.weight_buffers = target.weight_buffers
        self.timer = EvalTimer()
        model_ptr = target._model.ptr
        self._tctx = target._ctx.ptr
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(model_ptr))
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = target.n_ctx
        params.n_batch = target.n_batch
        params.n_ubatch = target.n_batch
        params.n_seq_max = 1
        params.n_rs_seq = 0
        params.n_threads = target.cfg.n_threads
        params.n_threads_batch = target.cfg.n_threads_batch
        params.no_perf = True
        params.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        params.ctx_other = self._tctx
        self.ctx: Any = llama_cpp.llama_init_from_model(model_ptr, params)
        self._batch: Any = None
        if not self.ctx:
            raise UserError(f"llama.cpp could not create an MTP context for {target.path.name}")
        # freed with the target's contexts, before its model
        target._model.contexts.append(self)  # type: ignore[arg-type]
        self._mem = llama_cpp.llama_get_memory(self.ctx)
        self._batch = llama_cpp.llama_batch_ext_init(self.ctx)
        llama_cpp_ext.llama_set_embeddings_nextn(self._tctx, True, False)
        llama_cpp_ext.llama_set_embeddings_nextn(self.ctx, True, True)
        #: The target's hidden state after each position it evaluated last, ``[n_embd]``.
        self._h: dict[int, np.ndarray] = {}
        #: The head's own output state after each position it evaluated with an output row.
        self._own: dict[int, np.ndarray] = {}
        #: Tokens the head's cache holds, and how each entry's input state was chosen.
        self._tokens: list[int] = []
        self._kinds: list[int] = []
        target.decode_hooks.append(self._read_target)

    # --- the target's states ---------------------------------------------------------------

    def _read_target(self, piece: Sequence[tuple[int, int, int, bool]]) -> None:
        """After one target ``llama_decode`` of ``piece`` (token, position, sequence, logits):
        keep the hidden state of every position (its context outputs all rows, unmasked)."""
        ptr = llama_cpp_ext.llama_get_embeddings_nextn(self._tctx)
        if not ptr:
            return
        rows = read_floats(ptr, len(piece), self.n_embd)  # one copy, then views
        for j, (_, pos, seq, _) in enumerate(piece):
            if seq == 0:
                self._h[pos] = rows[j]
        if len(self._h) > 2 * self.n_ctx:
            low = len(self._tokens) - 2
            for pos in [p for p in self._h if p < low]:
                del self._h[pos]

    def _state(self, p: int, known: int) -> tuple[np.ndarray, int]:
        """The input state of an entry at position ``p``, given that the target holds the
        first ``known`` tokens of this sequence: its ``h_{p-1}``, else the head's own."""
        if p == 0:
            return np.zeros(self.n_embd, dtype=np.float32), _TARGET
        if p - 1 < known and (h := self._h.get(p - 1)) is not None:
            return h, _TARGET
        if (own := self._own.get(p - 1)) is not None:
            return own, _OWN
        return np.zeros(self.n_embd, dtype=np.float32), _NONE

    # --- the sequence ------------------------------------------------------------------------

    @property
    def tokens(self) -> list[int]:
        """The entries worth keeping: up to the first one whose state the target could now
        give better (a copy)."""
        try:
            first = next(i for i, k in enumerate(self._kinds) if k != _TARGET)
        except StopIteration:
            return list(self._tokens)
        if _common(self.target.tokens, self._tokens) >= first:
            return self._tokens[:first]
        return list(self._tokens)

    def held(self, seq: int = 0) -> list[int]:
        return self.tokens

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def eval(
        self, tokens: Sequence[int], logits_at: Sequence[int] = (), *, chunk: int = 0, seq: int = 0
    ) -> np.ndarray:
        """Append ``tokens`` (after rolling back to :attr:`tokens`); logits rows
        ``[len(logits_at), V]``. Each is paired with the target's state where it has one, else
        with the head's own output at the previous position, evaluated one step at a time."""
        return self.eval_parts([Part(0, tokens, logits_at)], chunk=chunk)[0]

    #: The head's cache follows the target's hidden states row by row: no padding rows.
    can_pad = False

    def eval_parts(
        self, parts: Sequence[Part], *, chunk: int = 0, pad: int = 0
    ) -> list[np.ndarray]:
        """:meth:`NativeModel.eval_parts` for the one sequence (the batcher's door; ``pad`` is
        ignored, as :attr:`can_pad` says)."""
        if len(parts) != 1 or parts[0].seq != 0:
            raise ValueError("the MTP head holds one sequence")
        part = parts[0]
        want = part.wanted()
        self.rollback(len(self.tokens))
        start = time.perf_counter()
        out = np.empty((len(want), self.n_vocab), dtype=np.float32)
        rows = {j: r for r, j in enumerate(want)}
        new = [int(t) for t in part.tokens]
        known = _common(self.target.tokens, [*self._tokens, *new])
        step = min(chunk, self.n_batch) if chunk > 0 else self.n_batch
        i = 0
        while i < len(new):
            # one batch while the target's states pair the entries; past them, a drafted
            # token's state is the head's own output, so one entry per step
            entries: list[tuple[int, int, np.ndarray, int, bool]] = []
            while i < len(new) and len(entries) < step:
                p = len(self._tokens) + len(entries)
                h, kind = self._state(p, known)
                if kind != _TARGET and entries:
                    break
                entries.append((new[i], p, h, kind, i in rows))
                i += 1
                if kind != _TARGET:
                    break
            self._decode(entries, out, rows, i - len(entries))
        self.timer.n_evals += 1
        self.timer.n_tokens += len(new)
        self.timer.seconds += time.perf_counter() - start
        return [part.ordered(out, want)]

    def _decode(
        self,
        entries: Sequence[tuple[int, int, np.ndarray, int, bool]],
        out: np.ndarray,
        rows: dict[int, int],
        first: int,
    ) -> None:
        """One ``llama_process`` of ``entries`` (token, position, state, kind, row wanted);
        the last one always outputs (its state pairs the next drafted token)."""
        batch = self._batch
        llama_cpp.llama_batch_ext_clear(batch)
        states = np.ascontiguousarray(np.stack([e[2] for e in entries]), dtype=np.float32)
        base = states.ctypes.data
        row_bytes = self.n_embd * 4
        outputs: list[int] = []
        for j, (tok, pos, _, _, wanted) in enumerate(entries):
            idx = llama_cpp.llama_batch_ext_add_token(batch, 0, tok)
            p = llama_cpp.llama_pos(pos)
            llama_cpp.llama_batch_ext_set_pos(batch, idx, ctypes.byref(p))
            view = llama_cpp.llama_embd(
                ctypes.cast(base + j * row_bytes, ctypes.POINTER(ctypes.c_float)), 1, self.n_embd
            )
            llama_cpp.llama_batch_ext_set_embd_token(batch, idx, view)
            if wanted or j == len(entries) - 1:
                llama_cpp.llama_batch_ext_set_output_logits(batch, idx, True)
                outputs.append(j)
        rc = compute.run(  # native/compute.py
            llama_cpp.llama_process, self.ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, batch
        )
        if rc != 0:
            raise RuntimeError(f"the MTP head of {self.path.name} failed to decode (code {rc})")
        for j in outputs:
            tok, pos, _, _, wanted = entries[j]
            if wanted:
                ptr = llama_cpp.llama_get_logits_ith(self.ctx, j)
                copy_floats(out[rows[first + j]], ptr)
            h = llama_cpp_ext.llama_get_embeddings_nextn_ith(self.ctx, j)
            self._own[pos] = read_floats(h, self.n_embd)
        for tok, _, _, kind, _ in entries:
            self._tokens.append(tok)
            self._kinds.append(kind)

    def rollback(self, n_past: int, seq: int = 0) -> None:
        """Hold exactly the first ``n_past`` entries."""
        n_past = max(n_past, 0)
        if n_past < len(self._tokens):
            llama_cpp.llama_memory_seq_rm(self._mem, 0, n_past, -1)
            del self._tokens[n_past:]
            del self._kinds[n_past:]
            for pos in [p for p in self._own if p >= n_past]:
                del self._own[pos]

    def clear(self, seq: int = 0) -> None:
        self.rollback(0)

    def reset(self) -> None:
        self.rollback(0)

    # --- facts and lifecycle -----------------------------------------------------------------

    @property
    def n_layer(self) -> int:
        return n_layer_nextn(self.target)

    def metadata(self) -> dict[str, str]:
        return self.target.metadata()

    def chat_template(self) -> str | None:
        return self.target.chat_template()

    def describe_weights(self) -> str:
        return f"the MTP head of {self.path.name} (its NextN layer, beside the target)"

    def close(self) -> None:
        """Free the head's batch and context (before the target's model; idempotent)."""
        hooks = getattr(self.target, "decode_hooks", [])
        if self._read_target in hooks:
            hooks.remove(self._read_target)
        batch, self._batch = self._batch, None
        if batch:
            llama_cpp.llama_batch_ext_free(batch)
        ctx, self.ctx = self.ctx, None
        if ctx:
            llama_cpp.llama_free(ctx)
