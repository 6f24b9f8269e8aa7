"""Mixtures of experts in the planner: the bytes a block of tokens reads, and the experts of
chosen blocks in system RAM.

In each block a token of a mixture of experts reads the attention and shared weights and the
``K`` experts its router picks of ``E`` (llama.cpp's ``mul_mat_id`` reads only the experts some
token of the batch routes to). A block of ``k`` tokens reads the **union** of its tokens'
experts, so verifying ``k`` drafted tokens costs more than one token's bytes, unlike a dense
model. :class:`ExpertUnion` holds, for each block length ``k``, how a block's experts are loaded:

    loads[k][m] = mean number of a block's experts that exactly m of k consecutive tokens use
    touched(k)  = sum over m of loads[k][m]      (distinct experts per block; sum m*loads = k*K)

from routes recorded on real text (:meth:`ExpertUnion.from_routes`, the router's choices that
``native/routing.py`` records: ``int [n_tokens, n_layer, K]``), else for random routing
(:meth:`ExpertUnion.random`: each expert used by ``Binomial(k, K/E)`` tokens, so
``touched(k) = E * (1 - (1 - K/E)^k)``): the fallback, which ignores the locality real routing
has.

**Cost** (:func:`moe_curve`): a device's profile (``compose.DeviceProfile``) prices the dense part
it holds as any model's (``per_byte[n] * bytes + per_layer * blocks + fixed``); each expert it
holds costs what a dense matrix of that expert's bytes costs over the ``m`` tokens routed to it,
``per_byte[m] * bytes_per_expert``, summed over the expected loads. With every layer's experts
on the CPU, a token's price is the bytes of its ``K`` experts over the CPU's bandwidth plus the
GPU's share, and a block of ``k`` pays for the union.

**Placement** (:func:`expert_plan`): llama.cpp's ``--n-cpu-moe N`` keeps the routed experts
(``blk.i.ffn_*_exps``) of blocks ``0..N-1`` in CPU memory by tensor buffer overrides and puts
everything else where ``n_gpu_layers`` says. The planner offers every layer on the GPU with the
smallest ``N`` whose GPU share fits the budget left by the smaller tiers, beside ``-ngl`` layer
splits (:mod:`.rank` ranks both). Every such block sends its hidden state to the CPU and back
each evaluation (two link crossings). Sizes in bytes, times in seconds. Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..core.errors import UserError
from ..core.load import LoadConfig
from ..decoding.pricing.costs import CostCurve
from ..models.shapes import Experts
from .compose import MAX_N, DeviceProfile, Link, Shape, composed_curve
from .memory import ModelMemory
from .vram import AUTO_KV_TYPES, KvQuant, Plan, default_margin, make_plan, placement, tier_plan


def random_touched(n_expert: int, n_used: int, k: int) -> float:
    """Distinct experts per block that ``k`` tokens routed at random touch:
    ``E * (1 - (1 - K/E)^k)``."""
    return n_expert * (1.0 - (1.0 - n_used / n_expert) ** k)


@dataclass(frozen=True)
class ExpertUnion:
    """How a block's experts are shared by ``k = 1..len(loads)`` consecutive tokens.

    ``loads[k - 1][m - 1]``: mean number of a block's experts used by exactly ``m`` of the ``k``
    tokens (averaged over windows and blocks). ``source``: where it came from, in words.
    Longer blocks than recorded are priced for random routing.
    """

    n_expert: int
    n_used: int
    loads: tuple[tuple[float, ...], ...]
    source: str

    def load(self, k: int) -> tuple[float, ...]:
        """``loads`` of a block of ``k`` tokens (index ``m - 1``)."""
        if k < 1:
            raise ValueError("a block has at least one token")
        if k <= len(self.loads):
            return self.loads[k - 1]
        return _binomial_loads(self.n_expert, self.n_used, k)

    def touched(self, k: int) -> float:
        """Distinct experts per block that ``k`` tokens read."""
        return float(sum(self.load(k)))

    def ratio(self, k: int) -> float:
        """Expert bytes ``k`` tokens read over one token's (``touched(k) / K``)."""
        return self.touched(k) / self.n_used

    @classmethod
    def random(cls, n_expert: int, n_used: int, k_max: int = MAX_N) -> ExpertUnion:
        """Random routing: each expert used by ``Binomial(k, K/E)`` of ``k`` tokens."""
        loads = tuple(_binomial_loads(n_expert, n_used, k) for k in range(1, k_max + 1))
        return cls(n_expert, n_used, loads, f"random routing ({n_used} of {n_expert} experts)")

    @classmethod
    def from_routes(
        cls, routes: np.ndarray, n_expert: int, k_max: int = MAX_N, source: str = ""
    ) -> ExpertUnion:
        """The union measured on recorded routes: ``routes`` is ``int [n_tokens, n_layer, K]``
        (expert ids in ``[0, n_expert)``, consecutive tokens of real text; a block of -1 is one
        without a router, left out). For each ``k`` up to ``min(k_max, n_tokens)``, every
        window of ``k`` consecutive tokens and every routed block is counted once."""
        r = np.asarray(routes)
        if r.ndim != 3 or r.shape[0] < 1 or r.shape[2] < 1:
            raise UserError(f"routes must be [n_tokens, n_layer, K], got shape {r.shape}")
        if not np.issubdtype(r.dtype, np.integer):
            raise UserError(f"routes must hold expert ids in [0, {n_expert})")
        r = r[:, ~np.all(r == -1, axis=(0, 2))]  # blocks without a router
        if r.shape[1] == 0 or r.min() < 0 or r.max() >= n_expert:
            raise UserError(f"routes must hold expert ids in [0, {n_expert})")
        n_tokens, n_layer, n_used = r.shape
        if n_used > n_expert:
            raise UserError(f"routes pick {n_used} experts of {n_expert}")
        hot = np.zeros((n_tokens, n_layer, n_expert), dtype=np.int32)
        np.put_along_axis(hot, r.astype(np.int64), 1, axis=2)
        cum = np.concatenate([np.zeros((1, n_layer, n_expert), np.int32), np.cumsum(hot, 0)])
        loads = []
        for k in range(1, min(k_max, n_tokens) + 1):
            counts = cum[k:] - cum[:-k]  # [windows, n_layer, n_expert]: tokens using each
            per_m = np.bincount(counts.ravel(), minlength=k + 1)[1 : k + 1]
            loads.append(tuple(float(c) / (counts.shape[0] * n_layer) for c in per_m))
        what = source or f"routes recorded over {n_tokens} tokens"
        return cls(n_expert, n_used, tuple(loads), what)


