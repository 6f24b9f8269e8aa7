"""Device profiles for cards nobody here owns: a physical model of one llama.cpp evaluation,
fitted to published figures and priced from each card's spec sheet.

One evaluation of ``n`` tokens over a model part of ``W`` weight bytes and ``L`` blocks costs

    t(n) = matmul(n) + L * per_layer + fixed

On a GPU the matrix products stream the weights once per evaluation and compute on them with
the kernel llama.cpp picks for the batch size (``MMVQ_MAX_BATCH_SIZE`` in ggml-cuda):

    memory        = (W + KV bytes read) / (eta[arch] * bandwidth)
    n <= 8 (MMVQ) = n * W / (vec_rate * SMs * GHz)              CUDA cores, one pass per token
    n >  8 (MMQ)  = ceil(n / 128) * W / (tile_rate * SMs * GHz)  one column tile, then tensor cores:
                    + n * FLOPs per byte * W / (tensor_eff * int8 tensor peak)
    matmul(n)     = (memory^p + compute(n)^p) ^ (1 / p)          a roofline with a soft knee

A CPU is the same roofline with the cores' throughput as compute: ``W * (1 + batch_slope *
(n - 1)) / (cores * core_rate)`` against ``W / (eta * bandwidth)``, plus a fixed cost.

:func:`fit_gpu` fits ``eta`` per architecture, ``per_layer``, ``fixed``, the three compute rates
and ``p`` to published seconds (relative errors, Levenberg-Marquardt); :meth:`GpuModel.profile`
turns the model and a :class:`Spec` into the :class:`DeviceProfile` the planner composes.
Numbers here are predictions unless a figure says otherwise. Pure numpy.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .compose import MAX_N, DeviceProfile, Shape

#: GPU architectures with their own bandwidth efficiency.
ARCHS = ("turing", "ampere", "ada", "blackwell")
#: llama.cpp's largest batch for its matrix-vector kernels (``MMVQ_MAX_BATCH_SIZE``).
MMVQ_MAX_BATCH = 8
#: Columns of one MMQ tile (``mmq_x`` at its largest): a batch pays one tile pass per 128 tokens.
MMQ_TILE = 128
#: Dense int8 tensor operations per SM per clock of every GeForce architecture in ARCHS.
INT8_OPS_PER_SM_CLOCK = 2048
#: FLOPs per weight byte of a 4-bit model (2 per weight at ~4.6 bits): profiles price Q4 parts.
Q4_FLOP_PER_BYTE = 3.5
#: Tokens of llama-bench's prompt test (``pp512``): where a profile's tail is taken to.
PROMPT_N = 512

DEVICES_DIR = Path(__file__).resolve().parent.parent / "data" / "devices"


@dataclass(frozen=True)
class Spec:
    """What a device's spec sheet says: memory bandwidth (bytes/s), SMs and boost clock (GPU)
    or cores (CPU). ``cls``: ``consumer``, ``laptop``, ``workstation`` or ``datacenter``."""

    slug: str
    name: str
    kind: str
    cls: str
    arch: str
    bandwidth: float
    vram_bytes: int = 0
    sms: int = 0
    boost_ghz: float = 0.0
    cores: int = 0
    ship: bool = True
    sources: tuple[str, ...] = ()
    memory: str = ""
    #: A GPU's host link as ``GEN:LANES`` (``4.0:8``; :mod:`.links`), empty when not stated.
    pcie: str = ""
    #: A CPU's vector ISA for large-batch kernels (``avx2``, ``avx512``), empty when not stated.
    isa: str = ""

    @property
    def sm_ghz(self) -> float:
        """SMs x boost clock (GHz): what CUDA-core throughput scales with."""
        return self.sms * self.boost_ghz

    @property
    def int8_ops(self) -> float:
        """Dense int8 tensor operations per second at the boost clock."""
        return INT8_OPS_PER_SM_CLOCK * self.sms * self.boost_ghz * 1e9

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Spec:
        return cls(
            slug=str(d["slug"]),
            name=str(d["name"]),
            kind=str(d["kind"]),
            cls=str(d["class"]),
            arch=str(d["arch"]),
            bandwidth=float(d["bandwidth_gbs"]) * 1e9,
            vram_bytes=round(float(d.get("vram_gb", 0)) * 2**30),
            sms=int(d.get("sms", 0)),
            boost_ghz=float(d.get("boost_mhz", 0)) / 1000,
            cores=int(d.get("cores", 0)),
            ship=bool(d.get("ship", True)),
            sources=tuple(str(s) for s in d.get("sources", ())),
            memory=str(d.get("memory", "")),
            pcie=str(d.get("pcie", "")),
            isa=str(d.get("isa", "")),
        )


@dataclass(frozen=True)
class ModelFacts:
    """A published model file: bytes one evaluation reads (blocks + output head), blocks,
    parameters and KV cache bytes per token of context."""

    key: str
    name: str
    quant: str
    params: float
    weight_bytes: float
    n_layer: int
    kv_bytes_per_token: float

    @property
    def shape(self) -> Shape:
        return Shape(int(self.weight_bytes), self.n_layer)

    @property
    def flop_per_byte(self) -> float:
        return 2.0 * self.params / self.weight_bytes

    @classmethod
    def from_dict(cls, key: str, d: Mapping[str, Any]) -> ModelFacts:
        return cls(
            key,
            str(d["name"]),
            str(d["quant"]),
            float(d["params"]),
            float(d["weight_bytes"]),
            int(d["n_layer"]),
            float(d.get("kv_bytes_per_token", 0.0)),
        )


@dataclass(frozen=True)
class Work:
    """One evaluation: ``n`` tokens over ``weight_bytes`` of weights in ``n_layer`` blocks,
    reading ``kv_bytes`` of KV cache."""

    weight_bytes: float
    n_layer: int
    n: int = 1
    kv_bytes: float = 0.0
    flop_per_byte: float = Q4_FLOP_PER_BYTE


def soft_max(a: float, b: float, p: float) -> float:
    """``(a^p + b^p)^(1/p)``: the larger of two costs with a soft knee where they meet."""
    hi = max(a, b)
    if hi <= 0:
        return 0.0
    return hi * ((a / hi) ** p + (b / hi) ** p) ** (1.0 / p)


@dataclass(frozen=True)
class GpuModel:
    """The fitted GPU model (see the module docstring). ``eta``: bandwidth efficiency per
    architecture; ``per_layer`` / ``fixed``: seconds; ``vec_rate`` / ``tile_rate``: weight bytes
    per second per SM-GHz of the MMVQ / MMQ kernels; ``tensor_eff``: fraction of the int8 tensor
    peak; ``softness``: the roofline knee's exponent ``p``."""

    eta: Mapping[str, float]
    per_layer: float
    fixed: float
    vec_rate: float
    tile_rate: float
    tensor_eff: float
    softness: float

    def matmul(self, spec: Spec, w: Work) -> float:
        """Seconds of the matrix products of one evaluation."""
        memory = (w.weight_bytes + w.kv_bytes) / (self.eta[spec.arch] * spec.bandwidth)
        if w.n <= MMVQ_MAX_BATCH:
            compute = w.n * w.weight_bytes / (self.vec_rate * spec.sm_ghz)
        else:
            tiles = math.ceil(w.n / MMQ_TILE) * w.weight_bytes / (self.tile_rate * spec.sm_ghz)
            tensor = w.n * w.flop_per_byte * w.weight_bytes / (self.tensor_eff * spec.int8_ops)
            compute = tiles + tensor
        return soft_max(memory, compute, self.softness)

    def seconds(self, spec: Spec, w: Work) -> float:
        """Seconds of one evaluation (predicted)."""
        return self.matmul(spec, w) + w.n_layer * self.per_layer + self.fixed

    def per_byte(self, spec: Spec, n: int) -> float:
        """Seconds per weight byte of a 4-bit part at batch size ``n`` (the model is linear in
        bytes when no KV cache is read)."""
        return self.matmul(spec, Work(1.0, 0, n))

    def profile(self, spec: Spec, source: str, n_max: int = MAX_N) -> DeviceProfile:
        """The card's :class:`DeviceProfile`: per byte the roofline as the model prices it (MMQ
        at 9 tokens may cost less than MMVQ at 8: the curve says so), past ``n_max`` its mean
        slope up to :data:`PROMPT_N` tokens; per block and fixed the fitted overheads."""
        per_byte = [self.per_byte(spec, n) for n in range(1, n_max + 1)]
        tail = (self.per_byte(spec, PROMPT_N) - per_byte[-1]) / (PROMPT_N - n_max)
        return DeviceProfile(
            spec.slug,
            source,
            tuple(float(v) for v in per_byte),
            (self.per_layer,) * n_max,
            (self.fixed,) * n_max,
            max(float(tail), 0.0),
            spec.pcie or None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "eta": {a: round(v, 4) for a, v in self.eta.items()},
            "per_layer_us": round(self.per_layer * 1e6, 2),
            "fixed_us": round(self.fixed * 1e6, 1),
            "vec_rate_gb_per_sm_ghz": round(self.vec_rate / 1e9, 3),
            "tile_rate_gb_per_sm_ghz": round(self.tile_rate / 1e9, 3),
            "tensor_eff": round(self.tensor_eff, 4),
            "softness": round(self.softness, 3),
        }


