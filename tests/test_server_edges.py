"""Issue 24, the server's share: bad requests that were 500s, timings, disconnects, shutdown.

Tiny synthetic models behind a live uvicorn server, as in ``test_server.py``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from serving_support import LOAD, Live, free_port, slow_generation, wait_idle

from pyramid_gguf.api import Pyramid
from pyramid_gguf.serving.app import Server, create_app
from pyramid_gguf.serving.settings import ServerSettings


@contextmanager
def running(pyramid: Pyramid) -> Iterator[tuple[Live, Server]]:
    """The app on this project's :class:`Server` in a background thread."""
    port = free_port()
    config = uvicorn.Config(
        create_app(pyramid, ServerSettings()),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=60,
    )
    server = Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield Live(f"http://127.0.0.1:{port}", pyramid), server
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        assert not thread.is_alive()


@pytest.fixture(scope="module")
def target(tiny_target: Path) -> Iterator[Pyramid]:
    with Pyramid.from_paths(tiny_target, load=LOAD, name="tiny") as p:
        yield p


@pytest.fixture(scope="module")
def live(target: Pyramid) -> Iterator[Live]:
    with running(target) as (server, _):
        yield server


def post(live: Live, body: dict[str, Any] | bytes, path: str = "completions") -> httpx.Response:
    if isinstance(body, bytes):
        headers = {"Content-Type": "application/json"}
        return httpx.post(f"{live.v1}/{path}", content=body, headers=headers, timeout=60)
    return httpx.post(f"{live.v1}/{path}", json=body, timeout=60)


def bad_request(r: httpx.Response, *fragments: str, param: str | None = None) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert all(f in error["message"] for f in fragments), error


# --- 1, 2, 3, 9: values that were 500s ----------------------------------------------------------


def test_lone_surrogates_are_400(live: Live) -> None:
    r = post(live, b'{"prompt": "def f():\\ud800", "max_tokens": 2}')
    bad_request(r, "not valid UTF-8: U+D800 at character 8", param="prompt")
    chat = b'{"messages": [{"role": "user", "content": "hi \\udcff"}], "max_tokens": 2}'
    bad_request(post(live, chat, "chat/completions"), "byte 0xff at character 3", param="messages")


def test_seed_minus_one_and_a_tiny_temperature_are_answered(live: Live) -> None:
    r = post(live, {"prompt": "the cat", "max_tokens": 4, "temperature": 0.8, "seed": -1})
    assert r.status_code == 200, r.text
    tiny = post(live, {"prompt": "the cat", "max_tokens": 8, "temperature": 1e-320})
    greedy = post(live, {"prompt": "the cat", "max_tokens": 8, "temperature": 0})
    assert tiny.status_code == 200, tiny.text
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
    bad_request(post(live, {"prompt": "x", "seed": -7}), "--seed must be >= 0")


@pytest.mark.parametrize(
    "body", [b'{"prompt": "x", "tau_q": NaN}', b'{"prompt": "x", "tau_T": 1e999}']
)
def test_non_finite_thresholds_are_400(live: Live, body: bytes) -> None:
    bad_request(post(live, body), "must be a finite number, got")


# --- 10. token ids outside the vocabulary --------------------------------------------------------


def test_out_of_vocabulary_token_ids_are_400(live: Live, target: Pyramid) -> None:
    n_vocab = target.ladder.target.n_vocab
    for bad in (n_vocab, 10**12, -1):
        r = post(live, {"prompt": [1, 2, bad], "max_tokens": 2})
        bad_request(r, f"token id {bad} is not in the model's vocabulary", param="prompt")
    ok = post(live, {"prompt": [[1, 2, n_vocab - 1]], "max_tokens": 2})
    assert ok.status_code == 200, ok.text


# --- 13. timings as llama-server counts them ---------------------------------------------------


def test_timings_count_evaluated_and_cached_prompt_tokens(live: Live) -> None:
    body = {"prompt": "the model of the tree was", "max_tokens": 4, "temperature": 0}
    first, second = post(live, body).json(), post(live, body).json()
    for doc in (first, second):
        t = doc["timings"]
        assert t["prompt_n"] + t["cache_n"] == doc["usage"]["prompt_tokens"]
        assert t["prompt_n"] >= 1
    assert second["timings"]["cache_n"] > 0
    assert second["timings"]["prompt_n"] < second["usage"]["prompt_tokens"]


# --- 11. a non-streamed request whose client leaves ---------------------------------------------


def test_non_streamed_client_leaving_cancels_its_generation(
    live: Live, target: Pyramid, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_generation(target, monkeypatch, pause=0.002)
    before = wait_idle(live.url)["cancelled"]
    body = {"prompt": "the cat", "max_tokens": 900, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up while tokens keep coming
        httpx.post(f"{live.v1}/completions", json=body, timeout=0.5)
    after = wait_idle(live.url)
    assert after["cancelled"] == before + 1 and after["in_flight"] == 0


# --- 15. shutdown with requests in flight -------------------------------------------------------


def test_shutdown_cancels_requests_in_flight_with_openai_errors(
    tiny_target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = {"prompt": "the cat", "max_tokens": 900, "ignore_eos": True}
    with (
        Pyramid.from_paths(tiny_target, load=LOAD, name="tiny") as pyramid,
        running(pyramid) as (
            live,
            server,
        ),
    ):
        slow_generation(pyramid, monkeypatch, pause=0.002)

        def streamed() -> list[str]:
            with httpx.stream(
                "POST", f"{live.v1}/completions", json=slow | {"stream": True}, timeout=60
            ) as r:
                assert r.status_code == 200
                return [line for line in r.iter_lines() if line]

        with ThreadPoolExecutor(2) as pool:
            stream = pool.submit(streamed)  # runs first
            while httpx.get(f"{live.url}/health").json()["in_flight"] < 1:
                time.sleep(0.01)
            queued = pool.submit(post, live, slow)  # waits behind it
            while httpx.get(f"{live.url}/health").json()["in_flight"] < 2:
                time.sleep(0.01)
            server.should_exit = True  # what Ctrl-C does
            events, answer = stream.result(timeout=30), queued.result(timeout=30)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "server_shutting_down"
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "server_shutting_down" and error["type"] == "server_error"
