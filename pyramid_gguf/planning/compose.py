"""Cost curves of placements that were never loaded: composed from per-device parts.

A :class:`DeviceProfile` says what one evaluation of ``n`` tokens costs on one device as a sum
over the model parts it holds: ``per_byte[n]`` seconds per byte of matrix weights (the blocks'
and the output head's), ``per_layer[n]`` seconds per block (kernel launches, synchronisation),
and ``fixed[n]`` seconds once (graph, embeddings, logits). A profile is fitted
(:meth:`DeviceProfile.fit`, non-negative least squares per ``n``) to measured cost curves of
whole models of known shapes on that device: the H100's from ``docs/gpu-h100/``, a CPU's from
``calibrate`` curves of models with every layer on the CPU.

:func:`composed_curve` prices a tier split by llama.cpp's ``n_gpu_layers`` (the last blocks and
the output head on the GPU, the first blocks on the CPU) as its CPU part, plus its GPU part,
plus one transfer of the hidden state between them (:class:`Link`). docs/ALGORITHMS.md,
"Placements", writes the model down. Pure Python and numpy.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import UserError
from ..core.files import load_json
from ..decoding.pricing.costs import CostCurve
from .memory import ModelMemory
from .vram import placement

#: Sizes every profile covers (longer batches extrapolate: :meth:`DeviceProfile.cost`).
MAX_N = 16
#: Sizes a planned tier's cost curve covers: ``auto``'s longest block (``--max-block`` 64) and
#: past llama.cpp's op-offload threshold (:data:`OP_OFFLOAD_MIN_BATCH`).
CURVE_N = 64
#: Tokens from which llama.cpp's CUDA backend runs a matrix product over CPU-held weights on the
#: GPU, copying the weights there for the batch (``GGML_OP_OFFLOAD_MIN_BATCH``, ggml-cuda.cu).
OP_OFFLOAD_MIN_BATCH = 32


@dataclass(frozen=True)
class Shape:
    """What a device's cost depends on: matrix weight bytes and blocks held."""

    weight_bytes: int
    n_layer: int

    @classmethod
    def of(cls, mm: ModelMemory) -> Shape:
        """A whole model: its blocks and output head (the embedding table is only read)."""
        return cls(sum(mm.layer_bytes) + mm.head_bytes, mm.n_layer)


