"""What a rollback costs a model: the price a rejected round pays besides its batch.

A KV cache drops a suffix for nothing. A hybrid or recurrent cache (Gated DeltaNet, Mamba)
cannot: it restores a saved state and evaluates the kept tokens again, and saves a new state
(native/rollback.py), unless llama.cpp's per-sequence snapshots (``n_rs_seq``) cover the drop.
:func:`measure_rollback` times exactly what a speculative round does: evaluate a block of
``j + 1`` tokens in one batch (untimed), drop its last ``j`` (timed, whatever path the model
takes), for ``j`` in 1, 2, 4, 8, 16 (interpolated between). The result is the ``rollback``
of the model's :class:`~..pricing.costs.CostCurve` (``calibrate`` attaches it), which
``chains.expected_drop`` prices into every rejected round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...native import NativeModel

#: Longest drop measured (longer ones are priced as this one).
MAX_DROP = 16
#: Tokens held before each measured block (a short prompt's worth).
PREFIX = 48
#: Timings per drop length (the median is kept).
REPEATS = 3


@dataclass(frozen=True)
class RollbackConfig:
    """How :func:`measure_rollback` measures."""

    max_j: int = MAX_DROP
    prefix: int = PREFIX
    repeats: int = REPEATS


def needs_rollback_pricing(model: NativeModel) -> bool:
    """Whether dropping a suffix costs ``model`` anything (its cache is not a plain KV cache)."""
    return getattr(model, "snapshot_reason", None) is not None


def measure_rollback(model: NativeModel, cfg: RollbackConfig | None = None) -> tuple[float, ...]:
    """Seconds to drop the last ``j`` tokens of a block of ``j + 1`` just evaluated,
    ``out[j - 1]`` for ``j = 1..cfg.max_j`` (median of ``cfg.repeats`` at ``j`` = 1, 2, 4, 8,
    16, interpolated between), as rounds make them:
    each keeps the block's first token, so the next block follows it (a saved state, where the
    model takes that path, is one round old). Empties the model's sequence 0 (the next prompt
    is evaluated afresh)."""
    cfg = cfg or RollbackConfig()
    rng = np.random.default_rng(0)
    vocab = max(model.n_vocab, 4)
    room = (model.n_ctx - cfg.prefix) // (cfg.repeats + 1) - 2  # each round keeps a token
    max_j = max(1, min(cfg.max_j, model.n_batch - 1, room))
    sizes = sorted({min(j, max_j) for j in (1, 2, 4, 8, 16, max_j)})
    out: list[float] = []
    model.reset()
    prefix = [int(t) for t in rng.integers(3, vocab, size=cfg.prefix)]
    model.eval(prefix)
    for j in sizes:
        times = []
        for _ in range(cfg.repeats):
            block = [int(t) for t in rng.integers(3, vocab, size=j + 1)]
            held = model.n_past
            model.eval(block, [-1])
            start = time.perf_counter()
            model.rollback(held + 1)  # a round that keeps one token and drops j
            times.append(time.perf_counter() - start)
        out.append(float(np.median(times)))
    model.reset()
    full = np.interp(np.arange(1, max_j + 1), sizes, out)  # drops between measured ones
    return tuple(max(round(float(s), 6), 0.0) for s in full)