def load_routes(path: Path) -> np.ndarray:
    """Recorded routes from a ``.npy`` file (``native/routing.record_routes``'s array saved by
    ``numpy.save``), or a one-line :class:`UserError`."""
    try:
        routes = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read recorded routes from {path}: {e}") from None
    if not isinstance(routes, np.ndarray) or routes.ndim != 3:
        raise UserError(f"{path}: routes must be an int array [n_tokens, n_layer, K]")
    return routes


def _binomial_loads(n_expert: int, n_used: int, k: int) -> tuple[float, ...]:
    p = n_used / n_expert
    return tuple(n_expert * math.comb(k, m) * p**m * (1 - p) ** (k - m) for m in range(1, k + 1))


def union_of(mm: ModelMemory, union: ExpertUnion | None = None) -> ExpertUnion:
    """``union`` checked against ``mm``'s routing, else random routing for ``mm``."""
    x = _experts(mm)
    if union is None:
        return ExpertUnion.random(x.n_expert, x.n_used)
    if (union.n_expert, union.n_used) != (x.n_expert, x.n_used):
        raise UserError(
            f"routes of {union.n_used} of {union.n_expert} experts do not fit {mm.path} "
            f"({x.n_used} of {x.n_expert})"
        )
    return union


def _experts(mm: ModelMemory) -> Experts:
    if mm.experts is None:
        raise UserError(f"{mm.path} is not a mixture of experts (its header names no experts)")
    return mm.experts


def block_bytes(mm: ModelMemory, k: int, union: ExpertUnion | None = None) -> float:
    """Weight bytes a block of ``k`` tokens reads: every dense weight (blocks and output head)
    and, per block, the experts its tokens touch. A dense model reads all of its weights."""
    dense = sum(mm.layer_bytes) + mm.head_bytes
    if mm.experts is None:
        return float(dense)
    u, x = union_of(mm, union), mm.experts
    return dense - sum(x.layer_bytes) + u.touched(k) * sum(x.layer_bytes) / x.n_expert


def expert_cost(
    device: DeviceProfile, n: int, per_expert_bytes: float, union: ExpertUnion
) -> float:
    """Seconds ``device`` spends on the experts of blocks whose one expert's bytes sum to
    ``per_expert_bytes``, for ``n`` tokens: each expert used by ``m`` tokens priced as a dense
    matrix of its bytes over ``m`` tokens."""
    last = len(device.per_byte)
    return per_expert_bytes * sum(
        c * device.per_byte[min(m, last) - 1] for m, c in enumerate(union.load(n), start=1)
    )


