"""``auto``'s pricing against the replay behind ``plan``: on traces whose proposals are kept
independently, token by token (what the pricing assumes), the two agree.

The pricing (:meth:`Chain.price`) promises each chain's best round a rate: expected committed
tokens per second at its block size ``k`` (and a pyramid's ``l_d``). The replay
(:func:`replay_trace`) runs that same round, every round, through the real schedulers over
scripted tiers and charges each evaluation on the same cost curves. Where acceptance is
independent per token, the promise must be what the replay measures: here within 5%, with
blocks up to 64 tokens, on a CPU-shaped curve and on a flat (GPU-like) one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from pyramid_gguf.core.spec import SpecConfig
from pyramid_gguf.decoding.offline.replay import replay_trace
from pyramid_gguf.decoding.offline.traces import TierTrace, Trace
from pyramid_gguf.decoding.pricing import policy
from pyramid_gguf.decoding.pricing.chains import Chain, StageRule, draft_seconds
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.decoding.pricing.policy import Ledger, Option, lookahead
from pyramid_gguf.decoding.runtime.auto import ROUND_OVERHEAD

N = 1500
EXACT = StageRule("exact")
DRAFT = CostCurve.shaped(0.004, 0.003)
QUALIFIER = CostCurve.shaped(0.015, 0.010)
CURVES = {
    "cpu": CostCurve.shaped(0.040, 0.030),  # each token costs most of another
    "flat": CostCurve.shaped(0.100, 0.002),  # a split target past op offload: nearly flat
}


def _follow(rng: np.random.Generator, upper: tuple[int, ...], rate: float) -> tuple[int, ...]:
    """A tier whose argmax is ``upper``'s with probability ``rate`` at each position, alone."""
    fresh = iter(range(10**6, 10**7))
    return tuple(u if rng.random() < rate else next(fresh) for u in upper)


def _trace(keep_qt: float, keep_dq: float, *, draft_over: str, seed: int) -> Trace:
    """A target answer of :data:`N` distinct tokens (no n-gram repeats), a qualifier keeping
    ``keep_qt`` of it and a draft keeping ``keep_dq`` of ``draft_over``'s argmaxes."""
    rng = np.random.default_rng(seed)
    answer = tuple(range(1000, 1000 + N))
    qualifier = _follow(rng, answer, keep_qt)
    draft = _follow(rng, qualifier if draft_over == "qualifier" else answer, keep_dq)

    def tier(argmax: tuple[int, ...]) -> TierTrace:
        return TierTrace(argmax, (0.9,) * N, (0.5,) * N)

    return Trace(
        "k", "s", tuple(range(1, 11)), answer, {"qualifier": tier(qualifier), "draft": tier(draft)}
    )


def _agreement(lower: tuple[int, ...], upper: tuple[int, ...]) -> float:
    return float(np.mean([a == b for a, b in zip(lower, upper, strict=True)]))


@pytest.mark.parametrize("curve", sorted(CURVES))
@pytest.mark.parametrize("keep", [0.6, 0.9])
def test_a_drafts_price_is_what_its_replay_measures(curve: str, keep: float) -> None:
    trace = _trace(keep, keep, draft_over="answer", seed=int(keep * 100))
    realized = _agreement(trace.tiers["draft"].argmax, trace.answer)
    costs = {"target": CURVES[curve], "draft": DRAFT}
    chain = Chain("draft", ("draft", "target"), (EXACT,))
    best = chain.price(costs, ((realized, realized),), 64, overhead=ROUND_OVERHEAD).best
    assert best is not None
    replayed = replay_trace(trace, costs, SpecConfig(mode="sd", l_d=best.k))
    assert replayed.tps == pytest.approx(best.rate, rel=0.05)


@pytest.mark.parametrize("curve", sorted(CURVES))
@pytest.mark.parametrize(("keep_qt", "keep_dq"), [(0.6, 0.8), (0.95, 0.8), (0.9, 0.5)])
def test_a_pyramids_price_is_what_its_replay_measures(
    curve: str, keep_qt: float, keep_dq: float
) -> None:
    """Long blocks included: the qualifier's buffer is as long as the target's block, and its
    last check of a buffer drafts only what the buffer has room for."""
    trace = _trace(keep_qt, keep_dq, draft_over="qualifier", seed=int(keep_qt * 100))
    a_qt = _agreement(trace.tiers["qualifier"].argmax, trace.answer)
    a_dq = _agreement(trace.tiers["draft"].argmax, trace.tiers["qualifier"].argmax)
    costs = {"target": CURVES[curve], "qualifier": QUALIFIER, "draft": DRAFT}
    chain = Chain("pyramid", ("draft", "qualifier", "target"), (EXACT, EXACT))
    best = chain.price(costs, ((a_dq, a_dq), (a_qt, a_qt)), 64, overhead=ROUND_OVERHEAD).best
    assert best is not None
    spec = SpecConfig(mode="psd-exact", l_d=best.l_d, l_q=best.k)
    replayed = replay_trace(trace, costs, spec)
    assert replayed.tps == pytest.approx(best.rate, rel=0.05)


