"""llama-server's simple routes (issue 40), on the tiny ladder behind an API key: OpenAI's
routes without ``/v1``, ``/tokenize``, ``/detokenize``, ``/apply-template`` and ``/props`` in
the shapes of llama.cpp's own server (its ``tools/server/tests/unit`` tests ask these), bad
input answered in llama-server's error shape there (OpenAI's under ``/v1``), and the key taken
as ``Authorization: Bearer`` or ``X-Api-Key`` on every route but ``/health`` and
``/metrics``."""

from __future__ import annotations

import datetime
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import TINY_LOAD
from serving_support import Live, live_server
from tool_support import QWEN_TEMPLATE, TINY_TOOLS

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
    """A 400 in OpenAI's error shape (llama-server's off ``/v1``: the status as ``code``)
    saying every fragment on one line."""
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "\n" not in error["message"]
    assert all(f in error["message"] for f in fragments), error
    llama = not r.request.url.path.startswith("/v1/")
    assert (error["code"] == 400) if llama else (error.get("code") != 400), error


def test_openai_routes_answer_without_the_v1_prefix(live: Live) -> None:
    models = httpx.get(f"{live.url}/models", headers=AUTH)
    assert models.status_code == 200
    assert models.json() == httpx.get(f"{live.v1}/models", headers=AUTH).json()
    assert models.json()["data"][0]["id"] == "tiny"
    greedy = {"max_tokens": 6, "temperature": 0}
    body = {"messages": MESSAGES, **greedy}
    short, v1 = post(live, "/chat/completions", body), post(live, "/v1/chat/completions", body)
    assert short.status_code == v1.status_code == 200, short.text
    choice, same = short.json()["choices"][0], v1.json()["choices"][0]
    assert choice == same and short.json()["object"] == v1.json()["object"]
    assert short.json()["system_fingerprint"].startswith("b")  # llama-server's tests ask it
    # llama-server's /completions is its native /completion, not OpenAI's
    native = post(live, "/completions", {"prompt": "the model", "n_predict": 6, "temperature": 0})
    assert native.status_code == 200 and "choices" not in native.json()
    openai = post(live, "/v1/completions", {"prompt": "the model", **greedy}).json()
    assert native.json()["content"] == openai["choices"][0]["text"]
    streamed = post(live, "/chat/completions", {"messages": MESSAGES, "stream": True, **greedy})
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    bad(post(live, "/chat/completions", {"messages": []}), "messages")


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
    bad(post(live, "/apply-template", {"messages": MESSAGES, "chat_template_kwargs": [1]}))
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


def test_chat_template_kwargs_reach_apply_template_and_input_tokens(tiny_target: Path) -> None:
    """A request's ``chat_template_kwargs`` override the server's in every route that renders a
    chat: the prompt ``/apply-template`` shows, the count ``input_tokens`` gives, the answer."""
    template = "{% for m in messages %}{{ m.content }}{% endfor %} | {{ mood }}"
    pyramid = Pyramid.from_paths(tiny_target, load=TINY_LOAD, name="tiny")
    settings = ServerSettings(chat_template=template, chat_template_kwargs={"mood": "calm"})
    with pyramid, live_server(pyramid, settings) as live:
        calm = post(live, "/apply-template", {"messages": MESSAGES}, {}).json()["prompt"]
        body = {"messages": MESSAGES, "chat_template_kwargs": {"mood": "a storm of words"}}
        stormy = post(live, "/apply-template", body, {}).json()["prompt"]
        assert calm.endswith(" | calm") and stormy.endswith(" | a storm of words")
        for prompt, ask in ((calm, {"messages": MESSAGES}), (stormy, body)):
            counted = post(live, "/chat/completions/input_tokens", ask, {}).json()
            assert counted["input_tokens"] == len(live.pyramid.tokenize(prompt))
        answer = post(live, "/v1/chat/completions", {**body, "max_tokens": 1}, {}).json()
        assert answer["usage"]["prompt_tokens"] == len(live.pyramid.tokenize(stormy))


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
        assert r.status_code == 401, path
        error = r.json()["error"]
        if path.startswith("/v1/"):  # OpenAI's shape
            assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
        else:  # llama-server's
            assert error["code"] == 401 and error["type"] == "authentication_error", error
        assert httpx.get(f"{live.url}{path}", headers={"X-Api-Key": KEY}).status_code == 200
        assert httpx.get(f"{live.url}{path}", headers={"X-Api-Key": "no"}).status_code == 401
    for path in ("/tokenize", "/detokenize", "/apply-template", "/chat/completions"):
        assert post(live, path, {}, {}).status_code == 401, path
    assert httpx.get(f"{live.url}/health").status_code == 200
    assert httpx.get(f"{live.url}/metrics").status_code == 200


