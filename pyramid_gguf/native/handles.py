"""Owners of llama.cpp's native objects: one class per resource, freed exactly once.

:class:`ModelHandle` owns a ``llama_model``, :class:`ContextHandle` a ``llama_context``,
:class:`BatchHandle` a ``llama_batch`` (llama-cpp-python's ``_internals`` layering). Each
frees its pointer in :meth:`close` (idempotent) and, as a last resort, when collected.

A context must be freed before its model (``~llama_context`` reads the model), in whatever
order the garbage collector finalizes them: in a reference cycle (a traceback's frames holding
a half-used model after a Ctrl-C) it calls every ``__del__`` in no set order. So a model owns
its contexts and frees them first. A Ctrl-C lands at the first line of Python after a native
call: so each constructor frees what it made if it does not return, and :meth:`close` forgets
a pointer before freeing it (an interrupt there leaks it, never frees it twice).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from gguf import GGMLQuantizationType

from ..core.errors import ModelFileError, UserError
from ..core.load import KV_TYPES, LoadConfig
from .backend import captured_log
from .buffers import parse_buffer_sizes, plan_placement
from .rpc import remote_devices

#: KV cache type names -> ggml type ids (the gguf package's enum mirrors ggml's).
_GGML_TYPES: dict[str, int] = {name: int(GGMLQuantizationType[name.upper()]) for name in KV_TYPES}


class ModelHandle:
    """A loaded ``llama_model`` and what it knows about itself."""

    def __init__(self, path: Path, cfg: LoadConfig) -> None:
        self.path = path
        self.ptr: Any = None
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 0x7FFFFFFF if cfg.n_gpu_layers < 0 else cfg.n_gpu_layers
        params.load_mtp = cfg.load_mtp
        self.placement = plan_placement(path, cfg)
        #: What the tensor overrides point into, kept as long as the model.
        self._overrides = self.placement.apply(params)
        #: The RPC devices' array and the output layer's overrides that ``params`` points at
        #: (:class:`~.rpc.RemotePlacement`), kept as long as the model.
        self._devices = remote_devices(cfg, params)
        #: Contexts made from this model, freed before it.
        self.contexts: list[ContextHandle] = []
        with captured_log() as log:
            self.ptr = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        try:
            #: MiB of weights per llama.cpp buffer type, as the load reported them.
            self.weight_buffers = parse_buffer_sizes(log)
            if not self.ptr:
                raise ModelFileError(
                    f"llama.cpp could not load {path} (truncated or corrupt GGUF?)"
                )
            self.vocab_ptr = llama_cpp.llama_model_get_vocab(self.ptr)
            self._meta: dict[str, str] | None = None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Free the model, its contexts first (idempotent)."""
        for context in self.contexts:
            context.close()
        self.contexts.clear()
        ptr, self.ptr = self.ptr, None
        if ptr:
            llama_cpp.llama_model_free(ptr)

    def __del__(self) -> None:
        if getattr(self, "ptr", None):
            self.close()

    @property
    def n_layer(self) -> int:
        return int(llama_cpp.llama_model_n_layer(self.ptr))

    def cache_kind(self) -> str | None:
        """Why a suffix of this model's KV cache cannot simply be dropped, or None."""
        if llama_cpp.llama_model_is_recurrent(self.ptr):
            return "recurrent"
        if llama_cpp.llama_model_is_hybrid(self.ptr):
            return "hybrid"
        if llama_cpp.llama_model_n_swa(self.ptr) > 0:
            return "sliding-window"
        return None

    def metadata(self) -> dict[str, str]:
        """GGUF key/value metadata as strings (arrays are summarised by llama.cpp)."""
        if self._meta is None:
            meta: dict[str, str] = {}
            n = llama_cpp.llama_model_meta_count(self.ptr)
            key = ctypes.create_string_buffer(256)
            for i in range(n):
                llama_cpp.llama_model_meta_key_by_index(self.ptr, i, key, 256)
                size = llama_cpp.llama_model_meta_val_str_by_index(self.ptr, i, None, 0)
                val = ctypes.create_string_buffer(max(size, 0) + 1)
                llama_cpp.llama_model_meta_val_str_by_index(self.ptr, i, val, len(val))
                meta[key.value.decode("utf-8", "replace")] = val.value.decode("utf-8", "replace")
            self._meta = meta
        return self._meta

    def chat_template(self) -> str | None:
        """The GGUF's ``tokenizer.chat_template``, or None."""
        raw = llama_cpp.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8") if raw else None


