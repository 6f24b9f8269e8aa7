"""Ollama's API, live on uvicorn, driven by the official ``ollama`` client.

The tiny ladder (``sd``) behind the Qwen2.5 template (whose tool calls are Hermes') and an API
key: chat streamed and not, generate with a JSON schema, tools, list, show, ps, version; bad
input answered in Ollama's error shape ``{"error": "..."}``, never a traceback.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import ollama
import pytest
from conftest import TINY_CHAT_LOAD
from serving_support import live_server
from tool_support import KEYED, QWEN_TEMPLATE, TINY_MESSAGES, TINY_TOOLS

from pyramid_gguf import Pyramid, SamplingConfig
from pyramid_gguf.serving.ollama import sampling_of
from pyramid_gguf.serving.settings import ServerSettings

KEY = "sk-ollama"
AUTH = {"Authorization": f"Bearer {KEY}"}
GREEDY = {"temperature": 0, "num_predict": 12}
DURATIONS = ("total_duration", "prompt_eval_duration", "eval_duration")


@pytest.fixture(scope="module")
def url(tiny_chat: Pyramid) -> Iterator[str]:
    settings = ServerSettings(chat_template=QWEN_TEMPLATE, api_key=KEY)
    with live_server(tiny_chat, settings) as live:
        yield live.url


@pytest.fixture()
def client(url: str) -> ollama.Client:
    return ollama.Client(host=url, headers=AUTH, timeout=60)


def post(url: str, path: str, body: Any, **kw: Any) -> httpx.Response:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    headers = {**AUTH, "Content-Type": "application/json", **kw.pop("headers", {})}
    return httpx.post(f"{url}{path}", content=data, headers=headers, timeout=60, **kw)


def ollama_error(r: httpx.Response, status: int, *fragments: str) -> str:
    """An error in Ollama's shape: the status, ``{"error": one line}`` saying every fragment."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    assert "\n" not in body["error"] and "Traceback" not in body["error"], body
    assert all(f in body["error"] for f in fragments), body
    return str(body["error"])


def finished(r: Any, raw: dict[str, Any] | None = None) -> None:
    """The last object of an answer: done, Ollama's counts and durations; with the ``raw``
    object, llama-server's ``timings`` (speculation stats), which the client drops."""
    assert r.done is True and r.done_reason in ("stop", "length"), r
    assert r.eval_count and r.eval_count >= 1 and r.prompt_eval_count and r.prompt_eval_count > 1
    assert all(isinstance(r[k], int) and r[k] >= 0 for k in DURATIONS), r
    assert r.total_duration >= r.eval_duration
    if raw is not None:
        timings = raw["timings"]
        assert timings["mode"] == "sd" and timings["predicted_n"] == r.eval_count
        assert timings["draft_n"] >= timings["draft_n_accepted"] >= 0


# --- the happy paths ---------------------------------------------------------------------------


def test_chat_whole_and_streamed_agree(client: ollama.Client) -> None:
    messages = [{"role": "user", "content": "the cat"}]
    client.chat("tiny", messages=messages, options=GREEDY, stream=False)  # same cache state
    whole = client.chat("tiny", messages=messages, options=GREEDY, stream=False)
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.model == "tiny" and whole.created_at
    finished(whole)
    parts = list(client.chat("tiny", messages=messages, options=GREEDY, stream=True))
    assert len(parts) >= 2 and not any(p.done for p in parts[:-1])
    finished(parts[-1])
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count


def test_generate_streams_by_default(url: str) -> None:
    body = {"model": "tiny", "prompt": "def fib", "options": GREEDY}
    with httpx.stream("POST", f"{url}/api/generate", json=body, headers=AUTH, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-1]["done"] is True and all(not x["done"] for x in lines[:-1])
    assert all("response" in x for x in lines)
    finished(ollama.GenerateResponse.model_validate(lines[-1]), lines[-1])


