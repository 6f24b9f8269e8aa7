"""``auto``'s scheduling on a scripted target (no model): what it bets, and what it risks.

The target here (:mod:`pyramid_gguf.decoding.replay`) always predicts a fixed token sequence,
so every n-gram proposal is kept or refused deterministically and the only thing under test is
the scheduler: the cost curve, the acceptance estimates, the budget
(:class:`pyramid_gguf.decoding.policy.Budget`) and shadow blocks.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_policy import AVX512

from pyramid_gguf.decoding import policy
from pyramid_gguf.decoding.replay import ScriptedTarget, replay
from pyramid_gguf.decoding.stats import AutoStats


def run_auto(prompt: list[int], answer: list[int]) -> tuple[list[int], AutoStats, int]:
    """Decode ``answer`` after ``prompt`` with ``auto`` priced by the 2-core CPU curve."""
    r = replay(prompt, answer, AVX512)
    return r.tokens, r.auto, r.evaluations


def echo_text(rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """An answer that repeats a 6-token phrase of its own, each time followed by a new token:
    the n-gram drafter always proposes what followed it last time, and is always wrong."""
    phrase = [int(t) for t in rng.choice(np.arange(10, 100), 6, replace=False)]
    answer: list[int] = []
    for i in range(16):
        answer += [*phrase, 200 + i]
    return [int(t) for t in rng.integers(300, 500, 20)], answer


def test_an_answer_that_quotes_its_prompt_is_copied_in_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first plain rounds settle as shadow blocks that would have been kept: they teach
    the estimates and credit the budget, so auto starts proposing sooner than it would on
    real savings alone, and then copies in blocks."""
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.permutation(np.arange(10, 300))[:120]]
    got, auto, evaluations = run_auto(prompt, prompt[:100])
    assert got == prompt[:100]
    assert auto.choices["ngram"].committed > 80
    assert evaluations < 40  # 100 tokens in blocks of up to 4, not one by one
    assert auto.savings > 0 and auto.shadows > 0 and auto.shadow_credit > 0
    monkeypatch.setattr(policy, "SHADOW_CREDIT", 0.0)
    got, uncredited, later = run_auto(prompt, prompt[:100])
    assert got == prompt[:100] and uncredited.shadow_credit == 0
    assert later > evaluations


def test_echoes_that_do_not_copy_cost_at_most_the_confident_bets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every proposal fails, so no saving ever pays for a marginal bet: auto stays at plain
    decoding but for the few bets it was confident of. Betting on every marginal estimate
    instead (a confidence bar of 1) loses more."""
    prompt, answer = echo_text(np.random.default_rng(1))
    got, guarded, _ = run_auto(prompt, answer)
    assert got == answer
    assert guarded.unfunded > 0  # the rule engaged: some bets looked worth it on average
    assert guarded.savings <= 0  # nothing was ever kept
    monkeypatch.setattr(policy, "CONFIDENT_GAIN", 1.0)
    got, reckless, _ = run_auto(prompt, answer)
    assert got == answer and reckless.unfunded == 0
    assert reckless.savings < guarded.savings
    assert rounds_of(reckless, "ngram") > rounds_of(guarded, "ngram")


def rounds_of(auto: AutoStats, chain: str) -> int:
    return auto.choices[chain].rounds if chain in auto.choices else 0


def test_the_scripted_target_charges_the_cost_curve() -> None:
    target = ScriptedTarget([5, 6, 7, 8, 9], AVX512)
    rows = target.score([5, 6], [7, 1])
    assert rows.shape == (3, 10) and list(rows.argmax(axis=1)) == [7, 8, 9]
    assert target.seconds == pytest.approx(AVX512(3) + 4e-4) and target.evaluations == 1
    with pytest.raises(ValueError):
        target.score([5, 7], [])
    plain = replay([1, 2, 3], [4, 5, 6, 7], AVX512)  # nothing to copy: plain decoding
    assert plain.tokens == [4, 5, 6, 7] and plain.evaluations == 4
    assert plain.speedup == pytest.approx(1.0)
