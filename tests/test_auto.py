"""``auto``'s scheduling on a scripted target (no model): what it bets, and what it risks.

The target here (:mod:`pyramid_gguf.decoding.offline.replay`) always predicts a fixed token
sequence, so every n-gram proposal is kept or refused deterministically and the only thing under
test is the scheduler: the cost curve, the acceptance estimates, the budget
(:class:`pyramid_gguf.decoding.pricing.policy.Budget`) and shadow blocks.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pytest
from cost_curves import AVX512, NOAMX
from traces_fixtures import synthetic_trace

from pyramid_gguf.core.sampling import SamplingConfig
from pyramid_gguf.core.spec import SpecConfig
from pyramid_gguf.decoding.offline.replay import ScriptedTarget, replay, replay_trace
from pyramid_gguf.decoding.pricing import policy
from pyramid_gguf.decoding.pricing.chains import Chain, Keep
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.decoding.pricing.estimates import CARRY_TRIED, CHAIN_PRIOR, KeepMemory
from pyramid_gguf.decoding.runtime import ngram
from pyramid_gguf.decoding.runtime.auto import AutoScheduler
from pyramid_gguf.decoding.runtime.sampling import Sampler
from pyramid_gguf.decoding.runtime.stats import AutoStats, GenerationStats
from pyramid_gguf.decoding.runtime.tiers import Ladder, ModelTier


def run_auto(
    prompt: list[int], answer: list[int], curve: CostCurve = AVX512
) -> tuple[list[int], AutoStats, int]:
    """Decode ``answer`` after ``prompt`` with ``auto`` priced by a 2-core CPU curve."""
    r = replay(prompt, answer, curve)
    return r.tokens, r.auto, r.evaluations


def echo_text(rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """An answer that repeats a 6-token phrase of its own, each time followed by a new token:
    the n-gram drafter always proposes what followed it last time, and is always wrong."""
    phrase = [int(t) for t in rng.choice(np.arange(10, 100), 6, replace=False)]
    answer: list[int] = []
    for i in range(16):
        answer += [*phrase, 200 + i]
    return [int(t) for t in rng.integers(300, 500, 20)], answer


def quote() -> tuple[list[int], list[int]]:
    """A prompt of 120 distinct tokens and an answer that quotes 60 of them."""
    rng = np.random.default_rng(3)
    prompt = [int(t) for t in rng.permutation(np.arange(10, 300))[:120]]
    return prompt, prompt[40:100]


def decode_scripted(
    target: ScriptedTarget,
    prompt: list[int],
    answer: list[int],
    curve: CostCurve = AVX512,
    debt: float = 0.0,
) -> tuple[list[int], AutoScheduler]:
    """Decode after ``prompt`` with ``auto`` on a ladder of ``target`` alone, priced by
    ``curve``, until the answer is as long as ``answer`` (``debt``: failed shadows left the
    budget that much in debt); the tokens decoded and the scheduler."""
    stats = GenerationStats(mode="auto")
    sampler = Sampler(SamplingConfig(temperature=0, max_tokens=len(answer)))
    ladder = Ladder(target=cast(ModelTier, target))
    rounds = AutoScheduler(ladder, SpecConfig(mode="auto"), sampler, stats, {"target": curve})
    rounds.ledger.shadow_credit = -debt
    committed = list(prompt)
    while len(committed) < len(prompt) + len(answer):
        committed += rounds.run(committed, len(prompt) + len(answer) - len(committed))
    return committed[len(prompt) :], rounds


def test_an_answer_that_quotes_its_prompt_is_copied_in_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first plain rounds settle as shadow blocks that would have been kept: they teach
    the estimates and credit the budget, so auto starts proposing sooner than it would on
    real savings alone, and then copies in blocks. On the no-AMX curve no first bet is
    confident, so without shadow credit auto never starts. (Shadows alone: a quote of
    COPY_EVIDENCE tokens lifts the budget, see the next test.)"""
    monkeypatch.setattr(ngram, "COPY_EVIDENCE", 10**6)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.permutation(np.arange(10, 300))[:120]]
    got, auto, evaluations = run_auto(prompt, prompt[:100], NOAMX)
    assert got == prompt[:100]
    assert auto.choices["ngram"].committed > 80
    assert evaluations < 40  # 100 tokens in blocks, not one by one
    assert auto.savings > 0 and auto.shadows > 0 and auto.shadow_credit > 0
    monkeypatch.setattr(policy, "SHADOW_CREDIT", 0.0)
    got, uncredited, later = run_auto(prompt, prompt[:100], NOAMX)
    assert got == prompt[:100] and uncredited.shadow_credit == 0
    assert later > evaluations


