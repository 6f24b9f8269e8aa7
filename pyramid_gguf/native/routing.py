"""Which experts a mixture of experts routes each token to, recorded while llama.cpp evaluates.

llama.cpp's MoE layers name the router's choice ``ffn_moe_topk-<layer>`` (``build_moe_ffn`` in
src/llama-graph.cpp: an ``int32 [K, n_tokens]`` view of the router's descending argsort).
:func:`record_routes` evaluates tokens in a context of its own whose eval callback
(``llama_context_params.cb_eval``, ggml's ``ggml_backend_sched_eval_callback``) asks for exactly
those tensors and copies them out (``ggml_backend_tensor_get``: from any backend's buffer).

The result is what the block-union cost of an MoE is computed from (planning/moe.py): which
experts a block of k consecutive tokens reads, with the locality real routing has.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Sequence
from typing import Any

import llama_cpp
import numpy as np

from ..core.load import MIN_CTX
from . import compute
from .handles import BatchHandle
from .model import NativeModel

#: ``ffn_moe_topk-<layer>``: the experts each token of a micro-batch routes to.
_TOPK = re.compile(rb"^ffn_moe_topk-(\d+)$")


class _TensorHead(ctypes.Structure):
    """The first fields of ggml.h's ``struct ggml_tensor``: type, buffer, ``ne``, ``nb``."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
    ]


def _bind(name: str, restype: Any, *argtypes: Any) -> Any:
    f = getattr(llama_cpp.llama_cpp._lib, name)
    f.restype, f.argtypes = restype, list(argtypes)
    return f


def expert_shape(model: NativeModel) -> tuple[int, int]:
    """``(experts, experts used per token)`` from the GGUF header; ``(0, 0)``: not an MoE."""
    meta = model.metadata()
    arch = meta.get("general.architecture", "")
    n_expert = int(meta.get(f"{arch}.expert_count", "0") or 0)
    n_used = int(meta.get(f"{arch}.expert_used_count", "0") or 0)
    return n_expert, n_used


class _Recorder:
    """The eval callback: keeps each ``ffn_moe_topk-<layer>`` as ``int32 [n_tokens, K]``."""

    def __init__(self, n_layer: int) -> None:
        self.layers: list[list[np.ndarray]] = [[] for _ in range(n_layer)]
        self._name = _bind("ggml_get_name", ctypes.c_char_p, ctypes.c_void_p)
        self._nbytes = _bind("ggml_nbytes", ctypes.c_size_t, ctypes.c_void_p)
        self._get = _bind(
            "ggml_backend_tensor_get",
            None,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_size_t,
        )
        self.callback = llama_cpp.llama_cpp.ggml_backend_sched_eval_callback(self._call)

    def _call(self, tensor: int, ask: bool, _user: Any) -> bool:
        m = _TOPK.match(self._name(tensor) or b"")
        if ask or m is None:
            return m is not None  # ask: observe only the router's choices
        head = _TensorHead.from_address(tensor)
        k, n = int(head.ne[0]), int(head.ne[1])
        row = int(head.nb[1]) // 4  # a view: rows of the full argsort, the first K kept
        if n == 0:
            return True
        buf = np.zeros(n * row, dtype=np.int32)
        self._get(tensor, buf.ctypes.data, 0, int(self._nbytes(tensor)))
        self.layers[int(m.group(1))].append(buf.reshape(n, row)[:, :k].copy())
        return True


def record_routes(model: NativeModel, tokens: Sequence[int], *, chunk: int = 32) -> np.ndarray:
    """The experts each of ``tokens`` routes to in each layer when ``model`` evaluates them
    from an empty cache: ``int32 [n_tokens, n_layer, K]`` (K = experts used per token, in the
    router's descending order; -1 in a layer without a router, e.g. a dense first layer).

    Runs in a context of its own (``model``'s cache is untouched), ``chunk`` tokens per
    ``llama_decode`` with every row an output, so the last layer (which llama.cpp evaluates
    only at output rows) routes every token too. Raises ``ValueError`` for a model that is not
    a mixture of experts.
    """
    n_expert, n_used = expert_shape(model)
    if n_expert <= 0 or n_used <= 0:
        raise ValueError(f"{model.path.name} is not a mixture of experts (no expert_count)")
    tokens = [int(t) for t in tokens]
    n_layer = model.n_layer
    out = np.full((len(tokens), n_layer, n_used), -1, dtype=np.int32)
    if not tokens:
        return out
    cfg = model.cfg
    recorder = _Recorder(n_layer)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = max(MIN_CTX, -(-len(tokens) // MIN_CTX) * MIN_CTX)
    params.n_batch = params.n_ubatch = chunk
    params.n_seq_max = 1
    params.n_threads = cfg.n_threads
    params.n_threads_batch = cfg.n_threads_batch
    params.no_perf = True
    params.cb_eval = recorder.callback
    params.cb_eval_user_data = None
    ctx = llama_cpp.llama_init_from_model(model._model.ptr, params)
    if not ctx:
        raise RuntimeError(f"llama.cpp could not create a routing context for {model.path.name}")
    batch = BatchHandle(chunk)
    try:
        for start in range(0, len(tokens), chunk):
            piece = tokens[start : start + chunk]
            batch.fill([(t, start + j, 0, True) for j, t in enumerate(piece)])
            rc = compute.run(llama_cpp.llama_decode, ctx, batch.ptr)  # native/compute.py
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with code {rc} for {model.path.name}")
    finally:
        batch.close()
        llama_cpp.llama_free(ctx)
    for layer, parts in enumerate(recorder.layers):
        if parts:
            rows = np.concatenate(parts)
            if rows.shape != (len(tokens), n_used):
                raise RuntimeError(f"layer {layer} routed {rows.shape[0]} tokens of {len(tokens)}")
            out[:, layer] = rows
    return out