def test_a_prompt_over_the_context_is_refused_in_each_dialects_shape(live: Live) -> None:
    """OpenAI's ``context_length_exceeded`` under ``/v1``; llama-server's
    ``exceed_context_size_error`` with both counts on its routes, streamed or not."""
    long = "the cat " * 400  # over the tiny context of 512 tokens
    n_prompt = len(live.pyramid.tokenize(long))
    chat = [{"role": "user", "content": long}]
    for path, body in (
        ("/v1/completions", {"prompt": long}),
        ("/v1/chat/completions", {"messages": chat}),
        ("/v1/completions", {"prompt": long, "stream": True}),
    ):
        r = post(live, path, {**body, "max_tokens": 4})
        bad(r, "exceeds the available context size", str(TINY_LOAD.n_ctx))
        assert r.json()["error"]["code"] == "context_length_exceeded", path
    for path, body in (
        ("/completion", {"prompt": long}),
        ("/completions", {"prompt": long, "stream": True}),
        ("/chat/completions", {"messages": chat}),
        ("/chat/completions", {"messages": chat, "stream": True}),
    ):
        r = post(live, path, {**body, "n_predict": 4})
        assert r.status_code == 400, (path, r.text)
        error = r.json()["error"]
        assert error["type"] == "exceed_context_size_error" and error["code"] == 400, error
        assert error["n_ctx"] == TINY_LOAD.n_ctx and error["n_prompt_tokens"] >= n_prompt
        assert "exceeds the available context size" in error["message"]
    exact = post(live, "/completion", {"prompt": live.pyramid.tokenize(long)})
    assert exact.json()["error"]["n_prompt_tokens"] == n_prompt
    other = post(live, "/v1/completions", {"prompt": "a", "echo": True})
    bad(other, "echo")
    assert other.json()["error"]["code"] is None  # other 400s keep no code


PREFLIGHT = {
    "Origin": "https://page.example",
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


def test_a_browser_page_may_call_any_route_by_default(live: Live) -> None:
    """llama-server's default: any origin, echoed, with credentials. A preflight needs no key
    (browsers send none) and names llama-server's methods and any header."""
    for path in ("/v1/chat/completions", "/chat/completions", "/tokenize"):
        r = httpx.options(f"{live.url}{path}", headers=PREFLIGHT)
        assert r.status_code == 200, (path, r.text)
        assert r.headers["access-control-allow-origin"] == "https://page.example"
        assert r.headers["access-control-allow-credentials"] == "true"
        assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
        assert r.headers["access-control-allow-headers"] == "*"
        # llama-server's capitals: its own tests look the names up in a plain dict
        assert (b"Access-Control-Allow-Origin", b"https://page.example") in r.headers.raw
    origin = {"Origin": "https://page.example"}
    r = httpx.get(f"{live.url}/props", headers={**AUTH, **origin})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://page.example"
    denied = httpx.get(f"{live.url}/props", headers=origin)  # the 401 is readable by the page
    assert denied.status_code == 401
    assert denied.headers["access-control-allow-origin"] == "https://page.example"
    assert "access-control-allow-origin" not in httpx.get(f"{live.url}/props", headers=AUTH).headers


def test_cors_origins_limit_the_pages_or_turn_cors_off(tiny_target: Path) -> None:
    pyramid = Pyramid.from_paths(tiny_target, load=TINY_LOAD, name="tiny")
    with pyramid:
        only = ServerSettings(cors_origins=("https://page.example", "localhost"))
        with live_server(pyramid, only) as live:
            ok = httpx.options(f"{live.url}/v1/models", headers=PREFLIGHT)
            assert ok.headers["access-control-allow-origin"] == "https://page.example"
            for local in ("http://localhost:8080", "http://127.0.0.1", "http://[::1]:3000"):
                r = httpx.options(f"{live.url}/v1/models", headers={**PREFLIGHT, "Origin": local})
                assert r.headers["access-control-allow-origin"] == local
            for other in ("https://evil.example", "http://localhost.evil.com", "localhost"):
                r = httpx.options(f"{live.url}/v1/models", headers={**PREFLIGHT, "Origin": other})
                assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
        with live_server(pyramid, ServerSettings(cors_origins=())) as live:
            r = httpx.options(f"{live.url}/v1/models", headers=PREFLIGHT)
            assert r.status_code == 405 and "access-control-allow-origin" not in r.headers


# --- the native /completion -------------------------------------------------------------------

PROMPT = "I believe the meaning of life is"
YES_NO = 'root ::= "yes" | "no"'
SMALL = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["a"],
    "additionalProperties": False,
}


