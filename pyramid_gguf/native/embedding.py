"""Embeddings from one GGUF model: a context made for them, several inputs per ``llama_decode``.

:class:`EmbeddingModel` loads a model (:class:`~.handles.ModelHandle`) with a context of its own
(:class:`EmbeddingContext`: ``embeddings`` on, llama.cpp's ``pooling_type``) and evaluates
token lists, as many at once as fit one micro-batch, each under its own sequence id. Pooled
(``mean``, ``cls``, ``last``, ``rank``): one vector per input (``llama_get_embeddings_seq``),
normalised as llama-server normalises (``embd_normalize``, default 2: Euclidean, unit length).
``none``: one vector per token (``llama_get_embeddings_ith``), as llama.cpp returns them.

The pooling is the GGUF's ``<arch>.pooling_type`` unless :attr:`EmbeddingConfig.pooling` names
one; a model without it gets llama.cpp's default for such a model, ``none`` (a decoder such as
Qwen2.5 needs ``mean`` or ``last`` named to give one vector per input). Every input must fit one
micro-batch (pooling reads a whole sequence from one), so an input longer than
:attr:`EmbeddingModel.n_ctx` is a :class:`~pyramid_gguf.core.errors.ContextOverflow`, never cut.
One lock serialises the calls: a server calls from worker threads.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import llama_cpp
import numpy as np
from gguf import GGMLQuantizationType

from ..core.errors import ContextOverflow, UserError
from ..core.files import check_gguf_path
from ..core.load import MIN_CTX, LoadConfig, check_threads, default_threads
from . import compute
from .handles import BatchHandle, ContextHandle, ModelHandle, read_floats
from .vocab import Vocab

Pooling = Literal["none", "mean", "cls", "last", "rank"]

#: llama.cpp's pooling types by name (``LLAMA_POOLING_TYPE_*``; ``--pooling`` of llama-server).
POOLING: dict[Pooling, int] = {
    "none": llama_cpp.LLAMA_POOLING_TYPE_NONE,
    "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
    "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
    "rank": llama_cpp.LLAMA_POOLING_TYPE_RANK,
}
_NAMES: dict[int, Pooling] = {v: k for k, v in POOLING.items()}
#: Most inputs evaluated in one ``llama_decode`` (sequences of the context).
MAX_SEQUENCES = 16
#: ggml's type id of float32 (the embedding context's KV cells).
_GGML_F32 = int(GGMLQuantizationType.F32)


@dataclass(frozen=True)
class EmbeddingConfig:
    """How an embedding model is loaded.

    ``pooling=None``: the GGUF's own, else llama.cpp's default (``none``). ``n_ctx``: the most
    tokens of one input, and of one batch of inputs. ``normalize``: llama-server's
    ``embd_normalize`` for pooled vectors (-1 none, 0 max-abs scaled to int16, 2 Euclidean,
    p > 2 p-norm).
    """

    pooling: Pooling | None = None
    n_ctx: int = 512
    n_gpu_layers: int = -1
    n_threads: int = field(default_factory=default_threads)
    normalize: int = 2

    def __post_init__(self) -> None:
        if self.pooling is not None and self.pooling not in POOLING:
            raise UserError(f"--pooling must be one of {', '.join(POOLING)}, got {self.pooling!r}")
        if self.n_ctx < MIN_CTX:
            raise UserError(f"--embedding-ctx-size must be at least {MIN_CTX}, got {self.n_ctx}")
        if self.n_gpu_layers < -1:
            raise UserError(f"--n-gpu-layers must be -1 (all) or >= 0, got {self.n_gpu_layers}")
        check_threads(self.n_threads)
        check_normalize(self.normalize)


def check_normalize(p: int) -> None:
    """A :class:`UserError` unless ``p`` is an ``embd_normalize`` llama-server knows."""
    if isinstance(p, bool) or not isinstance(p, int) or p < -1 or p == 1:
        raise UserError(
            f"embd_normalize must be -1 (none), 0 (max-abs), 2 (Euclidean) or p > 2, got {p!r}"
        )


def normalize(vectors: np.ndarray, p: int) -> np.ndarray:
    """``vectors`` ``[n, d]`` scaled row by row as llama.cpp's ``common_embd_normalize`` does
    (a zero row stays zero); float32 ``[n, d]``."""
    x = vectors.astype(np.float64)
    if p == -1:
        return vectors.astype(np.float32)
    if p == 0:
        norm = np.abs(x).max(axis=1) / 32760.0
    elif p == 2:
        norm = np.sqrt((x * x).sum(axis=1))
    else:
        norm = (np.abs(x) ** p).sum(axis=1) ** (1.0 / p)
    scale = np.divide(1.0, norm, out=np.zeros_like(norm), where=norm > 0)
    return (x * scale[:, None]).astype(np.float32)


class EmbeddingContext(ContextHandle):
    """A ``llama_context`` with embeddings on: ``n_seq`` sequences sharing ``n_ctx`` cells,
    every input evaluated in one micro-batch of up to ``n_ctx`` tokens. Registered with its
    model, which frees it first (:class:`ContextHandle`'s rule)."""

    def __init__(self, model: ModelHandle, cfg: EmbeddingConfig, pooling: int, n_seq: int) -> None:
        self.ptr: Any = None
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = cfg.n_ctx
        params.n_batch = cfg.n_ctx
        params.n_ubatch = cfg.n_ctx
        params.n_seq_max = n_seq
        params.kv_unified = True  # any sequence may use any cell: one batch of inputs
        params.n_threads = cfg.n_threads
        params.n_threads_batch = cfg.n_threads
        params.embeddings = True
        params.pooling_type = pooling
        # An input's vector must not depend on the batch it rides in: the CPU's flash attention
        # moved vectors by 1e-4 between a batch of 16 and one alone, f16 cells by 7e-7; without
        # both the two agree to float rounding (1e-7). The cache lives for one decode.
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.type_k = params.type_v = _GGML_F32
        params.no_perf = True
        self.ptr = llama_cpp.llama_init_from_model(model.ptr, params)
        model.contexts.append(self)
        try:
            if not self.ptr:
                raise UserError(
                    f"llama.cpp could not create an embedding context for {model.path.name} "
                    f"(n_ctx={cfg.n_ctx}; out of memory?)"
                )
            self.memory = llama_cpp.llama_get_memory(self.ptr)
            #: Tokens one decode takes whole: the micro-batch, within the padded context.
            self.n_ctx = min(
                int(llama_cpp.llama_n_ctx(self.ptr)), int(llama_cpp.llama_n_ubatch(self.ptr))
            )
            self.n_batch = self.n_ctx
        except BaseException:
            self.close()
            raise


class EmbeddingModel:
    """A model loaded for embeddings only, with its context and batch, freed by :meth:`close`.

    ``n_embd``: the length of every vector; ``n_ctx``: the most tokens of one input;
    ``pooling``: the pooling llama.cpp runs (:data:`POOLING`'s names); ``decodes``: the
    ``llama_decode`` calls made so far.
    """

    def __init__(self, path: str | os.PathLike[str], cfg: EmbeddingConfig | None = None) -> None:
        self.cfg = cfg or EmbeddingConfig()
        self.path = check_gguf_path(path)
        load = LoadConfig(
            n_ctx=self.cfg.n_ctx,
            n_batch=self.cfg.n_ctx,
            n_gpu_layers=self.cfg.n_gpu_layers,
            n_threads=self.cfg.n_threads,
            n_threads_batch=self.cfg.n_threads,
        )
        self._lock = threading.Lock()
        self.decodes = 0
        self._model = ModelHandle(self.path, load)
        try:
            self._check_model()
            pooling = self._pooling_type()
            self._ctx = EmbeddingContext(self._model, self.cfg, pooling, MAX_SEQUENCES)
            self._batch = BatchHandle(self._ctx.n_batch)
            self.pooling: Pooling = _NAMES[int(llama_cpp.llama_pooling_type(self._ctx.ptr))]
            self.vocab = Vocab(self._model.vocab_ptr)
            train = int(llama_cpp.llama_model_n_ctx_train(self._model.ptr))
            # past its training length a model of learned positions (BERT) has no position
            self.n_ctx = min(self._ctx.n_ctx, train) if train > 0 else self._ctx.n_ctx
            if self.pooling == "rank":
                self.n_embd = int(llama_cpp.llama_model_n_cls_out(self._model.ptr))
            else:
                self.n_embd = int(llama_cpp.llama_model_n_embd_out(self._model.ptr))
        except BaseException:
            self.close()
            raise

    def _check_model(self) -> None:
        ptr = self._model.ptr
        if llama_cpp.llama_model_has_encoder(ptr) and llama_cpp.llama_model_has_decoder(ptr):
            raise UserError(
                f"{self.path.name} is an encoder-decoder model: embeddings need an encoder-only "
                "or a decoder-only model"
            )

    def _pooling_type(self) -> int:
        """The pooling asked for, as llama.cpp's enum (``UNSPECIFIED``: the model's own)."""
        meta = self._model.metadata()
        arch = meta.get("general.architecture", "")
        own = meta.get(f"{arch}.pooling_type")
        if self.cfg.pooling is None:
            return int(llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED)
        if self.cfg.pooling == "rank" and own != str(POOLING["rank"]):
            # llama.cpp aborts the process on a rank graph without a classification head
            raise UserError(
                f"--pooling rank needs a reranker (a GGUF whose {arch}.pooling_type is rank); "
                f"{self.path.name} is not one"
            )
        return POOLING[self.cfg.pooling]

    # --- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Free the batch, context and model (idempotent)."""
        for name in ("_batch", "_ctx", "_model"):
            handle = getattr(self, name, None)
            if handle is not None:
                handle.close()

    def __enter__(self) -> EmbeddingModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def metadata(self) -> dict[str, str]:
        """GGUF key/value metadata as strings."""
        return self._model.metadata()

    # --- embeddings ------------------------------------------------------------------------

    def embed(self, inputs: Sequence[Sequence[int]], normalize_p: int | None = None) -> np.ndarray:
        """One pooled vector per input: float32 ``[len(inputs), n_embd]``, normalised by
        ``normalize_p`` (``embd_normalize``; None: the config's). A :class:`UserError` when
        the pooling is ``none`` (:meth:`embed_tokens` gives those vectors)."""
        if self.pooling == "none":
            raise UserError(
                "pooling 'none' gives one vector per token, not per input: load the model "
                "with a pooling (--pooling mean, cls or last)"
            )
        p = self.cfg.normalize if normalize_p is None else normalize_p
        check_normalize(p)
        rows = self._run(inputs)
        out = np.stack([r[0] for r in rows]) if rows else np.empty((0, self.n_embd), np.float32)
        return normalize(out, p)

    def embed_tokens(self, inputs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """One vector per token of each input, as llama.cpp gives them (pooling ``none``): a
        float32 ``[len(input), n_embd]`` per input. A :class:`UserError` for a pooled model."""
        if self.pooling != "none":
            raise UserError(f"the model pools its tokens ({self.pooling}): use embed")
        return self._run(inputs)

    def _check(self, inputs: Sequence[Sequence[int]]) -> None:
        n_vocab = self.vocab.n_vocab
        for i, tokens in enumerate(inputs):
            if not tokens:
                raise UserError(f"input {i} is empty: no tokens to embed")
            if len(tokens) > self.n_ctx:
                raise ContextOverflow(
                    f"input {i} is too large to process: {len(tokens)} tokens, more than the "
                    f"embedding model's context of {self.n_ctx} (--embedding-ctx-size)"
                )
            bad = next((t for t in tokens if not 0 <= int(t) < n_vocab), None)
            if bad is not None:
                raise UserError(
                    f"input {i}: token id {bad} is not in the vocabulary (0 to {n_vocab - 1})"
                )

    def _run(self, inputs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Each input's rows (``[1, n_embd]`` pooled, ``[len(input), n_embd]`` per token), in
        order, from as few decodes as fit: inputs packed whole into batches of at most
        ``n_ctx`` tokens and :data:`MAX_SEQUENCES` inputs. Nothing runs if any input is bad."""
        self._check(inputs)
        out: list[np.ndarray] = []
        with self._lock:
            group: list[Sequence[int]] = []
            for tokens in inputs:
                if group and (
                    sum(map(len, group)) + len(tokens) > self._ctx.n_batch
                    or len(group) == MAX_SEQUENCES
                ):
                    out += self._decode(group)
                    group = []
                group.append(tokens)
            if group:
                out += self._decode(group)
        return out

    def _decode(self, group: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """One ``llama_decode`` of ``group`` (sequence ``s`` is ``group[s]``) on an empty cache."""
        ctx = self._ctx.ptr
        llama_cpp.llama_memory_clear(self._ctx.memory, True)
        entries = [
            (int(tok), pos, seq, True)
            for seq, tokens in enumerate(group)
            for pos, tok in enumerate(tokens)
        ]
        self._batch.fill(entries)
        rc = compute.run(llama_cpp.llama_decode, ctx, self._batch.ptr)  # native/compute.py
        self.decodes += 1
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc} for {self.path.name}")
        d = self.n_embd
        if self.pooling != "none":
            return [
                self._read(llama_cpp.llama_get_embeddings_seq(ctx, s), 1, d)
                for s in range(len(group))
            ]
        rows, start = [], 0
        for tokens in group:
            rows.append(
                np.stack(
                    [
                        self._read(llama_cpp.llama_get_embeddings_ith(ctx, start + j), 1, d)[0]
                        for j in range(len(tokens))
                    ]
                )
            )
            start += len(tokens)
        return rows

    def _read(self, ptr: Any, n: int, d: int) -> np.ndarray:
        if not ptr:
            raise RuntimeError(f"llama.cpp returned no embeddings for {self.path.name}")
        return read_floats(ptr, n, d)
