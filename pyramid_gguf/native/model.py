"""One loaded GGUF model with its own context: evaluate tokens, read logits rows, roll back.

:class:`NativeModel` evaluates token batches with one ``llama_decode`` per batch and returns
exactly the logits rows asked for (``llama_get_logits_ith``; never an ``n_ctx x n_vocab``
buffer). It tracks the tokens its KV cache holds (:attr:`NativeModel.tokens`), so callers
reason in token lists and never in native state.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp
import numpy as np

from ..core.errors import ContextOverflow
from ..core.files import check_gguf_path
from ..core.load import LoadConfig
from .buffers import describe_buffers
from .handles import BatchHandle, ContextHandle, ModelHandle
from .rollback import SequenceRollback
from .vocab import Vocab


@dataclass
class EvalTimer:
    """Time spent inside llama.cpp by one model."""

    n_evals: int = 0
    n_tokens: int = 0
    seconds: float = 0.0

    def snapshot(self) -> tuple[int, int, float]:
        return self.n_evals, self.n_tokens, self.seconds


class NativeModel:
    """A model, a one-sequence context and a batch, freed together by :meth:`close`."""

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
            self.n_ctx = self._ctx.n_ctx
            self.n_batch = self._ctx.n_batch
            reason = "forced" if self.cfg.force_snapshot_rollback else self._model.cache_kind()
            self._rollback = SequenceRollback(
                self._ctx.ptr, self._ctx.memory, reason, self.path.name
            )
            #: Tokens the KV cache holds, in order.
            self.tokens: list[int] = []
            self.timer = EvalTimer()
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
    def n_past(self) -> int:
        return len(self.tokens)

    def eval(
        self, tokens: Sequence[int], logits_at: Sequence[int] = (), *, chunk: int = 0
    ) -> np.ndarray:
        """Append ``tokens`` to the cache and return the logits at batch indices ``logits_at``.

        ``tokens``: ``[n]`` ids, evaluated in ONE ``llama_decode`` when ``n <= n_batch`` (longer
        prompts go in ``n_batch`` chunks; ``chunk > 0`` caps each call at ``chunk`` tokens).
        ``logits_at``: indices into ``tokens`` (negative counts from the end). Returns float32
        ``[len(logits_at), V]``, a copy of exactly those rows.
        """
        n = len(tokens)
        want = sorted({i + n if i < 0 else i for i in logits_at})
        if any(not 0 <= i < n for i in want):
            raise IndexError(f"logits_at {list(logits_at)} out of range for {n} tokens")
        if self.n_past + n > self.n_ctx:
            raise ContextOverflow(
                f"context full: {self.n_past} + {n} tokens exceed --ctx-size {self.n_ctx}"
            )
        rows = {i: r for r, i in enumerate(want)}
        out = np.empty((len(want), self.n_vocab), dtype=np.float32)
        start_time = time.perf_counter()
        step = min(chunk, self.n_batch) if chunk > 0 else self.n_batch
        for start in range(0, n, step):
            part = tokens[start : start + step]
            here = [i - start for i in want if start <= i < start + len(part)]
            self._batch.fill(part, self.n_past, here)
            rc = llama_cpp.llama_decode(self._ctx.ptr, self._batch.ptr)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with code {rc} for {self.path.name}")
            for j in here:
                ptr = llama_cpp.llama_get_logits_ith(self._ctx.ptr, j)
                out[rows[j + start]] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
            self.tokens.extend(int(t) for t in part)
        self.timer.n_evals += 1
        self.timer.n_tokens += n
        self.timer.seconds += time.perf_counter() - start_time
        order = [rows[i + n if i < 0 else i] for i in logits_at]
        return out[order] if order != list(range(len(want))) else out

    # --- KV-cache rollback -------------------------------------------------------------------

    @property
    def snapshot_reason(self) -> str | None:
        """Why suffix removal is not trusted for this model, or None when it is."""
        return self._rollback.reason

    def rollback(self, n_past: int) -> None:
        """Make the cache hold exactly ``tokens[:n_past]``, so the next logits are right."""
        if n_past >= self.n_past:
            return
        self._rollback.truncate(self.tokens, max(n_past, 0), self.eval)

    def reset(self) -> None:
        """Empty the cache."""
        self._rollback.clear()
        self.tokens = []

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
