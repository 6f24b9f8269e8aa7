"""No control-token text in any content (issue 40): with tools the answer is rendered with
special tokens, so that the call parser sees the format's markers; every other control token
(``<|im_start|>``, ``<s>``...) is dropped from content, streamed or not, and a call written
after one is still read.

The tiny ladder behind the Qwen2.5 template samples its own BOS ``<s>`` (a control token that
does not end a generation) now and then; the real Qwen2.5-Coder 0.5B is asked tool-result
follow-ups, sampled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving_support import live_server
from tool_support import QWEN_TEMPLATE, TINY_MESSAGES, TINY_TOOLS, TOOLS

from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.chat import parse_tool_request
from pyramid_gguf.serving.openai import create_chat_completion
from pyramid_gguf.serving.settings import ServerSettings


def sampling(seed: int) -> SamplingConfig:
    return SamplingConfig(temperature=1.5, seed=seed, max_tokens=48)


def seeds_writing_bos(tiny_chat: Pyramid, n: int) -> list[int]:
    """Seeds whose raw auto-tools answer holds the control token ``<s>``."""
    tools = parse_tool_request(TINY_TOOLS, "auto", None)
    found = []
    for seed in range(200):
        chat = tiny_chat.prepare_chat(TINY_MESSAGES, sampling(seed), tools, QWEN_TEMPLATE)
        raw = tiny_chat.generate(chat.tokens, chat.sampling, special=True).text
        if "<s>" in raw:
            found.append(seed)
            if len(found) == n:
                return found
    raise AssertionError("no sampled answer wrote <s>")


def test_the_vocabularys_control_tokens_are_dropped_but_not_the_formats_markers(
    tiny_chat: Pyramid,
) -> None:
    tools = parse_tool_request(TINY_TOOLS, "auto", None)
    chat = tiny_chat.prepare_chat(TINY_MESSAGES, sampling(0), tools, QWEN_TEMPLATE)
    assert chat.special and {"<s>", "</s>"} <= chat.controls
    assert "<tool_call>" not in chat.controls
    plain = tiny_chat.prepare_chat(TINY_MESSAGES, sampling(0), None, QWEN_TEMPLATE)
    assert not plain.special and plain.controls == frozenset()


def test_no_control_token_in_content_through_every_door(tiny_chat: Pyramid) -> None:
    seeds = seeds_writing_bos(tiny_chat, 2)
    for seed in seeds:
        out = create_chat_completion(
            tiny_chat, TINY_MESSAGES, sampling(seed), chat_template=QWEN_TEMPLATE, tools=TINY_TOOLS
        )
        assert "<s>" not in (out["choices"][0]["message"]["content"] or "")
    settings = ServerSettings(chat_template=QWEN_TEMPLATE)
    with live_server(tiny_chat, settings) as live:
        for seed in seeds:
            body: dict[str, Any] = {
                "messages": TINY_MESSAGES,
                "tools": TINY_TOOLS,
                "temperature": 1.5,
                "seed": seed,
                "max_tokens": 48,
            }
            r = httpx.post(f"{live.v1}/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            assert "<s>" not in (r.json()["choices"][0]["message"]["content"] or "")
            streamed = ""
            with httpx.stream(
                "POST", f"{live.v1}/chat/completions", json={**body, "stream": True}
            ) as s:
                for line in s.iter_lines():
                    if line.startswith("data: {"):
                        for choice in json.loads(line[6:])["choices"]:
                            streamed += choice["delta"].get("content") or ""
            assert "<s>" not in streamed
            assert streamed == (r.json()["choices"][0]["message"]["content"] or "")


@pytest.mark.real
def test_sampled_tool_result_follow_ups_carry_no_control_tokens(qwen_draft_path: Path) -> None:
    """The openai-agents loop of the issue: a call, its result, and the answer after it,
    sampled; no content holds ``<|...|>`` control-token text."""
    load = LoadConfig(n_ctx=4096, n_batch=512, n_threads=2, n_threads_batch=2, flash_attn=False)
    call = {"name": "get_weather", "arguments": json.dumps({"city": "Oslo", "unit": "celsius"})}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "What's the weather in Oslo? Use celsius."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 17}'},
    ]
    with Pyramid.from_paths(qwen_draft_path, load=load, spec=SpecConfig(mode="target")) as p:
        for seed in range(8):
            out = create_chat_completion(
                p, messages, SamplingConfig(temperature=1.0, seed=seed, max_tokens=40), tools=TOOLS
            )
            content = out["choices"][0]["message"]["content"] or ""
            assert "<|" not in content, content