@dataclass(frozen=True)
class CpuModel:
    """The CPU model: ``eta`` of the memory bandwidth, ``core_rate`` weight bytes per second
    one core computes on for one token, each further token of a batch (up to
    :data:`~.compose.MAX_N`) costing ``batch_slope`` of the first, a ``fixed`` cost per
    evaluation (seconds) and the knee's ``softness``. ``gemm_rate``: weight bytes x tokens per
    second one core reaches in a large batch (llama.cpp's prompt kernels), each token past
    ``MAX_N`` costing ``1 / (cores * gemm_rate)`` per byte (0: the small-batch line goes on)."""

    eta: float
    fixed: float
    core_rate: float
    batch_slope: float
    softness: float = 4.0
    gemm_rate: float = 0.0

    def per_byte(self, spec: Spec, n: int) -> float:
        memory = 1.0 / (self.eta * spec.bandwidth)
        small = n if not self.gemm_rate else min(n, MAX_N)
        compute = (1.0 + self.batch_slope * (small - 1)) / (spec.cores * self.core_rate)
        if n > small:
            compute += (n - small) / (spec.cores * self.gemm_rate)
        return soft_max(memory, compute, self.softness)

    def seconds(self, spec: Spec, w: Work) -> float:
        return self.per_byte(spec, w.n) * (w.weight_bytes + w.kv_bytes) + self.fixed

    def profile(self, spec: Spec, source: str, n_max: int = MAX_N) -> DeviceProfile:
        """The CPU's :class:`DeviceProfile`; past ``n_max`` each token adds the large-batch
        kernels' cost (``tail``), when ``gemm_rate`` is known."""
        per_byte = tuple(float(self.per_byte(spec, n)) for n in range(1, n_max + 1))
        tail = 1.0 / (spec.cores * self.gemm_rate) if self.gemm_rate else None
        return DeviceProfile(
            spec.slug, source, per_byte, (0.0,) * n_max, (self.fixed,) * n_max, tail
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "eta": round(self.eta, 4),
            "fixed_us": round(self.fixed * 1e6, 1),
            "core_rate_gb": round(self.core_rate / 1e9, 3),
            "batch_slope": round(self.batch_slope, 4),
            "softness": self.softness,
        }
        if self.gemm_rate:
            out["gemm_rate_gb"] = round(self.gemm_rate / 1e9, 3)
        return out