def test_a_flat_curve_buys_long_blocks() -> None:
    """Where the target checks many tokens for about the price of one, the pricing reaches far
    past the old 16-token cap; on a CPU-shaped curve it stays short."""
    keeps = ((0.95, 0.95),)
    chain = Chain("draft", ("draft", "target"), (EXACT,))
    flat = chain.price(
        {"target": CURVES["flat"], "draft": CostCurve.shaped(0.001, 0.001)}, keeps, 64, overhead=0.0
    ).best
    steep = chain.price({"target": CURVES["cpu"], "draft": DRAFT}, keeps, 64, overhead=0.0).best
    assert flat is not None and steep is not None
    assert flat.k > 16 > steep.k


def test_auto_drafts_on_to_where_op_offload_makes_the_batch_cheap() -> None:
    """A split target's curve rises to 31 tokens and falls at 32 (op offload: the CPU-held
    weights cross to the GPU once for the whole batch). Drafting token by token, each next
    token's share of the verification is dear, while a block of 31 pays: ``auto``'s lone draft
    looks ahead to it (:func:`~pyramid_gguf.decoding.pricing.policy.lookahead`) instead of
    stopping at the first dear token, and comes within 15% of the best fixed block."""
    target = CostCurve(tuple(0.30 + 0.12 * (n - 1) for n in range(1, 32)) + (0.48,) * 33)
    costs = {"target": target, "draft": CostCurve.shaped(0.012, 0.0001)}
    trace = _trace(0.92, 0.92, draft_over="answer", seed=7)
    fixed = max(replay_trace(trace, costs, SpecConfig(mode="sd", l_d=k)).tps for k in (3, 31))
    auto = replay_trace(trace, costs, SpecConfig(mode="auto"))
    drafted = auto.auto.choices["draft"]
    assert drafted.proposed / drafted.rounds > 16
    assert auto.tps >= 0.85 * fixed


def test_lookahead_is_the_marginal_rule_on_a_straight_curve() -> None:
    """On a curve that adds the same cost per token, drafting on never gets cheaper: each
    token must pay its own share, as before the look-ahead; a curve that falls lowers it."""
    straight = CostCurve(tuple(0.03 + 0.01 * n for n in range(1, 66)))
    limits = lookahead(straight, 0.9, 64)
    assert limits == pytest.approx((0.01,) * 64)
    falling = CostCurve(tuple(0.30 + 0.12 * (n - 1) for n in range(1, 32)) + (0.48,) * 34)
    assert lookahead(falling, 0.9, 64)[0] < 0.12 / 3


def test_lookahead_charges_the_drafts_own_steps() -> None:
    """Each drafted token also costs the draft's step that shows it the next one: on a
    straight curve every token must pay its share of the verification and that step."""
    straight = CostCurve(tuple(0.03 + 0.01 * n for n in range(1, 66)))
    assert lookahead(straight, 0.9, 64, 0.005) == pytest.approx((0.015,) * 64)
    assert lookahead(straight, 0.9, 64, 0.0) == lookahead(straight, 0.9, 64)


def _confident_trace(rate: float, *, sure: float, unsure: float, seed: int) -> Trace:
    """A draft agreeing with the target's answer of :data:`N` distinct tokens at ``rate``,
    independently per position, whose top probability is ``sure`` where it agrees and
    ``unsure`` where not: a draft whose confidence says when to stop."""
    rng = np.random.default_rng(seed)
    answer = tuple(range(1000, 1000 + N))
    hits = rng.random(N) < rate
    fresh = iter(range(10**6, 10**7))
    argmax = tuple(a if hit else next(fresh) for a, hit in zip(answer, hits, strict=True))
    tops = tuple(sure if hit else unsure for hit in hits)
    draft = TierTrace(argmax, tops, (0.5,) * N)
    return Trace("k", "s", tuple(range(1, 11)), answer, {"draft": draft})


def _best_p_min(trace: Trace, costs: dict[str, CostCurve], blocks: tuple[int, ...]) -> float:
    """llama.cpp's rule in our runner: a fixed block stopped by p-min 0.75, the best block."""
    return max(
        replay_trace(trace, costs, SpecConfig(mode="sd", l_d=k, p_min=0.75)).tps for k in blocks
    )


