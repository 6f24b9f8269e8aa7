"""Where llama.cpp keeps the weights left on the CPU beside a GPU, and what the card's PCIe
link then costs: the three weight placements :func:`~.plan.plan_ladder` ranks.

- ``mapped`` (llama.cpp's default): the GGUF is memory-mapped; CPU layers are pages of the file
  in the page cache (shared with any other process mapping it, dropped under pressure and read
  again), run by the plain CPU kernels (a mapped weight cannot be repacked, and llama.cpp
  prefers the GPU's host buffer type, which mapping replaces by the plain CPU one: dearer in
  small batches, cheaper in long ones, :data:`PLAIN_KERNEL_RATIO`). Op offload
  copies them from pageable memory through a staging buffer: :data:`PAGEABLE_BYTES_PER_S` at
  best, whatever the link.
- ``pinned`` (``--no-mmap``): the weights are read into the GPU's pinned host buffer: the same
  plain kernels, op offload at the link's rate (:data:`PINNED_EFFICIENCY` of its raw rate), and
  the bytes are locked in RAM (not shared, never paged out: a placement over the RAM does not
  load at all).
- ``repacked`` (``--no-host``): the host buffer is skipped, so the CPU's extra buffer types
  take the weights (CPU_REPACK): the kernels the shipped CPU profiles were measured with, in
  anonymous memory (swapped, not dropped, under pressure); op offload cannot copy a repacked
  weight (``ggml_backend_buffer_is_host`` is false for it), so a large batch stays on the CPU.
  The few tensors the repacking kernels do not take (Q6_K in a Q4_K_M) would still be copied;
  that share is not priced.

Pure Python.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Literal

from ..core.load import format_pcie, parse_pcie
from .compose import DeviceProfile, Link

Weights = Literal["mapped", "pinned", "repacked"]
WEIGHTS: tuple[Weights, ...] = ("mapped", "pinned", "repacked")
#: llama.cpp's flags for each placement of the CPU weights.
FLAGS: dict[str, str] = {"mapped": "", "pinned": "--no-mmap", "repacked": "--no-host"}

#: Bytes per second one lane carries per direction after line encoding (8b/10b to 2.0,
#: 128b/130b from 3.0; 6.0's FLIT mode taken at its 242/256 efficiency): the PCI-SIG rates.
LANE_BYTES_PER_S = {1.0: 0.25e9, 2.0: 0.5e9, 3.0: 0.985e9, 4.0: 1.969e9, 5.0: 3.938e9, 6.0: 7.56e9}
#: Share of the raw rate a pinned host-to-device copy reaches: about 25 GB/s on PCIe 4.0 x16
#: (31.5 GB/s raw), as CUDA's bandwidthTest reports on desktop boards (issue 48's figure).
PINNED_EFFICIENCY = 0.8
#: Pageable (memory-mapped) weights copied for op offload: the H200 host's measured crossing,
#: 11.4 GiB in 1.61 s with the GPU's work included (docs/gpu-big/, 2026-11-26): a lower bound
#: on that host, taken as the rate on any (the copy runs through a staging buffer at the speed
#: of one core's memcpy, not of the link).
PAGEABLE_BYTES_PER_S = 7.6e9
#: The link's latency per crossing (a small ``cudaMemcpy``), as :class:`~.compose.Link`.
LATENCY_S = 20e-6
#: What a card without a stated link is priced on.
DEFAULT_PCIE = "4.0:16"


@dataclass(frozen=True)
class Pcie:
    """A card's host link: PCIe ``gen`` x ``lanes``, and where that came from."""

    gen: float
    lanes: int
    source: str = ""

    @classmethod
    def parse(cls, text: str, source: str = "") -> Pcie:
        """``GEN:LANES`` (a one-line :class:`UserError` otherwise)."""
        gen, lanes = parse_pcie(text)
        return cls(gen, lanes, source)

    @property
    def name(self) -> str:
        """``PCIe 4.0 x8``."""
        return f"PCIe {self.gen:.1f} x{self.lanes}"

    @property
    def spec(self) -> str:
        """``4.0:8``: the ``--pcie`` spelling."""
        return format_pcie(self.gen, self.lanes)

    @property
    def raw_bytes_per_s(self) -> float:
        return LANE_BYTES_PER_S[self.gen] * self.lanes

    @property
    def pinned_bytes_per_s(self) -> float:
        """A pinned host-to-device copy's rate (predicted: :data:`PINNED_EFFICIENCY`)."""
        return PINNED_EFFICIENCY * self.raw_bytes_per_s

    def copy_rate(self, weights: Weights) -> float | None:
        """Bytes/s at which op offload copies CPU-held weights (None: it cannot)."""
        if weights == "repacked":
            return None
        if weights == "pinned":
            return self.pinned_bytes_per_s
        return min(self.pinned_bytes_per_s, PAGEABLE_BYTES_PER_S)

    def link(self, weights: Weights, *, op_offload: bool = True) -> Link:
        """The :class:`~.compose.Link` a tier with CPU weights ``weights`` crosses: hidden
        states at the pinned rate (llama.cpp's compute buffers beside a GPU are pinned), its
        weights under op offload at :meth:`copy_rate` (not priced when ``op_offload`` is off)."""
        rate = self.copy_rate(weights) if op_offload else None
        return Link(LATENCY_S, self.pinned_bytes_per_s, rate)