@dataclass(frozen=True)
class DeviceProfile:
    """Seconds of one evaluation of ``n = 1..len`` tokens on a device, by part held.

    ``name``: the device; ``source``: what it was fitted to (machine, build, date). ``tail``:
    seconds per weight byte that each token past the last size adds (a large batch's matrix
    kernels; None: the slope of the last quarter of ``per_byte``). ``pcie``: a GPU's host link
    as ``GEN:LANES`` (None: not stated).
    """

    name: str
    source: str
    per_byte: tuple[float, ...]
    per_layer: tuple[float, ...]
    fixed: tuple[float, ...]
    tail: float | None = None
    pcie: str | None = None

    def __post_init__(self) -> None:
        if not len(self.per_byte) == len(self.per_layer) == len(self.fixed) > 0:
            raise ValueError("a device profile needs one value per batch size in each part")

    def byte_cost(self, n: int) -> float:
        """Seconds per weight byte of one evaluation of ``n`` tokens: the profile's value, past
        its last size that value plus ``tail`` (or the last quarter's slope) per token."""
        m = len(self.per_byte)
        if n <= m:
            return self.per_byte[n - 1]
        slope = self.tail
        if slope is None:
            lo = max(1, m - max(1, m // 4))
            slope = max((self.per_byte[m - 1] - self.per_byte[lo - 1]) / max(m - lo, 1), 0.0)
        return self.per_byte[m - 1] + slope * (n - m)

    def cost(self, n: int, part: Shape) -> float:
        """Seconds of one evaluation of ``n`` tokens over ``part``."""
        i = min(n, len(self.fixed)) - 1
        return (
            self.byte_cost(n) * part.weight_bytes + self.per_layer[i] * part.n_layer + self.fixed[i]
        )

    def curve(self, part: Shape) -> CostCurve:
        """The cost curve of ``part`` held whole on this device."""
        return CostCurve(tuple(self.cost(n, part) for n in range(1, len(self.fixed) + 1)))

    @classmethod
    def fit(
        cls,
        name: str,
        source: str,
        samples: Sequence[tuple[Shape, CostCurve]],
        n_max: int = MAX_N,
        *,
        per_layer: bool = True,
    ) -> DeviceProfile:
        """Fit ``per_byte``, ``per_layer`` and ``fixed`` (each >= 0) to measured curves of whole
        models, per batch size (at least two models of different sizes). ``per_layer=False``
        fits no block term (a CPU: its cost is the work on the weights, and models of one width
        cannot tell a block term from a byte term)."""
        if len({s.weight_bytes for s, _ in samples}) < 2:
            raise UserError("fitting a device profile needs two models of different sizes")
        layers = 1.0 if per_layer else 0.0
        x = np.array(
            [[s.weight_bytes, layers * s.n_layer, 1.0] for s, _ in samples], dtype=np.float64
        )
        parts = []
        for n in range(1, n_max + 1):
            y = np.array([c(n) for _, c in samples], dtype=np.float64)
            parts.append(_nnls(x, y))
        byte_s, layer_s, fixed_s = (tuple(float(p[j]) for p in parts) for j in range(3))
        return cls(name, source, byte_s, layer_s, fixed_s)

    def errors(self, samples: Sequence[tuple[Shape, CostCurve]]) -> list[float]:
        """The largest relative error of the fitted cost over each sample's measured sizes."""
        n_max = len(self.fixed)
        return [
            max(abs(self.cost(n, s) / c(n) - 1.0) for n in range(1, n_max + 1)) for s, c in samples
        ]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "source": self.source,
            "per_byte": [float(f"{v:.6g}") for v in self.per_byte],
            "per_layer": [float(f"{v:.6g}") for v in self.per_layer],
            "fixed": [float(f"{v:.6g}") for v in self.fixed],
        }
        if self.tail is not None:
            out["tail_per_byte"] = float(f"{self.tail:.6g}")
        if self.pcie is not None:
            out["pcie"] = self.pcie
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeviceProfile:
        tail = data.get("tail_per_byte")
        return cls(
            str(data["name"]),
            str(data.get("source", "")),
            tuple(float(v) for v in data["per_byte"]),
            tuple(float(v) for v in data["per_layer"]),
            tuple(float(v) for v in data["fixed"]),
            None if tail is None else float(tail),
            None if data.get("pcie") is None else str(data["pcie"]),
        )

    @classmethod
    def load(cls, path: Path) -> DeviceProfile:
        """Read a profile (a one-line :class:`UserError` when it is missing or not one)."""
        return load_json(path, "device profile", cls.from_dict)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a few columns: the best exact fit over the column
    subsets whose solution is non-negative. ``[m, c], [m] -> [c]``."""
    best, best_err = np.zeros(x.shape[1]), float(np.sum(y * y))
    cols = range(x.shape[1])
    for r in range(1, x.shape[1] + 1):
        for keep in itertools.combinations(cols, r):
            sol, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
            if np.any(sol < 0):
                continue
            full = np.zeros(x.shape[1])
            full[list(keep)] = sol
            err = float(np.sum((x @ full - y) ** 2))
            if err < best_err:
                best, best_err = full, err
    return best


@dataclass(frozen=True)
class Link:
    """The host <-> GPU link a split model crosses once per evaluation (the hidden state of
    every token): a latency and a bandwidth. Defaults: PCIe 4.0 x16 as measured by typical
    ``cudaMemcpy`` of small buffers (assumed, not measured here).

    ``weights``: bytes per second at which llama.cpp's op offload copies CPU-held weights to
    the GPU for a batch of :data:`OP_OFFLOAD_MIN_BATCH` tokens or more (:mod:`.links` prices it
    from the card's PCIe link and whether the weights are pinned); None: no op offload priced
    (off, repacked weights, or a CPU-only build).
    """

    latency: float = 20e-6
    bandwidth: float = 20e9
    weights: float | None = None
    min_batch: int = OP_OFFLOAD_MIN_BATCH

    def cost(self, n: int, n_embd: int) -> float:
        return self.latency + n * n_embd * 4 / self.bandwidth

    def offloads(self, n: int) -> bool:
        """Whether a batch of ``n`` tokens runs its CPU-held matrix products on the GPU."""
        return self.weights is not None and n >= self.min_batch

    def offload_cost(self, n: int, part: Shape, gpu: DeviceProfile, n_embd: int) -> float:
        """Seconds of ``part`` (CPU-held) in a batch of ``n`` tokens under op offload: its
        weights copied once at ``weights`` bytes/s, the products on the GPU, and each block's
        hidden states crossing twice (attention reads the KV cache in host memory)."""
        assert self.weights is not None
        copy = part.weight_bytes / self.weights
        return copy + gpu.cost(n, part) + 2 * part.n_layer * self.cost(n, n_embd)


def split(mm: ModelMemory, n_gpu_layers: int) -> tuple[Shape, Shape]:
    """``(CPU part, GPU part)`` of ``mm`` loaded with llama.cpp's ``n_gpu_layers``: the last
    blocks and the output head go to the GPU first (see ``models.planner.placement``)."""
    blocks, output = placement(mm.n_layer, n_gpu_layers)
    first_gpu = mm.n_layer - blocks
    head = mm.head_bytes
    cpu = Shape(sum(mm.layer_bytes[:first_gpu]) + (0 if output else head), first_gpu)
    gpu = Shape(sum(mm.layer_bytes[first_gpu:]) + (head if output else 0), blocks)
    return cpu, gpu


def composed_curve(
    mm: ModelMemory,
    n_gpu_layers: int,
    cpu: DeviceProfile,
    gpu: DeviceProfile | None,
    link: Link | None = None,
    n_max: int = MAX_N,
) -> CostCurve:
    """The cost curve of ``mm`` at ``n_gpu_layers`` (0: all on the CPU): its CPU part priced
    by ``cpu`` (by op offload where ``link`` prices it and the batch reaches its threshold),
    its GPU part by ``gpu``, and one transfer between them when it is split."""
    link = link or Link()
    cpu_part, gpu_part = split(mm, n_gpu_layers if gpu is not None else 0)
    on_cpu = cpu_part.weight_bytes > 0
    on_gpu = gpu_part.weight_bytes > 0 and gpu is not None
    seconds = []
    for n in range(1, n_max + 1):
        s = cpu_cost(n, cpu_part, cpu, gpu, link, mm.n_embd) if on_cpu else 0.0
        if on_gpu:
            assert gpu is not None
            s += gpu.cost(n, gpu_part)
        if on_cpu and on_gpu:
            s += link.cost(n, mm.n_embd)
        seconds.append(s)
    return CostCurve(tuple(seconds))


def cpu_cost(
    n: int,
    part: Shape,
    cpu: DeviceProfile,
    gpu: DeviceProfile | None,
    link: Link,
    n_embd: int,
) -> float:
    """Seconds of a tier's CPU-held ``part`` in a batch of ``n`` tokens: on the CPU, or under
    op offload (:meth:`Link.offload_cost`) when a GPU is there and ``link`` prices it."""
    if gpu is not None and link.offloads(n):
        return link.offload_cost(n, part, gpu, n_embd)
    return cpu.cost(n, part)
