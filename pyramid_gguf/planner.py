"""GPU memory planner: how many layers of each tier fit a VRAM budget.

Everything is computed from GGUF headers (:mod:`pyramid_gguf.gguf_header`); no model is
loaded. All sizes are in **bytes** unless a name says otherwise.

Placement rule (mirrors llama.cpp's ``load_tensors`` in the libllama bundled with
llama-cpp-python 0.3.36, i.e. after llama.cpp PR #18148, "offload output layer to GPU first"):
a model with ``n`` repeating blocks has ``n + 1`` offloadable "layers". ``n_gpu_layers = k``
puts, for ``k >= 1``, the **output layer** (``output.weight`` and ``output_norm``; for tied
embeddings a duplicate of ``token_embd``) on the GPU first, then the **last** ``k - 1`` blocks;
``k >= n + 1`` offloads everything. The input embedding table ``token_embd`` always stays on
the CPU. (Older llama.cpp offloaded the last ``k`` blocks and the output layer only at
``k = n + 1``; pass ``output_first=False`` to :func:`placement` for that rule.) A block's KV
cache lives on the block's device.

Compute-buffer estimate (per context on a device; llama.cpp's allocator reuses memory, so the
largest single stage dominates)::

    buffer = max(logits, attention) + activations
    logits      = n_vocab * n_ubatch * 4          (only on the device holding the output layer)
    attention   = n_ubatch * n_ctx * n_head * 4   (f32 KQ scores; flash attention needs less)
    activations = n_ubatch * (2 * n_embd + n_ff) * 4

Host side: a tier that is not fully offloaded also gets a CPU buffer by the same formula (with
the logits when the output layer stays on the CPU); a fully offloaded tier keeps only
``2 * n_ubatch * n_embd * 4`` of host staging. Measured on the CPU backend (Qwen2.5-Coder
0.5B/1.5B, n_ubatch 512) llama.cpp reported 300-306 MiB against 310-320 MiB estimated: the
estimate errs high on purpose.

Policy: the draft first, then the qualifier, then the target (the lower tiers run most often).
A tier only receives layers once every tier before it is fully offloaded, so a draft is always
placed fully before any target layer. A safety margin (default ``max(256 MiB, 5 %)``) is kept
free for the CUDA context and fragmentation; the plan never exceeds ``budget - margin``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .config import KV_TYPES, LoadConfig
from .errors import ModelFileError, UserError
from .gguf_header import ArrayInfo, GGUFHeader, read_header

MiB = 1 << 20
GiB = 1 << 30
TIERS: tuple[str, ...] = ("draft", "qualifier", "target")
#: KV cache types ``kv_quant="auto"`` tries, in order.
AUTO_KV_TYPES: tuple[str, ...] = ("f16", "q8_0", "q4_0")
#: ``n_ctx`` is rounded up to this many cells by llama.cpp's KV cache.
KV_PAD = 256
DEFAULT_MARGIN_MIN = 256 * MiB
DEFAULT_MARGIN_FRACTION = 0.05

KvQuant = Literal["off", "auto"]

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


def model_memory(source: str | Path | GGUFHeader) -> ModelMemory:
    """The :class:`ModelMemory` of a GGUF file (path or parsed header)."""
    h = source if isinstance(source, GGUFHeader) else read_header(source)
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
        tokens = meta.get("tokenizer.ggml.tokens")
        n_vocab = tokens.length if isinstance(tokens, ArrayInfo) else len(tokens or [])
    tied = not has_output
    return ModelMemory(
        path=str(h.path),
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_ff=n_ff,
        n_vocab=n_vocab,
        n_embd_k=tuple(n * k_len for n in n_kv),
        n_embd_v=tuple(n * v_len for n in n_kv),
        layer_bytes=tuple(layers),
        head_bytes=head + (embd if tied else 0),
        file_head_bytes=head,
        embd_bytes=embd,
        other_bytes=other,
        tied_output=tied,
        tensor_bytes=h.tensor_bytes,
    )


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, list) and value else value


# --- placement --------------------------------------------------------------------------------


def placement(n_layer: int, n_gpu_layers: int, *, output_first: bool = True) -> tuple[int, bool]:
    """``(blocks on GPU, output layer on GPU)`` for llama.cpp's ``n_gpu_layers``.

    ``n_gpu_layers < 0`` means all. Blocks on the GPU are always the last ones.
    """
    k = n_layer + 1 if n_gpu_layers < 0 else min(n_gpu_layers, n_layer + 1)
    if output_first:
        return max(k - 1, 0), k >= 1
    return min(k, n_layer), k >= n_layer + 1


@dataclass(frozen=True)
class TierPlan:
    """Where one tier's memory goes for a given ``n_gpu_layers`` (all sizes in bytes)."""

    tier: str
    path: str
    n_layer: int
    n_gpu_layers: int
    blocks_on_gpu: int
    output_on_gpu: bool
    gpu_weight_bytes: int
    cpu_weight_bytes: int
    gpu_kv_bytes: int
    cpu_kv_bytes: int
    gpu_buffer_bytes: int
    cpu_buffer_bytes: int

    @property
    def full(self) -> bool:
        """Every offloadable layer (blocks and output) is on the GPU."""
        return self.n_gpu_layers >= self.n_layer + 1

    @property
    def gpu_bytes(self) -> int:
        return self.gpu_weight_bytes + self.gpu_kv_bytes + self.gpu_buffer_bytes

    @property
    def host_bytes(self) -> int:
        return self.cpu_weight_bytes + self.cpu_kv_bytes + self.cpu_buffer_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d |= {"full": self.full, "gpu_bytes": self.gpu_bytes, "host_bytes": self.host_bytes}
        return d


