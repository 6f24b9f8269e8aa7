"""The one adapter over llama.cpp: the only module that imports ``llama_cpp``.

:class:`NativeModel` owns a model, a context and a batch, and frees them deterministically.
It evaluates token batches with one ``llama_decode`` and returns exactly the logits rows asked
for (``llama_get_logits_ith``; never an ``n_ctx x n_vocab`` buffer), rolls the KV cache back
with ``llama_memory_seq_rm`` or, for caches that cannot drop a suffix (sliding-window,
recurrent, hybrid), with saved sequence states, and tokenizes / detokenizes.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import llama_cpp
import numpy as np
from gguf import GGMLQuantizationType

from .config import KV_TYPES, LoadConfig
from .errors import ContextOverflow, ModelFileError, UserError

GGUF_MAGIC = b"GGUF"
_SEQ = 0
_MAX_SNAPSHOTS = 8

#: KV cache type names -> ggml type ids (the gguf package's enum mirrors ggml's).
_GGML_TYPES: dict[str, int] = {name: int(GGMLQuantizationType[name.upper()]) for name in KV_TYPES}

_backend_lock = threading.Lock()
_backend_ready = False


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _quiet_log(level: int, text: bytes, user_data: Any) -> None:
    """llama.cpp log sink: silent unless PYRAMID_GGUF_VERBOSE is set."""
    if os.environ.get("PYRAMID_GGUF_VERBOSE"):
        print(text.decode("utf-8", errors="replace"), end="", flush=True)


def _init_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            llama_cpp.llama_log_set(_quiet_log, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _backend_ready = True


def check_gguf_path(path: str | os.PathLike[str]) -> Path:
    """A readable GGUF file, or a one-line :class:`ModelFileError` saying what is wrong."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelFileError(f"model file not found: {p}")
    if p.is_dir():
        raise ModelFileError(f"model path is a directory, not a GGUF file: {p}")
    try:
        with p.open("rb") as f:
            head = f.read(8)
    except OSError as e:
        raise ModelFileError(f"cannot read model file {p}: {e.strerror}") from None
    if head[:4] != GGUF_MAGIC:
        raise ModelFileError(f"not a GGUF file (bad magic {head[:4]!r}): {p}")
    if len(head) < 8:
        raise ModelFileError(f"truncated GGUF file: {p}")
    return p


def cpu_has_amx() -> bool:
    """Whether the CPU advertises Intel AMX tiles.

    llama.cpp places quantized weights in an AMX buffer on such CPUs, and with the llama.cpp
    bundled in llama-cpp-python 0.3.36 any batched ``llama_decode`` (more than one token) over
    those weights crashes with SIGSEGV (seen on Xeon VMs with ``amx_tile``; plain
    ``llama_cpp.Llama`` crashes the same way). Extra buffer types are therefore off by default
    there; ``LoadConfig(extra_buffers=True)`` turns them back on.
    """
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@dataclass(frozen=True)
class VocabInfo:
    """What the vocabulary check compares between tiers."""

    path: str
    tokenizer_model: str
    n_vocab: int
    bos: int
    eos: int

    def describe(self) -> str:
        return (
            f"{self.tokenizer_model} tokenizer, {self.n_vocab} tokens, "
            f"bos={self.bos} eos={self.eos}"
        )


@dataclass
class EvalTimer:
    """Time spent inside llama.cpp by one model."""

    n_evals: int = 0
    n_tokens: int = 0
    seconds: float = 0.0

    def snapshot(self) -> tuple[int, int, float]:
        return self.n_evals, self.n_tokens, self.seconds