def test_an_answer_copying_its_prompt_bets_whatever_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A quote of COPY_EVIDENCE tokens is what llama.cpp's ngram-simple bets on: auto proposes
    blocks from it even when failed shadows have left the budget in debt (as RAG answers that
    restate the question do), bounded by its estimates only. Without that rule the debt keeps
    it on plain decoding through the whole copy."""
    prompt, answer = quote()

    def run(debt: float) -> tuple[list[int], AutoStats, int]:
        target = ScriptedTarget([*prompt, *answer], AVX512)
        got, rounds = decode_scripted(target, prompt, answer, debt=debt)
        return got, rounds.auto, target.evaluations

    got, copying, evaluations = run(debt=10.0)
    assert got == answer and copying.shadow_credit < -9
    assert copying.choices["ngram"].committed > 40 and evaluations < 25
    monkeypatch.setattr(ngram, "COPY_EVIDENCE", 10**6)
    got, held, plain = run(debt=10.0)
    assert got == answer and "ngram" not in held.choices and plain == len(answer)


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
    assert got == answer and reckless.unfunded < guarded.unfunded
    assert reckless.savings < guarded.savings
    assert rounds_of(reckless, "ngram") > rounds_of(guarded, "ngram")


def test_blocks_on_a_hybrid_target_stay_within_its_snapshots() -> None:
    """A hybrid target drops natively only as many tokens as llama.cpp keeps recurrent-state
    snapshots of; a deeper drop restores a saved state that may be many rounds old, which
    calibration does not price. So auto copies a quote in blocks of at most that many tokens
    there, and in longer ones on a plain KV cache (a GPU-like curve: a long block costs little
    more than one token)."""
    flat = CostCurve.shaped(0.03, 0.0002)
    prompt, answer = quote()

    class Hybrid:
        n_rs_seq, snapshot_reason = 4, "hybrid"

    def longest_block(loaded: object) -> int:
        target = ScriptedTarget([*prompt, *answer], flat)
        target.loaded = loaded  # type: ignore[attr-defined]
        blocks = []
        score = target.score
        target.score = lambda c, t: (blocks.append(len(t)), score(c, t))[1]  # type: ignore[method-assign]
        got, _ = decode_scripted(target, prompt, answer, flat)
        assert got == answer
        return max(blocks)

    assert longest_block(Hybrid()) <= Hybrid.n_rs_seq
    assert longest_block(None) > Hybrid.n_rs_seq


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


def _uncached_bound(
    self: AutoScheduler, chain: Chain, keeps: tuple[Keep, ...], max_k: int, forced: int, priced
) -> policy.Option | None:
    costs, batch = priced
    return chain.price(costs, keeps, max_k, overhead=self.overhead, forced=forced, batch=batch).best


@pytest.mark.parametrize("agree", [0.0, 0.5, 0.9])
def test_auto_skips_pricing_it_can_prove_refused_and_chooses_the_same(
    monkeypatch: pytest.MonkeyPatch, agree: float
) -> None:
    """A hybrid-like CPU target (14 ms a token, 6 ms each more) and a cheap head (1.7 ms): at
    its optimistic keep rate the head's chain looks worth a bet, yet a draft that never agrees
    earns nothing to fund one. ``auto`` prices such a chain once per :data:`REFUSAL_ROUNDS`
    rounds, not every round, and reuses a lone draft's bound across shorter block limits;
    every round still chooses what pricing it in full chooses."""
    trace = synthetic_trace(4, n=160, draft=agree)
    costs = {"target": CostCurve.shaped(0.014, 0.006), "draft": CostCurve.shaped(0.0017, 0.0015)}
    calls = [0]
    price = Chain.price

    def counted(self: Chain, *args: Any, **kwargs: Any) -> policy.Pick:
        calls[0] += 1
        return price(self, *args, **kwargs)

    monkeypatch.setattr(Chain, "price", counted)
    cached = replay_trace(trace, costs, SpecConfig(mode="auto"))
    skipping = calls[0]
    calls[0] = 0
    monkeypatch.setattr(AutoScheduler, "_refused", lambda *args: None)
    monkeypatch.setattr(AutoScheduler, "_bound", _uncached_bound)
    full = replay_trace(trace, costs, SpecConfig(mode="auto"))
    assert cached.tokens == full.tokens == list(trace.answer)
    chosen = {c: (s.rounds, s.proposed, s.committed) for c, s in cached.auto.choices.items()}
    assert chosen == {c: (s.rounds, s.proposed, s.committed) for c, s in full.auto.choices.items()}
    assert cached.seconds == full.seconds and cached.evaluations == full.evaluations
    if agree == 0.0:
        assert "draft" not in cached.auto.choices and cached.auto.outlook["draft"] > 1.03
        assert skipping < calls[0] / 4


#: The synthetic hybrid's curve as measured on a 2-core Xeon (2-4 token batches cost little more
#: than two tokens) and its MTP head's (1.4 ms a token).
HYBRID_HEAD = {
    "target": CostCurve((0.025, 0.037, 0.0371, 0.041, 0.0548, 0.06, 0.065, 0.07)),
    "draft": CostCurve.shaped(0.0014, 0.0013),
}


def test_a_head_too_unsure_to_propose_is_soon_given_up() -> None:
    """A cheap head (1.4 ms) on a hybrid-like target whose 2-4 token batches cost little more
    than two tokens, never agreeing and never sure enough to propose (top probability 0.05):
    each try of its chain withholds the first token and commits what plain decoding would, a
    draft step dearer. Taught as a refusal, the chain's keep rate falls and auto gives it up
    after a try or two; untaught, the keep rate's upper bound only grew with the rounds and
    the chain ran every few rounds to the end (46 of 159 rounds, 0.94x plain decoding)."""
    costs = HYBRID_HEAD
    r = replay_trace(synthetic_trace(4, n=160, draft=0.0, top=0.05), costs, SpecConfig(mode="auto"))
    assert r.tokens == list(synthetic_trace(4, n=160).answer)
    assert rounds_of(r.auto, "draft") <= 3 and r.auto.choices["draft"].proposed == 0
    assert r.speedup >= 0.98


def test_the_next_answer_starts_from_what_the_last_one_learned() -> None:
    """A loaded ladder's generations share a :class:`KeepMemory`: after one answer taught auto
    that its draft never agrees (its keep rate worth at most CARRY_TRIED tokens), the next
    answer with the same knobs and sampling never tries the draft at all, where a fresh one (or
    one of other knobs) tries it again; a draft that agrees is trusted from the next answer's
    first rounds."""
    costs = HYBRID_HEAD
    never = synthetic_trace(4, n=160, draft=0.0, top=0.7)
    memory = KeepMemory()
    first = replay_trace(never, costs, SpecConfig(mode="auto"), memory=memory)
    second = replay_trace(never, costs, SpecConfig(mode="auto"), memory=memory)
    fresh = replay_trace(never, costs, SpecConfig(mode="auto"))
    assert rounds_of(first.auto, "draft") == rounds_of(fresh.auto, "draft") >= 1
    assert rounds_of(second.auto, "draft") == 0 and second.speedup >= fresh.speedup
    carried = memory.start((SpecConfig(mode="auto"), True)).rates["draft->target"]
    assert carried.tried <= CARRY_TRIED and carried.mean < CHAIN_PRIOR
    # other knobs, or sampling, learn on their own: they start from the priors
    assert not memory.start((SpecConfig(mode="auto"), False)).rates
    other = replay_trace(never, costs, SpecConfig(mode="auto", max_block=8), memory=memory)
    assert rounds_of(other.auto, "draft") == rounds_of(fresh.auto, "draft")
    agrees = synthetic_trace(5, n=160, draft=0.9, top=0.9)
    memory = KeepMemory()
    replay_trace(agrees, costs, SpecConfig(mode="auto"), memory=memory)
    warm = replay_trace(agrees, costs, SpecConfig(mode="auto"), memory=memory)
    cold = replay_trace(agrees, costs, SpecConfig(mode="auto"))
    assert warm.tokens == cold.tokens == list(agrees.answer)
    assert warm.speedup >= cold.speedup