def copy_floats(out: np.ndarray, ptr: Any) -> None:
    """Fill ``out`` (C-contiguous float32) with as many floats from the native pointer ``ptr``:
    one ``memmove`` (``np.ctypeslib.as_array`` builds a ctypes array type per call, which
    costs more than the copy on a decode's hot path)."""
    ctypes.memmove(out.ctypes.data, ptr, out.nbytes)


def read_floats(ptr: Any, *shape: int) -> np.ndarray:
    """A float32 copy ``[shape]`` of what the native pointer ``ptr`` holds."""
    out = np.empty(shape, dtype=np.float32)
    copy_floats(out, ptr)
    return out


class ContextHandle:
    """A ``llama_context`` of ``cfg.parallel`` sequences of ``cfg.n_ctx`` tokens each, created
    from a model and a :class:`LoadConfig` (and registered with the model, which frees it
    first)."""

    def __init__(self, model: ModelHandle, cfg: LoadConfig) -> None:
        self.ptr: Any = None
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = cfg.n_ctx * cfg.parallel
        params.n_batch = cfg.n_batch
        params.n_ubatch = cfg.n_batch
        params.n_seq_max = cfg.parallel
        # llama.cpp clamps it to 0 for architectures without per-sequence state rollback
        params.n_rs_seq = cfg.n_rs_seq
        # One cache for every sequence lets a batch of all of them run as one micro-batch; a
        # stream per sequence keeps each laid out as if alone (strict identity).
        params.kv_unified = not cfg.strict_identity
        params.n_threads = cfg.n_threads
        params.n_threads_batch = cfg.n_threads_batch
        params.type_k = _GGML_TYPES[cfg.type_k]
        params.type_v = _GGML_TYPES[cfg.type_v]
        params.no_perf = True
        params.op_offload = cfg.op_offload
        params.flash_attn_type = {
            None: llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
            True: llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
            False: llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
        }[cfg.flash_attn]
        self.ptr = llama_cpp.llama_init_from_model(model.ptr, params)
        model.contexts.append(self)
        try:
            if not self.ptr:
                raise UserError(
                    f"llama.cpp could not create a context for {model.path.name} "
                    f"(n_ctx={cfg.n_ctx}; out of memory or unsupported KV cache type?)"
                )
            self.memory = llama_cpp.llama_get_memory(self.ptr)
            #: Cells per sequence (llama.cpp pads the whole cache to a multiple of 256).
            self.n_ctx = int(llama_cpp.llama_n_ctx(self.ptr)) // cfg.parallel
            self.n_batch = int(llama_cpp.llama_n_batch(self.ptr))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr:
            llama_cpp.llama_free(ptr)

    def __del__(self) -> None:
        if getattr(self, "ptr", None):
            self.close()


class BatchHandle:
    """A ``llama_batch`` of up to ``capacity`` tokens, each of one sequence."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.ptr: Any = llama_cpp.llama_batch_init(capacity, 0, 1)

    def fill(self, entries: Sequence[tuple[int, int, int, bool]]) -> None:
        """One ``(token, position, sequence id, logits wanted)`` per batch index."""
        b = self.ptr
        for j, (tok, pos, seq, wanted) in enumerate(entries):
            b.token[j] = tok
            b.pos[j] = pos
            b.n_seq_id[j] = 1
            b.seq_id[j][0] = seq
            b.logits[j] = 1 if wanted else 0
        b.n_tokens = len(entries)

    def close(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr is not None:
            llama_cpp.llama_batch_free(ptr)

    def __del__(self) -> None:
        if getattr(self, "ptr", None) is not None:
            self.close()