class NativeModel:
    """One loaded GGUF model with its own context (one sequence) and batch.

    The adapter tracks the tokens its KV cache holds (:attr:`tokens`), so callers reason in
    token lists and never in native state.
    """

    def __init__(self, path: str | os.PathLike[str], cfg: LoadConfig | None = None) -> None:
        self.cfg = cfg or LoadConfig()
        self.path = check_gguf_path(path)
        _init_backend()
        self._model: Any = None
        self._ctx: Any = None
        self._batch: Any = None
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = 0x7FFFFFFF if self.cfg.n_gpu_layers < 0 else self.cfg.n_gpu_layers
        mparams.use_extra_bufts = (
            self.cfg.extra_buffers if self.cfg.extra_buffers is not None else not cpu_has_amx()
        )
        model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not model:
            raise ModelFileError(
                f"llama.cpp could not load {self.path} (truncated or corrupt GGUF?)"
            )
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(model))
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = self.cfg.n_ctx
        cparams.n_batch = self.cfg.n_batch
        cparams.n_ubatch = self.cfg.n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = self.cfg.n_threads
        cparams.n_threads_batch = self.cfg.n_threads_batch
        cparams.type_k = _GGML_TYPES[self.cfg.type_k]
        cparams.type_v = _GGML_TYPES[self.cfg.type_v]
        cparams.no_perf = True
        cparams.flash_attn_type = {
            None: llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
            True: llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
            False: llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
        }[self.cfg.flash_attn]
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            self.close()
            raise UserError(
                f"llama.cpp could not create a context for {self.path.name} "
                f"(n_ctx={self.cfg.n_ctx}; out of memory or unsupported KV cache type?)"
            )
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        self.n_ctx = int(llama_cpp.llama_n_ctx(ctx))
        self.n_batch = int(llama_cpp.llama_n_batch(ctx))
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        #: Why suffix removal is not trusted for this model, or None when it is.
        self.snapshot_reason = self._snapshot_reason()
        self._snapshots: list[tuple[int, bytes]] = []
        self.tokens: list[int] = []
        self.timer = EvalTimer()

    # --- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Free the batch, context and model (idempotent)."""
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> NativeModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_model", None) is not None:
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
        prompts go in ``n_batch`` chunks; ``chunk > 0`` caps each call at ``chunk`` tokens, see
        ``LoadConfig.verify_batch``). ``logits_at``: indices into ``tokens`` (negative counts
        from the end). Returns float32 ``[len(logits_at), V]``, a copy of exactly those rows.
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
            self._decode(part, [i - start for i in want if start <= i < start + len(part)])
            for i in want:
                if start <= i < start + len(part):
                    ptr = llama_cpp.llama_get_logits_ith(self._ctx, i - start)
                    out[rows[i]] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
            self.tokens.extend(int(t) for t in part)
        self.timer.n_evals += 1
        self.timer.n_tokens += n
        self.timer.seconds += time.perf_counter() - start_time
        order = [rows[i + n if i < 0 else i] for i in logits_at]
        return out[order] if order != list(range(len(want))) else out

    def _decode(self, chunk: Sequence[int], outputs: Sequence[int]) -> None:
        b = self._batch
        base = self.n_past
        flags = set(outputs)
        for j, tok in enumerate(chunk):
            b.token[j] = int(tok)
            b.pos[j] = base + j
            b.n_seq_id[j] = 1
            b.seq_id[j][0] = _SEQ
            b.logits[j] = 1 if j in flags else 0
        b.n_tokens = len(chunk)
        rc = llama_cpp.llama_decode(self._ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc} for {self.path.name}")

    # --- KV-cache rollback -------------------------------------------------------------------

    def _snapshot_reason(self) -> str | None:
        if self.cfg.force_snapshot_rollback:
            return "forced"
        if llama_cpp.llama_model_is_recurrent(self._model):
            return "recurrent"
        if llama_cpp.llama_model_is_hybrid(self._model):
            return "hybrid"
        if llama_cpp.llama_model_n_swa(self._model) > 0:
            return "sliding-window"
        return None

    def rollback(self, n_past: int) -> None:
        """Make the cache hold exactly ``tokens[:n_past]``, so the next logits are right.

        Truncates with ``llama_memory_seq_rm`` where the cache allows it; otherwise restores the
        newest saved sequence state at or before ``n_past`` and re-evaluates the gap.
        """
        if n_past >= self.n_past:
            return
        n_past = max(n_past, 0)
        if self.snapshot_reason is None:
            if llama_cpp.llama_memory_seq_rm(self._mem, _SEQ, n_past, -1):
                del self.tokens[n_past:]
                return
            self.snapshot_reason = "partial removal refused"
        self._restore(n_past)

    def _restore(self, n_past: int) -> None:
        kept = self.tokens[:n_past]
        while self._snapshots and self._snapshots[-1][0] > n_past:
            self._snapshots.pop()
        llama_cpp.llama_memory_seq_rm(self._mem, _SEQ, -1, -1)
        self.tokens = []
        if self._snapshots:
            pos, state = self._snapshots[-1]
            buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
            if llama_cpp.llama_state_seq_set_data(self._ctx, buf, len(state), _SEQ) == 0:
                raise RuntimeError(f"could not restore a saved state of {self.path.name}")
            self.tokens = kept[:pos]
        if len(self.tokens) < n_past:
            self.eval(kept[len(self.tokens) : n_past])
        self._save_snapshot()

    def _save_snapshot(self) -> None:
        if self._snapshots and self._snapshots[-1][0] == self.n_past:
            return
        size = llama_cpp.llama_state_seq_get_size(self._ctx, _SEQ)
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx, buf, size, _SEQ)
        self._snapshots.append((self.n_past, bytes(buf[:written])))
        del self._snapshots[:-_MAX_SNAPSHOTS]

    def reset(self) -> None:
        """Empty the cache."""
        llama_cpp.llama_memory_clear(self._mem, True)
        self.tokens = []
        self._snapshots = []

    # --- vocabulary ----------------------------------------------------------------------------

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        """Token ids of ``text``; ``add_special`` adds BOS where the model asks for it."""
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(
            self._vocab, data, len(data), buf, cap, add_special, parse_special
        )
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(
                self._vocab, data, len(data), buf, cap, add_special, parse_special
            )
        return list(buf[:n])

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The raw bytes one token renders to (control tokens render empty unless ``special``)."""
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, int(token), buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, int(token), buf, -n, 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        """Text of ``tokens`` (invalid UTF-8 replaced)."""
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def token_text(self, token: int) -> str:
        """The vocabulary's stored text of a token (what the vocabulary check compares)."""
        raw = llama_cpp.llama_vocab_get_text(self._vocab, int(token))
        return raw.decode("utf-8", errors="replace") if raw else ""

    def is_eog(self, token: int) -> bool:
        """End of generation (EOS, EOT, ...)."""
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, int(token)))

    @property
    def bos(self) -> int:
        return int(llama_cpp.llama_vocab_bos(self._vocab))

    @property
    def eos(self) -> int:
        return int(llama_cpp.llama_vocab_eos(self._vocab))

    def vocab_info(self) -> VocabInfo:
        return VocabInfo(
            path=str(self.path),
            tokenizer_model=self.metadata().get("tokenizer.ggml.model", "?"),
            n_vocab=self.n_vocab,
            bos=self.bos,
            eos=self.eos,
        )

    # --- metadata ------------------------------------------------------------------------------

    def metadata(self) -> dict[str, str]:
        """GGUF key/value metadata as strings (arrays are summarised by llama.cpp)."""
        if not hasattr(self, "_meta"):
            meta: dict[str, str] = {}
            n = llama_cpp.llama_model_meta_count(self._model)
            key = ctypes.create_string_buffer(256)
            for i in range(n):
                llama_cpp.llama_model_meta_key_by_index(self._model, i, key, 256)
                size = llama_cpp.llama_model_meta_val_str_by_index(self._model, i, None, 0)
                val = ctypes.create_string_buffer(max(size, 0) + 1)
                llama_cpp.llama_model_meta_val_str_by_index(self._model, i, val, len(val))
                meta[key.value.decode("utf-8", "replace")] = val.value.decode("utf-8", "replace")
            self._meta = meta
        return self._meta

    def chat_template(self) -> str | None:
        """The GGUF's ``tokenizer.chat_template``, or None."""
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8") if raw else None

    @property
    def n_layer(self) -> int:
        return int(llama_cpp.llama_model_n_layer(self._model))

    @property
    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self._model, buf, 256)
        return buf.value.decode("utf-8", "replace")


