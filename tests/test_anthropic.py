"""Anthropic's Messages API, live on uvicorn, driven by the official ``anthropic`` client.

The tiny ladder (``sd``) behind an API key: messages whole and streamed (the client's own event
accumulation), system prompts and text blocks, ``max_tokens`` and ``stop_sequences`` stop
reasons, ``count_tokens``, tools; extended thinking behind a small thinking template (thinking
history as the template's ``reasoning_content``, ``thinking`` enabled or disabled, the answer's
thinking as a ``thinking`` block); bad input answered in Anthropic's error shape, never a
traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import anthropic
import httpx
import jsonschema
import pydantic
import pytest
from serving_support import live_server
from tool_support import KEYED, QWEN_TEMPLATE, TINY_TOOLS

from pyramid_gguf import Pyramid
from pyramid_gguf.serving.settings import ServerSettings
from pyramid_gguf.serving.thinking import Thoughts, split

KEY = "sk-anthropic"
USER: Any = [{"role": "user", "content": "the cat"}]
#: Sampling fields the client no longer types (Anthropic's newest models fix them) go as extras.
GREEDY: dict[str, Any] = {"extra_body": {"temperature": 0}}
F = {"name": "f", "input_schema": {"type": "object", "properties": {}}}


@pytest.fixture(scope="module")
def live(tiny_chat: Pyramid) -> Iterator[tuple[str, Pyramid]]:
    settings = ServerSettings(api_key=KEY, chat_template=QWEN_TEMPLATE)
    with live_server(tiny_chat, settings) as server:
        yield server.url, tiny_chat


@pytest.fixture()
def url(live: tuple[str, Pyramid]) -> str:
    return live[0]


@pytest.fixture()
def client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=60)


def prompt_of(usage: Any) -> int:
    """The whole prompt of an Anthropic ``usage``: the tokens evaluated plus those read from
    the prompt cache (Anthropic's ``input_tokens`` leaves the cached ones out)."""
    return int(usage.input_tokens) + int(usage.cache_read_input_tokens or 0)


def post(url: str, path: str, body: Any) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body)
    headers = {"x-api-key": KEY, "content-type": "application/json"}
    return httpx.post(f"{url}{path}", content=data, headers=headers, timeout=60)


def anthropic_error(r: httpx.Response, status: int, kind: str, *fragments: str) -> None:
    """An error in Anthropic's shape, one line saying every fragment."""
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == kind, body
    message = body["error"]["message"]
    assert "\n" not in message and all(f in message for f in fragments), body


def test_message_whole_and_streamed_agree(client: anthropic.Anthropic) -> None:
    ask: dict[str, Any] = {"model": "tiny", "max_tokens": 12, "messages": USER, **GREEDY}
    client.messages.create(**ask)  # the same cache state for both
    whole = client.messages.create(**ask)
    assert whole.type == "message" and whole.role == "assistant" and whole.id.startswith("msg_")
    assert whole.model == "tiny" and whole.stop_reason in ("end_turn", "max_tokens")
    (block,) = whole.content
    assert block.type == "text" and block.text
    assert prompt_of(whole.usage) > 1 and whole.usage.input_tokens >= 1
    assert 1 <= whole.usage.output_tokens <= 12
    assert not whole.model_extra, whole.model_extra  # Anthropic's fields only: no timings
    with client.messages.stream(**ask) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) >= 2 and "".join(pieces) == block.text
    assert final.content[0].type == "text" and final.content[0].text == block.text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert prompt_of(final.usage) == prompt_of(whole.usage)


def test_streamed_events_come_in_anthropics_order(client: anthropic.Anthropic) -> None:
    stream = client.messages.create(
        model="tiny", max_tokens=6, messages=USER, stream=True, **GREEDY
    )
    events: list[Any] = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert events[-2].delta.stop_reason == "max_tokens" and events[-2].usage.output_tokens == 6


def test_system_blocks_and_max_tokens(client: anthropic.Anthropic, url: str) -> None:
    r = client.messages.create(
        model="tiny",
        max_tokens=3,
        **GREEDY,
        system=[{"type": "text", "text": "You are terse."}],
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "the "}, {"type": "text", "text": "cat"}],
            }
        ],
    )
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 3
    counted = client.messages.count_tokens(
        model="tiny", system="You are terse.", messages=[{"role": "user", "content": "the cat"}]
    )
    assert counted.input_tokens == prompt_of(r.usage)


