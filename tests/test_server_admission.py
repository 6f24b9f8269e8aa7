"""One admission for every door: embeddings share the slots' bounded queue with generations
(the same 503 past its bound, a gone client's request cancelled), every dialect refuses a
prompt over a slot's context before admission in its own error shape, and each route's errors
(the API key's 401 included) take its dialect's shape whatever its path."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import httpx
import pytest
from conftest import TINY_LOAD
from serving_support import Live, health, live_server, post, slow_generation, wait_until
from synth import write_tiny_llama

from pyramid_gguf.api import Pyramid
from pyramid_gguf.embeddings import Embedder, EmbeddingConfig
from pyramid_gguf.serving.settings import ServerSettings

KEY = "sk-admission"
AUTH = {"Authorization": f"Bearer {KEY}"}
#: Far more tokens than a slot's context (TINY_LOAD's 512) holds, in any tokenizer.
LONG = "the cat sat on the mat and " * 400
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


class _MeanPooled(gguf.GGUFWriter):
    """A GGUF writer that records mean pooling in the header, as embedding models do."""

    def write_header_to_file(self, *args: Any, **kwargs: Any) -> None:
        self.add_pooling_type(gguf.PoolingType.MEAN)
        super().write_header_to_file(*args, **kwargs)


@pytest.fixture(scope="module")
def embedder(tiny_dir: Path) -> Iterator[Embedder]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFWriter", _MeanPooled)
        path = write_tiny_llama(tiny_dir / "admission-embed.gguf", seed=21, name="tiny-embed")
    with Embedder.load(path, EmbeddingConfig(n_threads=1)) as e:
        yield e


@pytest.fixture(scope="module")
def one(tiny_target: Path, embedder: Embedder) -> Iterator[Live]:
    """The tiny target with an embedding model behind a queue of one."""
    pyramid = Pyramid.from_paths(tiny_target, load=TINY_LOAD, name="tiny")
    with pyramid, live_server(pyramid, ServerSettings(queue_size=1), embedder) as live:
        yield live


@pytest.fixture(scope="module")
def two(tiny_target: Path, embedder: Embedder) -> Iterator[Live]:
    """The tiny target (one slot) with an embedding model behind a queue of two."""
    pyramid = Pyramid.from_paths(tiny_target, load=TINY_LOAD, name="tiny")
    with pyramid, live_server(pyramid, ServerSettings(queue_size=2), embedder) as live:
        yield live


@pytest.fixture(scope="module")
def keyed(tiny_chat: Pyramid, embedder: Embedder) -> Iterator[Live]:
    """The tiny chat ladder behind an API key."""
    with live_server(tiny_chat, ServerSettings(api_key=KEY), embedder) as live:
        yield live


# --- embeddings in the one queue ---------------------------------------------------------------


def test_an_embedding_past_the_bound_gets_the_503_a_chat_gets(
    one: Live, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, gate = threading.Event(), threading.Event()
    run = embedder.run

    def held(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        gate.wait(30)
        return run(*args, **kwargs)

    monkeypatch.setattr(embedder, "run", held)
    first: list[httpx.Response] = []
    waiting = threading.Thread(
        target=lambda: first.append(post(f"{one.v1}/embeddings", {"input": "a cat"}))
    )
    waiting.start()
    try:
        assert entered.wait(10)  # the embedding runs on the pool's worker, its place taken
        embedding = post(f"{one.v1}/embeddings", {"input": "a dog"})
        chat = post(f"{one.v1}/chat/completions", CHAT)
        assert embedding.status_code == chat.status_code == 503
        assert embedding.json() == chat.json() and chat.json()["error"]["code"] == "queue_full"
        assert embedding.headers["Retry-After"] == chat.headers["Retry-After"] == "1"
        ollama = post(f"{one.url}/api/embed", {"input": "a dog"})
        assert ollama.status_code == 503 and ollama.json() == {
            "error": chat.json()["error"]["message"]
        }
    finally:
        gate.set()
        waiting.join(30)
    assert first[0].status_code == 200 and len(first[0].json()["data"]) == 1
    assert health(one.url)["in_flight"] == 0


def test_a_gone_clients_embedding_is_cancelled_and_never_runs(
    two: Live, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_generation(two.pyramid, monkeypatch)
    before, inputs = health(two.url), embedder.counts().inputs
    body = {"prompt": "the cat", "max_tokens": 50, "stream": True}
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", f"{two.v1}/completions", json=body) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()  # keep a reference: a dropped iterator closes the response
        assert next(lines).startswith("data: ")  # the one slot is busy generating
        with pytest.raises(httpx.ReadTimeout):  # queued behind it; the client gives up
            httpx.post(
                f"{two.v1}/embeddings",
                json={"input": "a cat"},
                timeout=httpx.Timeout(30, read=1.0),
            )
        wait_until(two.url, lambda h: h["in_flight"] == 2)
    # the generation's client went too: the queue empties, the embedding never having run
    after = wait_until(two.url, lambda h: h["in_flight"] == 0)
    assert after["cancelled"] == before["cancelled"] + 2
    assert embedder.counts().inputs == inputs
    monkeypatch.undo()
    again = post(f"{two.v1}/embeddings", {"input": "a cat"})
    assert again.status_code == 200 and embedder.counts().inputs == inputs + 1


def test_the_servers_shutdown_answers_a_running_embedding(
    tiny_target: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, gate = threading.Event(), threading.Event()
    run = embedder.run

    def held(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        gate.wait(30)
        return run(*args, **kwargs)

    monkeypatch.setattr(embedder, "run", held)
    pyramid = Pyramid.from_paths(tiny_target, load=TINY_LOAD, name="tiny")
    with pyramid, live_server(pyramid, ServerSettings(), embedder) as live:
        service = live.app.state.service
        answer: list[httpx.Response] = []
        waiting = threading.Thread(
            target=lambda: answer.append(post(f"{live.v1}/embeddings", {"input": "a cat"}))
        )
        waiting.start()
        try:
            assert entered.wait(10)
            (reader,) = service.readers  # tracked as every open generation is
            # what the server does on its event loop when it starts to stop
            reader._loop.call_soon_threadsafe(service.stop)
            waiting.join(30)
        finally:
            gate.set()
        assert answer[0].status_code == 503
        assert answer[0].json()["error"]["code"] == "server_shutting_down"


# --- a prompt over the context, refused before admission, each dialect in its shape ------------


def _refused(live: Live, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The 400 of ``body`` at ``path``, checked to have admitted nothing."""
    before = health(live.url)
    r = post(f"{live.url}{path}", body, AUTH)
    assert r.status_code == 400, r.text
    after = health(live.url)
    for count in ("completed", "cancelled", "in_flight"):
        assert after[count] == before[count], (count, before, after)
    assert "exceeds the available context size" in r.text
    return dict(r.json())