def supports_gpu_offload() -> bool:
    """Whether this llama.cpp build can offload layers to a GPU."""
    _init_backend()
    return bool(llama_cpp.llama_supports_gpu_offload())


def quantize(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], ftype: int, *, threads: int
) -> None:
    """``llama_model_quantize``, requantizing allowed; ``ftype`` is a ``LLAMA_FTYPE_*`` value."""
    _init_backend()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise UserError(f"llama.cpp could not quantize {src} (code {rc})")


def ftype_names() -> dict[str, int]:
    """Type names for :func:`quantize` (``Q4_0`` -> ``LLAMA_FTYPE_MOSTLY_Q4_0``)."""
    prefix = "LLAMA_FTYPE_MOSTLY_"
    return {
        name[len(prefix) :]: int(getattr(llama_cpp, name))
        for name in dir(llama_cpp)
        if name.startswith(prefix)
    }


def format_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
) -> str:
    """Render ``messages`` with a Jinja chat template (llama-cpp-python's formatter)."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    formatter = Jinja2ChatFormatter(
        template=template,
        eos_token=eos_token,
        bos_token=bos_token,
        add_generation_prompt=add_generation_prompt,
    )
    try:
        return formatter(messages=cast(Any, messages)).prompt
    except Exception as e:  # jinja2 raises many types for bad templates / messages
        raise UserError(f"chat template failed: {e}") from None
