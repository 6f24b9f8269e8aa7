"""Measuring a tier on this machine: its batch cost curve and its batch-identity probe.

:func:`calibrate` returns a :class:`Calibration` from the cache under
``$PYRAMID_GGUF_HOME/costs/`` when one matches the model file, the llama.cpp build and the
load settings (every :class:`~pyramid_gguf.core.load.LoadConfig` field that moves a cost:
threads, offload, experts' placement, mapped or pinned weights, KV types; and the weights'
buffer types), else measures one (about 10 s for the 1.5B Q4_K_M target on a 2-core CPU, batch
sizes 1 to 64, less for smaller tiers) and stores it, unless the machine was too busy to
measure (:data:`LOADED_SPREAD`). ``refresh`` measures again (``pyramid-gguf calibrate``). On a
shared VM the ratios move by about 10% between calibrations (``c(3) / c(1)`` 2.19-2.65 in six
back to back on a 2-core EPYC VM).

- :func:`measure_curve`: the median of ``repeats`` timings of one evaluation of ``n`` tokens
  after a short prefix, all ``n`` logits rows read, as a verification reads them; the sizes
  are timed in interleaved rounds, so a slow spell of a shared machine spoils one round's
  timings, never most timings of one size (and the median, unlike the fastest, is the cost a
  generation typically pays). Two spells can still spoil two of a size's three timings, so a
  size whose timings around the median spread beyond :data:`LOADED_SPREAD` is timed
  :data:`EXTRA_REPEATS` more times, up to :data:`RETRIES` times, and keeps the median of all
  (seen: a hybrid's one-token step timed 24, 35 and 52 ms where it costs 25 ms, which made
  verifying two tokens look cheaper than plain decoding, so ``auto`` drafted every round
  with a head that never agreed, at 0.72x plain decoding). :func:`summarize` keeps what was
  measured: a curve that flattens or falls (a kernel change, llama.cpp's op offload from 32
  tokens on a split tier) stays so, and only a dip within a size's own noise is smoothed.
- :func:`probe_identity`: the largest batch whose logits rows are bit-identical to evaluating
  the same tokens one at a time (``--strict-identity`` splits verifications into such batches).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...core.home import cache_home, unwritable
from ...native import NativeModel, build_id
from ..pricing.costs import CostCurve
from .rollback_cost import measure_rollback, needs_rollback_pricing
from .tiers import ModelTier

#: Batch sizes timed; the others up to :data:`MAX_N` are interpolated. They reach past 32, where
#: llama.cpp starts offloading the ops of CPU-held weights to a GPU (op offload: each such batch
#: copies those weights to the card), so a split tier's curve shows the flat stretch a long
#: verification block buys.
SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64)
MAX_N = 64
#: Largest batch the identity probe tries (``--strict-identity`` splits longer ones).
IDENTITY_MAX = 16
#: 4: sizes whose timings disagree are timed again (curves of version 3 may hold a spoiled size).
CACHE_VERSION = 4
PREFIX = 48
#: Rounds over :data:`SIZES` (each size keeps its median round).
REPEATS = 3
#: A measurement whose repeats typically spread by more than this share of their median (the
#: median over sizes of (slowest - fastest) / median) was taken on a busy machine: it is
#: measured again, and not cached if the second try is as noisy. Quiet 2-core VMs spread
#: 1-6%; beside a compile, 30% and more.
LOADED_SPREAD = 0.15
#: Measurements of a tier before giving up on a quiet one.
ATTEMPTS = 2
#: Timings added to a size whose timings around the median are noisy (:func:`_settled`), and
#: how many times: a median of 5, then 7, outvotes 2, then 3, spoiled timings.
EXTRA_REPEATS = 2
RETRIES = 2
#: Seconds of a size's spread that are no sign of load (a thread's wake-up, the timer): tiny
#: models' evaluations take a millisecond and spread by half of it on any machine.
JITTER = 1e-3


@dataclass(frozen=True)
class Timed:
    """What one size's repeats measured: their median and the range of the (at most three)
    timings around it, in seconds."""

    n: int
    median: float
    low: float
    high: float

    @property
    def spread(self) -> float:
        """(high - low) / median, less :data:`JITTER`: this size's noise, relative (the range
        of the timings around the median, outvoted outliers set aside)."""
        return max(self.high - self.low - JITTER, 0.0) / self.median if self.median > 0 else 0.0


@dataclass(frozen=True)
class Measured:
    """A measured cost curve, the timings behind it and how noisy they were."""

    curve: CostCurve
    timed: tuple[Timed, ...]

    @property
    def spread(self) -> float:
        """The typical relative spread of a size's repeats (median over the sizes)."""
        return float(np.median([t.spread for t in self.timed])) if self.timed else 0.0

    @property
    def loaded(self) -> bool:
        """Measured on a busy machine (:data:`LOADED_SPREAD`)."""
        return self.spread > LOADED_SPREAD


