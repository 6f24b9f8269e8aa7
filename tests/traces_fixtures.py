"""Synthetic acceptance traces with chosen agreement rates (for replay and planning tests)."""

from __future__ import annotations

import numpy as np

from pyramid_gguf.decoding.offline.traces import TierTrace, Trace, TraceSet


def synthetic_trace(
    seed: int,
    *,
    n: int = 160,
    draft: float = 0.6,
    qualifier: float = 0.9,
    draft_qualifier: float | None = None,
    top: float = 0.7,
) -> Trace:
    """An answer of ``n`` random tokens (nothing for the n-gram drafter to copy) and lower tiers
    whose argmax is the target's token at rate ``draft`` / ``qualifier``; where the draft
    misses the target it still agrees with the qualifier at rate ``draft_qualifier``."""
    rng = np.random.default_rng(seed)
    prompt = tuple(int(t) for t in rng.integers(1000, 60000, 40))
    answer = tuple(int(t) for t in rng.integers(1000, 60000, n))
    q = [a if rng.random() < qualifier else a + 1 for a in answer]
    dq = draft_qualifier if draft_qualifier is not None else 0.0
    d = []
    for a, qa in zip(answer, q, strict=True):
        if rng.random() < draft:
            d.append(a)
        else:
            d.append(qa if qa != a and rng.random() < dq else a + 2)
    tiers = {
        "qualifier": TierTrace(tuple(q), (top,) * n, (qualifier,) * n),
        "draft": TierTrace(tuple(d), (top,) * n, (draft,) * n),
    }
    return Trace(f"synthetic/{seed}", "synthetic", prompt, answer, tiers)


def synthetic_set(count: int = 3, **rates: float) -> TraceSet:
    traces = tuple(synthetic_trace(seed, **rates) for seed in range(count))  # type: ignore[arg-type]
    return TraceSet("synthetic", {}, 0.8, traces)
