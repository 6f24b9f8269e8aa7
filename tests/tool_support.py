"""Tools, chats and tool-call checks the serving tests share (a support module, not a test
module): the tool definitions, the Qwen template, the tiny chat, call ids and the checks of
parsed calls (whole and streamed), a JSON schema with keys, and an OpenAI 400's check."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import jsonschema
from openai.lib.streaming.chat import ChatCompletionStreamState

QWEN_TEMPLATE = (
    Path(__file__).parent / "data" / "templates" / "qwen2.5-instruct.jinja"
).read_text()


CALL_ID = re.compile(r"call_[A-Za-z0-9]{24}")


def function(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool whose parameters are all required."""
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


WEATHER = function(
    "get_weather",
    "Current weather in a city",
    {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
)


TIME = function(
    "get_time",
    "Current local time in a timezone",
    {"timezone": {"type": "string", "description": "IANA timezone, e.g. Europe/Oslo"}},
)


CONVERT = function(
    "convert_length",
    "Convert a length between units",
    {
        "value": {"type": "number"},
        "from_unit": {"type": "string", "enum": ["m", "km", "mi", "ft"]},
        "to_unit": {"type": "string", "enum": ["m", "km", "mi", "ft"]},
    },
)


TOOLS = [WEATHER, TIME, CONVERT]


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def checked_calls(message: Any, tools: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The message's calls as (name, arguments), each checked to have OpenAI's shape and
    arguments valid under its tool's schema."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    out = []
    for call in message.tool_calls or []:
        assert call.type == "function" and CALL_ID.fullmatch(call.id), call
        assert call.function.name in schemas, call
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, schemas[call.function.name])
        out.append((call.function.name, arguments))
    return out


def accumulate(chunks: list[Any]) -> tuple[str | None, list[tuple[str, str, str]], str | None]:
    """Content, calls (id, name, arguments) and finish reason of a stream, put together as a
    client does: a call's id and name come once, its arguments in fragments."""
    content: str | None = None
    calls: dict[int, list[str]] = {}
    finish = None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        if delta.content:
            content = (content or "") + delta.content
        for part in delta.tool_calls or []:
            if part.index not in calls:
                assert part.id and part.function.name and part.type == "function", part
                assert part.index == len(calls), part  # calls arrive in order
                calls[part.index] = [part.id, part.function.name, part.function.arguments or ""]
            else:
                assert part.id is None and not part.function.name, part  # sent once
                calls[part.index][2] += part.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, [(i, n, a) for i, n, a in calls.values()], finish


def same_calls(whole: Any, chunks: list[Any], tools: list[dict[str, Any]]) -> None:
    """The stream rebuilds exactly the non-streamed answer (call ids apart from their random
    values), by our accumulation and by the openai client's own."""
    message = whole.choices[0].message
    content, calls, finish = accumulate(chunks)
    assert finish == whole.choices[0].finish_reason
    assert (content or None) == (message.content or None)
    want = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    assert [(n, a) for _, n, a in calls] == want
    assert all(CALL_ID.fullmatch(i) for i, _, _ in calls)
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(chunk)
    rebuilt = state.get_final_completion().choices[0].message
    assert [(c.function.name, c.function.arguments) for c in rebuilt.tool_calls or []] == want
    assert [c.id for c in rebuilt.tool_calls or []] == [i for i, _, _ in calls]
    checked_calls(rebuilt, tools)


#: Tools whose strings are bounded, so that the tiny model's constrained calls end.
TINY_TOOLS = [
    function(
        "get_weather",
        "Weather",
        {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    ),
    function("get_time", "Time", {"tz": {"type": "string", "maxLength": 6}}),
]


TINY_MESSAGES = [{"role": "user", "content": "the model"}]


#: A keyed schema the byte-fallback tokens can spell, bounded so that answers end.
KEYED: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {
            "type": "array",
            "items": {"enum": ["red", "green", "blue"]},
            "minItems": 1,
            "maxItems": 3,
        },
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}


def bad_request(r: httpx.Response, param: str | None, *fragments: str) -> None:
    """A 400 in OpenAI's error shape, naming ``param`` and saying every fragment."""
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert all(f in error["message"] for f in fragments), error
    assert "\n" not in error["message"]
