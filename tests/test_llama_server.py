"""llama-server's simple routes (issue 40), on the tiny ladder behind an API key: OpenAI's
routes without ``/v1``, ``/tokenize``, ``/detokenize``, ``/apply-template`` and ``/props`` in
the shapes of llama.cpp's own server (its ``tools/server/tests/unit`` tests ask these), bad
input answered in OpenAI's error shape, and the key taken as ``Authorization: Bearer`` or
``X-Api-Key`` on every route but ``/health`` and ``/metrics``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import TINY_LOAD
from test_server import Live, live_server
from test_tools import QWEN_TEMPLATE, TINY_TOOLS

from pyramid_gguf import Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.serving.settings import ServerSettings

KEY = "sk-llama"
AUTH = {"Authorization": f"Bearer {KEY}"}
MESSAGES = [{"role": "user", "content": "What is today?"}]


@pytest.fixture(scope="module")
def live(tiny_target: Path, tiny_draft: Path) -> Iterator[Live]:
    pyramid = Pyramid.from_paths(
        tiny_target, draft=tiny_draft, load=TINY_LOAD, spec=SpecConfig(mode="sd"), name="tiny"
    )
    settings = ServerSettings(api_key=KEY, sampling=SamplingConfig(seed=42, max_tokens=99))
    with pyramid, live_server(pyramid, settings) as server:
        yield server


def post(live: Live, path: str, body: Any, headers: dict[str, str] = AUTH) -> httpx.Response:
    return httpx.post(f"{live.url}{path}", json=body, headers=headers, timeout=60)


def bad(r: httpx.Response, *fragments: str) -> None:
    """A 400 in OpenAI's error shape saying every fragment on one line."""
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "\n" not in error["message"]
    assert all(f in error["message"] for f in fragments), error


def test_openai_routes_answer_without_the_v1_prefix(live: Live) -> None:
    models = httpx.get(f"{live.url}/models", headers=AUTH)
    assert models.status_code == 200
    assert models.json() == httpx.get(f"{live.v1}/models", headers=AUTH).json()
    assert models.json()["data"][0]["id"] == "tiny"
    greedy = {"max_tokens": 6, "temperature": 0}
    for path, body in (
        ("/completions", {"prompt": "the model", **greedy}),
        ("/chat/completions", {"messages": MESSAGES, **greedy}),
    ):
        short, v1 = post(live, path, body), post(live, f"/v1{path}", body)
        assert short.status_code == v1.status_code == 200, short.text
        choice, same = short.json()["choices"][0], v1.json()["choices"][0]
        assert choice == same and short.json()["object"] == v1.json()["object"]
    streamed = post(live, "/chat/completions", {"messages": MESSAGES, "stream": True, **greedy})
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    bad(post(live, "/chat/completions", {"messages": MESSAGES, "logit_bias": {"1": 5}}))


def test_tokenize_and_detokenize_as_llama_server(live: Live) -> None:
    content = "What is the capital of France ?"
    tokens = post(live, "/tokenize", {"content": content}).json()["tokens"]
    assert len(tokens) > 5 and tokens[0] != live.pyramid.ladder.target.vocab.bos
    assert tokens == live.pyramid.tokenize(content)[1:]  # no BOS unless add_special
    with_bos = post(live, "/tokenize", {"content": content, "add_special": True}).json()
    assert with_bos["tokens"] == [live.pyramid.ladder.target.vocab.bos, *tokens]
    back = post(live, "/detokenize", {"tokens": tokens})
    assert back.status_code == 200 and back.json()["content"].strip() == content
    assert post(live, "/detokenize", {}).json() == {"content": ""}
    assert post(live, "/tokenize", {}).json() == {"tokens": []}


def test_tokenize_with_pieces_and_mixed_content(live: Live) -> None:
    content = "unicode 媽 and emoji 🤗"
    r = post(live, "/tokenize", {"content": content, "with_pieces": True})
    assert r.status_code == 200
    pieces = r.json()["tokens"]
    assert all(set(p) == {"id", "piece"} and p["id"] > 0 for p in pieces)
    raw = b"".join(
        p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces
    )
    assert raw.decode().strip() == content  # byte tokens come back as lists of byte values
    assert any(isinstance(p["piece"], list) for p in pieces)
    ids = [p["id"] for p in pieces]
    mixed = post(live, "/tokenize", {"content": ["unicode", 7, "and"], "add_special": True})
    first = post(live, "/tokenize", {"content": "unicode", "add_special": True}).json()["tokens"]
    last = post(live, "/tokenize", {"content": "and"}).json()["tokens"]
    assert mixed.json()["tokens"] == [*first, 7, *last]  # BOS only before the first text
    special = post(live, "/tokenize", {"content": "<s>x", "parse_special": False}).json()
    assert special["tokens"][0] != 1 and len(ids) > 0


def test_tokenize_and_detokenize_refuse_bad_input(live: Live) -> None:
    n_vocab = live.pyramid.ladder.target.n_vocab
    bad(post(live, "/detokenize", {"tokens": [1, n_vocab]}), "tokens", str(n_vocab))
    bad(post(live, "/detokenize", {"tokens": [-1]}), "tokens")
    bad(post(live, "/detokenize", {"tokens": "abc"}), "tokens")
    bad(post(live, "/tokenize", {"content": ["a", 10**9]}), "content")
    bad(post(live, "/tokenize", {"content": 5}), "content")
    bad(post(live, "/tokenize", {"content": "a", "pieces": True}), "pieces")  # unknown field


