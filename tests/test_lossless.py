"""Every lossless mode is lossless, on tiny generated models (any CPU).

- Distribution: the first two sampled tokens (the second is the first one a speculative round
  decides) follow the target's own joint distribution, by a chi-square test over thousands of
  seeds, for ``sd``, ``psd-exact`` (model and n-gram bottom), the greedy-match rule and
  ``auto`` (priced as on a GPU, so that it really runs model chains). A power check shows the
  same test rejects the draft's distribution.
- Greedy: ``--strict-identity`` makes output bit-identical to ``target``; ``auto`` follows the
  cost model (a small-CPU curve keeps it on plain decoding, a GPU curve makes it speculate)
  and stays on target's tokens either way.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_LOAD
from lossless import (
    GREEDY,
    HOT,
    PROMPT,
    TINY_TIE,
    assert_same_or_near_tie,
    chain_joint,
    chi_square_pvalue,
    generate,
    joint,
    pairs,
    shaped_costs,
)

from pyramid_gguf import Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.decoding.runtime.tiers import ModelTier


@pytest.mark.parametrize(
    "spec",
    [
        SpecConfig(mode="sd", l_d=3),
        SpecConfig(mode="psd-exact", l_d=2, l_q=3),
        SpecConfig(mode="sd", l_d=3, exact_rule="greedy-match"),
        SpecConfig(mode="auto"),
    ],
    ids=["sd", "psd-exact", "greedy-match", "auto"],
)
def test_sampled_tokens_follow_the_target_distribution(pyramid: Pyramid, spec: SpecConfig) -> None:
    prompt = pyramid.tokenize(PROMPT)
    gpu = shaped_costs(pyramid, per_token=0.02, draft=0.15)
    seen: set[str] = set()

    def run(seed: int) -> list[int]:
        tokens, stats = generate(pyramid, prompt, spec, HOT.with_(seed=seed), gpu)
        seen.update(s.name for s in stats.stages if s.verifications)
        return tokens

    sampled = pairs(run, pyramid.ladder.target.n_vocab)
    assert seen, "no speculative round ran: the test would prove nothing"
    assert chi_square_pvalue(sampled, joint(pyramid.ladder.target, prompt)) > 0.001
    # Power: the draft's distribution is rejected by the same test on the same samples.
    draft = pyramid.ladder.draft
    assert isinstance(draft, ModelTier)
    assert chi_square_pvalue(sampled, joint(draft, prompt)) < 1e-4


def test_ngram_bottom_pyramid_follows_the_target_distribution(ngram_pyramid: Pyramid) -> None:
    p = ngram_pyramid
    prompt = p.tokenize("the tree the tree the tree the")
    spec = SpecConfig(mode="psd-exact", l_d=2, l_q=3, ngram_min=2)

    def run(seed: int) -> list[int]:
        return p.generate(prompt, HOT.with_(seed=seed), spec).token_ids

    sampled = pairs(run, p.ladder.target.n_vocab)
    assert chi_square_pvalue(sampled, joint(p.ladder.target, prompt)) > 0.001


@pytest.mark.parametrize("mode", ["sd", "psd-exact", "auto"])
def test_strict_identity_is_bit_identical_to_target(
    tiny_target: Path, tiny_qualifier: Path, tiny_draft: Path, mode: str
) -> None:
    load = replace(TINY_LOAD, strict_identity=True)
    with Pyramid.from_paths(
        tiny_target, draft=tiny_draft, qualifier=tiny_qualifier, load=load
    ) as p:
        assert p.ladder.target.chunk == 0  # probed on first use
        for text in ("the model of the tree", "a", "def return if else"):
            want = p.generate(text, GREEDY, SpecConfig(mode="target")).token_ids
            got = p.generate(text, GREEDY, SpecConfig(mode=mode, l_d=4, l_q=8))  # type: ignore[arg-type]
            assert got.token_ids == want
        assert 1 <= p.ladder.target.chunk <= 16


def test_auto_follows_the_cost_model(pyramid: Pyramid) -> None:
    """Priced as a small CPU (a batch costs as many tokens, the draft most of the target),
    auto decodes plainly and never evaluates the draft or qualifier; priced as a GPU it runs
    model chains. Its greedy tokens are target's either way."""
    cpu = shaped_costs(pyramid, per_token=1.0, draft=0.6)
    gpu = shaped_costs(pyramid, per_token=0.02, draft=0.15)
    for text in ("the model of the tree", "def return if else"):
        prompt = pyramid.tokenize(text)
        want = pyramid.generate(prompt, GREEDY, SpecConfig(mode="target")).token_ids
        small = [m for m in pyramid.ladder.models if m is not pyramid.ladder.target]
        before = [m.timer.snapshot() for m in small]
        got, stats = generate(pyramid, prompt, SpecConfig(mode="auto"), GREEDY, cpu)
        assert stats.auto is not None and set(stats.auto.choices) <= {"target", "ngram"}
        assert [m.timer.snapshot() for m in small] == before  # never evaluated
        assert_same_or_near_tie(pyramid, prompt, got, want, TINY_TIE)
        got, stats = generate(pyramid, prompt, SpecConfig(mode="auto"), GREEDY, gpu)
        assert stats.auto is not None
        assert set(stats.auto.choices) & {"draft", "qualifier", "pyramid"}
        assert max(stats.auto.outlook.values()) > 1.0
        assert_same_or_near_tie(pyramid, prompt, got, want, TINY_TIE)