def tier_plan(
    tier: str,
    mm: ModelMemory,
    n_gpu_layers: int,
    *,
    n_ctx: int,
    n_ubatch: int = 512,
    type_k: str = "f16",
    type_v: str = "f16",
) -> TierPlan:
    """The memory split of ``mm`` loaded with ``n_gpu_layers`` (llama.cpp's counting)."""
    k = mm.n_layer + 1 if n_gpu_layers < 0 else min(n_gpu_layers, mm.n_layer + 1)
    blocks, output = placement(mm.n_layer, k)
    first_gpu = mm.n_layer - blocks
    gpu_w = sum(mm.layer_bytes[first_gpu:]) + (mm.head_bytes if output else 0)
    kv_tok = mm.kv_bytes_per_token(type_k, type_v)
    cells = padded_ctx(n_ctx)
    gpu_kv = cells * sum(kv_tok[first_gpu:])
    cpu_kv = cells * sum(kv_tok[:first_gpu])
    gpu_buf = mm.compute_bytes(n_ctx, n_ubatch, logits=output) if k > 0 else 0
    if blocks < mm.n_layer or not output:
        cpu_buf = mm.compute_bytes(n_ctx, n_ubatch, logits=not output)
    else:  # host staging of the input embeddings only
        cpu_buf = 2 * n_ubatch * mm.n_embd * 4
    return TierPlan(
        tier=tier,
        path=mm.path,
        n_layer=mm.n_layer,
        n_gpu_layers=k,
        blocks_on_gpu=blocks,
        output_on_gpu=output,
        gpu_weight_bytes=gpu_w,
        cpu_weight_bytes=mm.weight_bytes - gpu_w,
        gpu_kv_bytes=gpu_kv,
        cpu_kv_bytes=cpu_kv,
        gpu_buffer_bytes=gpu_buf,
        cpu_buffer_bytes=cpu_buf,
    )


@dataclass(frozen=True)
class Plan:
    """Offload plan of a ladder (tiers in placement order: draft, qualifier, target)."""

    budget_bytes: int
    margin_bytes: int
    n_ctx: int
    n_ubatch: int
    type_k: str
    type_v: str
    tiers: tuple[TierPlan, ...] = field(default_factory=tuple)

    @property
    def usable_bytes(self) -> int:
        return max(self.budget_bytes - self.margin_bytes, 0)

    @property
    def gpu_bytes(self) -> int:
        return sum(t.gpu_bytes for t in self.tiers)

    @property
    def host_bytes(self) -> int:
        return sum(t.host_bytes for t in self.tiers)

    def tier(self, name: str) -> TierPlan:
        for t in self.tiers:
            if t.tier == name:
                return t
        raise UserError(f"the plan has no {name} tier (tiers: {', '.join(self.tier_names)})")

    @property
    def tier_names(self) -> tuple[str, ...]:
        return tuple(t.tier for t in self.tiers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_bytes": self.budget_bytes,
            "margin_bytes": self.margin_bytes,
            "usable_bytes": self.usable_bytes,
            "n_ctx": self.n_ctx,
            "n_ubatch": self.n_ubatch,
            "type_k": self.type_k,
            "type_v": self.type_v,
            "gpu_bytes": self.gpu_bytes,
            "host_bytes": self.host_bytes,
            "tiers": [t.to_dict() for t in self.tiers],
        }


def default_margin(budget_bytes: int) -> int:
    """Bytes kept free: ``max(256 MiB, 5 % of the budget)``."""
    return max(DEFAULT_MARGIN_MIN, int(budget_bytes * DEFAULT_MARGIN_FRACTION))


def _place(
    models: Sequence[tuple[str, ModelMemory]],
    usable: int,
    *,
    n_ctx: int,
    n_ubatch: int,
    type_k: str,
    type_v: str,
) -> tuple[TierPlan, ...]:
    left = usable
    out: list[TierPlan] = []
    blocked = False
    for tier, mm in models:
        best = tier_plan(tier, mm, 0, n_ctx=n_ctx, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v)
        if not blocked:
            # gpu_bytes grows with n_gpu_layers: take the largest k that fits.
            for k in range(mm.n_layer + 1, 0, -1):
                tp = tier_plan(
                    tier, mm, k, n_ctx=n_ctx, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v
                )
                if tp.gpu_bytes <= left:
                    best = tp
                    break
            left -= best.gpu_bytes
            blocked = not best.full
        out.append(best)
    return tuple(out)