def test_generate_num_predict_and_raw(client: ollama.Client) -> None:
    r = client.generate("tiny", "the model", options={"temperature": 0, "num_predict": 3})
    assert r.eval_count == 3 and r.done_reason == "length"
    raw = client.generate(
        "tiny", "the model", raw=True, options={"temperature": 0, "num_predict": 3}
    )
    assert raw.prompt_eval_count and r.prompt_eval_count
    assert raw.prompt_eval_count < r.prompt_eval_count  # no chat template around it


def test_generate_with_a_json_schema(client: ollama.Client) -> None:
    r = client.generate(
        "tiny", "describe a person", format=KEYED, options={"temperature": 0, "num_predict": 200}
    )
    assert r.done_reason == "stop"
    jsonschema.validate(json.loads(r.response or ""), KEYED)
    anything = client.chat(
        "tiny",
        messages=[{"role": "user", "content": "json"}],
        format="json",
        options={"temperature": 0.8, "seed": 3, "num_predict": 200},
    )
    if anything.done_reason == "stop":
        assert isinstance(json.loads(anything.message.content or ""), dict)


def test_tools_auto_answers_parse(client: ollama.Client) -> None:
    r = client.chat("tiny", messages=TINY_MESSAGES, tools=TINY_TOOLS, options=GREEDY)
    finished(r)
    assert "<tool_call>" not in (r.message.content or "")
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TINY_TOOLS}
    for call in r.message.tool_calls or []:
        jsonschema.validate(dict(call.function.arguments), schemas[call.function.name])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_calls_come_as_ollama_objects(url: str, stream: bool) -> None:
    """``tool_choice`` (an extension) forces a call; it comes as Ollama's ``tool_calls``,
    arguments as an object valid under the tool's schema; a tool's result goes back in."""
    body = {
        "model": "tiny",
        "messages": TINY_MESSAGES,
        "tools": TINY_TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        "options": {"temperature": 0, "num_predict": 120},
        "stream": stream,
    }
    r = post(url, "/api/chat", body)
    assert r.status_code == 200, r.text
    lines = [json.loads(x) for x in r.text.splitlines() if x] if stream else [r.json()]
    last = ollama.ChatResponse.model_validate(lines[-1])
    finished(last, lines[-1])
    assert last.done_reason == "stop"
    (call,) = last.message.tool_calls or []
    assert call.function.name == "get_time"
    jsonschema.validate(dict(call.function.arguments), TINY_TOOLS[1]["function"]["parameters"])
    assert "<tool_call>" not in "".join(x["message"]["content"] for x in lines)
    history = [
        *TINY_MESSAGES,
        {"role": "assistant", "content": "", "tool_calls": [lines[-1]["message"]["tool_calls"][0]]},
        {"role": "tool", "content": "12:00", "tool_name": "get_time"},
    ]
    after = post(url, "/api/chat", {**body, "messages": history, "tool_choice": None})
    assert after.status_code == 200, after.text


def test_list_show_ps_version(client: ollama.Client, url: str) -> None:
    (model,) = client.list().models
    assert model.model == "tiny" and model.size and model.size > 0
    assert model.details and model.details.format == "gguf"
    shown = client.show("tiny")
    assert (
        shown.capabilities and "tools" in shown.capabilities and "completion" in shown.capabilities
    )
    assert shown.template == QWEN_TEMPLATE and shown.modelinfo
    (running,) = client.ps().models
    assert running.model == "tiny"
    version = httpx.get(f"{url}/api/version").json()["version"]
    assert isinstance(version, str) and version


