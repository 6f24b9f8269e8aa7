"""The arithmetic of ``auto`` (pure): expected tokens, block sizes that follow the cost curve,
chains that pay on a GPU and not on a small CPU, and the acceptance estimates."""

from __future__ import annotations

import math
import random

import pytest
from cost_curves import AVX512, CPU_DRAFT, GPU, GPU_DRAFT

from pyramid_gguf.decoding.pricing import policy
from pyramid_gguf.decoding.pricing.chains import (
    price_draft,
    price_lookup,
    price_plain,
    price_pyramid,
)
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.decoding.pricing.estimates import ChainAcceptance, NGramAcceptance, Rate


def test_expected_tokens() -> None:
    assert policy.expected_tokens(0.5, 0.5, 0) == 1.0
    assert policy.expected_tokens(1.0, 1.0, 4) == 5.0
    # 1 + a + a^2 + a^3 for a constant keep rate
    assert math.isclose(policy.expected_tokens(0.5, 0.5, 3), 1 + 0.5 + 0.25 + 0.125)
    # a weak first token caps everything behind it
    assert math.isclose(policy.expected_tokens(0.1, 1.0, 5), 1.5)


def test_cost_curve_extrapolates_and_chunks() -> None:
    c = CostCurve((1.0, 1.5, 2.0, 2.5))
    assert c(0) == 0 and c(4) == 2.5
    assert c(6) == pytest.approx(3.5)  # slope of the last quarter
    assert c.with_chunk(1)(3) == pytest.approx(3.0)  # strict identity: one token at a time
    assert c.with_chunk(2)(5) == pytest.approx(2 * 1.5 + 1.0)
    assert c.relative([1, 2]) == [1.0, 1.5]
    with pytest.raises(ValueError):
        CostCurve((1.0, 0.0))


def test_ngram_block_follows_the_cost_curve() -> None:
    """On the AVX-512 curve a 4-token batch is cheap and a 5-token one dear: with copying
    that is almost always kept, auto proposes 3 tokens (a batch of 4), not 4."""
    option = price_lookup("ngram", AVX512, 0.9, 0.95, available=16, max_k=7, overhead=0.0).allowed
    assert option is not None and option.k == 3
    # on a flat curve the same proposals are worth a long block
    flat = price_lookup("ngram", GPU, 0.9, 0.95, available=16, max_k=16, overhead=0.0).allowed
    assert flat is not None and flat.k > 8
    # a weak match does not pay on the CPU: plain decoding wins
    weak = price_lookup("ngram", AVX512, 0.3, 0.6, available=16, max_k=7, overhead=0.0).allowed
    assert policy.choose(price_plain(AVX512, 0.0), [weak]).chain == "target"


@pytest.mark.parametrize("keep", [0.6, 0.8, 0.95])
def test_model_drafts_do_not_pay_on_a_small_cpu(keep: float) -> None:
    base = price_plain(AVX512, 0.0)
    sd = price_draft("draft", AVX512, CPU_DRAFT, keep, 8, 0, 0.0).allowed
    psd = price_pyramid(AVX512, CPU_DRAFT, CPU_DRAFT, keep, keep, 8, (0, 0), 0.0).allowed
    assert policy.choose(base, [sd, psd]).chain == "target"


def test_model_drafts_pay_on_a_gpu_and_the_choice_follows_acceptance() -> None:
    base = price_plain(GPU, 0.0)
    good = price_draft("draft", GPU, GPU_DRAFT, 0.7, 16, 0, 0.0).allowed
    assert good is not None and good.rate > 1.4 * base.rate and good.k >= 3
    assert policy.choose(base, [good]).chain == "draft"
    bad = price_draft("draft", GPU, GPU_DRAFT, 0.05, 16, 0, 0.0).allowed
    assert policy.choose(base, [bad]).chain == "target"
    # a qualifier that agrees with the target far better than the draft: the pyramid wins
    qualifier = CostCurve.shaped(0.004, 0.0001)
    sd = price_draft("draft", GPU, GPU_DRAFT, 0.4, 16, 0, 0.0).allowed
    psd = price_pyramid(GPU, qualifier, GPU_DRAFT, 0.8, 0.9, 16, (0, 0), 0.0).allowed
    assert policy.choose(base, [sd, psd]).chain == "pyramid"


