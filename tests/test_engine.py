"""The engine on tiny generated models: lossless modes are lossless, stats add up, no KV drift."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from lossless import TINY_TIE, assert_same_or_near_tie, kernel_atol

from pyramid_gguf import Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.core.errors import ContextOverflow, UserError
from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.decoding.runtime.tiers import common_prefix
from pyramid_gguf.native import NativeModel

PROMPTS = [
    "the model of the tree",
    "def return if else for while import class self print",
    "a",
    "graph path file line text word code test model token layer batch cache and the",
]
GREEDY = SamplingConfig(temperature=0, max_tokens=48, ignore_eos=True)


def reference(p: Pyramid, prompt: str, sampling: SamplingConfig = GREEDY) -> list[int]:
    return p.generate(prompt, sampling, SpecConfig(mode="target")).token_ids


@pytest.mark.parametrize("mode", ["sd", "psd-exact"])
@pytest.mark.parametrize(("l_d", "l_q"), [(1, 1), (2, 3), (4, 8), (7, 16)])
def test_greedy_lossless_modes_match_target(
    pyramid: Pyramid, mode: str, l_d: int, l_q: int
) -> None:
    spec = SpecConfig(mode=mode, l_d=l_d, l_q=l_q)  # type: ignore[arg-type]
    for prompt in PROMPTS:
        tokens = pyramid.tokenize(prompt)
        got = pyramid.generate(tokens, GREEDY, spec)
        assert_same_or_near_tie(
            pyramid, tokens, got.token_ids, reference(pyramid, prompt), TINY_TIE
        )
        assert len(got.token_ids) == GREEDY.max_tokens
        for stage in got.stats.stages:
            assert 0 <= stage.draft_n_accepted <= stage.draft_n
            assert sum(stage.histogram) == stage.verifications


def test_speculation_actually_accepts_and_rejects(pyramid: Pyramid) -> None:
    """The tiny ladder is informative: some proposals pass, some fail, at both stages."""
    got = pyramid.generate(PROMPTS[0], GREEDY, SpecConfig(mode="psd-exact", l_d=4, l_q=8))
    for stage in got.stats.stages:
        assert 0 < stage.draft_n_accepted < stage.draft_n, stage


@pytest.mark.parametrize("mode", ["sd", "psd-exact"])
def test_ngram_bottom_tier_is_lossless(ngram_pyramid: Pyramid, mode: str) -> None:
    spec = SpecConfig(mode=mode, l_d=3, l_q=6, ngram_min=2)  # type: ignore[arg-type]
    for prompt in PROMPTS:
        tokens = ngram_pyramid.tokenize(prompt)
        got = ngram_pyramid.generate(tokens, GREEDY, spec)
        want = reference(ngram_pyramid, prompt)
        assert_same_or_near_tie(ngram_pyramid, tokens, got.token_ids, want, TINY_TIE)
        assert got.stats.stages[0].name.startswith("ngram->")


def test_greedy_match_rule_is_lossless(pyramid: Pyramid) -> None:
    spec = SpecConfig(mode="psd-exact", l_d=3, l_q=6, exact_rule="greedy-match")
    for prompt in PROMPTS[:2]:
        tokens = pyramid.tokenize(prompt)
        got = pyramid.generate(tokens, GREEDY, spec).token_ids
        assert_same_or_near_tie(pyramid, tokens, got, reference(pyramid, prompt), TINY_TIE)


@pytest.mark.parametrize("mode", ["fsd", "psd-a", "psd-f"])
def test_fuzzy_modes_with_negative_tau_are_exact(pyramid: Pyramid, mode: str) -> None:
    spec = SpecConfig(mode=mode, l_d=3, l_q=6, tau_q=-1, tau_t=-1)  # type: ignore[arg-type]
    for prompt in PROMPTS[:2]:
        tokens = pyramid.tokenize(prompt)
        got = pyramid.generate(tokens, GREEDY, spec).token_ids
        assert_same_or_near_tie(pyramid, tokens, got, reference(pyramid, prompt), TINY_TIE)


def test_fuzzy_with_huge_tau_accepts_every_proposal(pyramid: Pyramid) -> None:
    got = pyramid.generate(PROMPTS[0], GREEDY, SpecConfig(mode="fsd", l_d=4, tau_t=10.0))
    stage = got.stats.stages[0]
    assert stage.draft_n_accepted == stage.draft_n


def test_sampled_modes_are_reproducible_with_a_seed(pyramid: Pyramid) -> None:
    s = SamplingConfig(temperature=1.0, seed=123, max_tokens=30)
    spec = SpecConfig(mode="psd-exact", l_d=3, l_q=6)
    assert (
        pyramid.generate(PROMPTS[0], s, spec).token_ids
        == pyramid.generate(PROMPTS[0], s, spec).token_ids
    )


@pytest.mark.parametrize("seed", [5, 7, 19, 2026])
def test_no_kv_drift_after_many_rounds(
    pyramid: Pyramid, tiny_target: Path, tiny_qualifier: Path, tiny_draft: Path, seed: int
) -> None:
    """After a long sampled generation every tier's cache is what it says it holds.

    A generation ends without a last sync: a tier may still hold its own tail of the last
    round (the qualifier's buffered tokens where the target committed another). That tail is
    harmless, because every later use rolls back to the common prefix first (``sync``,
    ``prefill``), so it is at most one block, and once rolled back each tier's logits equal a
    fresh model's on the committed text."""
    sampling = SamplingConfig(temperature=0.9, seed=seed, max_tokens=120, ignore_eos=True)
    spec = SpecConfig(mode="psd-exact", l_d=4, l_q=8)
    prompt = pyramid.tokenize(PROMPTS[1])
    got = pyramid.generate(prompt, sampling, spec)
    committed = prompt + got.token_ids
    files = {"target": tiny_target, "qualifier": tiny_qualifier, "draft": tiny_draft}
    load = LoadConfig(n_ctx=512, n_threads=1, n_threads_batch=1, flash_attn=False)
    for tier in pyramid.ladder.models:
        held = tier.model.tokens
        assert common_prefix(held, committed) >= len(committed) - (spec.l_q + 2), tier.name
        after = tier.score(committed, [])[0]  # rolls back to the committed text first
        assert tier.model.tokens == committed, tier.name
        with NativeModel(files[tier.name], load) as fresh:
            want = fresh.eval(committed, [-1])[0]
        np.testing.assert_allclose(after, want, atol=kernel_atol(2e-2), err_msg=tier.name)
        assert int(np.argmax(after)) == int(np.argmax(want)), tier.name


def test_eos_inside_a_block_ends_generation(pyramid: Pyramid) -> None:
    """Hot sampling makes EOS likely inside accepted blocks: generation ends right there."""
    s = SamplingConfig(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=60)
    spec = SpecConfig(mode="psd-exact", l_d=4, l_q=8)
    finishes = set()
    for seed in range(40):
        got = pyramid.generate(PROMPTS[2], s.with_(seed=seed), spec)
        finishes.add(got.finish_reason)
        assert not any(pyramid.is_eog(t) for t in got.token_ids)
        assert got.stats.generated_tokens == len(got.token_ids)
        if got.finish_reason == "length":
            assert len(got.token_ids) == s.max_tokens
        else:
            assert got.finish_reason == "stop" and len(got.token_ids) < s.max_tokens
    assert finishes == {"stop", "length"}


def test_stop_string_truncates_text(pyramid: Pyramid) -> None:
    full = pyramid.generate(PROMPTS[0], GREEDY, SpecConfig(mode="target")).text
    stop = full[10:14]
    got = pyramid.generate(PROMPTS[0], GREEDY.with_(stop=(stop,)), SpecConfig(mode="psd-exact"))
    assert got.finish_reason == "stop"
    assert got.text == full[: full.index(stop)]


def test_prompt_longer_than_context_is_refused(pyramid: Pyramid) -> None:
    with pytest.raises(ContextOverflow, match="does not fit"):
        pyramid.generate(list(range(3, 3 + 600)), GREEDY)


def test_missing_tier_for_mode_is_a_user_error(tiny_target: Path, tiny_load: LoadConfig) -> None:
    with Pyramid.from_paths(tiny_target, load=tiny_load) as p:
        assert p.spec.mode == "auto"
        with pytest.raises(UserError, match="needs a draft"):
            p.generate("a", GREEDY, SpecConfig(mode="sd"))


def test_cancel_stops_generation(pyramid: Pyramid) -> None:
    """``Job.cancel`` ends a generation at its next token; its reader gets what was made and
    the finish reason ``cancelled``."""
    from queue import SimpleQueue

    from pyramid_gguf.api import Response

    steps: SimpleQueue[object] = SimpleQueue()
    jobs = []

    def deliver(item: object) -> None:
        steps.put(item)
        if isinstance(item, Response) and item.token_ids:
            jobs[0].cancel()  # after the first token

    jobs.append(pyramid.submit(PROMPTS[0], GREEDY, SpecConfig(mode="sd"), deliver=deliver))
    got = []
    while (item := steps.get(timeout=30)) is not None:
        assert isinstance(item, Response)
        got.append(item)
    assert got[-1].finish_reason == "cancelled"
    assert 1 <= sum(len(r.token_ids) for r in got) < GREEDY.max_tokens


def test_lag_counts_from_the_prefix_shared_with_the_committed_text(pyramid: Pyramid) -> None:
    """A tier holding its own rejected tokens past the committed text must re-evaluate from
    where they part: ``auto`` prices that catch-up (a count of held tokens would say 0)."""
    tier = pyramid.ladder.draft
    assert tier is not None and not isinstance(tier, str)
    prompt = pyramid.tokenize("the model of the tree")
    tier.model.reset()
    tier.model.eval([*prompt, 7, 8])  # the tier's own proposals, later rejected
    committed = [*prompt, 9, 10, 11]
    assert tier.lag(committed) == len(committed) - 1 - len(prompt)
    tier.model.reset()
    tier.model.eval(committed[:-1])
    assert tier.lag(committed) == 0
    tier.model.reset()


def test_summary_names_the_prompt_tokens_reused_from_the_cache(pyramid: Pyramid) -> None:
    """A prompt the context already holds is mostly not evaluated again: the stats line says how
    much was reused, so its prompt rate (evaluated tokens per second) is not read as slow."""
    tokens = pyramid.tokenize(PROMPTS[3])
    pyramid.generate(pyramid.tokenize(PROMPTS[2]), GREEDY, SpecConfig(mode="target"))
    first = pyramid.generate(tokens, GREEDY, SpecConfig(mode="target")).stats
    again = pyramid.generate(tokens, GREEDY, SpecConfig(mode="target")).stats
    assert 0 < again.prompt_evaluated < first.prompt_evaluated <= len(tokens)
    for stats in (first, again):
        cached = len(tokens) - stats.prompt_evaluated
        said = (
            f"prompt {len(tokens)} tok ({cached} cached) "
            if cached
            else f"prompt {len(tokens)} tok "
        )
        assert stats.summary().startswith(said)


def test_the_ladders_facts_are_read_without_its_tiers(
    pyramid: Pyramid, tiny_target: Path, tiny_draft: Path, tiny_qualifier: Path
) -> None:
    """What serving, the CLI and benchmarks read of a loaded ladder (``runtime/facts.py``):
    the context every request must fit, the vocabulary, the target's file, and each tier's."""
    assert pyramid.n_ctx == min(m.n_ctx for m in pyramid.ladder.models)
    assert pyramid.n_vocab == pyramid.vocab.n_vocab > 0
    assert pyramid.model_path == tiny_target
    assert pyramid.metadata()["general.architecture"] == "llama"
    tiers = pyramid.tiers()
    assert [t.name for t in tiers] == ["draft", "qualifier", "target"]
    assert [t.path for t in tiers] == [tiny_draft, tiny_qualifier, tiny_target]
    assert all(t.size == t.path.stat().st_size and t.weights for t in tiers)
    assert pyramid.detokenize(pyramid.tokenize("the model")).endswith("the model")
