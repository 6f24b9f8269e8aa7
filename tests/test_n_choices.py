"""OpenAI's ``n``: several independent choices of one request, whole and streamed, on the tiny
ladder (issue 40): each choice has its index, seeded choices repeat, usage sums them, and
routes that answer one choice refuse ``n > 1``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import TINY_LOAD
from serving_support import Live, live_server

from pyramid_gguf import Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.serving.settings import ServerSettings

HOT = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "ignore_eos": True}
MESSAGES = [{"role": "user", "content": "the tree"}]


@pytest.fixture(scope="module")
def live(tiny_target: Path, tiny_draft: Path) -> Iterator[Live]:
    pyramid = Pyramid.from_paths(
        tiny_target, draft=tiny_draft, load=TINY_LOAD, spec=SpecConfig(mode="sd"), name="tiny"
    )
    settings = ServerSettings(sampling=SamplingConfig(max_tokens=4), queue_size=8)
    with pyramid, live_server(pyramid, settings) as server:
        yield server


def post(live: Live, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{live.url}{path}", json=body, timeout=60)


def chat(live: Live, **body: Any) -> dict[str, Any]:
    r = post(live, "/v1/chat/completions", {"messages": MESSAGES, **HOT, **body})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_n_returns_that_many_indexed_choices_and_sums_usage(live: Live) -> None:
    out = chat(live, n=3, seed=5, max_tokens=4)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert out["usage"]["completion_tokens"] == 12  # 4 tokens each, end ignored
    alone = chat(live, n=1, seed=5, max_tokens=4)
    assert usage_total(alone) == alone["usage"]["prompt_tokens"] + 4
    assert out["usage"]["prompt_tokens"] == alone["usage"]["prompt_tokens"]
    texts = [c["message"]["content"] for c in out["choices"]]
    assert texts[0] == alone["choices"][0]["message"]["content"]  # choice 0 keeps the seed
    assert chat(live, n=3, seed=5, max_tokens=4)["choices"] == out["choices"]  # seeded: repeats
    many = chat(live, n=6, seed=1, max_tokens=4)
    assert len({c["message"]["content"] for c in many["choices"]}) > 1  # independent draws


def usage_total(body: dict[str, Any]) -> int:
    return int(body["usage"]["total_tokens"])


def test_completions_take_n_too(live: Live) -> None:
    r = post(live, "/v1/completions", {"prompt": "the tree", "n": 2, "seed": 3, **HOT})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert out["usage"]["completion_tokens"] == 8


def test_streamed_choices_carry_their_index(live: Live) -> None:
    body = {"messages": MESSAGES, **HOT, "n": 3, "seed": 5, "max_tokens": 4, "stream": True}
    body["stream_options"] = {"include_usage": True}
    with httpx.stream("POST", f"{live.url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines.count("[DONE]") == 1 and lines[-1] == "[DONE]"
    events = [json.loads(line) for line in lines[:-1]]
    usage = [e for e in events if not e["choices"]]
    assert len(usage) == 1 and usage[0]["usage"]["completion_tokens"] == 12
    text: dict[int, str] = {0: "", 1: "", 2: ""}
    finished = set()
    for e in events:
        for c in e["choices"]:
            text[c["index"]] += c["delta"].get("content") or ""
            if c["finish_reason"] is not None:
                finished.add(c["index"])
    assert finished == {0, 1, 2}
    whole = chat(live, n=3, seed=5, max_tokens=4)
    assert [text[i] for i in range(3)] == [c["message"]["content"] for c in whole["choices"]]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": MESSAGES, "n": 0}),
        ("/v1/chat/completions", {"messages": MESSAGES, "n": 129}),
        ("/completion", {"prompt": "the tree", "n": 2}),
    ],
)
def test_bad_n_is_a_400(live: Live, path: str, body: dict[str, Any]) -> None:
    r = post(live, path, body)
    assert r.status_code == 400, r.text
    assert "n" in r.json()["error"]["message"] and "Traceback" not in r.text
