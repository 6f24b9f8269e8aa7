"""Log-probabilities of emitted tokens: the target's own, in every mode, through the API and the
server in OpenAI's shapes (completions' parallel lists, chat's content list)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import TINY_LOAD
from lossless import kernel_atol, target_logits_at
from serving_support import live_server

from pyramid_gguf import Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.decoding.runtime.calibrate import Calibration
from pyramid_gguf.decoding.runtime.sampling import log_softmax
from pyramid_gguf.serving.settings import ServerSettings


@pytest.fixture(scope="module")
def pyramid(tiny_target: Path, tiny_qualifier: Path, tiny_draft: Path) -> Iterator[Pyramid]:
    with Pyramid.from_paths(
        tiny_target, draft=tiny_draft, qualifier=tiny_qualifier, load=TINY_LOAD
    ) as p:
        p._calibration = {  # a GPU-shaped machine, so that auto runs model chains too
            t.name: Calibration(CostCurve.shaped(1.0 if t.name == "target" else 0.1, 0.02))
            for t in p.ladder.models
        }
        yield p


@pytest.mark.parametrize("mode", ["target", "sd", "psd-exact", "auto"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_each_token_carries_the_targets_log_probability(
    pyramid: Pyramid, mode: str, temperature: float
) -> None:
    prompt = pyramid.tokenize("def return if else for while import class")
    sampling = SamplingConfig(temperature=temperature, seed=3, max_tokens=12, ignore_eos=True)
    steps = list(pyramid.stream(prompt, sampling, SpecConfig(mode=mode), logprobs=3))
    tokens = [t for s in steps for t in s.token_ids]
    lps = [lp for s in steps for lp in s.logprobs]
    assert [lp.token for lp in lps] == tokens and len(tokens) == 12
    for i, lp in enumerate(lps):
        want = log_softmax(target_logits_at(pyramid, prompt, tokens[:i]))
        assert lp.logprob == pytest.approx(want[lp.token], abs=kernel_atol(2e-3))
        assert len(lp.top) == 3 and lp.top[0][2] >= lp.top[1][2] >= lp.top[2][2]
        assert lp.top[0][2] == pytest.approx(want.max(), abs=kernel_atol(2e-3))
        if temperature == 0:  # greedy: the token is the target's top choice, up to a near-tie
            assert lp.logprob >= lp.top[0][2] - kernel_atol(2e-3)
        assert lp.piece == pyramid.ladder.target.vocab.token_bytes(lp.token)
    assert np.all(np.array([lp.logprob for lp in lps]) <= 0)


def test_without_logprobs_nothing_is_kept(pyramid: Pyramid) -> None:
    steps = list(pyramid.stream("def", SamplingConfig(temperature=0, max_tokens=4)))
    assert all(s.logprobs == () for s in steps)


@pytest.fixture(scope="module")
def url(pyramid: Pyramid) -> Iterator[str]:
    settings = ServerSettings(sampling=SamplingConfig(max_tokens=8), spec=SpecConfig(mode="sd"))
    with live_server(pyramid, settings) as live:
        yield live.v1


def test_completions_answer_logprobs_in_openais_legacy_shape(url: str) -> None:
    body = {"prompt": "def return", "max_tokens": 6, "temperature": 0, "logprobs": 2}
    out = httpx.post(f"{url}/completions", json=body, timeout=60).json()
    lp = out["choices"][0]["logprobs"]
    n = out["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n
    assert "".join(lp["tokens"]) == out["choices"][0]["text"]
    assert lp["text_offset"][0] == 0 and all(v <= 0 for v in lp["token_logprobs"])
    assert all(len(alts) <= 2 for alts in lp["top_logprobs"])
    plain = httpx.post(f"{url}/completions", json={**body, "logprobs": None}, timeout=60).json()
    assert plain["choices"][0]["logprobs"] is None


def test_chat_answers_logprobs_in_openais_shape_streamed_or_not(url: str) -> None:
    body = {
        "messages": [{"role": "user", "content": "the cat"}],
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    out = httpx.post(f"{url}/chat/completions", json=body, timeout=60).json()
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"]
    assert all(len(c["top_logprobs"]) == 2 and c["logprob"] <= 0 for c in content)
    assert (
        bytes(b for c in content for b in c["bytes"]).decode()
        == (out["choices"][0]["message"]["content"])
    )
    with httpx.stream("POST", f"{url}/chat/completions", json={**body, "stream": True}) as r:
        chunks = [ln for ln in r.iter_lines() if ln.startswith("data: {")]
    streamed = [
        c
        for ln in chunks
        for ch in json.loads(ln[6:])["choices"]
        if ch.get("logprobs")
        for c in ch["logprobs"]["content"]
    ]
    assert [c["token"] for c in streamed] == [c["token"] for c in content]


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("completions", {"prompt": "x", "logprobs": 50}, "logprobs"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
         "top_logprobs"),
    ],
)  # fmt: skip
def test_bad_logprob_requests_are_400(url: str, path: str, extra: dict, param: str) -> None:
    r = httpx.post(f"{url}/{path}", json={"max_tokens": 2, **extra}, timeout=60)
    assert r.status_code == 400, r.text
    assert param in r.text