def moe_curve(
    mm: ModelMemory,
    n_gpu_layers: int,
    n_cpu_moe: int,
    cpu: DeviceProfile,
    gpu: DeviceProfile | None,
    link: Link | None = None,
    union: ExpertUnion | None = None,
    n_max: int = MAX_N,
) -> CostCurve:
    """The cost curve of a mixture of experts loaded with ``n_gpu_layers`` (llama.cpp's
    counting: the output head, then the last blocks) and the experts of blocks
    ``0..n_cpu_moe-1`` in CPU memory: each device's dense part priced by its profile, each
    device's experts by the expected loads of ``union`` (None: random routing), one link
    crossing for a layer split and two for each block whose attention is on the GPU and whose
    experts are not."""
    x, u, link = _experts(mm), union_of(mm, union), link or Link()
    blocks, output = placement(mm.n_layer, n_gpu_layers if gpu is not None else 0)
    first_gpu = mm.n_layer - blocks
    dense = [b - e for b, e in zip(mm.layer_bytes, x.layer_bytes, strict=True)]
    head = mm.head_bytes
    cpu_dense = Shape(sum(dense[:first_gpu]) + (0 if output else head), first_gpu)
    gpu_dense = Shape(sum(dense[first_gpu:]) + (head if output else 0), blocks)
    cpu_x = [i for i in range(mm.n_layer) if i < first_gpu or i < n_cpu_moe]
    gpu_x = [i for i in range(mm.n_layer) if i not in set(cpu_x)]
    crossings = 2 * (len(cpu_x) - first_gpu) + (1 if first_gpu and (blocks or output) else 0)
    cpu_pe = sum(x.bytes_per_expert(i) for i in cpu_x)
    gpu_pe = sum(x.bytes_per_expert(i) for i in gpu_x)
    cpu_shape = replace(cpu_dense, n_layer=len(cpu_x))
    seconds = []
    for n in range(1, n_max + 1):
        s = 0.0
        if cpu_dense.weight_bytes or cpu_x:
            s += cpu.cost(n, cpu_shape) + expert_cost(cpu, n, cpu_pe, u)
        if gpu is not None and (gpu_dense.weight_bytes or gpu_x):
            s += gpu.cost(n, gpu_dense) + expert_cost(gpu, n, gpu_pe, u)
        seconds.append(s + crossings * link.cost(n, mm.n_embd))
    return CostCurve(tuple(seconds))


def tier_curve(
    mm: ModelMemory,
    n_gpu_layers: int,
    n_cpu_moe: int,
    cpu: DeviceProfile,
    gpu: DeviceProfile | None,
    link: Link | None = None,
    union: ExpertUnion | None = None,
    n_max: int = MAX_N,
) -> CostCurve:
    """Any tier's composed cost curve: :func:`moe_curve` for a mixture of experts, else
    ``compose.composed_curve`` (``n_cpu_moe`` and ``union`` only matter to the former)."""
    if mm.experts is None:
        return composed_curve(mm, n_gpu_layers, cpu, gpu, link, n_max)
    return moe_curve(mm, n_gpu_layers, n_cpu_moe, cpu, gpu, link, union, n_max)


def expert_plan(
    models: Sequence[tuple[str, ModelMemory]],
    budget_bytes: int,
    load: LoadConfig,
    *,
    kv_quant: KvQuant = "off",
    margin_bytes: int | None = None,
    n_cpu_moe: int | None = None,
) -> Plan | None:
    """Every tier of ``models`` (placed in order; the last a mixture of experts) wholly on the
    GPU but the last one's experts of its first ``N`` blocks: ``n_cpu_moe`` if given, else the
    smallest ``N >= 1`` that fits (KV cache types tried as :func:`~.vram.make_plan` does). None
    when it does not fit, when the smaller tiers do not fit whole first, or when no experts
    need to leave the GPU (``N = 0`` fits: the plain plan already holds everything)."""
    *smaller, (tier, mm) = models
    x = _experts(mm)
    if n_cpu_moe is not None and n_cpu_moe < 0:
        raise UserError(f"--n-cpu-moe must be >= 0, got {n_cpu_moe}")
    margin = default_margin(budget_bytes) if margin_bytes is None else margin_bytes
    usable = max(budget_bytes - margin, 0)
    kv_choices = [(load.type_k, load.type_v)]
    if kv_quant == "auto":
        kv_choices = [(t, t) for t in AUTO_KV_TYPES]
    for tk, tv in kv_choices:
        here = replace(load, type_k=tk, type_v=tv)
        first = make_plan(smaller, budget_bytes, here, margin_bytes=margin).tiers if smaller else ()
        if not all(t.full for t in first):
            continue
        left = usable - sum(t.gpu_bytes for t in first)
        if n_cpu_moe is None and tier_plan(tier, mm, -1, here).gpu_bytes <= left:
            return None
        tries = [n_cpu_moe] if n_cpu_moe is not None else range(1, len(x.layer_bytes) + 1)
        for n in tries:
            tp = tier_plan(tier, mm, -1, here, n_cpu_moe=n)
            if tp.gpu_bytes <= left:
                return Plan(budget_bytes, margin, here, (*first, tp))
    return None
