"""OpenAI's Responses API, live on uvicorn, driven by the official ``openai`` client.

The tiny ladder (``sd``) behind the Qwen2.5 template (whose tool calls are Hermes') and an API
key: responses whole and streamed (the client's own event accumulation, ``responses.stream``
and ``create(stream=True)``), instructions and input items, ``max_output_tokens`` ending an
answer ``incomplete``, function tools and their outputs in the next turn, ``.parse`` with a
pydantic model; bad input answered in OpenAI's error shape, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest
from serving_support import live_server
from tool_support import QWEN_TEMPLATE, TINY_TOOLS

from pyramid_gguf import Pyramid
from pyramid_gguf.serving.settings import ServerSettings

KEY = "sk-responses"
ASK: dict[str, Any] = {"model": "tiny", "input": "the cat", "temperature": 0}
#: The tiny tools as the Responses API sends them: flat, ``strict``.
TOOLS: Any = [{"type": "function", **t["function"], "strict": True} for t in TINY_TOOLS]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def live(tiny_chat: Pyramid) -> Iterator[tuple[str, Pyramid]]:
    settings = ServerSettings(api_key=KEY, chat_template=QWEN_TEMPLATE)
    with live_server(tiny_chat, settings) as server:
        yield server.url, tiny_chat


@pytest.fixture()
def url(live: tuple[str, Pyramid]) -> str:
    return live[0]


@pytest.fixture()
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture()
def controls(live: tuple[str, Pyramid]) -> frozenset[str]:
    """The texts of the tiny vocabulary's control tokens, which no answer may show."""
    return live[1].control_texts


def post(url: str, body: Any, path: str = "/v1/responses") -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    return httpx.post(f"{url}{path}", content=data, headers=headers, timeout=60)


def openai_error(r: httpx.Response, status: int, param: str | None, *fragments: str) -> None:
    """An error in OpenAI's shape naming ``param``, one line saying every fragment."""
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert "\n" not in error["message"] and "Traceback" not in error["message"], error
    assert all(f in error["message"] for f in fragments), error


def texts(response: Any) -> list[str]:
    """Every text of a response's output: message parts, call names and arguments."""
    out = []
    for item in response.output:
        if item.type == "message":
            out += [part.text for part in item.content]
        else:
            out += [item.name, item.arguments]
    return out


def clean(response: Any, controls: frozenset[str]) -> None:
    assert not any(c in text for text in texts(response) for c in controls), response.output


# --- answers -----------------------------------------------------------------------------------


def test_create_answers_a_response_object(
    client: openai.OpenAI, url: str, controls: frozenset[str]
) -> None:
    r = client.responses.create(**ASK, max_output_tokens=12)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny"
    (message,) = r.output
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_")
    (part,) = message.content
    assert part.type == "output_text" and part.annotations == [] and part.text
    assert r.output_text == part.text  # the client's own sum of the text parts
    assert r.usage is not None and r.usage.output_tokens <= 12 < r.usage.input_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    if r.status == "incomplete":
        assert r.incomplete_details is not None
        assert r.incomplete_details.reason == "max_output_tokens"
        assert message.status == "incomplete" and r.usage.output_tokens == 12
    else:
        assert r.status == "completed" and r.incomplete_details is None
    assert r.model_extra and r.model_extra["timings"]["mode"] == "sd"
    assert r.model_extra["store"] is False  # accepted, never stored
    raw = post(url, {**ASK, "max_output_tokens": 2}).json()
    assert "output_text" not in raw  # the client computes it
    clean(r, controls)