def test_auto_uses_ngram_where_text_repeats(pyramid: Pyramid) -> None:
    """Greedy decoding of the tiny target after "a" settles into a loop; once it does, auto
    (priced as a GPU, the models too dear to draft) proposes the n-gram continuation and the
    target keeps most of it."""
    target_only = SpecConfig(mode="target")
    prompt = pyramid.tokenize("a")
    want = pyramid.generate(prompt, GREEDY.with_(max_tokens=80), target_only).token_ids
    assert len(set(want[-20:])) <= 4, "the tiny model no longer loops; pick another prompt"
    gpu = shaped_costs(pyramid, per_token=0.02, draft=10.0)
    got, stats = generate(
        pyramid, prompt, SpecConfig(mode="auto"), GREEDY.with_(max_tokens=80), gpu
    )
    assert_same_or_near_tie(pyramid, prompt, got, want, TINY_TIE)
    assert stats.auto is not None and "ngram" in stats.auto.choices
    ngram = next(s for s in stats.stages if s.name == "ngram->target")
    assert ngram.draft_n_accepted > 20 and ngram.acceptance_rate > 0.5


# --- llama.cpp's other samplers: every tier warps the same way, each position after its prefix


def _chains(pyramid: Pyramid, prompt: list[int]) -> dict[str, SamplingConfig]:
    """Penalties with a logit bias that bans the target's favourite, and XTC with typical."""
    top = int(np.argmax(pyramid.ladder.target.score(prompt, [])[0]))
    pyramid.ladder.target.model.reset()
    return {
        "penalties+bias": HOT.with_(
            repeat_penalty=1.3,
            presence_penalty=1.5,
            frequency_penalty=0.5,
            repeat_last_n=-1,
            logit_bias=((top, -np.inf), (top + 1, 2.0)),
        ),
        "xtc+typical": HOT.with_(xtc_probability=0.5, xtc_threshold=0.05, typical_p=0.9),
    }


@pytest.mark.parametrize(
    ("spec", "chain"),
    [
        (SpecConfig(mode="sd", l_d=3), "penalties+bias"),
        (SpecConfig(mode="psd-exact", l_d=2, l_q=3), "xtc+typical"),
    ],
    ids=["sd-penalties-bias", "psd-exact-xtc-typical"],
)
def test_llama_samplers_stay_lossless(pyramid: Pyramid, spec: SpecConfig, chain: str) -> None:
    prompt = pyramid.tokenize("the tree the model of the tree")
    sampling = _chains(pyramid, prompt)[chain]
    seen: set[str] = set()

    def run(seed: int) -> list[int]:
        tokens, stats = generate(pyramid, prompt, spec, sampling.with_(seed=seed))
        seen.update(s.name for s in stats.stages if s.verifications)
        return tokens

    sampled = pairs(run, pyramid.ladder.target.n_vocab)
    assert seen, "no speculative round ran: the test would prove nothing"
    want = chain_joint(pyramid.ladder.target, prompt, sampling)
    assert chi_square_pvalue(sampled, want) > 0.001
    # Power: the target without the chain (plain HOT) is rejected on the same samples.
    assert chi_square_pvalue(sampled, joint(pyramid.ladder.target, prompt)) < 1e-4


@pytest.mark.parametrize("mode", ["sd", "psd-exact"])
def test_greedy_under_penalties_and_bias_is_target_decoding(
    tiny_target: Path, tiny_qualifier: Path, tiny_draft: Path, mode: str
) -> None:
    load = replace(TINY_LOAD, strict_identity=True)
    with Pyramid.from_paths(
        tiny_target, draft=tiny_draft, qualifier=tiny_qualifier, load=load
    ) as p:
        for text in ("the model of the tree", "a"):
            prompt = p.tokenize(text)
            plain = p.generate(prompt, GREEDY, SpecConfig(mode="target")).token_ids
            sampling = GREEDY.with_(
                repeat_penalty=1.5, presence_penalty=0.5, logit_bias=((plain[0], -np.inf),)
            )
            want = p.generate(prompt, sampling, SpecConfig(mode="target")).token_ids
            assert want != plain and plain[0] not in want[:1]
            got = p.generate(prompt, sampling, SpecConfig(mode=mode, l_d=4, l_q=8))  # type: ignore[arg-type]
            assert got.token_ids == want