def test_empty_prompt_loads(client: ollama.Client) -> None:
    r = client.generate("tiny", "")
    assert r.done and r.done_reason == "load" and r.response == ""


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "fragments"),
    [
        ("/api/chat", b"{not json", ("invalid JSON",)),
        ("/api/generate", b"[1, 2]", ("JSON object",)),
        ("/api/chat", {"model": "tiny", "messages": "hi"}, ("messages",)),
        ("/api/chat", {"model": "tiny", "messages": [{"content": "x"}]}, ("role",)),
        ("/api/generate", {"model": "tiny", "prompt": "x", "options": {"temperature": "hot"}},
         ("temperature",)),
        ("/api/generate", {"model": "tiny", "prompt": "x", "options": {"top_p": 5}},
         ("option top_p must be in (0, 1], got 5",)),
        ("/api/generate", {"model": "tiny", "prompt": "x", "options": {"temperature": -1}},
         ("option temperature must be >= 0, got -1",)),
        ("/api/generate", {"model": "tiny", "prompt": "x", "options": {"num_predict": 0}},
         ("option num_predict must be at least 1",)),
        ("/api/generate", {"model": "tiny", "prompt": "x", "options": {"repeat_penalty": 0}},
         ("option repeat_penalty must be > 0",)),
        ("/api/generate", {"model": "tiny", "prompt": "x", "options": {"typical_p": 0}},
         ("option typical_p must be > 0",)),
        ("/api/generate", {"model": "tiny", "prompt": "x", "options": {"repeat_last_n": -5}},
         ("option repeat_last_n must be >= -1",)),
        ("/api/generate", {"model": "tiny", "prompt": "x", "options": {"repeat_last_n": 1.5}},
         ("repeat_last_n",)),
        ("/api/generate", {"model": "tiny", "prompt": "x", "options": {"tfs_z": 0.5}},
         ("tfs_z", "not supported")),
        ("/api/generate", {"model": "tiny", "prompt": "x", "options": {"mirostat": 2}},
         ("mirostat",)),
        ("/api/generate", {"model": "tiny", "prompt": "x", "options": {"stop": 3}}, ("stop",)),
        ("/api/generate", {"model": "tiny", "prompt": "x", "options": [1]}, ("options",)),
        ("/api/generate", {"model": "tiny", "prompt": "x", "format": "xml"}, ("format",)),
        ("/api/generate", {"model": "tiny", "prompt": "x", "format": {"type": "nonsense"}},
         ("format",)),
        ("/api/generate", {"model": "tiny", "prompt": "x", "suffix": "y"}, ("suffix",)),
        ("/api/generate", b'{"model": "tiny", "prompt": "a\\ud800"}', ("UTF-8",)),
        ("/api/chat", b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udfff"}]}',
         ("UTF-8",)),
        ("/api/generate", {"model": "tiny", "prompt": 5}, ("prompt",)),
        ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": 5}]},
         ("content",)),
        ("/api/chat", {"model": "tiny", "messages": [{"role": "assistant", "content": "",
                       "tool_calls": [{"function": {}}]}]}, ("tool_calls[0]",)),
        ("/api/generate", {"model": "tiny", "prompt": "x", "images": ["aGk="]}, ("images",)),
        ("/api/chat", {"model": "tiny", "messages": TINY_MESSAGES, "think": True}, ("think",)),
        ("/api/chat", {"model": "tiny", "messages": TINY_MESSAGES, "tools": "x"}, ("tools",)),
        ("/api/chat", {"model": "tiny", "messages": TINY_MESSAGES, "tools": TINY_TOOLS,
                       "format": "json"}, ("tools",)),
        ("/api/chat", {"model": "tiny", "messages": TINY_MESSAGES, "mode": "warp"}, ("mode",)),
    ],
)  # fmt: skip
def test_bad_input_is_an_ollama_400(url: str, path: str, body: Any, fragments: Any) -> None:
    ollama_error(post(url, path, body), 400, *fragments)


