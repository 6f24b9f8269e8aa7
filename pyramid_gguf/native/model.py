"""One loaded GGUF model with its own context: evaluate tokens, read logits rows, roll back.

:class:`NativeModel` evaluates token batches with one ``llama_decode`` per batch and returns
exactly the logits rows asked for (``llama_get_logits_ith``; never an ``n_ctx x n_vocab``
buffer). Its context holds ``cfg.parallel`` sequences; :meth:`NativeModel.eval_parts` evaluates
tokens of several of them in one batch (:class:`Part`). It tracks the tokens each sequence's
KV cache holds (:meth:`NativeModel.held`; :attr:`NativeModel.tokens` is sequence 0's), so
callers reason in token lists and never in native state.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import llama_cpp
import numpy as np

from ..core.errors import ContextOverflow
from ..core.files import check_gguf_path
from ..core.load import LoadConfig
from . import compute
from .buffers import describe_buffers
from .handles import BatchHandle, ContextHandle, ModelHandle
from .rollback import SequenceRollback
from .vocab import Vocab


@dataclass(frozen=True)
class Part:
    """Tokens of sequence ``seq`` for one batched evaluation, appended after what it holds,
    with logits wanted at ``logits_at`` (indices into ``tokens``; negative from the end)."""

    seq: int
    tokens: Sequence[int]
    logits_at: Sequence[int] = ()

    def wanted(self) -> list[int]:
        """The distinct indices of ``logits_at``, counted from the start, in order."""
        n = len(self.tokens)
        want = sorted({i + n if i < 0 else i for i in self.logits_at})
        if any(not 0 <= i < n for i in want):
            raise IndexError(f"logits_at {list(self.logits_at)} out of range for {n} tokens")
        return want

    def ordered(self, rows: np.ndarray, want: Sequence[int]) -> np.ndarray:
        """``rows`` (one per index of ``want``, from :meth:`wanted`) in the order, and with
        the repeats, of ``logits_at``."""
        n = len(self.tokens)
        index = {i: r for r, i in enumerate(want)}
        order = [index[i + n if i < 0 else i] for i in self.logits_at]
        return rows[order] if order != list(range(len(want))) else rows


@dataclass
class EvalTimer:
    """Time spent inside llama.cpp by one model: ``seconds`` in whole evaluations, of which
    ``decode_seconds`` inside ``llama_decode`` itself (the rest: filling the batch, copying
    logits rows out, bookkeeping); ``n_tokens`` counts the parts' tokens, not padding."""

    n_evals: int = 0
    n_tokens: int = 0
    seconds: float = 0.0
    decode_seconds: float = 0.0
    #: Padding rows evaluated with the tokens (:meth:`NativeModel.eval_parts`' ``pad``).
    padded: int = 0

    def snapshot(self) -> tuple[int, int, float]:
        return self.n_evals, self.n_tokens, self.seconds