def test_every_dialect_refuses_an_over_long_prompt_in_its_shape(keyed: Live) -> None:
    turn = [{"role": "user", "content": LONG}]
    openai_chat = _refused(keyed, "/v1/chat/completions", {"messages": turn, "max_tokens": 2})
    assert openai_chat["error"]["code"] == "context_length_exceeded"
    completion = _refused(keyed, "/v1/completions", {"prompt": LONG, "max_tokens": 2})
    assert completion["error"]["code"] == "context_length_exceeded"
    responses = _refused(keyed, "/v1/responses", {"input": LONG, "max_output_tokens": 2})
    assert responses["error"]["code"] == "context_length_exceeded"
    llama = _refused(keyed, "/completion", {"prompt": LONG, "n_predict": 2})
    assert llama["error"]["type"] == "exceed_context_size_error"
    assert llama["error"]["code"] == 400 and llama["error"]["n_ctx"] == keyed.pyramid.n_ctx
    llama_chat = _refused(keyed, "/chat/completions", {"messages": turn, "max_tokens": 2})
    assert llama_chat["error"]["type"] == "exceed_context_size_error"
    body = {"model": "tiny", "max_tokens": 2, "messages": turn}
    anthropic = _refused(keyed, "/v1/messages", body)
    assert anthropic["type"] == "error"
    assert anthropic["error"]["type"] == "invalid_request_error"
    for path, ask in (("/api/generate", {"prompt": LONG}), ("/api/chat", {"messages": turn})):
        ollama = _refused(keyed, path, {"model": "tiny", "stream": False} | ask)
        assert set(ollama) == {"error"} and isinstance(ollama["error"], str)


# --- errors in the route's dialect -------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/v1/models", "openai"),
        ("/models", "llama"),
        ("/api/tags", "ollama"),
        ("/api/embed", "ollama"),
        ("/v1/messages", "anthropic"),
        ("/embeddings", "llama"),
        ("/v1/responses", "openai"),
    ],
)
def test_the_api_keys_401_takes_the_routes_shape(keyed: Live, path: str, shape: str) -> None:
    method = "GET" if path in ("/v1/models", "/models", "/api/tags") else "POST"
    r = httpx.request(method, f"{keyed.url}{path}", json={})
    assert r.status_code == 401, r.text
    body = r.json()
    if shape == "openai":
        assert body["error"]["code"] == "invalid_api_key"
    elif shape == "llama":
        assert body["error"]["code"] == 401 and body["error"]["type"] == "authentication_error"
    elif shape == "ollama":
        assert set(body) == {"error"} and "API key" in body["error"]
    else:
        assert body["type"] == "error" and body["error"]["type"] == "authentication_error"


def test_a_path_no_route_has_is_answered_in_openais_shape(keyed: Live) -> None:
    r = httpx.get(f"{keyed.url}/nowhere/at/all", headers=AUTH)
    assert r.status_code == 404
    assert json.loads(r.text)["error"]["type"] == "invalid_request_error"
