"""llama-server's and OpenAI's sampler fields over HTTP (issue 40): each is honoured and
changes the answer, bad values are a 400 naming the field, and mirostat and DRY are refused
with their reason; ``n_probs`` on ``/completion`` reports llama-server's
``completion_probabilities``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import httpx
import pytest
from click.testing import CliRunner
from conftest import TINY_LOAD
from serving_support import Live, live_server

from pyramid_gguf import Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.cli.options import sampling_config_from, sampling_options
from pyramid_gguf.core.sampling import SAMPLER_FIELDS, SamplerField
from pyramid_gguf.serving.anthropic import MessagesRequest
from pyramid_gguf.serving.errors import ApiError
from pyramid_gguf.serving.llama_server import NativeCompletionRequest, _params
from pyramid_gguf.serving.ollama import sampling_of
from pyramid_gguf.serving.responses import ResponsesRequest
from pyramid_gguf.serving.schemas import ChatCompletionRequest
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
        ("xtc_probability", 2, "xtc_probability must be in [0, 1]"),
        ("repeat_penalty", 0, "repeat_penalty must be > 0"),
        ("samplers", "top_k;bogus", "bogus"),
        ("logit_bias", {"": 1}, "empty text"),
        ("logit_bias", [[1, "x"]], "logit_bias"),
        ("logit_bias", {"99999999": 1}, "not in the vocabulary"),
        ("mirostat", 2, "per accepted token"),
        ("dry_allowed_length", -1, "dry_allowed_length must be >= 0"),
        ("top_k", "many", "top_k must be a number"),
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


# --- the one table drives the CLI and every dialect's schema -----------------------------------

BASE = SamplingConfig()
USER = [{"role": "user", "content": "a"}]


def _changed(field: SamplerField) -> float:
    """A valid value of ``field`` other than its default."""
    default = getattr(BASE, field.name)
    for value in (2, 3, 1, 0, 0.5, 0.25, -1):
        if value != default and field.problem(value) is None:
            BASE.with_(**{field.name: value})  # the config takes it too
            return value
    raise AssertionError(f"no valid value for {field.name}")


def _responses(body: dict[str, Any]) -> SamplingConfig:
    request = ResponsesRequest.model_validate({"input": "a", **body})
    return request.sampling(request.extensions().sampling(BASE))


def _readers(field: SamplerField) -> dict[str, Callable[[Any], SamplingConfig]]:
    """Each dialect's reading of a value of ``field`` into its request's sampling."""
    out: dict[str, Callable[[Any], SamplingConfig]] = {
        "openai": lambda v: ChatCompletionRequest.model_validate(
            {"messages": USER, field.name: v}
        ).sampling(BASE),
        "llama-server": lambda v: NativeCompletionRequest.model_validate(
            {"prompt": "a", field.name: v}
        ).sampling(BASE),
        "responses": lambda v: _responses({field.name: v}),
    }
    if field.ollama is not None:
        out["ollama"] = lambda v: sampling_of({field.ollama: v}, BASE, 512)
    if field.anthropic is not None:
        out["anthropic"] = lambda v: MessagesRequest.model_validate(
            {"model": "m", "messages": USER, field.anthropic: v}
        ).sampling(BASE)
    return out


@pytest.mark.parametrize("field", SAMPLER_FIELDS, ids=lambda f: f.name)
def test_every_table_field_reaches_sampling_through_the_cli_and_each_dialect(
    field: SamplerField,
) -> None:
    value = _changed(field)

    @click.command()
    @sampling_options
    def cli(**params: Any) -> None:
        click.echo(repr(getattr(sampling_config_from(params), field.name)))

    ran = CliRunner().invoke(cli, [field.flag, str(value)])
    assert ran.exit_code == 0, ran.output
    assert float(ran.output) == value
    for flag in field.aliases:
        assert float(CliRunner().invoke(cli, [flag, str(value)]).output) == value
    for dialect, read in _readers(field).items():
        assert getattr(read(value), field.name) == value, dialect
    assert _params(BASE.with_(**{field.name: value}))[field.name] == value  # /props echoes it


@pytest.mark.parametrize("field", SAMPLER_FIELDS, ids=lambda f: f.name)
def test_a_bad_table_value_is_a_400_naming_the_field_in_each_dialect(field: SamplerField) -> None:
    for dialect, read in _readers(field).items():
        with pytest.raises(ApiError) as e:
            read("lots")
        name = {"ollama": f"option {field.ollama}", "anthropic": field.anthropic}.get(dialect)
        assert e.value.status == 400, dialect
        assert f"{name or field.name} must be a number" in e.value.message, dialect
    bad = CliRunner().invoke(
        click.command()(sampling_options(lambda **p: None)), [field.flag, "lots"]
    )
    assert bad.exit_code != 0 and field.flag in bad.output
