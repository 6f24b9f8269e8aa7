"""GPU memory planner: how many layers of each tier fit a VRAM budget.

Everything is computed from GGUF headers (:mod:`.memory`); no model is loaded. All sizes are
in **bytes** unless a name says otherwise.

Placement rule (mirrors llama.cpp's ``load_tensors`` in the libllama bundled with
llama-cpp-python 0.3.36, i.e. after llama.cpp PR #18148, "offload output layer to GPU first"):
a model with ``n`` repeating blocks has ``n + 1`` offloadable "layers". ``n_gpu_layers = k``
puts, for ``k >= 1``, the **output layer** (``output.weight`` and ``output_norm``; for tied
embeddings a duplicate of ``token_embd``) on the GPU first, then the **last** ``k - 1`` blocks;
``k >= n + 1`` offloads everything. The input embedding table ``token_embd`` always stays on
the CPU. (Older llama.cpp offloaded the last ``k`` blocks and the output layer only at
``k = n + 1``; pass ``output_first=False`` to :func:`placement` for that rule.) A block's KV
cache lives on the block's device.

A tier with no GPU layers still reserves a GPU compute buffer on a GPU build: llama.cpp's op
offload runs large batches (a prompt) over CPU weights on the GPU, copying the weights through
that buffer, the output head the largest of them (measured on an H100: 669 MiB for an 8B
with a 128k vocabulary at ``n_ubatch = 512``). It costs what ``k = 1`` costs, so the planner
gives such a tier op offload only where that fits, and turns it off otherwise (the tier then
takes no GPU memory at all).

Host side: a tier that is not fully offloaded also gets a CPU buffer by the same formula (with
the logits when the output layer stays on the CPU); a fully offloaded tier keeps only
``2 * n_ubatch * n_embd * 4`` of host staging.

Policy: the draft first, then the qualifier, then the target (the lower tiers run most often).
A tier only receives layers once every tier before it is fully offloaded, so a draft is always
placed fully before any target layer. A safety margin (default ``max(256 MiB, 5 %)``) is kept
free for the CUDA context and fragmentation; the plan never exceeds ``budget - margin``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from ..core.errors import UserError
from ..core.ladder import LadderPaths
from ..core.load import KvType, LoadConfig
from .memory import MiB, ModelMemory, model_memory, padded_ctx, parse_size

#: KV cache types ``kv_quant="auto"`` tries, in order.
AUTO_KV_TYPES: tuple[KvType, ...] = ("f16", "q8_0", "q4_0")
DEFAULT_MARGIN_MIN = 256 * MiB
DEFAULT_MARGIN_FRACTION = 0.05

KvQuant = Literal["off", "auto"]


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
    #: llama.cpp's op offload (see the module docstring); only a zero-layer tier goes without.
    op_offload: bool = True
    #: llama.cpp's ``--n-cpu-moe``: the routed experts of the first blocks kept in CPU memory
    #: (a mixture of experts only; planning/moe.py).
    n_cpu_moe: int = 0

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
    load: LoadConfig,
    *,
    op_offload: bool = True,
    n_cpu_moe: int = 0,
) -> TierPlan:
    """The memory split of ``mm`` loaded with ``n_gpu_layers`` (llama.cpp's counting), with
    the context size (``n_ctx`` cells for each of ``parallel`` slots), micro-batch and KV cache
    types of ``load``; ``op_offload`` only matters with no GPU layers (a GPU buffer for the
    output head and the logits, or nothing). ``n_cpu_moe``: a mixture of experts' routed
    experts of the first ``n_cpu_moe`` blocks stay in CPU memory (ignored for a dense model)."""
    n_ctx, n_ubatch = load.n_ctx * load.parallel, load.n_batch
    k = mm.n_layer + 1 if n_gpu_layers < 0 else min(n_gpu_layers, mm.n_layer + 1)
    blocks, output = placement(mm.n_layer, k)
    first_gpu = mm.n_layer - blocks
    gpu_w = sum(mm.layer_bytes[first_gpu:]) + (mm.head_bytes if output else 0)
    n_cpu_moe = min(n_cpu_moe, mm.n_layer) if mm.experts is not None else 0
    gpu_w -= sum(mm.experts.layer_bytes[first_gpu:n_cpu_moe]) if mm.experts is not None else 0
    kv_tok = mm.kv_bytes_per_token(load.type_k, load.type_v)
    cells = padded_ctx(n_ctx)
    gpu_kv = cells * sum(kv_tok[first_gpu:])
    cpu_kv = cells * sum(kv_tok[:first_gpu])
    if mm.state_bytes:  # a hybrid's recurrent states, with llama.cpp's rollback snapshots
        state = mm.recurrent_bytes(load.parallel, load.n_rs_seq)
        gpu_kv, cpu_kv = gpu_kv + sum(state[first_gpu:]), cpu_kv + sum(state[:first_gpu])
    if k > 0:
        gpu_buf = mm.compute_bytes(n_ctx, n_ubatch, logits=output)
    elif op_offload:
        gpu_buf = mm.head_bytes + mm.compute_bytes(n_ctx, n_ubatch, logits=True)
    else:
        gpu_buf = 0
    if blocks < mm.n_layer or not output or n_cpu_moe > first_gpu:
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
        op_offload=op_offload or k > 0,
        n_cpu_moe=n_cpu_moe,
    )


@dataclass(frozen=True)
class Plan:
    """Offload plan of a ladder (tiers in placement order: draft, qualifier, target).

    ``load``: the context, micro-batch and KV cache types planned for (the KV types chosen
    by ``kv_quant="auto"`` included).
    """

    budget_bytes: int
    margin_bytes: int
    load: LoadConfig
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
            "n_ctx": self.load.n_ctx,
            "n_ubatch": self.load.n_batch,
            "type_k": self.load.type_k,
            "type_v": self.load.type_v,
            "gpu_bytes": self.gpu_bytes,
            "host_bytes": self.host_bytes,
            "tiers": [t.to_dict() for t in self.tiers],
        }


def default_margin(budget_bytes: int) -> int:
    """Bytes kept free: ``max(256 MiB, 5 % of the budget)``."""
    return max(DEFAULT_MARGIN_MIN, int(budget_bytes * DEFAULT_MARGIN_FRACTION))


def _place(
    models: Sequence[tuple[str, ModelMemory]], usable: int, load: LoadConfig
) -> tuple[TierPlan, ...]:
    left = usable
    out: list[TierPlan] = []
    blocked = False
    for tier, mm in models:
        best = tier_plan(tier, mm, 0, load, op_offload=False)
        if not blocked:
            # gpu_bytes grows with n_gpu_layers: take the largest k that fits.
            for k in range(mm.n_layer + 1, 0, -1):
                tp = tier_plan(tier, mm, k, load)
                if tp.gpu_bytes <= left:
                    best = tp
                    break
            blocked = not best.full
        else:  # no layers, but op offload where its buffer still fits
            offload = tier_plan(tier, mm, 0, load)
            best = offload if offload.gpu_bytes <= left else best
        left -= best.gpu_bytes
        out.append(best)
    return tuple(out)


def make_plan(
    models: Sequence[tuple[str, ModelMemory]],
    budget_bytes: int,
    load: LoadConfig | None = None,
    *,
    kv_quant: KvQuant = "off",
    margin_bytes: int | None = None,
) -> Plan:
    """Assign ``n_gpu_layers`` to each ``(tier, model)`` within ``budget_bytes`` of VRAM.

    ``models`` are placed in the order given (use draft, qualifier, target). ``load`` gives
    the context size, micro-batch (``n_batch``) and KV cache types. With ``kv_quant="auto"``
    the KV types f16, q8_0, q4_0 are tried (both K and V) and the first that offloads
    everything wins, else the one offloading the most weight bytes (earliest on ties); a
    quantized V cache needs flash attention in llama.cpp.
    """
    load = load or LoadConfig()
    if budget_bytes < 0:
        raise UserError("the VRAM budget must not be negative")
    margin = default_margin(budget_bytes) if margin_bytes is None else margin_bytes
    if margin < 0:
        raise UserError("the VRAM margin must not be negative")
    usable = max(budget_bytes - margin, 0)
    kv_choices = [(load.type_k, load.type_v)]
    if kv_quant == "auto":
        kv_choices = [(t, t) for t in AUTO_KV_TYPES]
    elif kv_quant != "off":
        raise UserError(f"--kv-quant must be off or auto, got {kv_quant!r}")
    best: tuple[TierPlan, ...] | None = None
    best_load = load
    for tk, tv in kv_choices:
        here = replace(load, type_k=tk, type_v=tv)
        tiers = _place(models, usable, here)
        if best is None or _weight_on_gpu(tiers) > _weight_on_gpu(best):
            best, best_load = tiers, here
        if all(t.full for t in tiers):
            break
    assert best is not None
    return Plan(budget_bytes, margin, best_load, best)


def _weight_on_gpu(tiers: Sequence[TierPlan]) -> int:
    return sum(t.gpu_weight_bytes for t in tiers)


def fit_ladder(
    budget_bytes: int,
    paths: LadderPaths,
    load: LoadConfig | None = None,
    *,
    kv_quant: KvQuant = "off",
    margin_bytes: int | None = None,
) -> Plan:
    """:func:`make_plan` over the model files of a ladder (an n-gram draft takes no memory)."""
    models = [(tier, model_memory(p)) for tier, p in paths.model_files().items()]
    return make_plan(models, budget_bytes, load, kv_quant=kv_quant, margin_bytes=margin_bytes)


def apply_plan(plan: Plan, tier: str) -> int:
    """``n_gpu_layers`` to load ``tier`` with (llama.cpp's counting; ``n_layer + 1`` = all)."""
    return plan.tier(tier).n_gpu_layers


def tier_load_config(plan: Plan, tier: str, base: LoadConfig) -> LoadConfig:
    """``base`` with the plan's ``n_gpu_layers``, op offload and ``n_cpu_moe`` for ``tier`` and
    its KV cache types.

    A quantized V cache needs flash attention, so ``flash_attn`` is forced on then.
    """
    changes: dict[str, Any] = {
        "n_gpu_layers": apply_plan(plan, tier),
        "op_offload": plan.tier(tier).op_offload,
        "n_cpu_moe": plan.tier(tier).n_cpu_moe,
        "cpu_moe": False,
        "type_k": plan.load.type_k,
        "type_v": plan.load.type_v,
    }
    if plan.load.type_v not in ("f32", "f16", "bf16"):
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
    from ..native import supports_gpu_offload  # lazy: native imports llama_cpp

    if not supports_gpu_offload():
        raise UserError(
            "this llama.cpp build has no GPU offload, so free VRAM cannot be detected; "
            "pass --vram SIZE (e.g. --vram 8GiB) to plan for a GPU"
        )
    free = nvidia_free_bytes()
    if free is None:
        raise UserError("could not read free GPU memory from nvidia-smi; pass --vram SIZE")
    return free