def test_catching_up_a_lagging_draft_is_priced() -> None:
    fresh = price_draft("draft", GPU, GPU_DRAFT, 0.7, 16, lag=0, overhead=0.0).allowed
    behind = price_draft("draft", GPU, GPU_DRAFT, 0.7, 16, lag=2000, overhead=0.0).allowed
    assert fresh is not None and behind is not None and behind.rate < fresh.rate


def test_choose_keeps_plain_decoding_for_marginal_gains() -> None:
    base = policy.Option("target", 0, 1.0, 1.0)
    marginal = policy.Option("ngram", 2, 1.02, 1.0)
    assert policy.choose(base, [marginal, None]) is base
    clear = policy.Option("ngram", 2, 1.5, 1.0)
    assert policy.choose(base, [marginal, clear]) is clear


def test_ngram_acceptance_learns_per_match_length() -> None:
    est = NGramAcceptance()
    short_prior, long_prior = est.estimate(2)[0], est.estimate(40)[0]
    assert short_prior < long_prior  # longer matches are trusted more before any evidence
    for _ in range(50):
        est.record(40, proposed=8, kept=8)  # long matches: everything kept
        est.record(3, proposed=4, kept=0)  # short ones: nothing
    first, after = est.estimate(40)
    assert first > 0.9 and after > 0.9
    assert est.estimate(3)[0] < 0.1
    assert est.estimate(2)[0] == short_prior  # another bucket: untouched


def test_chain_acceptance_counts_only_tested_tokens() -> None:
    est = ChainAcceptance()
    est.record("draft->target", proposed=4, kept=1)  # tokens 1 and 2 tested, 1 kept
    rate = est.rates["draft->target"]
    assert (rate.kept, rate.tried) == (Rate.prior(0.6).kept + 1, Rate.prior(0.6).tried + 2)
    est.record_confidence([0.9, 0.9, 0.9], kept=3)
    assert est.token(0.9) > 0.9 * 0.99  # kept as often as the draft was confident


def test_a_refused_block_lowers_only_its_own_bucket() -> None:
    """A long block refused at its first token (a quote the answer left) teaches its bucket;
    the other lengths keep their estimates, so the prompt's long quotes are still proposed."""
    est = NGramAcceptance()
    long_quote, short_echo = est.estimate(20, quoted=True), est.estimate(3)
    for _ in range(3):
        est.record(12, proposed=15, kept=0, quoted=True)
    assert est.estimate(12, quoted=True)[0] < 0.6
    assert est.estimate(20, quoted=True) == long_quote
    assert est.estimate(3) == short_echo


def test_a_round_may_lose_what_the_generation_saved() -> None:
    """A block promising less than CONFIDENT_GAIN runs only when earlier savings cover its
    loss (its whole cost, for the one token plain decoding would have made); a confident one
    may also risk one plain token's time, once: not after the generation has lost."""
    base = policy.Option("target", 0, 1.0, 1.0)
    marginal = policy.Option("ngram", 3, 2.2, 2.0)  # 1.1x: above MIN_GAIN, not confident
    assert policy.MIN_GAIN < marginal.rate < policy.CONFIDENT_GAIN
    assert policy.Budget(base).allows(marginal)  # no ledger: the mean decides
    assert not policy.Budget(base, 0.99).allows(marginal)
    assert policy.Budget(base, 1.0).allows(marginal)
    confident = policy.Option("ngram", 3, 2.6, 2.0)  # 1.3x, loses 1.0 if nothing is kept
    assert policy.Budget(base, 0.0).allows(confident)
    assert not policy.Budget(base, -0.01).allows(confident)
    long_bet = policy.Option("ngram", 12, 5.2, 4.0)  # 1.3x, loses 3.0
    assert not policy.Budget(base, 1.99).allows(long_bet)
    assert policy.Budget(base, 2.0).allows(long_bet)