@dataclass(frozen=True)
class Calibration:
    """A tier's cost curve and, when probed, its largest identity-preserving batch.

    ``timed``: the sizes measured and their noise (empty when read from an older cache);
    ``loaded``: measured on a busy machine, so not cached."""

    curve: CostCurve
    identity_batch: int | None = None
    measured: bool = False  # measured now rather than read from the cache
    timed: tuple[Timed, ...] = ()
    loaded: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "curve": self.curve.to_dict(),
            "identity_batch": self.identity_batch,
            "timed": [[t.n, t.median, t.low, t.high] for t in self.timed],
        }


def _tokens(model: NativeModel, count: int, seed: int) -> list[int]:
    """Ordinary token ids (clear of the special ids at the start of most vocabularies)."""
    rng = np.random.default_rng(seed)
    low = min(100, model.n_vocab // 4)
    return [int(t) for t in rng.integers(low, max(low + 1, model.n_vocab - 1), size=count)]


def _middle(samples: Sequence[float]) -> list[float]:
    """The three timings around the median (all of them when there are three or fewer)."""
    ordered = sorted(samples)
    cut = max((len(ordered) - 3) // 2, 0)
    return ordered[cut : len(ordered) - cut]


def _timed(n: int, samples: Sequence[float]) -> Timed:
    """Size ``n``'s median and the range of the timings around it (:func:`_middle`): its noise
    once outvoted outliers are set aside."""
    middle = _middle(samples)
    return Timed(n, float(np.median(samples)), float(middle[0]), float(middle[-1]))


def _settled(samples: Sequence[float]) -> bool:
    """Whether a size's timings agree around their median (spread within :data:`LOADED_SPREAD`)."""
    return _timed(0, samples).spread <= LOADED_SPREAD


def summarize(rounds: Mapping[int, Sequence[float]]) -> Measured:
    """The cost curve of timings ``rounds[n]`` (seconds of each repeat at size ``n``).

    Each size keeps its median. A median below the size before it is lifted to that size's
    value only when the fall is within its own noise (its repeats' range): a curve
    that really flattens or falls (a kernel change, op offload past 32 tokens) is recorded as
    measured, and smoothing never lifts a point above its measurement by more than noise.
    Sizes between measured ones are interpolated linearly.
    """
    timed = tuple(_timed(n, r) for n, r in sorted(rounds.items()))
    values: list[float] = []
    for t in timed:
        value = t.median
        if values and value < values[-1] <= value + (t.high - t.low):
            value = values[-1]
        values.append(value)
    xs = [t.n for t in timed]
    seconds = np.interp(range(1, xs[-1] + 1), xs, values)
    # Microseconds: what the cache stores, so a fresh and a cached curve decide alike.
    curve = CostCurve(tuple(max(round(float(s), 6), 1e-6) for s in seconds))
    return Measured(curve, timed)


def measure_curve(
    model: NativeModel,
    *,
    sizes: tuple[int, ...] = SIZES,
    repeats: int = REPEATS,
    prefix: int = PREFIX,
) -> Measured:
    """Time one evaluation of ``n`` tokens at each of ``sizes`` (``repeats`` rounds over all of
    them, interleaved, then :data:`EXTRA_REPEATS` more of the sizes not yet settled, up to
    :data:`RETRIES` times), all ``n`` logits rows read as a verification reads them, after a
    ``prefix``; :func:`summarize` makes the curve (the cache is emptied after)."""
    prefix_tokens = _tokens(model, prefix, seed=1)
    batch = _tokens(model, max(sizes), seed=2)
    model.reset()
    model.eval(prefix_tokens)
    model.eval(batch[:4], range(4))  # warm-up: weights paged in, buffers allocated
    rounds: dict[int, list[float]] = {n: [] for n in sizes}

    def time_round(ns: Sequence[int]) -> None:
        for n in ns:
            model.rollback(prefix)
            t0 = time.perf_counter()
            model.eval(batch[:n], range(n))
            rounds[n].append(time.perf_counter() - t0)

    for _ in range(repeats):
        time_round(sizes)
    for _ in range(RETRIES):
        noisy = [n for n in sizes if not _settled(rounds[n])]
        if not noisy:
            break
        for _ in range(EXTRA_REPEATS):
            time_round(noisy)
    model.reset()
    return summarize(rounds)


def probe_identity(model: NativeModel, *, max_n: int = IDENTITY_MAX) -> int:
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


#: Load settings that do not change what an evaluation costs (the context's size barely does;
#: ``strict_identity`` splits batches by the probed size, priced from the same curve; ``pcie``
#: only moves the planner's predictions).
_NOT_KEYED = frozenset({"n_ctx", "parallel", "strict_identity", "force_snapshot_rollback", "pcie"})


def cache_key(model: NativeModel) -> dict[str, Any]:
    """What a calibration depends on: the file, the llama.cpp build, the load settings (every
    field of its :class:`~pyramid_gguf.core.load.LoadConfig` that moves a cost: threads,
    offload, placement of experts, mapped or pinned weights, KV types, RPC servers and the
    rest), where llama.cpp put the weights, and this key's version."""
    path = model.path.resolve()
    st = path.stat()
    load = {k: v for k, v in asdict(model.cfg).items() if k not in _NOT_KEYED}
    if kind := getattr(model, "kind", None):  # the target's MTP head: its file, not its cost
        load["kind"] = kind
    return {
        "version": CACHE_VERSION,
        "file": str(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "build": build_id(),
        "load": json.loads(json.dumps(load, default=str)),
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
        timed = tuple(Timed(int(n), *map(float, rest)) for n, *rest in data.get("timed", []))
        return Calibration(CostCurve.from_dict(data["curve"]), batch, timed=timed)
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


def measure_quietly(
    model: NativeModel,
    say: Callable[[str], None] | None = None,
    *,
    attempts: int = ATTEMPTS,
) -> Measured:
    """:func:`measure_curve`, again while the machine looks busy (:attr:`Measured.loaded`), up
    to ``attempts`` times; the least noisy measurement (still ``loaded`` when none was quiet)."""
    best = measure_curve(model)
    for _ in range(attempts - 1):
        if not best.loaded:
            break
        if say is not None:
            say(f"the machine looks busy (repeats spread {best.spread:.0%}): measuring again")
        again = measure_curve(model)
        best = again if again.spread < best.spread else best
    return best


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
    ``$PYRAMID_GGUF_HOME`` that cannot be written only costs measuring again next time), and
    one more when the machine is too busy for a curve worth keeping: such a curve is used for
    this run and measured again next time, so one busy minute does not price a machine forever.
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
    if cached is not None:
        curve, timed, loaded = cached.curve, cached.timed, False
    else:
        measured = measure_quietly(model, say)
        curve, timed, loaded = measured.curve, measured.timed, measured.loaded
        if loaded and say is not None:
            say(
                f"{model.path.name}: repeats spread {measured.spread:.0%} (busy machine): "
                "using this curve now, not caching it"
            )
    if needs_rollback_pricing(model) and not curve.rollback:
        # a hybrid or recurrent cache: what a rejected round pays to roll back
        curve = curve.with_rollback(measure_rollback(model))
    batch = probe_identity(model) if probe else None
    cal = Calibration(curve, batch, measured=True, timed=timed, loaded=loaded)
    if problem is None and not loaded:
        _write(path, key, cal)
    return cal
