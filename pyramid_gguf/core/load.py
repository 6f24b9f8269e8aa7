"""How one GGUF file is loaded into llama.cpp: :class:`LoadConfig` and the thread limits."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from .endpoints import parse_endpoints
from .errors import UserError

KvType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"]

KV_TYPES: tuple[KvType, ...] = (
    "f32",
    "f16",
    "bf16",
    "q8_0",
    "q4_0",
    "q4_1",
    "q5_0",
    "q5_1",
    "iq4_nl",
)


def default_threads() -> int:
    """All cores: llama-cpp-python's own default (`cpu_count // 2`) leaves half the CPU idle."""
    return max(1, os.cpu_count() or 1)


#: ggml's thread pool holds at most this many threads (GGML_MAX_N_THREADS); more crash it.
GGML_MAX_THREADS = 512
#: Most sequences one context holds (llama.cpp's LLAMA_MAX_SEQ is 256; past a few dozen a
#: CPU gains nothing and every slot's cache is allocated up front).
MAX_PARALLEL = 64
#: Smallest context llama.cpp creates: it pads ``n_ctx`` up to a multiple of 256 cells.
MIN_CTX = 256


def max_threads() -> int:
    """Most threads a command accepts: four per core (ggml's cap at most). Past the core count
    llama.cpp's threads spin waiting for each other (5000 threads on 2 cores ran at 0.1
    tokens/s), and past ggml's cap its thread pool crashes."""
    return min(GGML_MAX_THREADS, 4 * default_threads())


def check_threads(n: int, flag: str = "--threads") -> None:
    """A :class:`UserError` unless ``1 <= n <=`` :func:`max_threads`."""
    if n < 1:
        raise UserError(f"{flag} must be at least 1")
    if n > max_threads():
        raise UserError(
            f"{flag} {n} is more than this machine can use: it has {default_threads()} cores, "
            f"so at most {max_threads()} threads (llama.cpp slows down past the core count)"
        )


#: PCIe generations llama.cpp's cards use, and the lane counts a slot offers.
PCIE_GENS = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
PCIE_LANES = (1, 2, 4, 8, 16)


def parse_pcie(text: str) -> tuple[float, int]:
    """``(generation, lanes)`` of ``GEN:LANES`` (``4:16``, ``4.0:x8``, ``5:8``); a
    :class:`UserError` on anything else."""
    gen, sep, lanes = str(text).strip().lower().partition(":")
    try:
        g, n = float(gen), int(lanes.removeprefix("x"))
    except ValueError:
        g, n = 0.0, 0
    if not sep or g not in PCIE_GENS or n not in PCIE_LANES:
        raise UserError(
            f"--pcie must be GEN:LANES, a PCIe generation of 1-6 and 1, 2, 4, 8 or 16 lanes "
            f"(4:16, 5.0:8), got {text!r}"
        )
    return g, n


def format_pcie(gen: float, lanes: int) -> str:
    """``4.0:16``: the canonical spelling of a link."""
    return f"{gen:.1f}:{lanes}"