def test_stop_sequences_are_reported(client: anthropic.Anthropic) -> None:
    ask: dict[str, Any] = {"model": "tiny", "max_tokens": 40, "messages": USER, **GREEDY}
    text = client.messages.create(**ask).content[0].text
    stop = text[len(text) // 2 :][:3].strip() or text[:2]
    r = client.messages.create(**ask, stop_sequences=["\x00never", stop])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop, (text, stop, r)
    out = r.content[0].text
    assert stop not in out and text.startswith(out)


def test_count_tokens(client: anthropic.Anthropic) -> None:
    short = client.messages.count_tokens(model="tiny", messages=USER)
    long = client.messages.count_tokens(
        model="tiny", messages=[{"role": "user", "content": "the cat sat on the mat " * 4}]
    )
    assert 1 < short.input_tokens < long.input_tokens


@pytest.mark.parametrize(
    ("body", "fragments"),
    [
        (b"{nope", ("invalid JSON",)),
        (b"[]", ("JSON object",)),
        ({"model": "tiny", "messages": USER}, ("max_tokens",)),
        ({"model": "tiny", "max_tokens": 0, "messages": USER}, ("max_tokens",)),
        ({"model": "tiny", "max_tokens": 4, "messages": []}, ("messages",)),
        ({"model": "tiny", "max_tokens": 4, "messages": [{"role": "robot", "content": "x"}]},
         ("role",)),
        ({"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {}}]}]}, ("image",)),
        ({"model": "tiny", "max_tokens": 4, "messages": [*USER, {"role": "assistant",
          "content": "The"}]}, ("prefill",)),
        ({"model": "tiny", "max_tokens": 4, "messages": USER, "temperature": -1},
         ("temperature",)),
        ({"model": "tiny", "max_tokens": 4, "messages": USER,
          "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, ("tools.0",)),
        ({"model": "tiny", "max_tokens": 4, "messages": USER, "tools": [F],
          "tool_choice": {"type": "tool", "name": "g"}}, ("tool_choice", "'g'")),
        ({"model": "tiny", "max_tokens": 4, "messages": USER, "tools": [F],
          "tool_choice": {"type": "sometimes"}}, ("tool_choice",)),
        ({"model": "tiny", "max_tokens": 4, "messages": USER, "tools": {"name": "f"}},
         ("tools",)),
        ({"model": "tiny", "max_tokens": 4, "messages": USER, "tools": [F],
          "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
         ("tools",)),
        ({"model": "tiny", "max_tokens": 4, "messages": USER,
          "thinking": {"type": "enabled", "budget_tokens": 1024}},
         ("thinking.budget_tokens", "less than max_tokens")),
        ({"model": "tiny", "max_tokens": 40, "messages": USER,
          "thinking": {"type": "enabled", "budget_tokens": 0}}, ("thinking.budget_tokens",)),
        ({"model": "tiny", "max_tokens": 40, "messages": USER,
          "thinking": {"type": "sometimes"}}, ("thinking.type",)),
        ({"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "x"}]}]},
         ("messages.0.content.0", "assistant")),
        ({"model": "tiny", "max_tokens": 4, "messages": USER, "stop_sequences": [""]},
         ("stop_sequences",)),
        ({"model": "tiny", "max_tokens": 4, "messages": USER, "mode": "warp"}, ("mode",)),
        ({"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "\\udfff"}]},
         ("UTF-8",)),
    ],
)  # fmt: skip
def test_bad_input_is_an_anthropic_400(url: str, body: Any, fragments: Any) -> None:
    if isinstance(body, dict) and "\\udfff" in json.dumps(body):
        body = json.dumps(body).replace("\\\\udfff", "\\udfff").encode()
    anthropic_error(post(url, "/v1/messages", body), 400, "invalid_request_error", *fragments)


def test_the_client_raises_anthropic_errors(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="tiny", max_tokens=4, messages=[])
    assert e.value.status_code == 400
    with pytest.raises(anthropic.BadRequestError):
        bad: Any = [{"role": "user", "content": 5}]
        client.messages.count_tokens(model="tiny", messages=bad)


def test_the_api_key_is_checked(url: str) -> None:
    bad = anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="tiny", max_tokens=2, messages=USER)


class Verdict(pydantic.BaseModel):
    ok: bool
    color: Literal["red", "green", "blue"]


def test_structured_output(client: anthropic.Anthropic) -> None:
    """``output_config.format`` (a JSON schema) is the answer's grammar; the client's
    ``.parse(output_format=...)`` reads a pydantic model back."""
    r = client.messages.create(
        model="tiny",
        max_tokens=200,
        messages=[{"role": "user", "content": "describe a person"}],
        output_config={"format": {"type": "json_schema", "schema": KEYED}},
        **GREEDY,
    )
    assert r.stop_reason == "end_turn"
    jsonschema.validate(json.loads(r.content[0].text), KEYED)
    parsed = client.messages.parse(
        model="tiny", max_tokens=200, messages=USER, output_format=Verdict, **GREEDY
    )
    assert isinstance(parsed.parsed_output, Verdict)


@pytest.mark.parametrize(
    ("fmt", "fragment"),
    [({"type": "xml"}, "json_schema"), ({"type": "json_schema"}, "schema"),
     ({"type": "json_schema", "schema": {"type": "nonsense"}}, "schema")],
)  # fmt: skip
def test_bad_output_formats_are_400s(url: str, fmt: Any, fragment: str) -> None:
    body = {"model": "tiny", "max_tokens": 4, "messages": USER, "output_config": {"format": fmt}}
    anthropic_error(post(url, "/v1/messages", body), 400, "invalid_request_error", fragment)


#: The tiny tools in Anthropic's shape.
TOOLS: Any = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in TINY_TOOLS
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_use_blocks(client: anthropic.Anthropic, stream: bool) -> None:
    """A forced call comes back as a ``tool_use`` block whose input is valid under the tool's
    schema (``stop_reason: "tool_use"``), whole or through the client's stream accumulation;
    the ``tool_result`` goes back in the next turn."""
    ask: dict[str, Any] = {
        "model": "tiny",
        "max_tokens": 120,
        "messages": USER,
        "tools": TOOLS,
        "tool_choice": {"type": "tool", "name": "get_time"},
        **GREEDY,
    }
    if stream:
        with client.messages.stream(**ask) as events:
            r = events.get_final_message()
    else:
        r = client.messages.create(**ask)
    assert r.stop_reason == "tool_use", r
    (use,) = [b for b in r.content if b.type == "tool_use"]
    assert use.name == "get_time" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, TOOLS[1]["input_schema"])
    assert all("<tool_call>" not in b.text for b in r.content if b.type == "text")
    turn: Any = {"role": "assistant", "content": [b.model_dump() for b in r.content]}
    result: Any = {"type": "tool_result", "tool_use_id": use.id, "content": "12:00"}
    after = client.messages.create(
        model="tiny",
        max_tokens=4,
        messages=[*USER, turn, {"role": "user", "content": [result]}],
        tools=TOOLS,
        **GREEDY,
    )
    assert prompt_of(after.usage) > prompt_of(r.usage)


def test_any_tool_may_be_called_in_parallel_or_not(client: anthropic.Anthropic) -> None:
    r = client.messages.create(
        model="tiny",
        max_tokens=160,
        messages=USER,
        tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        **GREEDY,
    )
    uses = [b for b in r.content if b.type == "tool_use"]
    assert r.stop_reason == "tool_use" and len(uses) == 1
    schemas = {t["name"]: t["input_schema"] for t in TOOLS}
    jsonschema.validate(uses[0].input, schemas[uses[0].name])


# --- extended thinking ------------------------------------------------------------------------

#: A thinking model's template in the manner of Qwen3's: an assistant's ``reasoning_content`` in
#: ``<think>`` tags, the answer's thinking opened by the prompt, or closed empty when
#: ``enable_thinking`` is false.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking %}<think>\n{% else %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
THOUGHT = "The user names an animal; I should say something about cats."


def history(thinking: bool) -> Any:
    """A finished turn (with its thinking, or without) and the next question."""
    said: list[dict[str, Any]] = [{"type": "text", "text": "Cats sleep a lot."}]
    if thinking:
        said.insert(0, {"type": "thinking", "thinking": THOUGHT, "signature": ""})
    return [*USER, {"role": "assistant", "content": said}, {"role": "user", "content": "more"}]


@pytest.fixture(scope="module")
def thinker_url(tiny_chat: Pyramid) -> Iterator[str]:
    """The tiny ladder behind :data:`THINKING_TEMPLATE`."""
    settings = ServerSettings(api_key=KEY, chat_template=THINKING_TEMPLATE)
    with live_server(tiny_chat, settings) as server:
        yield server.url


@pytest.fixture()
def thinker(thinker_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=thinker_url, api_key=KEY, max_retries=0, timeout=60)


def counted(client: anthropic.Anthropic, messages: Any, **kw: Any) -> int:
    return client.messages.count_tokens(model="tiny", messages=messages, **kw).input_tokens


def test_thinking_history_is_the_templates_reasoning(
    thinker: anthropic.Anthropic, client: anthropic.Anthropic
) -> None:
    """Thinking blocks of earlier turns render where the template renders reasoning (more
    tokens, the same count for ``messages`` as for ``count_tokens``) and are left out where it
    does not (Qwen2.5's: the same count as without them); redacted thinking is left out."""
    with_thought, without = counted(thinker, history(True)), counted(thinker, history(False))
    assert with_thought > without
    r = thinker.messages.create(model="tiny", max_tokens=2, messages=history(True), **GREEDY)
    assert prompt_of(r.usage) == with_thought
    assert counted(client, history(True)) == counted(client, history(False))
    redacted: Any = history(False)
    redacted[1]["content"].insert(0, {"type": "redacted_thinking", "data": "opaque"})
    assert counted(thinker, redacted) == without


def test_thinking_enabled_or_disabled_is_the_templates_switch(thinker: anthropic.Anthropic) -> None:
    on = counted(thinker, USER, thinking={"type": "enabled", "budget_tokens": 1024})
    off = counted(thinker, USER, thinking={"type": "disabled"})
    assert off > on  # disabled: the template closes an empty thinking block in the prompt
    assert counted(thinker, USER) == on  # not asked: the template's default, thinking on


def test_the_answers_thinking_is_a_thinking_block(thinker: anthropic.Anthropic) -> None:
    """Behind a template that opens the thinking, the answer is thinking until ``</think>``
    (the tiny model never writes it): one ``thinking`` block, whole or streamed (thinking
    deltas, an empty signature before the block closes)."""
    ask: dict[str, Any] = {
        "model": "tiny",
        "max_tokens": 12,
        "messages": USER,
        "thinking": {"type": "enabled", "budget_tokens": 8},
        **GREEDY,
    }
    thinker.messages.create(**ask)  # the same cache state for both
    whole = thinker.messages.create(**ask)
    (block,) = whole.content
    assert block.type == "thinking" and block.thinking and block.signature == ""
    assert whole.stop_reason in ("end_turn", "max_tokens") and whole.usage.output_tokens <= 12
    events: list[Any] = list(thinker.messages.create(**ask, stream=True))
    kinds = [(e.type, e.delta.type if e.type == "content_block_delta" else None) for e in events]
    assert kinds[1] == ("content_block_start", None) and events[1].content_block.type == "thinking"
    assert set(kinds[2:-4]) == {("content_block_delta", "thinking_delta")}
    assert kinds[-4:-2] == [
        ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
    ]
    assert "".join(e.delta.thinking for e in events[2:-4]) == block.thinking
    with thinker.messages.stream(**ask) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking == block.thinking


@pytest.mark.parametrize(
    ("text", "opened", "thought", "answer"),
    [
        ("<think>\nsum it\n\nis 4\n</think>\n\nIt is 4.", False, "sum it\n\nis 4", "It is 4."),
        ("sum it\n</think>\n\nIt is 4.", True, "sum it", "It is 4."),
        ("It is 4.", False, "", "It is 4."),
        ("It is <think>4</think>", False, "", "It is <think>4</think>"),
        ("\n<think>cut short </thi", False, "cut short </thi", ""),
        ("<thi", False, "", "<thi"),
    ],
)
def test_thoughts_split_alike_whole_or_in_pieces(
    text: str, opened: bool, thought: str, answer: str
) -> None:
    assert split(text, opened) == (thought, answer)
    for size in (1, 2, 3, 5):
        thoughts = Thoughts(opened)
        parts = [thoughts.feed(text[i : i + size]) for i in range(0, len(text), size)]
        parts.append(thoughts.finish())
        assert ("".join(t for t, _ in parts), "".join(a for _, a in parts)) == (thought, answer)