def test_block_size_follows_the_budget() -> None:
    """On the AVX-512 curve a copying match wants a long block; with no savings yet auto
    proposes a short one, and grows it as the generation saves."""
    base = price_plain(AVX512, 0.0)
    free = price_lookup("ngram", AVX512, 0.95, 0.95, available=8, max_k=8, overhead=0.0).allowed
    budget = policy.Budget(base, 0.0)
    pick = price_lookup("ngram", AVX512, 0.95, 0.95, 8, 8, 0.0, budget)
    short = pick.allowed
    assert free is not None and short is not None and short.k < free.k
    assert short.seconds - base.seconds <= base.seconds
    assert pick.refused and pick.best == free  # the block it would run, budget aside
    rich = price_lookup("ngram", AVX512, 0.95, 0.95, 8, 8, 0.0, policy.Budget(base, 1.0))
    assert rich.allowed == free and not rich.refused
    weak = price_lookup("ngram", AVX512, 0.65, 0.8, 8, 8, 0.0, policy.Budget(base, 0.0))
    assert weak.allowed is None
    assert weak.refused  # worth running on average, refused for lack of savings


def test_quoted_matches_are_trusted_more_than_echoes() -> None:
    est = NGramAcceptance()
    for n in (2, 3, 4, 6):
        assert est.estimate(n, quoted=True)[0] > est.estimate(n, quoted=False)[0]
    echo_before = est.estimate(3)
    for _ in range(20):
        est.record(3, proposed=3, kept=3, quoted=True)
    assert est.estimate(3, quoted=True)[0] > 0.9
    assert est.estimate(3) == echo_before  # the other source: untouched


def test_best_block_scans_sizes_once_first_of_equals_winning() -> None:
    base = policy.Option("target", 0, 1.0, 1.0)  # plain decoding: 1 token per second
    tokens = [2.0, 4.0, 4.0, 3.0]  # k = 2 and k = 3 tie at 2 tokens per second
    seconds = [1.6, 2.0, 2.0, 3.0]
    free = policy.best_block("ngram", tokens, seconds)
    assert free.best is not None and (free.best.k, free.best.rate) == (2, 2.0)
    assert free.allowed is free.best and not free.refused
    # with no savings a round may lose nothing, unless it promises CONFIDENT_GAIN: then one
    # plain token's time (1 s); k = 2 (loses 1 s) promises 2x and is allowed, k = 4 is not
    poor = policy.best_block("ngram", tokens, seconds, budget=policy.Budget(base, 0.0))
    assert poor.allowed is not None and poor.allowed.k == 2
    # a budget in debt allows nothing; k = 1..3 were worth running (>= MIN_GAIN), k = 4 was not
    debt = policy.best_block("ngram", tokens, seconds, budget=policy.Budget(base, -1.0))
    assert debt.allowed is None and debt.refused and debt.best == free.best
    dull = policy.best_block("ngram", [1.0], [1.5], budget=policy.Budget(base, -1.0))
    assert dull.allowed is None and not dull.refused  # 0.67 tokens/s is worth nothing
    assert policy.best_block("ngram", [], []) == policy.Pick()


@pytest.mark.parametrize("seed", range(5))
def test_best_block_allows_exactly_what_the_budget_allows(seed: int) -> None:
    """best_block unrolls Budget.allows for speed: its picks equal a plain scan by allows()."""
    rng = random.Random(seed)
    base = price_plain(CostCurve.shaped(0.01, 0.005), 0.0)
    for _ in range(200):
        n = rng.randint(1, 16)
        seconds = sorted(rng.uniform(0.005, 0.1) for _ in range(n))
        tokens = [rng.uniform(1.0, 1.0 + k) for k in range(1, n + 1)]
        budget = policy.Budget(base, rng.choice([0.0, -0.01, rng.uniform(-0.02, 0.05)]))
        pick = policy.best_block("ngram", tokens, seconds, budget=budget)
        options = [
            policy.Option("ngram", k, tokens[k - 1], seconds[k - 1]) for k in range(1, n + 1)
        ]
        allowed = [o for o in options if budget.allows(o)]
        top = max((o.rate for o in allowed), default=None)
        expected = next((o for o in allowed if o.rate == top), None)
        assert pick.allowed == expected
        assert pick.refused == any(not budget.allows(o) and budget.worth(o) for o in options)
