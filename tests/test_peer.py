"""llama.cpp's ``-md`` peer (planning/peer.py): the fast walk follows llama.cpp's rules step by
step, and the peer is searched at its best ``--spec-draft-n-max`` up to 64 and its best
``--spec-draft-p-min``, on the placement's own curves (issue 48, part 4)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from pyramid_gguf.decoding.offline.traces import TierTrace, Trace, TraceSet
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.planning.peer import MAX_DRAFT, P_MINS, PeerWalks, walk


def _reference(traces: TraceSet, tier: str, n_max: int, p_min: float, n_min: int) -> tuple:
    """llama.cpp's draft loop written out token by token (common/speculative.cpp's
    draft-simple: evaluate, stop under p_min with that evaluation paid, stop at n_max without
    evaluating the last, cap at what the answer has left less one)."""
    batches: Counter[int] = Counter()
    steps = 0
    for trace in traces.traces:
        tt, answer = trace.tiers[tier], trace.answer
        off_top = sum(tt.top) / max(len(tt.top), 1)
        i = 1
        while i < len(answer):
            cap = min(n_max, len(answer) - i - 1)
            drafted = kept = evals = 0
            if cap > 0:
                evals, on_path = 1, True
                while True:
                    pos = i + drafted
                    top = tt.top[pos] if on_path and pos < len(tt.top) else off_top
                    if top < p_min:
                        break
                    if on_path:
                        on_path = pos < len(tt.argmax) and tt.argmax[pos] == answer[pos]
                        kept += on_path
                    drafted += 1
                    if drafted == cap:
                        break
                    evals += 1
            if drafted < n_min:
                drafted = kept = 0
            steps += evals
            batches[drafted + 1] += 1
            i += kept + 1
    return dict(batches), steps


def _random_set(seed: int, n_traces: int = 4, agree: float = 0.8) -> TraceSet:
    rng = np.random.default_rng(seed)
    traces = []
    for k in range(n_traces):
        n = int(rng.integers(5, 90))
        answer = tuple(int(t) for t in rng.integers(10, 50, n))
        right = rng.random(n) < agree
        # the draft is surer where it is right, as real drafts are (not always)
        top = np.clip(np.where(right, 0.85, 0.45) + rng.normal(0, 0.15, n), 0.01, 1.0)
        argmax = tuple(a if r else a + 100 for a, r in zip(answer, right, strict=True))
        short = int(rng.integers(0, 3))  # a tier trace may stop before the answer does
        tier = TierTrace(argmax[: n - short], tuple(top[: n - short]), tuple(top[: n - short]))
        traces.append(Trace(f"k{k}", "s", (1, 2), answer, {"draft": tier}))
    return TraceSet("t", {}, 0.0, tuple(traces))


@pytest.mark.parametrize("seed", range(6))
def test_the_fast_walk_is_llamas_loop(seed: int) -> None:
    traces = _random_set(seed)
    for n_max in (1, 2, 3, 5, 8, 17, 64):
        for p_min in (0.0, 0.5, 0.75, 0.95):
            for n_min in (0, 2):
                w = walk(traces, "draft", n_max, p_min, n_min)
                batches, steps = _reference(traces, "draft", n_max, p_min, n_min)
                assert (dict(w.target_batches), w.draft_steps) == (batches, steps), (
                    n_max,
                    p_min,
                    n_min,
                )


def _always_right(n: int = 200, top: float = 0.99) -> TraceSet:
    answer = tuple(range(10, 10 + n))
    tier = TierTrace(answer, (top,) * n, (top,) * n)
    return TraceSet("t", {}, 0.0, (Trace("k", "s", (1,), answer, {"draft": tier}),))


def test_the_peer_reaches_long_drafts_where_verification_is_flat() -> None:
    """A split target past op offload: 65 tokens cost what one does; a cheap, always-right
    draft. llama.cpp would then draft far past 16, and the peer is priced there."""
    assert MAX_DRAFT == 64 and 0.0 in P_MINS and 0.75 in P_MINS
    flat = CostCurve((1.0,) * 80)
    draft = CostCurve(tuple(0.001 * (1 + 0.01 * i) for i in range(80)))
    best = PeerWalks(_always_right()).best({"target": flat, "draft": draft})
    assert best is not None and best.draft_max > 32
    capped = PeerWalks(_always_right(), max_draft=16).best({"target": flat, "draft": draft})
    assert capped is not None and capped.draft_max == 16 and capped.tps < best.tps


def test_the_peer_stays_short_where_verification_is_steep() -> None:
    steep = CostCurve(tuple(1.0 + 0.9 * i for i in range(80)))
    draft = CostCurve(tuple(0.05 * (1 + 0.5 * i) for i in range(80)))
    best = PeerWalks(_random_set(1, agree=0.6)).best({"target": steep, "draft": draft})
    assert best is not None and best.draft_max <= 4


def test_the_peer_takes_the_p_min_that_pays() -> None:
    """A dear draft that is sure where it is right and unsure where it is wrong: stopping at
    its first doubt (p-min between the two) beats drafting blind; a draft sure everywhere
    wants no p-min at all."""
    n = 300
    rng = np.random.default_rng(3)
    answer = tuple(int(t) for t in rng.integers(10, 50, n))
    right = rng.random(n) < 0.7
    top = tuple(0.95 if r else 0.4 for r in right)
    argmax = tuple(a if r else a + 100 for a, r in zip(answer, right, strict=True))
    traces = TraceSet(
        "t", {}, 0.0, (Trace("k", "s", (1,), answer, {"draft": TierTrace(argmax, top, top)}),)
    )
    flat = CostCurve((1.0,) * 80)
    dear = CostCurve(tuple(0.3 * (1 + 0.05 * i) for i in range(80)))
    walks = PeerWalks(traces)
    best = walks.best({"target": flat, "draft": dear})
    assert best is not None and 0.4 < best.p_min <= 0.95
    blind = PeerWalks(traces, p_mins=(0.0,)).best({"target": flat, "draft": dear})
    assert blind is not None and blind.tps < best.tps
    sure = PeerWalks(_always_right(top=0.5)).best({"target": flat, "draft": dear})
    assert sure is not None and sure.p_min < 0.5


def test_the_peer_is_priced_on_the_curves_it_is_given() -> None:
    """The same walks on two placements' curves: a dearer target step is a slower peer, and
    a placement without a smaller model has none."""
    walks = PeerWalks(_random_set(2))
    draft = CostCurve(tuple(0.01 * (1 + 0.1 * i) for i in range(80)))
    fast = walks.best({"target": CostCurve((0.1,) * 80), "draft": draft})
    slow = walks.best({"target": CostCurve((0.2,) * 80), "draft": draft})
    assert fast is not None and slow is not None and slow.tps < fast.tps
    assert walks.best({"target": CostCurve((0.1,) * 80)}) is None


def test_bad_peer_knobs_are_refused() -> None:
    with pytest.raises(ValueError):
        PeerWalks(_always_right(), max_draft=0)
    with pytest.raises(ValueError):
        PeerWalks(_always_right(), p_mins=())