def test_max_output_tokens_makes_an_incomplete_response(client: openai.OpenAI) -> None:
    r = client.responses.create(**ASK, max_output_tokens=3)
    assert r.status == "incomplete" and r.usage is not None and r.usage.output_tokens == 3
    assert r.incomplete_details is not None and r.incomplete_details.reason == "max_output_tokens"
    events: list[Any] = list(client.responses.create(**ASK, max_output_tokens=3, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.output[0].status == "incomplete"


def test_streamed_events_rebuild_the_whole_answer(client: openai.OpenAI) -> None:
    """``create(stream=True)``: the typed events in the Responses API's order, numbered from 0,
    whose deltas and final response hold the text of the same request answered whole."""
    ask: dict[str, Any] = {**ASK, "max_output_tokens": 10}
    client.responses.create(**ask)  # the same cache state for both
    whole = client.responses.create(**ask)
    events: list[Any] = list(client.responses.create(**ask, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        f"response.{whole.status}",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-4].text == whole.output_text
    final = events[-1].response
    assert final.id == events[0].response.id and final.output[0].content[0].text == deltas
    assert whole.usage is not None and final.usage.output_tokens == whole.usage.output_tokens


def test_llama_servers_stream_telemetry(client: openai.OpenAI) -> None:
    """llama-server's extensions: ``return_progress`` (a ``response.in_progress`` event with the
    prompt's progress), ``timings_per_token`` (``timings`` on every text delta); the last event
    carries the answer's ``timings`` either way."""
    telemetry = {"timings_per_token": True, "return_progress": True}
    ask: dict[str, Any] = {**ASK, "max_output_tokens": 6, "stream": True}
    events: list[Any] = list(client.responses.create(**ask, extra_body=telemetry))
    final = events[-1].model_extra
    (progress,) = [
        e.model_extra["prompt_progress"]
        for e in events
        if "prompt_progress" in (e.model_extra or {})
    ]
    usage = events[-1].response.usage
    assert progress["total"] == progress["processed"] == usage.input_tokens > 0
    assert (
        progress["cache"] == usage.input_tokens_details.cached_tokens and progress["time_ms"] >= 0
    )
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas and all(e.model_extra["timings"]["predicted_n"] >= 1 for e in deltas)
    assert final["timings"] == events[-1].response.model_extra["timings"]
    assert final["timings"]["predicted_n"] == usage.output_tokens
    plain = list(client.responses.create(**ask))
    assert not any("prompt_progress" in (e.model_extra or {}) for e in plain)
    assert not any("timings" in (e.model_extra or {}) for e in plain[:-1])


def test_responses_stream_gets_the_final_response(client: openai.OpenAI) -> None:
    """The client's ``responses.stream`` helper rebuilds a completed answer (a stop string,
    llama-server's ``stop`` extension, ends it before ``max_output_tokens``)."""
    text = client.responses.create(**ASK, max_output_tokens=40).output_text
    stop = text[len(text) // 2 :][:3].strip() or text[:2]
    ask: dict[str, Any] = {**ASK, "max_output_tokens": 40, "extra_body": {"stop": [stop]}}
    whole = client.responses.create(**ask)
    assert whole.status == "completed" and text.startswith(whole.output_text), (text, stop)
    with client.responses.stream(**ask) as stream:
        pieces = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(pieces) == final.output_text == whole.output_text
    assert final.status == "completed" and final.id.startswith("resp_")


def test_instructions_and_input_items_are_the_chats_prompt(client: openai.OpenAI) -> None:
    """``instructions`` is the system prompt, ``developer`` a system turn, text parts are
    joined, earlier assistant turns kept: the prompt is the one chat completions makes of the
    same turns."""
    system, user = (
        "You are terse.",
        [{"type": "input_text", "text": "the "}, {"type": "input_text", "text": "cat"}],
    )
    items: Any = [
        {"role": "developer", "content": system},
        {"type": "message", "role": "user", "content": user},
        {"role": "assistant", "content": [{"type": "output_text", "text": "A cat."}]},
        {"role": "user", "content": "and the dog?"},
    ]  # fmt: skip
    messages: Any = [
        {"role": "system", "content": system},
        {"role": "user", "content": "the cat"},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": "and the dog?"},
    ]
    for turns, instructions in ((items, None), (items[1:], system)):
        r = client.responses.create(
            model="tiny", instructions=instructions, input=turns, max_output_tokens=1
        )
        chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1)
        assert r.usage is not None and chat.usage is not None
        assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.instructions == system
    short = client.responses.create(model="tiny", input=items[:2], max_output_tokens=1)
    assert r.usage is not None and short.usage is not None
    assert short.usage.input_tokens < r.usage.input_tokens


# --- tools -------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_function_call_comes_back_and_its_output_goes_on(
    client: openai.OpenAI, stream: bool, controls: frozenset[str]
) -> None:
    """A forced call is a ``function_call`` item whose arguments match the tool's schema,
    whole or through ``responses.stream``; the call and its ``function_call_output`` go back as
    input items of the next turn."""
    ask: dict[str, Any] = {
        **ASK,
        "max_output_tokens": 120,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "name": "get_time"},
    }
    if stream:
        with client.responses.stream(**ask) as events:
            argument_deltas = [
                e.delta for e in events if e.type == "response.function_call_arguments.delta"
            ]
            r: Any = events.get_final_response()
    else:
        r = client.responses.create(**ask)
    assert r.status == "completed"
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert call.name == "get_time" and call.id.startswith("fc_") and call.status == "completed"
    assert call.call_id.startswith("call_") and call.call_id != call.id
    jsonschema.validate(json.loads(call.arguments), SCHEMAS["get_time"])
    if stream:
        assert "".join(argument_deltas) == call.arguments
        assert json.loads(call.arguments) == call.parsed_arguments  # strict: the client parsed
    clean(r, controls)
    result: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "12:00"}
    turn = [{"role": "user", "content": "the cat"}, call.model_dump(exclude_none=True), result]
    after = client.responses.create(
        model="tiny", input=turn, tools=TOOLS, max_output_tokens=4, temperature=0
    )
    assert after.usage is not None and r.usage is not None
    assert after.usage.input_tokens > r.usage.input_tokens
    clean(after, controls)


