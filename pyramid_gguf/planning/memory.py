"""Memory facts of one GGUF file, from its header alone (or from the shape ``models.toml`` ships
for it): weights per block, KV cache, buffers.

All sizes are in **bytes** unless a name says otherwise. Compute-buffer estimate (per context
on a device; llama.cpp's allocator reuses memory, so the largest single stage dominates)::

    buffer = max(logits, attention) + activations
    logits      = n_vocab * n_ubatch * 4          (only on the device holding the output layer)
    attention   = n_ubatch * n_ctx * n_head * 4   (f32 KQ scores; flash attention needs less)
    activations = n_ubatch * (2 * n_embd + n_ff) * 4

Measured on the CPU backend (Qwen2.5-Coder 0.5B/1.5B, n_ubatch 512) llama.cpp reported
300-306 MiB against 310-320 MiB estimated: the estimate errs high on purpose.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..core.errors import ModelFileError, UserError
from ..core.gguf_header import ArrayInfo, GGUFHeader, read_header
from ..core.load import KV_TYPES
from ..models.shapes import Experts, TierShape

MiB = 1 << 20
GiB = 1 << 30
#: ``n_ctx`` is rounded up to this many cells by llama.cpp's KV cache.
KV_PAD = 256

# --- sizes ------------------------------------------------------------------------------------

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 10**3,
    "m": MiB, "mib": MiB, "mb": 10**6,
    "g": GiB, "gib": GiB, "gb": 10**9,
    "t": 1 << 40, "tib": 1 << 40, "tb": 10**12,
}  # fmt: skip
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes in ``text``: ``8GiB``, ``6GB``, ``512MiB``, ``1.5G`` (bare K/M/G/T are binary).

    A bare number is only accepted for ``0``; anything else needs a unit.
    """
    m = _SIZE_RE.match(text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise UserError(f"bad size {text!r}; use a number with a unit, e.g. 8GiB, 6GB, 512MiB")
    value = float(m.group(1))
    if not unit and value != 0:
        raise UserError(f"size {text!r} needs a unit, e.g. {text}GiB or {text}MiB")
    return int(value * _UNITS[unit])


def fmt_mib(n: int) -> str:
    """``n`` bytes as MiB with one decimal."""
    return f"{n / MiB:.1f}"


def kv_row_bytes(kv_type: str, n: int) -> int:
    """Bytes of ``n`` cache values stored as ``kv_type`` (``f16``, ``q8_0``, ...)."""
    if kv_type not in KV_TYPES:
        raise UserError(f"KV cache type must be one of {', '.join(KV_TYPES)}, got {kv_type!r}")
    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[kv_type.upper()]]
    return -(-n // block) * type_size


def padded_ctx(n_ctx: int) -> int:
    """KV cells llama.cpp allocates for ``n_ctx`` (rounded up to :data:`KV_PAD`)."""
    return -(-n_ctx // KV_PAD) * KV_PAD


# --- one model --------------------------------------------------------------------------------

_BLK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class ModelMemory:
    """Memory facts of one GGUF file (bytes), read from its header.

    ``layer_bytes[i]``: tensors ``blk.i.*``. ``head_bytes``: the output layer
    (``output.weight`` or, when the embeddings are tied, the duplicate of ``token_embd`` that
    llama.cpp creates, plus ``output_norm.*``). ``embd_bytes``: ``token_embd`` (always CPU).
    ``other_bytes``: any remaining non-block tensors (kept on the CPU).
    ``file_head_bytes`` counts only tensors stored in the file (tied duplicate excluded), so
    ``sum(layer_bytes) + file_head_bytes + embd_bytes + other_bytes == tensor_bytes``.
    ``experts``: a mixture of experts' routing and its routed experts' bytes per block (a part
    of ``layer_bytes``; None: a dense model; planning/moe.py prices it).
    """

    path: str
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_ff: int
    n_vocab: int
    #: Per block: K and V values per token (``n_head_kv * key_length``, ``... value_length``).
    n_embd_k: tuple[int, ...]
    n_embd_v: tuple[int, ...]
    layer_bytes: tuple[int, ...]
    head_bytes: int
    file_head_bytes: int
    embd_bytes: int
    other_bytes: int
    tied_output: bool
    tensor_bytes: int
    experts: Experts | None = None
    #: Per block: bytes of one sequence's recurrent state (Gated DeltaNet: conv and SSM
    #: states, f32), 0 for attention blocks; llama.cpp keeps ``1 + n_rs_seq`` copies of it
    #: per sequence (the snapshots a rollback restores). Empty: no recurrent block.
    state_bytes: tuple[int, ...] = ()

    def recurrent_bytes(self, parallel: int = 1, n_rs_seq: int = 0) -> tuple[int, ...]:
        """Per block: recurrent-state bytes of ``parallel`` sequences with ``n_rs_seq``
        snapshots each (llama.cpp's ``llama_memory_recurrent``: ``1 + n_rs_seq`` rows)."""
        return tuple(b * parallel * (1 + n_rs_seq) for b in self.state_bytes)

    @property
    def weight_bytes(self) -> int:
        """Every weight llama.cpp allocates (the tied duplicate included)."""
        return sum(self.layer_bytes) + self.head_bytes + self.embd_bytes + self.other_bytes

    def kv_bytes_per_token(self, type_k: str = "f16", type_v: str = "f16") -> tuple[int, ...]:
        """Per block: KV bytes one token occupies."""
        return tuple(
            kv_row_bytes(type_k, k) + kv_row_bytes(type_v, v)
            for k, v in zip(self.n_embd_k, self.n_embd_v, strict=True)
        )

    def kv_bytes(self, n_ctx: int, type_k: str = "f16", type_v: str = "f16") -> int:
        """KV cache bytes of all blocks for a context of ``n_ctx`` tokens (padded)."""
        return padded_ctx(n_ctx) * sum(self.kv_bytes_per_token(type_k, type_v))

    def compute_bytes(self, n_ctx: int, n_ubatch: int, *, logits: bool) -> int:
        """Compute-buffer estimate of one context (see the module docstring)."""
        stage = n_ubatch * padded_ctx(n_ctx) * self.n_head * 4
        if logits:
            stage = max(stage, self.n_vocab * n_ubatch * 4)
        return stage + n_ubatch * (2 * self.n_embd + self.n_ff) * 4


def _per_layer(meta: dict[str, Any], key: str, n_layer: int, default: int) -> tuple[int, ...]:
    value = meta.get(key, default)
    if isinstance(value, list):
        if len(value) != n_layer:
            raise ModelFileError(f"{key} has {len(value)} entries for {n_layer} blocks")
        return tuple(int(v) for v in value)
    if isinstance(value, ArrayInfo):
        raise ModelFileError(f"{key} is an unexpectedly long array")
    return (int(value),) * n_layer


@dataclass(frozen=True)
class _Hyper:
    """The hyper-parameters a header's metadata gives (per block where they may vary)."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_ff: int
    n_head_kv: tuple[int, ...]
    key_length: int
    value_length: int


def _hyper(h: GGUFHeader) -> _Hyper:
    meta = h.metadata
    arch = str(meta.get("general.architecture", ""))
    if not arch:
        raise ModelFileError(f"GGUF file has no general.architecture: {h.path}")

    def need(key: str) -> int:
        if f"{arch}.{key}" not in meta:
            raise ModelFileError(f"GGUF file lacks {arch}.{key}: {h.path}")
        value = meta[f"{arch}.{key}"]
        return int(value[0] if isinstance(value, list) else value)

    n_layer = need("block_count")
    n_embd = need("embedding_length")
    n_head = need("attention.head_count")
    n_ff = int(_first(meta.get(f"{arch}.feed_forward_length", 4 * n_embd)))
    head_dim = n_embd // max(n_head, 1)
    n_kv = _per_layer(meta, f"{arch}.attention.head_count_kv", n_layer, n_head)
    k_len = int(meta.get(f"{arch}.attention.key_length", head_dim))
    v_len = int(meta.get(f"{arch}.attention.value_length", head_dim))
    return _Hyper(arch, n_layer, n_embd, n_head, n_ff, n_kv, k_len, v_len)


#: A routed expert's tensors: ``blk.i.ffn_(gate|up|down|gate_up)_exps.(weight|bias|scale)``.
_EXPS = re.compile(r"^blk\.(\d+)\.ffn_[a-z_]*_exps\.")


def header_experts(h: GGUFHeader, arch: str, n_layer: int) -> Experts | None:
    """A mixture of experts' routing from the header (``<arch>.expert_count``,
    ``expert_used_count``, ``expert_feed_forward_length``,
    ``expert_shared_feed_forward_length``) and its ``*_exps`` tensors' bytes per block; None
    for a dense model (no experts, or none used)."""
    meta = h.metadata
    n_expert = int(_first(meta.get(f"{arch}.expert_count", 0)) or 0)
    n_used = int(_first(meta.get(f"{arch}.expert_used_count", 0)) or 0)
    if n_expert <= 0 or n_used <= 0:
        return None
    per_block = [0] * n_layer
    for t in h.tensors:
        m = _EXPS.match(t.name)
        if m and int(m.group(1)) < n_layer:
            per_block[int(m.group(1))] += t.nbytes
    return Experts(
        n_expert=n_expert,
        n_used=n_used,
        expert_ff=int(_first(meta.get(f"{arch}.expert_feed_forward_length", 0)) or 0),
        shared_ff=int(_first(meta.get(f"{arch}.expert_shared_feed_forward_length", 0)) or 0),
        layer_bytes=tuple(per_block),
    )


def model_memory(source: str | Path | GGUFHeader) -> ModelMemory:
    """The :class:`ModelMemory` of a GGUF file (path or parsed header)."""
    h = source if isinstance(source, GGUFHeader) else read_header(source)
    hp = _hyper(h)
    n_layer = hp.n_layer
    layers = [0] * n_layer
    head = embd = other = 0
    has_output = False
    n_vocab = 0
    for t in h.tensors:
        m = _BLK.match(t.name)
        if m:
            il = int(m.group(1))
            if il >= n_layer:
                raise ModelFileError(f"tensor {t.name} beyond block_count {n_layer}: {h.path}")
            layers[il] += t.nbytes
        elif t.name.startswith("output.") or t.name.startswith("output_norm."):
            head += t.nbytes
            if t.name == "output.weight":
                has_output = True
                n_vocab = n_vocab or (t.shape[1] if len(t.shape) > 1 else 0)
        elif t.name.startswith("token_embd."):
            embd += t.nbytes
            if t.name == "token_embd.weight" and len(t.shape) > 1:
                n_vocab = t.shape[1]
        else:
            other += t.nbytes
    if not n_vocab:
        tokens = h.metadata.get("tokenizer.ggml.tokens")
        n_vocab = tokens.length if isinstance(tokens, ArrayInfo) else len(tokens or [])
    tied = not has_output
    state, attn = _recurrent(h, hp)
    return ModelMemory(
        path=str(h.path),
        arch=hp.arch,
        n_layer=n_layer,
        n_embd=hp.n_embd,
        n_head=hp.n_head,
        n_ff=hp.n_ff,
        n_vocab=n_vocab,
        n_embd_k=tuple(n * hp.key_length * a for n, a in zip(hp.n_head_kv, attn, strict=True)),
        n_embd_v=tuple(n * hp.value_length * a for n, a in zip(hp.n_head_kv, attn, strict=True)),
        layer_bytes=tuple(layers),
        head_bytes=head + (embd if tied else 0),
        file_head_bytes=head,
        embd_bytes=embd,
        other_bytes=other,
        tied_output=tied,
        tensor_bytes=h.tensor_bytes,
        experts=header_experts(h, hp.arch, n_layer),
        state_bytes=state,
    )


#: Hybrids whose blocks are Gated DeltaNet except every ``full_attention_interval``-th.
_DELTANET = frozenset({"qwen35", "qwen35moe", "qwen3next"})


def _recurrent(h: GGUFHeader, hp: _Hyper) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per block: one sequence's recurrent-state bytes, and 1 where the block keeps a KV cache
    in the main context (0 for a recurrent block, and for a NextN block, whose cache lives in
    the MTP context). Dense and other architectures: no state, every block attends."""
    n = hp.n_layer
    meta = h.metadata
    if hp.arch not in _DELTANET:
        return (), (1,) * n
    nextn = int(_first(meta.get(f"{hp.arch}.nextn_predict_layers", 0)) or 0)
    trunk = n - nextn
    interval = int(_first(meta.get(f"{hp.arch}.full_attention_interval", 4)) or 4)
    d_conv = int(_first(meta.get(f"{hp.arch}.ssm.conv_kernel", 4)))
    d_state = int(_first(meta.get(f"{hp.arch}.ssm.state_size", 0)))
    groups = int(_first(meta.get(f"{hp.arch}.ssm.group_count", 0)))
    heads = int(_first(meta.get(f"{hp.arch}.ssm.time_step_rank", 0)))
    conv_dim = 2 * d_state * groups + d_state * heads
    one = 4 * ((d_conv - 1) * conv_dim + d_state * d_state * heads)
    recurrent = [i < trunk and (i + 1) % interval != 0 for i in range(n)]
    state = tuple(one if r else 0 for r in recurrent)
    attention = tuple(int(i < trunk and not r) for i, r in enumerate(recurrent))
    return state, attention


def shape_of(h: GGUFHeader, source: str) -> TierShape:
    """The :class:`~pyramid_gguf.models.shapes.TierShape` of a parsed header, as
    ``models.toml`` ships it (``source``: where the header came from)."""
    hp, mm = _hyper(h), model_memory(h)
    return TierShape(
        source=source,
        arch=hp.arch,
        n_layer=hp.n_layer,
        n_embd=hp.n_embd,
        n_head=hp.n_head,
        n_head_kv=hp.n_head_kv,
        key_length=hp.key_length,
        value_length=hp.value_length,
        n_ff=hp.n_ff,
        n_vocab=mm.n_vocab,
        tied=mm.tied_output,
        layer_bytes=mm.layer_bytes,
        head_bytes=mm.file_head_bytes,
        embd_bytes=mm.embd_bytes,
        other_bytes=mm.other_bytes,
        experts=mm.experts,
    )


def shape_memory(shape: TierShape, label: str) -> ModelMemory:
    """The :class:`ModelMemory` of a file known only by its shipped shape (``label`` stands
    for its path in plans)."""
    return ModelMemory(
        path=label,
        arch=shape.arch,
        n_layer=shape.n_layer,
        n_embd=shape.n_embd,
        n_head=shape.n_head,
        n_ff=shape.n_ff,
        n_vocab=shape.n_vocab,
        n_embd_k=tuple(n * shape.key_length for n in shape.n_head_kv),
        n_embd_v=tuple(n * shape.value_length for n in shape.n_head_kv),
        layer_bytes=shape.layer_bytes,
        head_bytes=shape.head_bytes + (shape.embd_bytes if shape.tied else 0),
        file_head_bytes=shape.head_bytes,
        embd_bytes=shape.embd_bytes,
        other_bytes=shape.other_bytes,
        tied_output=shape.tied,
        tensor_bytes=shape.tensor_bytes,
        experts=shape.experts,
    )


def keep_blocks(mm: ModelMemory, blocks: list[int], label: str) -> ModelMemory:
    """``mm`` with only ``blocks`` kept (a tier derived by ``keep_layers``), renumbered."""
    kept = tuple(mm.layer_bytes[i] for i in blocks)
    return replace(
        mm,
        path=label,
        n_layer=len(blocks),
        n_embd_k=tuple(mm.n_embd_k[i] for i in blocks),
        n_embd_v=tuple(mm.n_embd_v[i] for i in blocks),
        state_bytes=tuple(mm.state_bytes[i] for i in blocks) if mm.state_bytes else (),
        layer_bytes=kept,
        tensor_bytes=mm.tensor_bytes - sum(mm.layer_bytes) + sum(kept),
        experts=mm.experts.keep(blocks) if mm.experts is not None else None,
    )


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, list) and value else value