@dataclass(frozen=True)
class LoadConfig:
    """How one GGUF file is loaded.

    ``n_gpu_layers=-1`` offloads every layer when llama.cpp is built with a GPU backend and is
    ignored on a CPU-only build. ``flash_attn=None`` lets llama.cpp decide.
    """

    n_ctx: int = 4096
    n_batch: int = 512
    n_gpu_layers: int = -1
    n_threads: int = field(default_factory=default_threads)
    n_threads_batch: int = field(default_factory=default_threads)
    flash_attn: bool | None = None
    type_k: KvType = "f16"
    type_v: KvType = "f16"
    #: Split the target's verification batches into micro-batches whose logits are
    #: bit-identical to one-token decoding on this machine (found by a probe, cached with the
    #: cost curve), so greedy output equals ``target`` exactly; costs what batching saves.
    #: Off: one batch per verification, and greedy text may differ from ``target`` only at
    #: floating-point near-ties (docs/ALGORITHMS.md, "What lossless means").
    strict_identity: bool = False
    #: llama.cpp's extra weight buffer types (CPU_REPACK, AMX). None: llama.cpp's own choice,
    #: except where it would use the AMX kernels, which crash on batched decodes: there extra
    #: types are off and the weights the repacking kernels take go to CPU_REPACK by tensor
    #: overrides (native/buffers.py). True: llama.cpp's own choice, AMX included. False: none,
    #: every CPU weight in the plain buffer (no repacked kernels).
    extra_buffers: bool | None = None
    #: llama.cpp's op offload: large batches over weights kept on the CPU run on the GPU, the
    #: weights copied through a compute buffer there (for a tier with no GPU layers, about its
    #: output head plus the logits of one micro-batch). The planner turns it off for a tier
    #: whose buffer does not fit the budget. No effect on a CPU-only build.
    op_offload: bool = True
    #: Sequences each context holds (``serve --parallel``): every slot gets ``n_ctx`` cells of
    #: one KV cache of ``n_ctx * parallel`` (Ollama's ``OLLAMA_NUM_PARALLEL``; llama-server's
    #: ``-np`` splits ``-c`` instead). The cache is unified (any slot may use any cell, so one
    #: batch of every slot is one micro-batch), except with ``strict_identity``: there each
    #: sequence has its own stream, laid out as if it ran alone.
    parallel: int = 1
    #: RPC servers (``HOST:PORT``) whose devices hold this model's layers (core/remote.py);
    #: empty: this machine's devices only.
    rpc: tuple[str, ...] = ()
    #: With ``rpc``: the output layer on the servers too (the logits cross the link), else here.
    rpc_output: bool = False
    #: llama.cpp's ``--n-cpu-moe N``: the routed experts (``ffn_(up|down|gate)_exps``) of the
    #: first N layers stay in CPU memory by tensor buffer overrides, everything else goes
    #: where ``n_gpu_layers`` puts it (native/buffers.py, :func:`~..native.buffers.moe_patterns`).
    n_cpu_moe: int = 0
    #: llama.cpp's ``--cpu-moe``: the routed experts of every layer in CPU memory.
    cpu_moe: bool = False
    #: Recurrent-state snapshots llama.cpp keeps per sequence (``n_rs_seq``): a hybrid or
    #: recurrent cache of an architecture llama.cpp allows (qwen35, nemotron_h...) then drops up
    #: to this many tokens of its last evaluation natively (native/rollback.py); others ignore
    #: it. Each costs one recurrent state per sequence (planning/memory.py counts them) and a
    #: state copy per block at every evaluation, so :meth:`Pyramid.load` keeps at most this
    #: many, and only what the mode it loads for can drop (``runtime.loading.rollback_depth``:
    #: none for plain decoding).
    n_rs_seq: int = 16
    #: Load the GGUF's NextN (MTP) layers beside the trunk (``llama_model_params.load_mtp``),
    #: so the model's own MTP head can draft for it (native/mtp.py).
    load_mtp: bool = False
    #: Memory-map the GGUF (llama.cpp's default): weights left on the CPU are pages of the file
    #: in the page cache (shared, evictable). False (``--no-mmap``): they are read into memory;
    #: on a build that offloads, into the GPU's pinned host buffer, so llama.cpp's op offload
    #: copies them at the link's rate instead of through a staging buffer
    #: (``llama_model_params.load_mode`` NONE against AUTO).
    use_mmap: bool = True
    #: llama.cpp's ``--no-host``: skip the GPU's host buffer for weights left on the CPU, so the
    #: CPU's extra buffer types (CPU_REPACK) take them: faster CPU kernels, but op offload
    #: cannot copy repacked weights (``llama_model_params.no_host``).
    no_host: bool = False
    #: The GPU's PCIe link as ``GEN:LANES`` (``4:16``, ``5.0:8``) for the planner's op-offload
    #: and prompt predictions; None: the card profile's. Changes no load, only predictions.
    pcie: str | None = None
    #: Test hook: use state snapshots for rollback even when the cache supports truncation.
    force_snapshot_rollback: bool = False
    #: Test hook: the AMX placement (extra types off, CPU_REPACK by overrides) on any CPU.
    force_repack_overrides: bool = False

    def __post_init__(self) -> None:
        if self.n_ctx < MIN_CTX:
            raise UserError(
                f"--ctx-size must be at least {MIN_CTX} (llama.cpp's smallest context; it "
                f"rounds up to a multiple of {MIN_CTX}), got {self.n_ctx}"
            )
        if self.n_batch < 1:
            raise UserError(f"--batch-size must be positive, got {self.n_batch}")
        if not 1 <= self.parallel <= MAX_PARALLEL:
            raise UserError(f"--parallel must be 1 to {MAX_PARALLEL}, got {self.parallel}")
        for n in (self.n_threads, self.n_threads_batch):
            check_threads(n)
        if self.n_gpu_layers < -1:
            raise UserError(f"--n-gpu-layers must be -1 (all) or >= 0, got {self.n_gpu_layers}")
        if self.n_rs_seq < 0:
            raise UserError(f"n_rs_seq must be >= 0, got {self.n_rs_seq}")
        if self.n_cpu_moe < 0:
            raise UserError(f"--n-cpu-moe must be >= 0, got {self.n_cpu_moe}")
        if self.rpc and (self.n_cpu_moe or self.cpu_moe):
            raise UserError("--n-cpu-moe/--cpu-moe with --rpc is not supported")
        if self.rpc:
            object.__setattr__(self, "rpc", tuple(str(e) for e in parse_endpoints(self.rpc)))
        if self.force_repack_overrides and self.extra_buffers is not None:
            raise UserError("force_repack_overrides places the weights itself: drop extra_buffers")
        if self.pcie is not None:
            object.__setattr__(self, "pcie", format_pcie(*parse_pcie(self.pcie)))
        for name, value in (("type_k", self.type_k), ("type_v", self.type_v)):
            if value not in KV_TYPES:
                raise UserError(f"{name} must be one of {', '.join(KV_TYPES)}, got {value!r}")
