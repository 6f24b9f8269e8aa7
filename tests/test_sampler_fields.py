"""llama-server's and OpenAI's sampler fields over HTTP (issue 40): each is honoured and
changes the answer, bad values are a 400 naming the field, and mirostat and DRY are refused
with their reason; ``n_probs`` on ``/completion`` reports llama-server's
``completion_probabilities``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import TINY_LOAD
from test_server import Live, live_server

from pyramid_gguf import Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.serving.settings import ServerSettings


@pytest.fixture(scope="module")
def live(tiny_target: Path, tiny_draft: Path) -> Iterator[Live]:
    pyramid = Pyramid.from_paths(
        tiny_target, draft=tiny_draft, load=TINY_LOAD, spec=SpecConfig(mode="sd"), name="tiny"
    )
    settings = ServerSettings(sampling=SamplingConfig(max_tokens=60))
    with pyramid, live_server(pyramid, settings) as server:
        yield server


def post(live: Live, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{live.url}{path}", json=body, timeout=60)


def tokens(live: Live, **body: Any) -> list[int]:
    """The greedy answer's token ids on ``/completion`` (the prompt "a", which loops)."""
    sent = {"prompt": "a", "temperature": 0, "return_tokens": True, "ignore_eos": True}
    r = post(live, "/completion", {**sent, **body})
    assert r.status_code == 200, r.text
    return list(r.json()["tokens"])


def test_logit_bias_banning_the_greedy_token_changes_it(live: Live) -> None:
    first = tokens(live, n_predict=1)[0]
    for bias in ([[first, False]], [[first, -1e9]], {str(first): -100}):
        assert tokens(live, n_predict=1, logit_bias=bias)[0] != first
    r = post(
        live,
        "/v1/completions",
        {"prompt": "a", "temperature": 0, "max_tokens": 1, "logit_bias": {str(first): -100}},
    )
    plain = post(live, "/v1/completions", {"prompt": "a", "temperature": 0, "max_tokens": 1})
    assert r.status_code == plain.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] != plain.json()["choices"][0]["text"]


def test_logit_bias_by_text_biases_each_of_its_tokens(live: Live) -> None:
    """llama-server's text keys: every token of the text (tokenized without BOS or special
    tokens) gets the bias, exactly as if each id had been sent (a repeated token twice, as
    llama.cpp adds up repeated entries)."""
    vocab = live.pyramid.ladder.target.vocab
    text = "the model"
    ids = vocab.tokenize(text, add_special=False, parse_special=False)  # repeats add up
    assert len(set(ids)) >= 2, "pick a text of several tokens"
    by_id = tokens(live, n_predict=3, logit_bias=[[t, 50] for t in ids])
    assert by_id[0] in ids
    for bias in ([[text, 50]], {text: 50}):
        assert tokens(live, n_predict=3, logit_bias=bias) == by_id
    banned = tokens(live, n_predict=3, logit_bias=[[text, False]])
    assert not set(banned) & set(ids)


def test_penalties_change_a_looping_answer(live: Live) -> None:
    plain = tokens(live, n_predict=60)
    assert len(set(plain[-20:])) <= 3, "the tiny model no longer loops; pick another prompt"
    for field in (
        {"repeat_penalty": 3.0},
        {"presence_penalty": 5.0},
        {"frequency_penalty": 2.0},
    ):
        changed = tokens(live, n_predict=60, **field)
        assert changed != plain, field
        assert len(set(changed)) > len(set(plain)), field
    # repeat_last_n 0 turns them off again.
    assert tokens(live, n_predict=60, repeat_penalty=3.0, repeat_last_n=0) == plain


def test_the_other_samplers_are_taken_and_reported(live: Live) -> None:
    body = {
        "typical_p": 0.9,
        "top_n_sigma": 2.0,
        "xtc_probability": 0.5,
        "xtc_threshold": 0.1,
        "dynatemp_range": 0.3,
        "dynatemp_exponent": 1.5,
        "samplers": "kyxt",
    }
    r = post(live, "/completion", {"prompt": "a", "n_predict": 3, "seed": 1, **body})
    assert r.status_code == 200, r.text
    settings = r.json()["generation_settings"]
    assert settings["samplers"] == ["top_k", "typ_p", "xtc", "temperature"]
    assert {k: settings[k] for k in body if k != "samplers"} == {
        k: v for k, v in body.items() if k != "samplers"
    }
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **body}
    assert post(live, "/v1/chat/completions", chat).status_code == 200


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("typical_p", 0, "typical"),
        ("xtc_probability", 2, "xtc-probability"),
        ("repeat_penalty", 0, "repeat-penalty"),
        ("samplers", "top_k;bogus", "bogus"),
        ("logit_bias", {"": 1}, "empty text"),
        ("logit_bias", [[1, "x"]], "logit_bias"),
        ("logit_bias", {"99999999": 1}, "not in the vocabulary"),
        ("mirostat", 2, "per accepted token"),
        ("dry_allowed_length", -1, "dry-allowed-length"),
    ],
)
def test_bad_sampler_fields_are_400s(live: Live, field: str, value: Any, says: str) -> None:
    for path, body in (
        ("/completion", {"prompt": "a", "n_predict": 1}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]}),
    ):
        r = post(live, path, {**body, field: value})
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert says in message and "\n" not in message and "Traceback" not in r.text


def test_n_probs_reports_completion_probabilities(live: Live) -> None:
    body = {"prompt": "a", "temperature": 0, "n_predict": 4, "n_probs": 3, "ignore_eos": True}
    r = post(live, "/completion", {**body, "return_tokens": True})
    assert r.status_code == 200, r.text
    out = r.json()
    probs = out["completion_probabilities"]
    assert [p["id"] for p in probs] == out["tokens"] and out["generation_settings"]["n_probs"] == 3
    for p in probs:
        top = [t["logprob"] for t in p["top_logprobs"]]
        assert len(top) == 3 and top == sorted(top, reverse=True) and top[0] <= 0
        assert p["logprob"] == pytest.approx(top[0])  # greedy: the most likely token
        assert p["top_logprobs"][0]["id"] == p["id"] and isinstance(p["bytes"], list)
    assert "completion_probabilities" not in post(live, "/completion", body | {"n_probs": 0}).json()
    with httpx.stream("POST", f"{live.url}/completion", json={**body, "stream": True}) as s:
        chunks = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    streamed = [p for c in chunks for p in json.loads(c).get("completion_probabilities", [])]
    assert [p["id"] for p in streamed] == out["tokens"]
