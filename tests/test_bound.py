"""The copy bound: the longest copy runs match their definition, the schedule is the cheapest
one, and no replay of ``auto`` beats it."""

from __future__ import annotations

import random

import pytest

from pyramid_gguf.decoding.offline.bound import copy_bound, copy_runs
from pyramid_gguf.decoding.offline.replay import replay
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.decoding.runtime.auto import ROUND_OVERHEAD

LINEAR = CostCurve.shaped(1.0, 0.1)


def naive_runs(prompt: list[int], answer: list[int], anchored: bool) -> list[int]:
    """The definition, spelled out: every earlier start ``j`` (anchored: those after an earlier
    occurrence of the last committed token)."""
    text, start = prompt + answer, len(prompt)
    runs = []
    for i in range(len(answer)):
        p, best = start + i, 0
        for j in range(0 if not anchored else 1, p):
            if anchored and text[j - 1] != text[p - 1]:
                continue
            b = 0
            while p + b < len(text) and text[j + b] == text[p + b]:
                b += 1
            best = max(best, b)
        runs.append(best)
    return runs


@pytest.mark.parametrize("anchored", [True, False])
@pytest.mark.parametrize("seed", range(20))
def test_copy_runs_match_their_definition(seed: int, anchored: bool) -> None:
    rng = random.Random(seed)
    alphabet = rng.randint(2, 6)  # few symbols: many anchors, overlapping runs
    prompt = [rng.randrange(alphabet) for _ in range(rng.randint(1, 30))]
    answer = [rng.randrange(alphabet) for _ in range(rng.randint(1, 30))]
    runs = copy_runs(prompt, answer, anchored=anchored)
    assert runs.tolist() == naive_runs(prompt, answer, anchored)


def test_an_answer_that_copies_nothing_is_bounded_by_plain_decoding() -> None:
    assert copy_runs([1, 2, 3], [4, 5, 6, 7]).tolist() == [0, 0, 0, 0]
    assert copy_bound([1, 2, 3], [4, 5, 6, 7], LINEAR) == 1.0


def test_the_bound_takes_the_cheapest_schedule() -> None:
    # answer[0] follows 50, seen nowhere before: one plain token; then 1..8 copy the prompt
    # after the anchor 9, a run of 8 of which a block may take 7 (the verifier adds the 8th).
    prompt, answer = [9, 1, 2, 3, 4, 5, 6, 7, 8, 50], [9, 1, 2, 3, 4, 5, 6, 7, 8]
    assert copy_runs(prompt, answer).tolist() == [0, 8, 7, 6, 5, 4, 3, 2, 1]
    one_block = 1.0 + LINEAR(8)  # 1 plain + 7 proposed and 1 verified
    assert copy_bound(prompt, answer, LINEAR) == pytest.approx(9 / one_block)
    two_blocks = 1.0 + 2 * LINEAR(4)  # blocks of at most 3: 3 + 1, then 3 + 1
    assert copy_bound(prompt, answer, LINEAR, max_block=3) == pytest.approx(9 / two_blocks)


def test_an_edit_is_copied_on_only_without_the_anchor() -> None:
    # the answer renames 5 to 9 and goes on copying: right after 9 (seen nowhere before) only
    # an unanchored copier can propose 6, 7, 8; that lifts its bound above the anchored one
    prompt, answer = [1, 2, 3, 4, 5, 6, 7, 8, 0], [1, 2, 3, 4, 9, 6, 7, 8]
    assert copy_runs(prompt, answer).tolist()[5] == 0
    assert copy_runs(prompt, answer, anchored=False).tolist()[5] == 3
    unanchored = copy_bound(prompt, answer, LINEAR, anchored=False)
    assert unanchored > copy_bound(prompt, answer, LINEAR)


def test_a_step_in_the_curve_prices_a_block_at_the_cheapest_larger_evaluation() -> None:
    stepped = CostCurve((1.0, 1.1, 5.0, 1.2))  # three tokens cost more than four
    prompt, answer = [7, 1, 2, 3], [7, 1, 2, 3]  # answer[1:] copies 1, 2, 3 after the anchor 7
    # one plain token, then 2 proposed + 1 verified: three tokens, priced as four
    assert copy_bound(prompt, answer, stepped, max_block=3) == pytest.approx(4 / (1.0 + 1.2))


@pytest.mark.parametrize("seed", range(6))
def test_no_replay_of_auto_beats_the_bound(seed: int) -> None:
    rng = random.Random(seed)
    source = [rng.randrange(200) for _ in range(120)]
    answer: list[int] = []
    while len(answer) < 150:  # copies of the source, cut by edits and fresh text
        at = rng.randrange(len(source) - 30)
        answer += source[at : at + rng.randint(3, 30)]
        answer += [200 + rng.randrange(50) for _ in range(rng.randint(0, 4))]
    curve = CostCurve.shaped(0.03, 0.01)
    r = replay(source, answer, curve)
    model_seconds = r.seconds - r.evaluations * ROUND_OVERHEAD
    auto = len(answer) * curve(1) / model_seconds
    bound = copy_bound(source, answer, curve)
    assert auto > 1.2  # the answer copies, and auto gains on it
    assert auto <= bound + 1e-9