def test_required_tools_stream_their_arguments(client: openai.OpenAI) -> None:
    events: list[Any] = list(
        client.responses.create(
            **ASK, max_output_tokens=160, tools=TOOLS, tool_choice="required",
            parallel_tool_calls=False, stream=True,
        )
    )  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[-1] == "response.completed", kinds
    calls = [i for i in events[-1].response.output if i.type == "function_call"]
    assert len(calls) == 1 and events[-1].response.parallel_tool_calls is False
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == done.arguments == calls[0].arguments and done.item_id == calls[0].id
    jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS[calls[0].name])
    added = kinds.index("response.output_item.added")
    assert kinds.index("response.function_call_arguments.delta") > added


# --- structured output -------------------------------------------------------------------------


class Pet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    kind: Literal["cat", "dog"]


def test_parse_reads_back_a_pydantic_model(client: openai.OpenAI) -> None:
    """``.parse(text_format=Pet)`` sends ``text.format`` (a strict JSON schema): the answer is
    that model's JSON with only its declared keys."""
    r = client.responses.parse(**ASK, max_output_tokens=200, text_format=Pet)
    assert r.status == "completed" and isinstance(r.output_parsed, Pet)
    assert set(json.loads(r.output_text)) == {"name", "kind"}
    assert r.text is not None and r.text.format is not None
    assert r.text.format.type == "json_schema"
    with client.responses.stream(**ASK, max_output_tokens=200, text_format=Pet) as stream:
        final = stream.get_final_response()
    assert isinstance(final.output_parsed, Pet)


def test_json_object_format(client: openai.OpenAI) -> None:
    r = client.responses.create(
        **ASK, max_output_tokens=200, text={"format": {"type": "json_object"}}
    )
    assert r.status == "completed" and isinstance(json.loads(r.output_text), dict)


# --- refusals and errors -----------------------------------------------------------------------

F: Any = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}


@pytest.mark.parametrize(
    ("body", "param", "fragments"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", ("keeps no responses",)),
        ({"reasoning": {"effort": "high"}}, "reasoning", ("reasoning effort",)),
        ({"tools": [{"type": "web_search"}]}, "tools", ("tools.0", "'web_search'")),
        ({"include": ["message.output_text.logprobs"]}, "include", ("include",)),
        ({"truncation": "auto"}, "truncation", ("truncation",)),
        ({"background": True}, "background", ("background",)),
        ({"conversation": "conv_1"}, "conversation", ("conversation",)),
        ({"text": {"verbosity": "low"}}, "text", ("verbosity",)),
        ({"best_of": 2}, "best_of", ("best_of",)),  # refused as on chat completions
        ({"max_tokens": 4}, "max_tokens", ("max_output_tokens",)),
        ({"response_format": {"type": "json_object"}}, "response_format", ("text.format",)),
        ({"input": []}, "input", ("input",)),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input", ("input.0",)),
        ({"input": [{"role": "robot", "content": "x"}]}, "input", ("input.0.role",)),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input", ("input_image",)),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]},
         "input", ("input.0.arguments",)),
        ({"max_output_tokens": 0}, "max_output_tokens", ("max_output_tokens",)),
        ({"temperature": -1}, "temperature", ("temperature",)),
        ({"tools": [F], "tool_choice": {"type": "function", "name": "g"}}, "tool_choice",
         ("'g'",)),
        ({"tools": [F], "tool_choice": {"type": "allowed_tools"}}, "tool_choice",
         ("allowed_tools",)),
        ({"text": {"format": {"type": "xml"}}}, "text", ("text.format.type",)),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text",
         ("text.format.schema",)),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
         "text", ("text.format.schema",)),
        ({"mode": "warp"}, "mode", ("mode",)),
    ],
)  # fmt: skip
def test_bad_or_unhonoured_fields_are_openai_400s(
    url: str, body: Any, param: str, fragments: Any
) -> None:
    openai_error(post(url, {**ASK, **body}), 400, param, *fragments)


@pytest.mark.parametrize(("body", "fragment"), [(b"{nope", "invalid JSON"), (b"[]", "JSON object")])
def test_bad_json_is_an_openai_400(url: str, body: bytes, fragment: str) -> None:
    openai_error(post(url, body), 400, None, fragment)
    openai_error(post(url, body, "/responses"), 400, None, fragment)  # llama-server's path


def test_the_client_raises_openai_errors(client: openai.OpenAI, url: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**ASK, previous_response_id="resp_1")
    assert e.value.status_code == 400 and "keeps no responses" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_1")
    bad = openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.responses.create(**ASK, max_output_tokens=2)


def test_harmless_fields_change_nothing(client: openai.OpenAI) -> None:
    """``store``, ``metadata``, ``user``, a neutral ``reasoning`` and ``truncation`` are
    accepted: the answer is the one without them, and metadata is echoed."""
    ask: dict[str, Any] = {**ASK, "max_output_tokens": 6}
    plain = client.responses.create(**ask)
    decorated = client.responses.create(
        **ask,
        store=True,
        metadata={"who": "test"},
        user="u1",
        truncation="disabled",
        reasoning={"effort": None},
        text={"format": {"type": "text"}},
    )
    assert decorated.output_text == plain.output_text and decorated.metadata == {"who": "test"}