@dataclass(frozen=True)
class Figure:
    """One published (or measured) figure: ``n`` tokens per evaluation at ``tokens_per_s``."""

    id: str
    card: str | None
    model: str | None
    n: int
    tokens_per_s: float
    depth: float
    use: str
    test: str = ""
    backend: str = ""
    source: str = ""
    relative_to: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        """Seconds of one evaluation."""
        return self.n / self.tokens_per_s

    def work(self, models: Mapping[str, ModelFacts]) -> Work:
        m = models[str(self.model)]
        return Work(
            m.weight_bytes, m.n_layer, self.n, m.kv_bytes_per_token * self.depth, m.flop_per_byte
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Figure:
        known = {"id", "card", "model", "n", "tokens_per_s", "depth", "use", "test", "backend"}
        known |= {"source", "relative_to"}
        return cls(
            str(d["id"]),
            d.get("card"),
            d.get("model"),
            int(d["n"]),
            float(d["tokens_per_s"]),
            float(d.get("depth", 0.0)),
            str(d["use"]),
            str(d.get("test", "")),
            str(d.get("backend", "")),
            str(d.get("source", "")),
            d.get("relative_to"),
            {k: v for k, v in d.items() if k not in known},
        )


def load_specs(path: Path = DEVICES_DIR / "specs.json") -> dict[str, Spec]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return {d["slug"]: Spec.from_dict(d) for d in data["devices"]}


def load_published(
    path: Path = DEVICES_DIR / "published.json",
) -> tuple[dict[str, ModelFacts], list[Figure]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    models = {k: ModelFacts.from_dict(k, v) for k, v in data["models"].items()}
    return models, [Figure.from_dict(f) for f in data["figures"]]


def shipped(kind: str) -> dict[str, Path]:
    """The shipped profiles of ``kind`` (``gpus`` or ``cpus``) by slug."""
    return {p.stem: p for p in sorted((DEVICES_DIR / kind).glob("*.json"))}


def priced(f: Figure, specs: Mapping[str, Spec], kind: str) -> bool:
    """A figure the model can price: a known device of ``kind`` running a known model file."""
    spec = specs.get(f.card or "")
    return spec is not None and spec.kind == kind and f.model is not None


def fit_figures(figures: Iterable[Figure], specs: Mapping[str, Spec], kind: str) -> list[Figure]:
    """The figures a fit of ``kind`` uses: marked ``fit``, priced, and (GPU) run on CUDA."""
    return [
        f
        for f in figures
        if f.use == "fit" and priced(f, specs, kind) and (kind == "cpu" or f.backend == "CUDA")
    ]


# --- fitting -----------------------------------------------------------------------------------

_GPU_SCALARS = ("per_layer", "fixed", "vec_rate", "tile_rate", "tensor_eff")


def _gpu_vector(m: GpuModel, archs: Sequence[str]) -> np.ndarray:
    vals = [m.eta[a] for a in archs] + [getattr(m, k) for k in _GPU_SCALARS]
    return np.array([*np.log(vals), math.log(m.softness - 1.0)])


def _gpu_model(x: np.ndarray, archs: Sequence[str], base: GpuModel) -> GpuModel:
    v = np.exp(x)
    eta = dict(base.eta) | {a: float(v[i]) for i, a in enumerate(archs)}
    k = len(archs)
    scalars = {name: float(v[k + i]) for i, name in enumerate(_GPU_SCALARS)}
    return replace(base, eta=eta, softness=1.0 + float(v[-1]), **scalars)


def levenberg_marquardt(
    residuals: Callable[[np.ndarray], np.ndarray], x0: np.ndarray, iters: int = 200
) -> np.ndarray:
    """Minimise ``sum(residuals(x)^2)`` (numerical Jacobian, adaptive damping)."""
    x, lam = np.asarray(x0, dtype=np.float64), 1e-3
    r = residuals(x)
    cost = float(r @ r)
    for _ in range(iters):
        jac = np.empty((r.size, x.size))
        for j in range(x.size):
            h = 1e-6 * max(1.0, abs(x[j]))
            step = np.zeros_like(x)
            step[j] = h
            jac[:, j] = (residuals(x + step) - residuals(x - step)) / (2 * h)
        jtj, jtr = jac.T @ jac, jac.T @ r
        improved = done = False
        while lam < 1e10:
            dx = np.linalg.solve(jtj + lam * np.diag(np.diag(jtj) + 1e-12), -jtr)
            r_new = residuals(x + dx)
            new = float(r_new @ r_new)
            if new < cost:
                x, r, lam, improved = x + dx, r_new, max(lam / 3, 1e-12), True
                done = cost - new < 1e-14 * max(cost, 1e-30)
                cost = new
                break
            lam *= 4
        if not improved or done:
            break
    return x


#: Where a GPU fit starts: physically plausible values (not fitted).
GPU_START = GpuModel(
    eta=dict.fromkeys(ARCHS, 0.8),
    per_layer=20e-6,
    fixed=200e-6,
    vec_rate=15e9,
    tile_rate=3e9,
    tensor_eff=0.3,
    softness=4.0,
)


def fit_gpu(
    figures: Iterable[Figure],
    specs: Mapping[str, Spec],
    models: Mapping[str, ModelFacts],
    start: GpuModel = GPU_START,
) -> GpuModel:
    """Fit the GPU model to figures (relative errors). A figure with ``relative_to`` (another
    figure of the set) is fitted as its ratio to that one: the shape of one source's curve, not
    its host's absolute speed. Architectures without a figure keep ``start``'s efficiency."""
    figures = list(figures)
    index = {f.id: i for i, f in enumerate(figures)}
    ref = np.array(
        [index.get(f.relative_to, i) if f.relative_to else i for i, f in enumerate(figures)]
    )
    relative = ref != np.arange(len(figures))
    data = [(specs[str(f.card)], f.work(models)) for f in figures]
    archs = [a for a in ARCHS if any(s.arch == a for s, _ in data)]
    seconds = np.log([f.seconds for f in figures])
    observed = seconds - np.where(relative, seconds[ref], 0.0)

    def residuals(x: np.ndarray) -> np.ndarray:
        m = _gpu_model(x, archs, start)
        pred = np.log([m.seconds(s, w) for s, w in data])
        return pred - np.where(relative, pred[ref], 0.0) - observed

    return _gpu_model(levenberg_marquardt(residuals, _gpu_vector(start, archs)), archs, start)


def cpu_compute(measured: DeviceProfile, cores: int) -> tuple[float, float]:
    """``(core_rate, batch_slope)`` from a measured profile of a compute-bound CPU: its cost
    per byte at ``n`` is ``(1 + slope * (n - 1)) / (cores * core_rate)`` (least squares)."""
    y = np.array(measured.per_byte) * cores
    x = np.arange(len(y), dtype=np.float64)
    slope, intercept = np.polyfit(x, y, 1)
    return 1.0 / float(intercept), float(slope / intercept)


def fit_cpu(
    figures: Iterable[Figure],
    specs: Mapping[str, Spec],
    models: Mapping[str, ModelFacts],
    core_rate: float,
    batch_slope: float,
) -> CpuModel:
    """Fit a CPU's bandwidth efficiency and fixed cost to figures, its compute given."""
    data = [(specs[str(f.card)], f.work(models), f.seconds) for f in figures]
    observed = np.log([t for _, _, t in data])

    def model(x: np.ndarray) -> CpuModel:
        return CpuModel(float(np.exp(x[0])), float(np.exp(x[1])), core_rate, batch_slope)

    def residuals(x: np.ndarray) -> np.ndarray:
        m = model(x)
        return np.log([m.seconds(s, w) for s, w, _ in data]) - observed

    return model(levenberg_marquardt(residuals, np.log([0.6, 1e-3])))


def fit_cpu_gemm(
    figures: Iterable[Figure],
    specs: Mapping[str, Spec],
    models: Mapping[str, ModelFacts],
    base: CpuModel,
) -> CpuModel:
    """``base`` with the ``gemm_rate`` that prices large-batch figures (prompt tests,
    ``n > MAX_N``) best (relative errors, least squares in logs); ``base`` itself when none."""
    data = [(specs[str(f.card)], f.work(models), f.seconds) for f in figures if f.n > MAX_N]
    if not data:
        return base
    observed = np.log([t for _, _, t in data])

    def model(x: np.ndarray) -> CpuModel:
        return replace(base, gemm_rate=float(np.exp(x[0])))

    def residuals(x: np.ndarray) -> np.ndarray:
        m = model(x)
        return np.log([m.seconds(s, w) for s, w, _ in data]) - observed

    return model(levenberg_marquardt(residuals, np.log([30e9])))