def test_the_client_raises_ollama_errors(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        client.generate("tiny", "x", options={"mirostat": 2})
    assert e.value.status_code == 400 and "mirostat" in e.value.error
    neutral = {"mirostat": 0, "tfs_z": 1.0, "num_ctx": 4096, "whatever": 1}
    assert client.generate("tiny", "x", options={**neutral, "num_predict": 2}).done


def test_sampler_options_map_onto_the_sampling_config() -> None:
    options = {
        "repeat_penalty": 1.3,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "repeat_last_n": -1,
        "typical_p": 0.9,
        "top_k": 7,
        "top_p": 0.8,
        "min_p": 0.1,
    }
    got = sampling_of(options, SamplingConfig(), num_ctx=4096)
    for name, value in options.items():
        assert getattr(got, name) == value, name


def test_penalties_change_a_repetitive_answer(client: ollama.Client) -> None:
    """Greedy on the tiny model loops; the penalties (over the whole context) break the loop,
    and a seeded answer under them is reproducible."""
    prompt = "the model the model the model the model"
    greedy = {"temperature": 0, "num_predict": 40}
    plain = client.generate("tiny", prompt, raw=True, options=greedy).response
    penalised = {**greedy, "repeat_penalty": 1.8, "presence_penalty": 2.0, "repeat_last_n": -1}
    once = client.generate("tiny", prompt, raw=True, options=penalised).response
    assert once != plain
    again = client.generate("tiny", prompt, raw=True, options=penalised).response
    assert again == once
    words = (once or "").split()
    assert len(set(words)) > len(set((plain or "").split()))


@pytest.mark.parametrize("action", ["pull", "create", "push", "copy"])
def test_model_management_is_a_clear_error(url: str, action: str) -> None:
    ollama_error(post(url, f"/api/{action}", {"model": "llama3"}), 501, "does not manage models")
    with pytest.raises(ollama.ResponseError, match="does not manage models"):
        ollama.Client(host=url, headers=AUTH).pull("llama3")


def test_delete_and_embed_are_clear_errors(url: str) -> None:
    r = httpx.request("DELETE", f"{url}/api/delete", json={"model": "x"}, headers=AUTH)
    ollama_error(r, 501, "does not manage models")
    # no --embedding-model: how to load one (tests/test_embeddings.py serves one)
    ollama_error(post(url, "/api/embed", {"model": "x", "input": "y"}), 400, "--embedding-model")


def test_the_api_key_is_checked(url: str) -> None:
    body = {"model": "tiny", "prompt": "x"}
    ollama_error(post(url, "/api/generate", body, headers={"Authorization": "Bearer no"}), 401)
    ollama_error(httpx.get(f"{url}/api/tags"), 401, "API key")
    assert httpx.get(f"{url}/api/tags", headers={"X-Api-Key": KEY}).status_code == 200
    assert httpx.get(f"{url}/api/version").status_code == 200  # a public probe, as in Ollama
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=url).list()
    assert e.value.status_code == 401


# --- the queue and the client's disconnect -----------------------------------------------------


@pytest.fixture(scope="module")
def small(tiny_target: Any) -> Iterator[tuple[str, Pyramid]]:
    """The tiny target alone behind a queue of one, no API key."""
    pyramid = Pyramid.from_paths(tiny_target, load=TINY_CHAT_LOAD, name="plain")
    with pyramid, live_server(pyramid, ServerSettings(queue_size=1)) as live:
        yield live.url, pyramid


def test_full_queue_is_a_503_and_a_gone_client_cancels(
    small: tuple[str, Pyramid], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, pyramid = small
    generate = pyramid._generate

    def slow(*args: Any, **kwargs: Any) -> Iterator[Any]:
        for step in generate(*args, **kwargs):
            yield step
            time.sleep(0.5)  # the slot stays busy after each step

    monkeypatch.setattr(pyramid, "_generate", slow)
    before = httpx.get(f"{url}/health").json()["cancelled"]
    body = {"model": "plain", "prompt": "the cat", "options": {"num_predict": 50}}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", f"{url}/api/generate", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()  # keep a reference: a dropped iterator closes the response
            assert json.loads(next(lines))["done"] is False
            busy = http.post(f"{url}/api/chat", json={"model": "plain", "messages": TINY_MESSAGES})
            ollama_error(busy, 503, "retry later")
            assert busy.headers["Retry-After"] == "1"
        deadline = time.monotonic() + 10  # far less than the 25 s the request would run
        while (health := http.get(f"{url}/health").json())["cancelled"] != before + 1:
            assert time.monotonic() < deadline, health
            time.sleep(0.05)
        assert health["in_flight"] == 0
    monkeypatch.undo()
    ok = ollama.Client(host=url).generate("plain", "hi", options={"num_predict": 2})
    assert ok.done and ok.eval_count == 2