def test_apply_template_renders_the_chat_prompt(live: Live) -> None:
    r = post(live, "/apply-template", {"messages": MESSAGES})
    assert r.status_code == 200 and set(r.json()) == {"prompt"}
    assert r.json()["prompt"] == live.pyramid.apply_chat_template(MESSAGES)
    assert r.json()["prompt"].endswith("<s>assistant\n")
    closed = post(live, "/apply-template", {"messages": MESSAGES, "add_generation_prompt": False})
    assert not closed.json()["prompt"].endswith("<s>assistant\n")
    # sampling fields do not change the prompt: taken and ignored, as llama-server does
    same = post(live, "/apply-template", {"messages": MESSAGES, "temperature": 0, "model": "x"})
    assert same.json() == r.json()
    bad(post(live, "/apply-template", {"messages": []}), "messages")
    bad(post(live, "/apply-template", {"messages": MESSAGES, "chat_template_kwargs": {"a": 1}}))
    bad(post(live, "/apply-template", {"messages": MESSAGES, "tools": [{"type": "x"}]}), "tools")


def test_apply_template_renders_tools(tiny_target: Path) -> None:
    pyramid = Pyramid.from_paths(tiny_target, load=TINY_LOAD, name="tiny")
    settings = ServerSettings(chat_template=QWEN_TEMPLATE)
    with pyramid, live_server(pyramid, settings) as live:
        r = post(live, "/apply-template", {"messages": MESSAGES, "tools": TINY_TOOLS}, {})
        assert r.status_code == 200, r.text
        prompt = r.json()["prompt"]
        assert "<tools>" in prompt and "get_weather" in prompt
        assert prompt.endswith("<|im_start|>assistant\n")
        hidden = {"messages": MESSAGES, "tools": TINY_TOOLS, "tool_choice": "none"}
        assert "get_weather" not in post(live, "/apply-template", hidden, {}).json()["prompt"]
        props = httpx.get(f"{live.url}/props").json()
        assert props["chat_template"] == QWEN_TEMPLATE


def test_props_as_llama_server(live: Live) -> None:
    r = httpx.get(f"{live.url}/props", headers=AUTH)
    assert r.status_code == 200
    props = r.json()
    assert ".gguf" in props["model_path"] and props["model_alias"] == "tiny"
    assert props["total_slots"] == live.pyramid.snapshot().slots == 1
    default = props["default_generation_settings"]
    assert default["n_ctx"] == TINY_LOAD.n_ctx
    assert default["params"]["seed"] == 42 and default["params"]["n_predict"] == 99
    assert props["chat_template"] == live.pyramid.chat_template
    assert props["build_info"].startswith("pyramid-gguf ")
    assert props["bos_token"] == "<s>" and props["eos_token"] == "</s>"


def test_every_route_but_health_needs_the_key_in_either_header(live: Live) -> None:
    for path in ("/props", "/models", "/v1/models"):
        r = httpx.get(f"{live.url}{path}")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
        assert httpx.get(f"{live.url}{path}", headers={"X-Api-Key": KEY}).status_code == 200
        assert httpx.get(f"{live.url}{path}", headers={"X-Api-Key": "no"}).status_code == 401
    for path in ("/tokenize", "/detokenize", "/apply-template", "/chat/completions"):
        assert post(live, path, {}, {}).status_code == 401, path
    assert httpx.get(f"{live.url}/health").status_code == 200
    assert httpx.get(f"{live.url}/metrics").status_code == 200


def test_a_prompt_over_the_context_is_openais_context_length_exceeded(live: Live) -> None:
    long = "the cat " * 400  # over the tiny context of 512 tokens
    for path, body in (
        ("/v1/completions", {"prompt": long}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": long}]}),
        ("/completions", {"prompt": long, "stream": True}),
    ):
        r = post(live, path, {**body, "max_tokens": 4})
        bad(r, "does not fit the context")
        assert r.json()["error"]["code"] == "context_length_exceeded", path
    other = post(live, "/v1/completions", {"prompt": "a", "logit_bias": {"1": 5}})
    bad(other, "logit_bias")
    assert other.json()["error"]["code"] is None  # other 400s keep no code


PREFLIGHT = {
    "Origin": "https://page.example",
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


def test_a_browser_page_may_call_any_route_by_default(live: Live) -> None:
    """llama-server's default: any origin. A preflight needs no key (browsers send none)."""
    for path in ("/v1/chat/completions", "/chat/completions", "/tokenize"):
        r = httpx.options(f"{live.url}{path}", headers=PREFLIGHT)
        assert r.status_code == 200, (path, r.text)
        assert r.headers["access-control-allow-origin"] == "*"
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "authorization" in r.headers["access-control-allow-headers"].lower()
    origin = {"Origin": "https://page.example"}
    r = httpx.get(f"{live.url}/props", headers={**AUTH, **origin})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
    denied = httpx.get(f"{live.url}/props", headers=origin)  # the 401 is readable by the page
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == "*"


def test_cors_origins_limit_the_pages_or_turn_cors_off(tiny_target: Path) -> None:
    pyramid = Pyramid.from_paths(tiny_target, load=TINY_LOAD, name="tiny")
    with pyramid:
        only = ServerSettings(cors_origins=("https://page.example",))
        with live_server(pyramid, only) as live:
            ok = httpx.options(f"{live.url}/v1/models", headers=PREFLIGHT)
            assert ok.headers["access-control-allow-origin"] == "https://page.example"
            other = {**PREFLIGHT, "Origin": "https://evil.example"}
            r = httpx.options(f"{live.url}/v1/models", headers=other)
            assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
        with live_server(pyramid, ServerSettings(cors_origins=())) as live:
            r = httpx.options(f"{live.url}/v1/models", headers=PREFLIGHT)
            assert r.status_code == 405 and "access-control-allow-origin" not in r.headers