def complete(live: Live, **body: Any) -> dict[str, Any]:
    r = post(live, "/completion", {"prompt": PROMPT, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    assert "Traceback" not in r.text
    return dict(r.json())


def chunks(live: Live, **body: Any) -> list[dict[str, Any]]:
    """The ``data:`` chunks of a streamed ``/completion`` (no ``[DONE]``, as llama-server)."""
    r = post(live, "/completion", {"prompt": PROMPT, "temperature": 0, "stream": True, **body})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in r.text.split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") for e in events) and "[DONE]" not in r.text
    return [json.loads(e[len("data: ") :]) for e in events]


def test_completion_answers_in_llama_servers_fields(live: Live) -> None:
    out = complete(live, n_predict=5, return_tokens=True)
    n_prompt = len(live.pyramid.tokenize(PROMPT))
    assert out["stop"] is True and out["stop_type"] == "limit" and out["stopping_word"] == ""
    assert out["tokens_predicted"] == len(out["tokens"]) == 5
    assert all(isinstance(t, int) for t in out["tokens"])
    assert out["content"] == live.pyramid.detokenize(out["tokens"])
    assert out["tokens_evaluated"] == n_prompt and out["truncated"] is False
    assert out["tokens_cached"] == n_prompt + 5
    assert isinstance(out["has_new_line"], bool) and out["model"] == "tiny"
    timings = out["timings"]
    assert timings["predicted_n"] == 5 and timings["prompt_n"] + timings["cache_n"] == n_prompt
    settings = out["generation_settings"]
    assert (
        settings["grammar"] == ""
        and settings["n_predict"] == 5
        and settings["seed"] == 42
        and settings["temperature"] == 0
    )
    assert settings["stream"] is False and settings["n_probs"] == 0
    assert complete(live, n_predict=5)["tokens"] == []  # only with return_tokens
    # the same answer as OpenAI's /completions, and from the prompt's token ids
    openai = post(live, "/v1/completions", {"prompt": PROMPT, "max_tokens": 5, "temperature": 0})
    assert openai.json()["choices"][0]["text"] == out["content"]
    ids = complete(live, prompt=live.pyramid.tokenize(PROMPT), n_predict=5)
    assert ids["content"] == out["content"] and ids["tokens_evaluated"] == n_prompt


def test_response_fields_keep_only_those_paths_of_the_body(live: Live) -> None:
    """``response_fields`` as llama-server: the listed paths, flat, nested ones by ``/``; a
    path that reaches nothing is left out; the streamed last chunk too."""
    whole = complete(live, n_predict=3)
    fields = ["content", "generation_settings/n_predict", "prompt", "timings/no_such", "nope"]
    out = complete(live, n_predict=3, response_fields=fields)
    assert out == {
        "content": whole["content"],
        "generation_settings/n_predict": 3,
        "prompt": whole["prompt"],
    }
    last = chunks(live, n_predict=3, response_fields=["stop", "timings/predicted_n"])[-1]
    assert last == {"stop": True, "timings/predicted_n": 3}


def test_verbose_chat_answers_carry_the_rendered_prompt(live: Live) -> None:
    """llama-server's ``verbose: true``: the whole answer carries ``__verbose`` with the prompt
    as the template rendered it and the raw text; without it, nothing."""
    for path in ("/chat/completions", "/v1/chat/completions"):
        body = {"messages": MESSAGES, "max_tokens": 3, "temperature": 0}
        plain = post(live, path, body).json()
        assert "__verbose" not in plain
        out = post(live, path, {**body, "verbose": True}).json()
        prompt = out["__verbose"]["prompt"]
        assert "What is today?" in prompt and prompt != "What is today?"  # the template's
        assert out["__verbose"]["content"] == out["choices"][0]["message"]["content"]


def test_completion_streams_as_llama_server(live: Live) -> None:
    whole = complete(live, n_predict=8)
    events = chunks(live, n_predict=8)
    *parts, last = events
    assert parts and all(p["stop"] is False and p["tokens"] for p in parts)
    assert all(isinstance(t, int) for p in parts for t in p["tokens"])
    assert "".join(p["content"] for p in parts) == whole["content"]
    assert sum(len(p["tokens"]) for p in parts) == 8
    assert last["stop"] is True and last["content"] == "" and last["tokens"] == []
    assert last["stop_type"] == "limit" and last["tokens_predicted"] == 8
    assert last["timings"]["predicted_n"] == 8 and last["truncated"] is False
    assert last["generation_settings"]["n_predict"] == 8
    assert last["generation_settings"]["stream"] is True


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completion_stops_at_a_word(live: Live, stream: bool) -> None:
    full = complete(live, n_predict=16)["content"]
    word = full[len(full) // 2 : len(full) // 2 + 2]
    want = full[: full.find(word)]
    if stream:
        *parts, out = chunks(live, n_predict=16, stop=[word])
        content = "".join(p["content"] for p in parts)
    else:
        out = complete(live, n_predict=16, stop=[word])
        content = out["content"]
    assert content == want
    assert out["stop_type"] == "word" and out["stopping_word"] == word
    unmatched = complete(live, n_predict=4, stop=["\x00never"])
    assert unmatched["stop_type"] == "limit" and unmatched["stopping_word"] == ""


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completion_grammars_end_by_eos(live: Live, stream: bool) -> None:
    for field, value in (("grammar", YES_NO), ("json_schema", SMALL)):
        body = {field: value, "n_predict": 40}
        if stream:
            *parts, out = chunks(live, **body)
            content = "".join(p["content"] for p in parts)
        else:
            out = complete(live, **body)
            content = out["content"]
        if field == "grammar":
            assert content in ("yes", "no") and out["generation_settings"]["grammar"] == YES_NO
        else:
            assert set(json.loads(content)) == {"a"}
        assert out["stop_type"] == "eos" and out["stopping_word"] == "", out


def test_completion_takes_the_sampling_fields(live: Live) -> None:
    sampled = {"temperature": 1.0, "top_k": 20, "top_p": 0.9, "min_p": 0.01, "n_predict": 6}
    first = complete(live, seed=7, **sampled)
    assert complete(live, seed=7, **sampled)["content"] == first["content"]
    settings = first["generation_settings"]
    assert settings["seed"] == 7 and settings["top_k"] == 20 and settings["top_p"] == 0.9
    assert settings["min_p"] == 0.01 and settings["temperature"] == 1.0
    eos = complete(live, n_predict=7, ignore_eos=True)
    assert eos["tokens_predicted"] == 7 and eos["generation_settings"]["ignore_eos"] is True
    assert complete(live, n_predict=-1)["generation_settings"]["n_predict"] == 99  # the server's
    assert complete(live, n_predict=3, n_probs=0)["tokens_predicted"] == 3


def test_completion_reuses_the_cache_whatever_cache_prompt_says(live: Live) -> None:
    complete(live, n_predict=2, cache_prompt=False)
    again = complete(live, n_predict=2, cache_prompt=False)
    n_prompt = again["tokens_evaluated"]
    assert 0 < again["timings"]["cache_n"] <= n_prompt
    assert again["timings"]["prompt_n"] + again["timings"]["cache_n"] == n_prompt


def test_completion_refuses_bad_input_in_llama_servers_shape(live: Live) -> None:
    n_vocab = live.pyramid.ladder.target.n_vocab
    for body, fragments in (
        ({"n_predict": 0}, ("n_predict",)),
        ({"n_predict": -2}, ("n_predict",)),
        ({"n_predict": "many"}, ("n_predict",)),
        ({"prompt": [1, n_vocab]}, ("prompt", str(n_vocab))),
        ({"prompt": [-3]}, ("prompt",)),
        ({"prompt": 5}, ("prompt",)),
        ({"prompt": None}, ("prompt",)),
        ({"prompt": []}, ("prompt",)),
        ({"n_probs": 21}, ("n_probs",)),
        ({"temperature": -1}, ("temperature",)),
        ({"top_p": 2}, ("top_p",)),
        ({"grammar": YES_NO, "json_schema": SMALL}, ("grammar", "json_schema")),
        ({"grammar": 'root ::= ( "a"'}, ("grammar",)),
        ({"json_schema": {"not": {}}}, ("json_schema",)),
        ({"dry_multiplier": 0.5, "dry_base": 0.5}, ("dry-base",)),
        ({"stream": True, "n_predict": 0}, ("n_predict",)),
    ):
        r = post(live, "/completion", {"prompt": PROMPT, **body})
        bad(r, *fragments)
        assert "Traceback" not in r.text
    bad(post(live, "/completion", {"n_predict": 2}), "prompt")  # required, as llama-server's
    for raw in (b"{", b"[1, 2]", b'{"prompt": "a"'):
        r = httpx.post(f"{live.url}/completion", content=raw, headers=AUTH)
        bad(r)
    long = post(live, "/completion", {"prompt": "the cat " * 400, "n_predict": 4})
    assert long.json()["error"]["type"] == "exceed_context_size_error"
    assert post(live, "/completion", {"prompt": PROMPT}, {}).status_code == 401


# --- /slots and OpenAI's usage chunk ------------------------------------------------------------


def test_slots_lists_each_slot_read_only(live: Live) -> None:
    complete(live, n_predict=2)
    r = httpx.get(f"{live.url}/slots", headers=AUTH)
    assert r.status_code == 200
    (slot,) = r.json()
    assert slot["id"] == 0 and slot["n_ctx"] == TINY_LOAD.n_ctx
    assert slot["is_processing"] is False and slot["n_prompt_tokens"] > 0
    now = live.pyramid.snapshot()
    assert now.slot_busy == (False,) and now.slot_cached[0] == slot["n_prompt_tokens"]
    free = httpx.get(f"{live.url}/slots", params={"fail_on_no_slot": 1}, headers=AUTH)
    assert free.status_code == 200
    assert httpx.post(f"{live.url}/slots", headers=AUTH).status_code == 405
    assert httpx.get(f"{live.url}/slots").status_code == 401
    assert httpx.get(f"{live.url}/props", headers=AUTH).json()["endpoint_slots"] is True


def test_slots_show_a_slot_at_work(live: Live) -> None:
    started, release = threading.Event(), threading.Event()

    def deliver(item: object) -> None:  # holds the slot until released
        started.set()
        release.wait(30)

    job = live.pyramid.submit(PROMPT, SamplingConfig(max_tokens=2), deliver=deliver)
    try:
        assert started.wait(30)
        (slot,) = httpx.get(f"{live.url}/slots", headers=AUTH).json()
        assert slot["is_processing"] is True and live.pyramid.snapshot().slot_busy == (True,)
        busy = httpx.get(f"{live.url}/slots", params={"fail_on_no_slot": 1}, headers=AUTH)
        assert busy.status_code == 503 and "no slot" in busy.json()["error"]["message"]
    finally:
        release.set()
        job.wait()
    assert httpx.get(f"{live.url}/slots", headers=AUTH).json()[0]["is_processing"] is False


def test_openais_streamed_usage_chunk_carries_timings(live: Live) -> None:
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0}
    for path, asked in (
        ("/v1/completions", body),
        ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3}),
    ):
        stream = {**asked, "stream": True, "stream_options": {"include_usage": True}}
        r = post(live, path, stream)
        events = [e[len("data: ") :] for e in r.text.split("\n\n") if e.startswith("data: ")]
        last = json.loads(events[-2])  # before [DONE]
        assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3
        assert last["timings"]["predicted_n"] == 3
        t = last["timings"]
        assert t["prompt_n"] + t["cache_n"] == last["usage"]["prompt_tokens"]