def test_a_lone_draft_pays_for_its_own_steps() -> None:
    """Where verification is nearly free and the draft's steps are not, a lone draft stops at
    the token its confidence doubts (the look-ahead charges each token the draft's next step):
    ``auto`` within 10% of the best fixed block stopped by llama.cpp's p-min (it drafted on
    through doubtful tokens at 0.77x)."""
    costs = {"target": CostCurve.shaped(0.10, 0.001), "draft": CostCurve.shaped(0.03, 0.001)}
    trace = _confident_trace(0.9, sure=0.9, unsure=0.6, seed=1)
    auto = replay_trace(trace, costs, SpecConfig(mode="auto"))
    assert auto.tps >= 0.9 * _best_p_min(trace, costs, (4, 8, 16))


def test_a_lone_draft_that_stops_is_booked_as_it_ran() -> None:
    """A split target's curve: steep to 8 tokens, flat after. ``auto`` chooses its lone draft
    at a long block and the draft stops where its confidence falls, often at once; the ledger
    books the round it ran (a probe and one token), not the long block it was chosen for, so
    the savings do not run dry and plain decoding does not take over where the draft pays
    (booked at the chosen block: 0.69x the best fixed block stopped by p-min, 700 of 973
    rounds plain)."""
    steep = tuple(0.25 + 0.09 * (n - 1) for n in range(1, 9))
    target = CostCurve(steep + tuple(0.88 + 0.0005 * (n - 8) for n in range(9, 66)))
    costs = {"target": target, "draft": CostCurve.shaped(0.016, 0.001)}
    trace = _confident_trace(0.75, sure=0.95, unsure=0.45, seed=1)
    auto = replay_trace(trace, costs, SpecConfig(mode="auto"))
    assert auto.tps >= 0.9 * _best_p_min(trace, costs, (8, 16, 31))
    assert auto.auto.choices["target"].rounds < auto.auto.choices["draft"].rounds


def test_a_lone_draft_is_booked_at_the_keep_rate_it_was_priced_at(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round that stops early is booked as it ran, by the keep rate and cost curves its
    choice was priced with: the ledger entry is the choice's seconds less the block it was
    chosen for plus the block it proposed (:func:`draft_seconds`, stopped), both at the keep
    rate the chain was priced at that round (its upper confidence bound before the round),
    not at the mean the round then taught (which made the booking drift from the choice's
    price). The keep rate and curves are read off the pricing call that offered the choice."""
    steep = tuple(0.25 + 0.09 * (n - 1) for n in range(1, 9))
    target = CostCurve(steep + tuple(0.88 + 0.0005 * (n - 8) for n in range(9, 66)))
    costs = {"target": target, "draft": CostCurve.shaped(0.016, 0.001)}
    trace = _confident_trace(0.75, sure=0.95, unsure=0.45, seed=1)
    offered: list[tuple[Any, float, policy.Pick]] = []  # this round's draft prices
    chosen: list[tuple[Option, Any, float]] = []  # this round's choice, its curves and keep
    rounds: list[tuple[Option, Any, float, Option]] = []  # ... and the option booked
    price, choose, book = Chain.price, policy.choose, Ledger.round

    def priced(self: Chain, curves: Any, keeps: Any, *args: Any, **kwargs: Any) -> policy.Pick:
        pick = price(self, curves, keeps, *args, **kwargs)
        if self.name == "draft":
            offered.append((curves, keeps[0][0], pick))
        return pick

    def choosing(base: Option, options: Any) -> Option:
        choice = choose(base, options)
        offer = next(((c, k) for c, k, p in offered if p.allowed is choice), (None, math.nan))
        chosen[:] = [(choice, *offer)]
        offered.clear()
        return choice

    def booking(self: Ledger, option: Option, committed: int, base: Option) -> None:
        rounds.append((*chosen[0], option))
        book(self, option, committed, base)

    monkeypatch.setattr(Chain, "price", priced)
    monkeypatch.setattr(policy, "choose", choosing)
    monkeypatch.setattr(Ledger, "round", booking)
    replay_trace(trace, costs, SpecConfig(mode="auto"))
    stopped = [r for r in rounds if r[0].chain == "draft" and r[3].k < r[0].k]
    assert len(stopped) > 10 and len({keep for _, _, keep, _ in stopped}) > 1
    for choice, curves, keep, booked in stopped:
        t, d = curves["target"], curves["draft"]
        chosen_block = draft_seconds(t, d, keep, choice.k)
        ran = draft_seconds(t, d, keep, booked.k, stopped=True)
        assert booked.seconds == pytest.approx(choice.seconds - chosen_block + ran, rel=1e-9)
