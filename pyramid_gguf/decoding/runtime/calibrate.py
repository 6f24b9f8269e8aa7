"""Measuring a tier on this machine: its batch cost curve and its batch-identity probe.

:func:`calibrate` returns a :class:`Calibration` from the cache under
``$PYRAMID_GGUF_HOME/costs/`` when one matches the model file, the llama.cpp build and the
load settings (threads, offload, KV types, the weights' buffer types), else measures one (7 s
for the 1.5B Q4_K_M target on a 2-core CPU, less for smaller tiers) and stores it. ``refresh``
measures again (``pyramid-gguf calibrate``). On a shared VM the ratios move by about 10%
between calibrations (``c(3) / c(1)`` 2.19-2.65 in six back to back on a 2-core EPYC VM).

- :func:`measure_curve`: the median of ``repeats`` timings of one evaluation of ``n`` tokens
  after a short prefix, all ``n`` logits rows read, as a verification reads them; the sizes
  are timed in interleaved rounds, so a slow spell of a shared machine spoils one round's
  timings, never most timings of one size (and the median, unlike the fastest, is the cost a
  generation typically pays).
- :func:`probe_identity`: the largest batch whose logits rows are bit-identical to evaluating
  the same tokens one at a time (``--strict-identity`` splits verifications into such batches).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...core.home import cache_home, unwritable
from ...native import NativeModel, build_id
from ..pricing.costs import CostCurve
from .tiers import ModelTier

#: Batch sizes timed; the others up to :data:`MAX_N` are interpolated.
SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16)
MAX_N = 16
CACHE_VERSION = 2
PREFIX = 48
#: Rounds over :data:`SIZES` (each size keeps its median round).
REPEATS = 3


@dataclass(frozen=True)
class Calibration:
    """A tier's cost curve and, when probed, its largest identity-preserving batch."""

    curve: CostCurve
    identity_batch: int | None = None
    measured: bool = False  # measured now rather than read from the cache

    def to_dict(self) -> dict[str, Any]:
        return {"curve": self.curve.to_dict(), "identity_batch": self.identity_batch}


def _tokens(model: NativeModel, count: int, seed: int) -> list[int]:
    """Ordinary token ids (clear of the special ids at the start of most vocabularies)."""
    rng = np.random.default_rng(seed)
    low = min(100, model.n_vocab // 4)
    return [int(t) for t in rng.integers(low, max(low + 1, model.n_vocab - 1), size=count)]


def measure_curve(
    model: NativeModel,
    *,
    sizes: tuple[int, ...] = SIZES,
    repeats: int = REPEATS,
    prefix: int = PREFIX,
) -> CostCurve:
    """Seconds of one evaluation of ``n`` tokens for ``n`` up to ``max(sizes)``, timed at
    ``sizes`` (``repeats`` rounds over all of them, the median per size) and interpolated
    between them (the cache is emptied after)."""
    prefix_tokens = _tokens(model, prefix, seed=1)
    batch = _tokens(model, max(sizes), seed=2)
    model.reset()
    model.eval(prefix_tokens)
    model.eval(batch[:4], range(4))  # warm-up: weights paged in, buffers allocated
    rounds: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            model.rollback(prefix)
            t0 = time.perf_counter()
            model.eval(batch[:n], range(n))
            rounds[n].append(time.perf_counter() - t0)
    timed = {n: float(np.median(r)) for n, r in rounds.items()}
    model.reset()
    xs = sorted(timed)
    seconds = np.interp(range(1, max(sizes) + 1), xs, [timed[x] for x in xs])
    # Microseconds: what the cache stores, so a fresh and a cached curve decide alike.
    return CostCurve(tuple(max(round(float(s), 6), 1e-6) for s in np.maximum.accumulate(seconds)))


def probe_identity(model: NativeModel, *, max_n: int = MAX_N) -> int:
    """The largest ``n <= max_n`` such that every batch of up to ``n`` tokens gives logits
    bit-identical to one-token decoding, at two prefix lengths (cache emptied after)."""
    safe = max_n
    for prefix_len in (24, 61):
        prefix = _tokens(model, prefix_len, seed=3)
        tokens = _tokens(model, max_n, seed=4)
        model.reset()
        model.eval(prefix)
        singles = np.stack([model.eval([t], [0])[0] for t in tokens])
        for n in range(2, safe + 1):
            model.rollback(prefix_len)
            if not np.array_equal(model.eval(tokens[:n], range(n)), singles[:n]):
                safe = n - 1
                break
    model.reset()
    return safe


def cache_key(model: NativeModel) -> dict[str, Any]:
    """What a calibration depends on: the file, the llama.cpp build, the load settings, and for
    a model on RPC servers the link (measured again through another endpoint)."""
    path = model.path.resolve()
    st = path.stat()
    cfg = model.cfg
    remote = {"rpc": [*cfg.rpc, cfg.rpc_output]} if cfg.rpc else {}  # a link's costs are its own
    return {
        **remote,
        "version": CACHE_VERSION,
        "file": str(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "build": build_id(),
        "threads": [cfg.n_threads, cfg.n_threads_batch],
        "n_gpu_layers": cfg.n_gpu_layers,
        "n_batch": cfg.n_batch,
        "flash_attn": cfg.flash_attn,
        "kv": [cfg.type_k, cfg.type_v],
        "placement": model.placement.kind,
        "weights": model.weight_buffers,
    }


def cache_path(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_home() / "costs" / f"{digest}.json"


def _read(path: Path, key: dict[str, Any]) -> Calibration | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("key") != key:
            return None
        batch = data.get("identity_batch")
        return Calibration(CostCurve.from_dict(data["curve"]), batch)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, key: dict[str, Any], cal: Calibration) -> None:
    """Cache ``cal``; a cache that cannot be written only costs a measurement next time."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"key": key, **cal.to_dict()}, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def calibrate(
    tier: ModelTier,
    *,
    probe: bool = False,
    refresh: bool = False,
    say: Callable[[str], None] | None = None,
) -> Calibration:
    """``tier``'s cached calibration, or a new one (``probe``: include the identity probe).

    Measuring empties the tier's KV cache (the next prompt is evaluated afresh). ``say``
    hears one line before anything is measured, saying whether the result can be cached (a
    ``$PYRAMID_GGUF_HOME`` that cannot be written only costs measuring again next time).
    """
    model = tier.loaded
    key = cache_key(model)
    path = cache_path(key)
    cached = None if refresh else _read(path, key)
    if cached is not None and (cached.identity_batch is not None or not probe):
        return cached
    problem = unwritable(path.parent)
    if say is not None:
        where = "cached afterwards" if problem is None else f"not cached: {path.parent}: {problem}"
        machine = f"through RPC {','.join(model.cfg.rpc)}" if model.cfg.rpc else "on this machine"
        say(f"measuring batch costs of {model.path.name} {machine} ({where})")
    curve = cached.curve if cached is not None else measure_curve(model)
    batch = probe_identity(model) if probe else None
    cal = Calibration(curve, batch, measured=True)
    if problem is None:
        _write(path, key, cal)
    return cal