def test_openai_usage_reports_cached_prompt_tokens(live: Live) -> None:
    body = {"prompt": PROMPT + " again", "max_tokens": 3, "temperature": 0}
    post(live, "/v1/completions", body)
    doc = post(live, "/v1/completions", body).json()
    cached = doc["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == doc["timings"]["cache_n"] > 0
    assert cached + doc["timings"]["prompt_n"] == doc["usage"]["prompt_tokens"]
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    events = [e[6:] for e in post(live, "/v1/completions", stream).text.split("\n\n") if e]
    last = json.loads(events[-2])  # before [DONE]
    details = last["usage"]["prompt_tokens_details"]
    assert details["cached_tokens"] == last["timings"]["cache_n"]


# --- llama-server's own checks and fields -------------------------------------------------------


def test_two_assistant_messages_at_the_end_are_refused_as_llama_server(live: Live) -> None:
    """llama-server continues a last assistant message and cannot continue two: a 400 on its
    route; OpenAI's route renders them as they are."""
    turns = [
        *MESSAGES,
        {"role": "assistant", "content": "a"},
        {"role": "assistant", "content": "b"},
    ]
    body = {"messages": turns, "max_tokens": 2}
    r = post(live, "/chat/completions", body)
    assert r.status_code == 400 and "2 or more assistant messages" in r.json()["error"]["message"]
    assert post(live, "/v1/chat/completions", body).status_code == 200
    one = [*MESSAGES, {"role": "assistant", "content": "a"}, *MESSAGES]
    assert post(live, "/chat/completions", {**body, "messages": one}).status_code == 200


def test_input_tokens_counts_the_chat_prompt(live: Live) -> None:
    turns = [{"role": "system", "content": "Be brief."}, *MESSAGES]
    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        r = post(live, path, {"messages": turns})
        assert r.status_code == 200, r.text
        used = post(live, "/v1/chat/completions", {"messages": turns, "max_tokens": 1}).json()
        assert r.json() == {"input_tokens": used["usage"]["prompt_tokens"]}
    assert post(live, "/chat/completions/input_tokens", {"messages": []}).status_code == 400


def test_ignore_eos_reports_the_end_tokens_as_banned(live: Live) -> None:
    """llama-server shows ``ignore_eos`` as a -inf (null) logit bias on each end token."""
    banned = complete(live, n_predict=2, ignore_eos=True)["generation_settings"]["logit_bias"]
    vocab = live.pyramid.ladder.target.vocab
    assert banned and all(b["bias"] is None and vocab.is_eog(b["token"]) for b in banned)
    assert vocab.eos in {b["token"] for b in banned}
    assert complete(live, n_predict=2)["generation_settings"]["logit_bias"] == []


def test_an_answer_that_fills_the_context_is_truncated(live: Live) -> None:
    out = complete(live, n_predict=TINY_LOAD.n_ctx, ignore_eos=True)  # more than is left
    assert out["stop_type"] == "limit" and out["truncated"] is True
    assert out["tokens_evaluated"] + out["tokens_predicted"] == TINY_LOAD.n_ctx
    assert complete(live, n_predict=3, ignore_eos=True)["truncated"] is False


def test_serve_takes_llama_servers_default_sampling_flags() -> None:
    from pyramid_gguf.cli.serve import default_sampling

    given = {"temperature": 0.1, "seed": 7, "n_predict": 12, "n_ctx": 300}
    assert default_sampling(given) == SamplingConfig(temperature=0.1, seed=7, max_tokens=12)
    to_the_end = default_sampling({**given, "n_predict": -1})
    assert to_the_end.max_tokens == 300  # -1: until the context is full
    assert default_sampling({k: None for k in given}) == SamplingConfig()


def _shim() -> Any:
    import importlib.util

    path = Path(__file__).parents[1] / "scripts" / "llama_server_suite" / "shim.py"
    spec = importlib.util.spec_from_file_location("llama_server_shim", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_suites_shim_maps_llama_servers_flags_or_refuses_them(tmp_path: Path) -> None:
    shim = _shim()
    model = str(tmp_path / "m.gguf")
    args = shim.translate(
        ["--model", model, "--ctx-size", "512", "--parallel", "2", "--temp", "0.8", "--no-jinja",
         "--n-predict", "64", "--alias", "tiny", "-fa", "on", "--metrics"]
    )  # fmt: skip
    pairs = dict(zip(args[::2], args[1::2], strict=False))
    assert args[:2] == ["--target", model] and pairs["--parallel"] == "2"
    assert "--ctx-size" in args and args[args.index("--ctx-size") + 1] == "256"  # per slot
    assert args[args.index("--temp") + 1] == "0.8" and "--flash-attn" in args
    assert "--no-jinja" not in args and "--metrics" in args and "--no-metrics" not in args
    quiet = shim.translate(["--model", model, "--no-slots", "--reasoning", "on"])
    assert "--no-metrics" in quiet and "--no-slots" in quiet  # llama-server's defaults
    for refused in (["--context-shift"], ["--lora", "x"], ["--alias", "a,b"], ["--reranking"]):
        with pytest.raises(shim.Refused):
            shim.translate(["--model", model, *refused])
    with pytest.raises(shim.Refused, match="no local stand-in"):
        shim.translate(["--hf-repo", "someone/unknown-model"])


def test_the_suites_shim_serves_the_router_preset_with_its_stand_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-server's router preset (no model; its tests ask CORS) gets the stand-in model;
    the router's own flags stay refused."""
    shim = _shim()
    monkeypatch.setenv("PYRAMID_GGUF_HOME", str(tmp_path))
    router = ["--port", "8080", "--cors-origins", "localhost", "--ctx-size", "1024"]
    with pytest.raises(shim.Refused, match="stand-in model"):  # not pulled yet
        shim.translate(router)
    stand_in = tmp_path / "models" / shim.ROUTER_STAND_IN
    stand_in.parent.mkdir()
    stand_in.write_bytes(b"GGUF")
    args = shim.translate(router)
    assert args[:2] == ["--target", str(stand_in)]
    assert args[args.index("--cors-origins") + 1] == "localhost"
    with pytest.raises(shim.Refused, match="router"):
        shim.translate([*router, "--models-dir", str(tmp_path)])


def test_completion_takes_llama_servers_prompt_forms(live: Live) -> None:
    """Several prompts answer as a list, in order; text, ids, both mixed and a
    ``prompt_string`` object are the same prompt."""
    ids = live.pyramid.tokenize(PROMPT)
    one = complete(live, n_predict=4)
    many = post(live, "/completion", {"prompt": [ids, PROMPT, {"prompt_string": PROMPT}],
                                      "n_predict": 4, "temperature": 0})  # fmt: skip
    assert many.status_code == 200, many.text
    answers = many.json()
    assert [a["index"] for a in answers] == [0, 1, 2]
    assert all(a["content"] == one["content"] for a in answers)
    half = len(PROMPT) // 2
    mixed = complete(live, prompt=[*ids[:1], PROMPT[:half], PROMPT[half:]], n_predict=2)
    assert mixed["tokens_evaluated"] > len(ids) // 2  # the texts and the id, one prompt
    for prompt, says in (
        ({"prompt_string": PROMPT, "multimodal_data": ["AA=="]}, "multimodal_data"),
        ({"text": PROMPT}, "prompt_string"),
        ([[1.5]], "prompt"),
    ):
        bad(post(live, "/completion", {"prompt": prompt}), says)
    streamed = post(live, "/completion", {"prompt": [PROMPT, PROMPT], "stream": True})
    bad(streamed, "several prompts")


def test_the_role_chunk_has_a_null_content_as_llama_servers(live: Live) -> None:
    body = {"messages": MESSAGES, "stream": True, "max_tokens": 2}
    for path, content in (("/chat/completions", None), ("/v1/chat/completions", "")):
        r = post(live, path, body)
        first = json.loads(r.text.split("\n\n")[0].removeprefix("data: "))
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": content}, path


def test_native_timings_are_numbers_and_the_speculation_stands_beside(live: Live) -> None:
    """llama-server's clients read every ``timings`` value as a number; our mode and stages
    come under ``speculative``."""
    for out in (complete(live, n_predict=4), chunks(live, n_predict=4)[-1]):
        timings = out["timings"]
        assert all(isinstance(v, int | float) and v >= 0 for v in timings.values()), timings
        assert timings["predicted_n"] == 4
        # llama-server's rates count the decode steps: the first token is the prompt's
        assert timings["predicted_per_token_ms"] == pytest.approx(
            timings["predicted_ms"] / 3, abs=1e-3
        )
        assert timings["predicted_per_second"] == 1e3 / timings["predicted_ms"] * 3
        assert timings["prompt_per_second"] == 1e3 / timings["prompt_ms"] * timings["prompt_n"]
        assert out["speculative"]["mode"] == "sd" and out["speculative"]["stages"]
    one = complete(live, n_predict=1)["timings"]
    assert one["predicted_n"] == 1
    assert one["predicted_per_second"] == one["predicted_per_token_ms"] == 0.0


# --- /metrics and /slots as llama-server serves them --------------------------------------------


def _prometheus(text: str) -> dict[str, tuple[str, float]]:
    """``{name: (type, value)}`` of a Prometheus text body's unlabelled samples."""
    types, out = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#") and "{" not in line:
            name, value = line.split(" ", 1)
            out[name] = (types[name], float(value))
    return out


def test_metrics_carry_llama_servers_names_and_start_time(live: Live) -> None:
    before = _prometheus(httpx.get(f"{live.url}/metrics").text)
    prompt = "the quick brown fox jumps over the lazy dog"
    answers = [complete(live, prompt=prompt, n_predict=3, temperature=0) for _ in range(2)]
    r = httpx.get(f"{live.url}/metrics")
    assert r.status_code == 200 and 0 < int(r.headers["Process-Start-Time-Unix"]) <= time.time()
    assert b"Process-Start-Time-Unix" in dict(r.headers.raw)  # llama-server's capitals
    after = _prometheus(r.text)

    def grew(name: str) -> float:
        return after[name][1] - before.get(name, ("", 0.0))[1]

    timings = [a["timings"] for a in answers]
    assert grew("llamacpp:tokens_predicted_total") == sum(t["predicted_n"] for t in timings)
    assert grew("llamacpp:prompt_tokens_total") == sum(t["prompt_n"] for t in timings)
    assert grew("llamacpp:prompt_tokens_cached_total") == sum(t["cache_n"] for t in timings) > 0
    assert after["llamacpp:prompt_tokens_total"] == after["pyramid_gguf:prompt_tokens_total"]
    assert after["llamacpp:predicted_tokens_seconds"][0] == "gauge"
    assert after["llamacpp:predicted_tokens_seconds"][1] > 0
    assert after["llamacpp:requests_processing"] == ("gauge", 0.0)
    # llama-server's speculative counters: what the target verified (this server runs sd)
    stages = [
        s for a in answers for s in a["speculative"]["stages"] if s["name"].endswith("->target")
    ]
    assert stages and grew("llamacpp:spec_decode_num_drafts_total") == sum(
        s["verifications"] for s in stages
    )
    assert grew("llamacpp:spec_decode_num_draft_tokens_total") == sum(s["draft_n"] for s in stages)
    assert grew("llamacpp:spec_decode_num_accepted_tokens_total") == sum(
        s["draft_n_accepted"] for s in stages
    )
    longest = max(t["prompt_n"] + t["cache_n"] + t["predicted_n"] for t in timings)
    assert after["llamacpp:n_tokens_max"][0] == "counter"
    assert after["llamacpp:n_tokens_max"][1] >= longest


def test_metrics_and_slots_can_be_turned_off_as_llama_server(tiny_target: Path) -> None:
    pyramid = Pyramid.from_paths(tiny_target, load=TINY_LOAD, name="tiny")
    with pyramid, live_server(pyramid, ServerSettings(metrics=False, slots=False)) as live:
        for path in ("/metrics", "/slots"):
            r = httpx.get(f"{live.url}{path}")
            assert r.status_code == 501, (path, r.text)
            assert "off" in r.json()["error"]["message"]
        assert httpx.get(f"{live.url}/health").status_code == 200


def test_serve_turns_metrics_and_slots_on_or_off() -> None:
    from click.testing import CliRunner

    from pyramid_gguf.cli.serve import serve

    help_text = CliRunner().invoke(serve, ["--help"]).output
    assert "--metrics / --no-metrics" in help_text and "--slots / --no-slots" in help_text


# --- chat templates rendered with llama-server's context ----------------------------------------

THINKING = (
    "{{ messages[0].content }}|{{ date_string }}|{{ datetime }}|"
    "{% if enable_thinking %}<think>{% else %}<think></think>{% endif %}"
)


def test_chat_template_kwargs_reach_the_template(tiny_target: Path) -> None:
    pyramid = Pyramid.from_paths(tiny_target, load=TINY_LOAD, name="tiny")
    settings = ServerSettings(chat_template=THINKING, sampling=SamplingConfig(max_tokens=1))
    # serve --chat-template-kwargs: every render's, under a request's own
    quiet = ServerSettings(chat_template=THINKING, chat_template_kwargs={"enable_thinking": False})
    with pyramid:
        with live_server(pyramid, settings) as live:
            prompt = post(live, "/apply-template", {"messages": MESSAGES}, {}).json()["prompt"]
            today = datetime.date.today()
            assert prompt.startswith(f"What is today?|{today:%d %b %Y}|{today:%b %d %Y}|")
            assert prompt.endswith("|<think>")  # thinking on, as llama-server renders by default

            def prompt_tokens(**extra: Any) -> int:
                body = {"messages": MESSAGES, "max_tokens": 1, **extra}
                r = post(live, "/v1/chat/completions", body, {})
                assert r.status_code == 200, r.text
                return int(r.json()["usage"]["prompt_tokens"])

            on = prompt_tokens()
            off = prompt_tokens(chat_template_kwargs={"enable_thinking": False})
            assert off > on  # "<think></think>" is longer than "<think>"
            assert prompt_tokens(chat_template_kwargs={"enable_thinking": True}) == on
            wrong = {"messages": MESSAGES, "chat_template_kwargs": 3}
            bad(post(live, "/v1/chat/completions", wrong))
        with live_server(pyramid, quiet) as live:
            prompt = post(live, "/apply-template", {"messages": MESSAGES}, {}).json()["prompt"]
            assert prompt.endswith("|<think></think>")


def test_serve_reads_chat_template_kwargs_as_a_json_object() -> None:
    from pyramid_gguf.cli.serve import template_kwargs
    from pyramid_gguf.core.errors import UserError

    assert template_kwargs('{"enable_thinking": false}') == {"enable_thinking": False}
    assert template_kwargs(None) == {}
    for wrong in ("[1]", "{oops"):
        with pytest.raises(UserError, match="--chat-template-kwargs"):
            template_kwargs(wrong)
    off = _shim().translate(["--model", "m.gguf", "--reasoning", "off"])
    assert off[off.index("--chat-template-kwargs") + 1] == '{"enable_thinking": false}'