class NativeModel:
    """A model, a context of ``cfg.parallel`` sequences and a batch, freed together by
    :meth:`close`."""

    def __init__(self, path: str | os.PathLike[str], cfg: LoadConfig | None = None) -> None:
        self.cfg = cfg or LoadConfig()
        self.path = check_gguf_path(path)
        self._model = ModelHandle(self.path, self.cfg)
        try:
            self._ctx = ContextHandle(self._model, self.cfg)
            self._batch = BatchHandle(self._ctx.n_batch)
            #: How the weights were placed (llama.cpp's extra buffer types, CPU_REPACK overrides).
            self.placement = self._model.placement
            #: MiB of weights per llama.cpp buffer type (``CPU_REPACK``, ``CPU_Mapped``...).
            self.weight_buffers = self._model.weight_buffers
            self.vocab = Vocab(self._model.vocab_ptr)
            self.n_vocab = self.vocab.n_vocab
            #: Tokens each sequence may hold.
            self.n_ctx = self._ctx.n_ctx
            self.n_batch = self._ctx.n_batch
            self.n_seq = self.cfg.parallel
            reason = "forced" if self.cfg.force_snapshot_rollback else self._model.cache_kind()
            #: llama.cpp's recurrent-state snapshots per sequence (0 where it keeps none).
            self.n_rs_seq = int(llama_cpp.llama_n_rs_seq(self._ctx.ptr))
            self._rollbacks = [
                SequenceRollback(
                    self._ctx.ptr, self._ctx.memory, reason, self.path.name, seq, self.n_rs_seq
                )
                for seq in range(self.n_seq)
            ]
            #: Tokens each sequence's KV cache holds, in order.
            self._held: list[list[int]] = [[] for _ in range(self.n_seq)]
            self.timer = EvalTimer()
            #: Called after each ``llama_decode`` with its entries (token, position, sequence,
            #: logits wanted): the MTP head reads the target's hidden states (native/mtp.py).
            self.decode_hooks: list[Callable[[Sequence[tuple[int, int, int, bool]]], None]] = []
        except BaseException:  # a Ctrl-C too: nothing half-made is left to the collector
            self.close()
            raise

    # --- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Free the batch, context and model, in that order, as far as they were made
        (idempotent)."""
        for name in ("_batch", "_ctx", "_model"):
            handle = getattr(self, name, None)
            if handle is not None:
                handle.close()

    def __enter__(self) -> NativeModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # context before model, whatever the collection order
        self.close()

    # --- evaluation --------------------------------------------------------------------------

    @property
    def tokens(self) -> list[int]:
        """Tokens sequence 0 holds (the one-sequence view)."""
        return self._held[0]

    @property
    def n_past(self) -> int:
        return len(self._held[0])

    def held(self, seq: int) -> list[int]:
        """Tokens sequence ``seq`` holds, in order (the model's own list: do not change it)."""
        return self._held[seq]

    def eval(
        self, tokens: Sequence[int], logits_at: Sequence[int] = (), *, chunk: int = 0, seq: int = 0
    ) -> np.ndarray:
        """Append ``tokens`` to sequence ``seq`` and return the logits at batch indices
        ``logits_at``.

        ``tokens``: ``[n]`` ids, evaluated in ONE ``llama_decode`` when ``n <= n_batch`` (longer
        prompts go in ``n_batch`` chunks; ``chunk > 0`` caps each call at ``chunk`` tokens).
        ``logits_at``: indices into ``tokens`` (negative counts from the end). Returns float32
        ``[len(logits_at), V]``, a copy of exactly those rows.
        """
        return self.eval_parts([Part(seq, tokens, logits_at)], chunk=chunk)[0]

    def eval_parts(
        self, parts: Sequence[Part], *, chunk: int = 0, pad: int = 0
    ) -> list[np.ndarray]:
        """Evaluate every part in one batch (``n_batch`` or ``chunk`` tokens per
        ``llama_decode``, in order) and return each part's rows ``[len(logits_at), V]``.

        Each sequence appears at most once. Nothing is evaluated when a part would overflow its
        sequence's ``n_ctx`` (:class:`ContextOverflow`) or asks for a row it does not have.

        ``pad``: rows added to a batch of one ``llama_decode`` only to run a cheaper kernel
        (:meth:`~pyramid_gguf.decoding.pricing.costs.CostCurve.padding`): copies of a part's
        last token after it in its sequence, no logits, dropped from the cache right after
        the call, so no sequence holds them and no part's rows depend on them (they come after
        every token of their sequence). Ignored unless :attr:`can_pad`, the batch is one call
        and a part's sequence has room for them.
        """
        seqs = [p.seq for p in parts]
        if len(set(seqs)) != len(seqs) or any(not 0 <= s < self.n_seq for s in seqs):
            raise ValueError(f"parts need distinct sequences of 0..{self.n_seq - 1}, got {seqs}")
        wants = [p.wanted() for p in parts]
        for p in parts:
            held = len(self._held[p.seq])
            if held + len(p.tokens) > self.n_ctx:
                raise ContextOverflow(
                    f"context full: {held} + {len(p.tokens)} tokens exceed --ctx-size {self.n_ctx}"
                )
        outs = [np.empty((len(w), self.n_vocab), dtype=np.float32) for w in wants]
        row_bytes = 4 * self.n_vocab
        # (token, position, sequence, logits wanted) per batch index, and the address of the
        # row its logits are copied to (0: none)
        entries: list[tuple[int, int, int, bool]] = []
        dest: list[int] = []
        for p, want, out in zip(parts, wants, outs, strict=True):
            rows = {j: out.ctypes.data + r * row_bytes for r, j in enumerate(want)}
            first = len(self._held[p.seq])
            for j, tok in enumerate(p.tokens):
                entries.append((int(tok), first + j, p.seq, j in rows))
                dest.append(rows.get(j, 0))
        start_time = time.perf_counter()
        in_decode = 0.0
        step = min(chunk, self.n_batch) if chunk > 0 else self.n_batch
        pads = self._pads(parts, pad, len(entries), step)
        removed = True
        ctx = self._ctx.ptr
        for start in range(0, len(entries), step):
            piece = entries[start : start + step]
            self._batch.fill([*piece, *pads])
            t0 = time.perf_counter()
            # on the process's one compute thread: a second thread running graphs would slow
            # every graph's barriers (native/compute.py)
            rc = compute.run(llama_cpp.llama_decode, ctx, self._batch.ptr)
            if pads:
                _, first, seq, _ = pads[0]
                removed = llama_cpp.llama_memory_seq_rm(self._ctx.memory, seq, first, -1)
                self.timer.padded += len(pads)
            in_decode += time.perf_counter() - t0
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with code {rc} for {self.path.name}")
            if pads and not removed:
                raise RuntimeError(f"{self.path.name}: padding rows could not be dropped")
            if len(parts) == 1:
                self._rollbacks[parts[0].seq].decoded(len(piece))
            else:
                counts: dict[int, int] = {}
                for _, _, seq, _ in piece:
                    counts[seq] = counts.get(seq, 0) + 1
                for seq, n in counts.items():
                    self._rollbacks[seq].decoded(n)
            for hook in self.decode_hooks:
                hook(piece)
            for j, (tok, _, seq, _) in enumerate(piece):
                self._held[seq].append(tok)
                if to := dest[start + j]:  # the row straight into its place: one copy
                    ctypes.memmove(to, llama_cpp.llama_get_logits_ith(ctx, j), row_bytes)
        self.timer.n_evals += 1
        self.timer.n_tokens += len(entries)
        self.timer.seconds += time.perf_counter() - start_time
        self.timer.decode_seconds += in_decode
        return [p.ordered(out, want) for out, p, want in zip(outs, parts, wants, strict=True)]

    @property
    def can_pad(self) -> bool:
        """Whether a batch may carry padding rows (:meth:`eval_parts`' ``pad``): only where
        dropping them leaves the cache exactly as before, a plain KV cache with no decode hook
        reading every row (an MTP head), and not under ``--strict-identity``, whose batches
        run as they would alone."""
        plain = self.snapshot_reason is None and not self.decode_hooks
        return plain and not self.cfg.strict_identity

    def _pads(
        self, parts: Sequence[Part], pad: int, n_entries: int, step: int
    ) -> list[tuple[int, int, int, bool]]:
        """The padding entries (token, position, sequence, no logits) of one batch: ``pad``
        copies of the last token of the last part whose sequence has room, after it; none when
        padding is not allowed or the batch takes more than one call."""
        if pad <= 0 or not self.can_pad or n_entries + pad > step:
            return []
        for p in reversed(parts):
            end = len(self._held[p.seq]) + len(p.tokens)
            if p.tokens and end + pad <= self.n_ctx:
                return [(int(p.tokens[-1]), end + i, p.seq, False) for i in range(pad)]
        return []

    # --- KV-cache rollback -------------------------------------------------------------------

    def rollback_counts(self, seq: int = 0) -> tuple[int, int]:
        """Rollbacks of sequence ``seq`` so far: (native, through a saved state)."""
        r = self._rollbacks[seq]
        return r.native_rollbacks, r.state_rollbacks

    @property
    def snapshot_reason(self) -> str | None:
        """Why suffix removal is not trusted for this model, or None when it is."""
        return self._rollbacks[0].reason

    def rollback(self, n_past: int, seq: int = 0) -> None:
        """Make sequence ``seq`` hold exactly its first ``n_past`` tokens, so the next logits
        are right."""
        held = self._held[seq]
        if n_past >= len(held):
            return

        def reeval(gap: Sequence[int]) -> None:
            self.eval(gap, seq=seq)

        self._rollbacks[seq].truncate(held, max(n_past, 0), reeval)

    def clear(self, seq: int = 0) -> None:
        """Empty sequence ``seq``'s cache."""
        self._rollbacks[seq].clear()
        self._held[seq].clear()

    def reset(self) -> None:
        """Empty the cache of every sequence."""
        for seq in range(self.n_seq):
            self.clear(seq)

    # --- a prefix shared between sequences -------------------------------------------------------

    @property
    def can_share(self) -> bool:
        """Whether this context's sequences may share a prefix (:meth:`share_prefix`).

        Only plain KV caches share: a sliding window may already have dropped cells that tokens
        after the prefix attend to, a recurrent state is one per sequence rather than one per
        position, and a context whose decodes feed a hook (an MTP head reads the target's
        hidden states) would miss the shared tokens. Nor with ``--strict-identity``: a stream
        per sequence, and a prompt is evaluated afresh there anyway."""
        return (
            self.n_seq > 1
            and not self.cfg.strict_identity
            and self.snapshot_reason is None
            and not self.decode_hooks
        )

    def share_prefix(self, src: int, dst: int, n: int) -> None:
        """Make sequence ``dst`` hold exactly the first ``n`` tokens sequence ``src`` holds,
        unevaluated: the same cells (``dst``'s own cache is cleared first).

        In the unified KV cache (``kv_unified``, loaded without ``--strict-identity``)
        ``llama_memory_seq_cp`` adds a sequence to cells another one holds: metadata only,
        nothing copied or evaluated. So a prompt that starts the way another slot's cache does
        (a chat template's system prompt) evaluates only what follows, and the other slot keeps
        its cache (llama-server gets the prefix by moving the request into the other slot,
        cutting its cache). The cells hold what evaluating the same tokens at the same
        positions left there, as a slot reusing its own cache does. The caller holds whatever
        guards the context (the slots' batcher lock): nothing else may touch it meanwhile."""
        if not self.can_share:
            raise ValueError(f"{self.path.name}: its sequences cannot share cells")
        held = self._held[src]
        if src == dst or not 0 <= n <= len(held):
            raise ValueError(f"cannot share {n} tokens of sequence {src} ({len(held)}) with {dst}")
        prefix = held[:n]
        self.clear(dst)
        if n == 0:
            return
        llama_cpp.llama_memory_seq_cp(self._ctx.memory, src, dst, 0, n)
        self._held[dst].extend(prefix)

    # --- what the file says ------------------------------------------------------------------

    def metadata(self) -> dict[str, str]:
        """GGUF key/value metadata as strings (arrays are summarised by llama.cpp)."""
        return self._model.metadata()

    def chat_template(self) -> str | None:
        """The GGUF's ``tokenizer.chat_template``, or None."""
        return self._model.chat_template()

    @property
    def n_layer(self) -> int:
        return self._model.n_layer

    def describe_weights(self) -> str:
        """Where the weights are: ``CPU_REPACK 748.0 MiB, CPU_Mapped 313.5 MiB (extra ...)``."""
        return f"{describe_buffers(self.weight_buffers)} ({self.placement.describe()})"