def make_plan(
    models: Sequence[tuple[str, ModelMemory]],
    budget_bytes: int,
    *,
    n_ctx: int = 4096,
    n_ubatch: int = 512,
    type_k: str = "f16",
    type_v: str = "f16",
    kv_quant: KvQuant = "off",
    margin_bytes: int | None = None,
) -> Plan:
    """Assign ``n_gpu_layers`` to each ``(tier, model)`` within ``budget_bytes`` of VRAM.

    ``models`` are placed in the order given (use draft, qualifier, target). With
    ``kv_quant="auto"`` the KV types f16, q8_0, q4_0 are tried (both K and V) and the first
    that offloads everything wins, else the one offloading the most weight bytes (earliest on
    ties); a quantized V cache needs flash attention in llama.cpp.
    """
    if budget_bytes < 0:
        raise UserError("the VRAM budget must not be negative")
    if n_ctx < 1 or n_ubatch < 1:
        raise UserError("--ctx-size and --batch-size must be positive")
    margin = default_margin(budget_bytes) if margin_bytes is None else margin_bytes
    if margin < 0:
        raise UserError("the VRAM margin must not be negative")
    usable = max(budget_bytes - margin, 0)
    kv_choices = [(type_k, type_v)]
    if kv_quant == "auto":
        kv_choices = [(t, t) for t in AUTO_KV_TYPES]
    elif kv_quant != "off":
        raise UserError(f"--kv-quant must be off or auto, got {kv_quant!r}")
    best: tuple[TierPlan, ...] | None = None
    best_kv = kv_choices[0]
    for tk, tv in kv_choices:
        tiers = _place(models, usable, n_ctx=n_ctx, n_ubatch=n_ubatch, type_k=tk, type_v=tv)
        if best is None or _weight_on_gpu(tiers) > _weight_on_gpu(best):
            best, best_kv = tiers, (tk, tv)
        if all(t.full for t in tiers):
            break
    assert best is not None
    return Plan(budget_bytes, margin, n_ctx, n_ubatch, best_kv[0], best_kv[1], best)


def _weight_on_gpu(tiers: Sequence[TierPlan]) -> int:
    return sum(t.gpu_weight_bytes for t in tiers)


def plan_ladder(
    budget_bytes: int,
    *,
    draft: str | Path | None = None,
    qualifier: str | Path | None = None,
    target: str | Path,
    n_ctx: int = 4096,
    n_ubatch: int = 512,
    type_k: str = "f16",
    type_v: str = "f16",
    kv_quant: KvQuant = "off",
    margin_bytes: int | None = None,
) -> Plan:
    """:func:`make_plan` over GGUF paths; ``None`` tiers are left out."""
    paths = (("draft", draft), ("qualifier", qualifier), ("target", target))
    models = [(tier, model_memory(p)) for tier, p in paths if p is not None]
    return make_plan(
        models,
        budget_bytes,
        n_ctx=n_ctx,
        n_ubatch=n_ubatch,
        type_k=type_k,
        type_v=type_v,
        kv_quant=kv_quant,
        margin_bytes=margin_bytes,
    )


def apply_plan(plan: Plan, tier: str) -> int:
    """``n_gpu_layers`` to load ``tier`` with (llama.cpp's counting; ``n_layer + 1`` = all)."""
    return plan.tier(tier).n_gpu_layers


def tier_load_config(plan: Plan, tier: str, base: LoadConfig) -> LoadConfig:
    """``base`` with the plan's ``n_gpu_layers`` for ``tier`` and its KV cache types.

    A quantized V cache needs flash attention, so ``flash_attn`` is forced on then.
    """
    changes: dict[str, Any] = {
        "n_gpu_layers": apply_plan(plan, tier),
        "type_k": plan.type_k,
        "type_v": plan.type_v,
    }
    if plan.type_v not in ("f32", "f16", "bf16"):
        changes["flash_attn"] = True
    return replace(base, **changes)


# --- budget -----------------------------------------------------------------------------------


def nvidia_free_bytes() -> int | None:
    """Free memory of the first GPU per ``nvidia-smi``, or None when unavailable."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
        return int(out.split()[0]) * MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def resolve_budget(vram: str | None) -> int:
    """VRAM budget in bytes from a ``--vram`` value (``None`` or ``auto``: detect).

    Detection needs a GPU build of llama.cpp and ``nvidia-smi``; otherwise a
    :class:`UserError` asks for ``--vram``.
    """
    if vram is not None and vram.strip().lower() != "auto":
        return parse_size(vram)
    from .native import supports_gpu_offload  # lazy: native imports llama_cpp

    if not supports_gpu_offload():
        raise UserError(
            "this llama.cpp build has no GPU offload, so free VRAM cannot be detected; "
            "pass --vram SIZE (e.g. --vram 8GiB) to plan for a GPU"
        )
    free = nvidia_free_bytes()
    if free is None:
        raise UserError("could not read free GPU memory from nvidia-smi; pass --vram SIZE")
    return free