def card_pcie(override: str | None, stated: str | None, card: str) -> Pcie:
    """The link to price: ``override`` (``--pcie``), else the card profile's ``stated`` one,
    else :data:`DEFAULT_PCIE`, each saying where it came from."""
    if override is not None:
        return Pcie.parse(override, "--pcie")
    if stated is not None:
        return Pcie.parse(stated, f"{card}'s profile")
    return Pcie.parse(DEFAULT_PCIE, f"assumed ({card}'s profile states no link; --pcie sets it)")


def describe_weights(weights: Weights) -> str:
    """One phrase: where the CPU layers' weights sit and what they cost in RAM."""
    return {
        "mapped": "mapped from the file (page cache: shared, evictable)",
        "pinned": "pinned in the GPU's host buffer (--no-mmap: locked in RAM, not shared)",
        "repacked": "repacked for the CPU (--no-host: ordinary memory, no op offload)",
    }[weights]


#: What the plain CPU kernels (weights in the GPU's host buffer, or mapped) cost against the
#: repacked ones the shipped CPU profiles were measured with, by batch size: measured on this
#: project's 2-core AVX-512 EPYC VM, ``llama-bench -p 1,2,4,8,16,32,64,512 -n 0 -t 2 --repack
#: 1,0 -r 3`` on the Qwen2.5-Coder 1.5B Q4_K_M, 2026-11-28 (mean ms, plain over repacked; spread
#: under 5%). Small batches cost 1.1-1.4x unrepacked; from 32 tokens the plain path (llamafile's
#: sgemm) is the faster one (0.68x at 512). Interpolated between sizes, the last past 512.
PLAIN_KERNEL_RATIO: dict[int, float] = {
    1: 1.097,
    2: 1.412,
    4: 1.273,
    8: 1.299,
    16: 1.168,
    32: 0.847,
    64: 0.744,
    512: 0.682,
}


def plain_ratio(n: int) -> float:
    """:data:`PLAIN_KERNEL_RATIO` at ``n`` tokens (linear between measured sizes)."""
    sizes = sorted(PLAIN_KERNEL_RATIO)
    if n <= sizes[0]:
        return PLAIN_KERNEL_RATIO[sizes[0]]
    for lo, hi in itertools.pairwise(sizes):
        if n <= hi:
            w = (n - lo) / (hi - lo)
            return (1 - w) * PLAIN_KERNEL_RATIO[lo] + w * PLAIN_KERNEL_RATIO[hi]
    return PLAIN_KERNEL_RATIO[sizes[-1]]


def plain_kernels(cpu: DeviceProfile) -> DeviceProfile:
    """``cpu`` (a profile of repacked kernels) priced for weights the plain kernels run: its
    per-byte cost times :func:`plain_ratio` at each size, its tail times the ratio at 512."""
    per_byte = tuple(v * plain_ratio(n) for n, v in enumerate(cpu.per_byte, start=1))
    tail = None if cpu.tail is None else cpu.tail * plain_ratio(512)
    return replace(cpu, per_byte=per_byte, tail=tail, source=cpu.source + "; plain kernels")
