"""Tool calling end to end (issue 33): the server and the Python API with real clients.

- Real Qwen2.5-Coder 1.5B Instruct (the default ladder's target, alone, in ``auto``; marked
  ``real``): a set of tool tasks answered at temperature 0 with the right function, schema-valid
  arguments and ``finish_reason: "tool_calls"``, or in text when no tool is needed; streamed
  deltas rebuild exactly the non-streamed calls; the openai client's loop (call, ``role:
  "tool"`` result, an answer that uses it); a pydantic-ai agent's two-step run.
- The tiny ladder behind the Qwen2.5 template: constrained calls (``required``, a named
  function) parse and validate, stream as OpenAI's deltas, end by ``length`` when cut; bad
  requests are 400s in OpenAI's shape, and one-line ``UserError``s through the Python API.

The 1.5B often writes a call as a fenced ```` ```json ```` object rather than in
``<tool_call>`` tags; the Hermes format reads both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pydantic
import pytest
from serving_support import Live, live_server
from tool_support import (
    CALL_ID,
    QWEN_TEMPLATE,
    TINY_MESSAGES,
    TINY_TOOLS,
    TOOLS,
    accumulate,
    bad_request,
    checked_calls,
    function,
    named,
    same_calls,
)

from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.serving.openai import create_chat_completion
from pyramid_gguf.serving.schemas import ChatCompletionRequest
from pyramid_gguf.serving.settings import ServerSettings

SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


# --- the real model ---------------------------------------------------------------------------

#: test_real's settings (n_ctx aside), so that auto reuses the cost curves measured there.
REAL_LOAD = LoadConfig(n_ctx=2048, n_batch=256, n_threads=2, n_threads_batch=2)


@pytest.fixture(scope="module")
def qwen(qwen_target_path: Path) -> Iterator[Live]:
    """Qwen2.5-Coder 1.5B Instruct alone behind ``serve``, in ``auto``."""
    p = Pyramid.from_paths(
        qwen_target_path, load=REAL_LOAD, spec=SpecConfig(mode="auto"), name="qwen"
    )
    with p, live_server(p, ServerSettings()) as live:
        yield live


@pytest.fixture()
def qclient(qwen: Live) -> openai.OpenAI:
    return openai.OpenAI(base_url=qwen.v1, api_key="unused", max_retries=0, timeout=300)


def ask(client: openai.OpenAI, question: str, **kw: Any) -> Any:
    return client.chat.completions.create(
        model="qwen",
        messages=[{"role": "user", "content": question}],
        tools=kw.pop("tools", TOOLS),
        temperature=0,
        max_tokens=kw.pop("max_tokens", 120),
        **kw,
    )


@dataclass(frozen=True)
class Task:
    question: str
    choice: Any
    #: The function to call (None: any), and argument values it must get (a string: contained,
    #: case apart; anything else: equal).
    name: str | None
    args: dict[str, Any]


TASKS = {
    "single": Task(
        "What's the weather in Oslo right now? Use celsius.",
        "auto",
        "get_weather",
        {"city": "Oslo", "unit": "celsius"},
    ),
    "enum": Task(
        "Weather in Chicago in fahrenheit please.",
        "auto",
        "get_weather",
        {"city": "Chicago", "unit": "fahrenheit"},
    ),
    "unit": Task(
        "How many kilometers is 26.2 miles?",
        "auto",
        "convert_length",
        {"value": 26.2, "from_unit": "mi", "to_unit": "km"},
    ),
    "required": Task("Tell me about Paris.", "required", None, {}),
    "named": Task("I am going to Berlin.", named("get_weather"), "get_weather", {"city": "Berlin"}),
}


def argument_matches(want: Any, got: Any) -> bool:
    if isinstance(want, str):
        return isinstance(got, str) and want.lower() in got.lower()
    return bool(want == got)


@pytest.mark.real
@pytest.mark.parametrize("task", sorted(TASKS))
def test_tool_tasks(qclient: openai.OpenAI, task: str) -> None:
    t = TASKS[task]
    r = ask(qclient, t.question, tool_choice=t.choice)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None, choice.message
    calls = checked_calls(choice.message, TOOLS)
    assert len(calls) == 1, calls
    name, arguments = calls[0]
    if t.name is not None:
        assert name == t.name, calls
    else:  # any tool, about the place asked about
        assert "paris" in json.dumps(arguments).lower(), calls
    for key, want in t.args.items():
        assert argument_matches(want, arguments.get(key)), (key, calls)
    timings = r.model_extra["timings"]  # type: ignore[index]
    if t.choice != "auto":  # constrained from the start: the name and keys are free drafts
        assert timings["forced_n"] > 0 and timings["forced_n_accepted"] == timings["forced_n"]


@pytest.mark.real
def test_two_calls_at_once(qclient: openai.OpenAI) -> None:
    """Two calls in one answer are allowed (``parallel_tool_calls`` by default); the 1.5B makes
    the first one only, the weather in Oslo, and stops."""
    r = ask(
        qclient,
        "Get the weather in Oslo in celsius and the current time in Asia/Tokyo.",
        tool_choice="required",
    )
    assert r.choices[0].finish_reason == "tool_calls"
    calls = checked_calls(r.choices[0].message, TOOLS)
    assert calls[0][0] == "get_weather" and "oslo" in calls[0][1]["city"].lower(), calls
    if len(calls) > 1:  # a model that does both
        assert calls[1][0] == "get_time" and "tokyo" in calls[1][1]["timezone"].lower(), calls
    ids = [c.id for c in r.choices[0].message.tool_calls or []]
    assert len(set(ids)) == len(ids)


@pytest.mark.real
@pytest.mark.parametrize(
    ("question", "says"),
    [
        ("What is 2 + 2? Answer with just the number.", "4"),
        ("Write a Python one-liner that reverses a string s.", "[::-1]"),
    ],
)
def test_a_question_needing_no_tool_is_answered_in_text(
    qclient: openai.OpenAI, question: str, says: str
) -> None:
    r = ask(qclient, question, tool_choice="auto")
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls, choice
    assert says in (choice.message.content or ""), choice.message


@pytest.mark.real
@pytest.mark.parametrize("task", ["single", "named"])
def test_streamed_deltas_rebuild_the_calls(qclient: openai.OpenAI, task: str) -> None:
    """``single`` is a call the model opens itself (a fenced object read by the lazy trigger),
    ``named`` one the grammar writes from the start."""
    t = TASKS[task]
    # The same cache state for both: each evaluates the prompt's last token alone over the
    # prompt this first request left (a shorter or longer reuse rounds differently).
    ask(qclient, t.question, tool_choice=t.choice, max_tokens=1)
    whole = ask(qclient, t.question, tool_choice=t.choice)
    chunks = list(ask(qclient, t.question, tool_choice=t.choice, stream=True))
    assert whole.choices[0].message.tool_calls
    same_calls(whole, chunks, TOOLS)
    assert chunks[0].choices[0].delta.role == "assistant"


@pytest.mark.real
def test_the_openai_loop_uses_the_tools_result(qclient: openai.OpenAI) -> None:
    """Call, result (``role: "tool"``, ``tool_call_id``), answer. Under ``auto`` the 1.5B often
    calls the tool again rather than answering: that second answer must still be a valid call
    or text; asked for text (``tool_choice: "none"``) it answers from the result."""
    messages: list[Any] = [
        {"role": "user", "content": "What's the weather in Oslo right now? Use celsius."}
    ]
    first = ask(qclient, messages[0]["content"], tool_choice="auto")
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    result = {"temperature": 17, "unit": "celsius", "conditions": "light rain"}
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    kw: dict[str, Any] = {"model": "qwen", "messages": messages, "temperature": 0}
    again = qclient.chat.completions.create(tools=TOOLS, max_tokens=120, **kw)
    choice = again.choices[0]
    if choice.finish_reason == "tool_calls":
        assert checked_calls(choice.message, TOOLS)
    else:
        assert choice.finish_reason == "stop" and choice.message.content
    final = qclient.chat.completions.create(tools=TOOLS, tool_choice="none", max_tokens=60, **kw)
    text = final.choices[0].message.content or ""
    assert final.choices[0].finish_reason == "stop" and not final.choices[0].message.tool_calls
    assert "17" in text and "oslo" in text.lower(), text


class Weather(pydantic.BaseModel):
    city: str
    temperature_celsius: float


@pytest.mark.real
def test_pydantic_ai_agent_runs_a_two_step_task(
    qwen: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pydantic-ai with a structured output: the agent's first request has the model call
    ``get_weather``, its second (after the tool's result) has it call the output tool, both
    with ``tool_choice: "required"``; the output holds the tool's temperature, not a guess."""
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("qwen", provider=OpenAIProvider(base_url=qwen.v1, api_key="unused"))
    agent = Agent(model, output_type=Weather, model_settings={"temperature": 0, "max_tokens": 120})
    asked: list[str] = []

    @agent.tool_plain
    def get_weather(city: str) -> dict[str, Any]:
        """Current weather in a city."""
        asked.append(city)
        return {"city": city, "temperature_celsius": 17, "conditions": "light rain"}

    choices: list[Any] = []
    tool_request = ChatCompletionRequest.tool_request

    def spy(self: ChatCompletionRequest) -> Any:
        choices.append(self.tool_choice)
        return tool_request(self)

    monkeypatch.setattr(ChatCompletionRequest, "tool_request", spy)
    result = agent.run_sync("What is the temperature in Oslo right now?")
    assert choices == ["required", "required"]
    assert [c.lower() for c in asked] == ["oslo"]
    assert result.output.temperature_celsius == 17 and "oslo" in result.output.city.lower()
    # two model calls: get_weather, then the output tool with the tool's figure
    responses = [m for m in result.all_messages() if m.kind == "response"]
    called = [[p.tool_name for p in r.parts if p.part_kind == "tool-call"] for r in responses]
    assert called == [["get_weather"], ["final_result"]], called  # pydantic-ai's output tool


@pytest.mark.real
def test_create_chat_completion_returns_tool_calls(qwen: Live) -> None:
    out = create_chat_completion(
        qwen.pyramid,
        [{"role": "user", "content": "I am going to Berlin."}],
        SamplingConfig(temperature=0, max_tokens=80),
        tools=TOOLS,
        tool_choice=named("get_weather"),
    )
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and CALL_ID.fullmatch(call["id"])
    assert call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, SCHEMAS["get_weather"])
    assert "berlin" in arguments["city"].lower()


# --- the tiny ladder behind the Qwen2.5 template ----------------------------------------------


@pytest.fixture(scope="module")
def tiny_server(tiny_chat: Pyramid) -> Iterator[str]:
    """The tiny ladder (``sd``) served with the Qwen2.5 template, whose calls are Hermes'."""
    with live_server(tiny_chat, ServerSettings(chat_template=QWEN_TEMPLATE)) as live:
        yield live.v1


@pytest.fixture()
def tclient(tiny_server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server, api_key="unused", max_retries=0, timeout=60)


def tiny_ask(client: openai.OpenAI, **kw: Any) -> Any:
    return client.chat.completions.create(
        model="tiny",
        messages=TINY_MESSAGES,  # type: ignore[arg-type]
        tools=kw.pop("tools", TINY_TOOLS),
        temperature=0,
        max_tokens=kw.pop("max_tokens", 120),
        **kw,
    )


@pytest.mark.parametrize(
    ("choice", "parallel"),
    [
        ("required", None),
        ("required", False),
        (named("get_time"), None),
        (named("get_weather"), None),
    ],
    ids=["required", "required-single", "named-time", "named-weather"],
)
def test_constrained_calls_parse_validate_and_stream(
    tclient: openai.OpenAI, choice: Any, parallel: bool | None
) -> None:
    """Whatever the tiny model wants to say, the grammar makes it a call of an offered tool
    with valid arguments; the names and keys it forces are verified as free drafts."""
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}
    ask_it = {"tool_choice": choice, **extra}
    tiny_ask(tclient, max_tokens=1, **ask_it)  # the same cache state for both (see above)
    whole = tiny_ask(tclient, **ask_it)
    assert whole.choices[0].finish_reason == "tool_calls"
    assert whole.choices[0].message.content is None
    calls = checked_calls(whole.choices[0].message, TINY_TOOLS)
    assert calls
    if isinstance(choice, dict):
        assert {name for name, _ in calls} == {choice["function"]["name"]}
    if parallel is False or isinstance(choice, dict):
        assert len(calls) == 1
    timings = whole.model_extra["timings"]  # type: ignore[index]
    assert timings["forced_n"] > 0 and timings["forced_n_accepted"] == timings["forced_n"]
    same_calls(whole, list(tiny_ask(tclient, stream=True, **ask_it)), TINY_TOOLS)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_call_cut_by_max_tokens_ends_by_length(tclient: openai.OpenAI, stream: bool) -> None:
    r = tiny_ask(tclient, tool_choice="required", max_tokens=12, stream=stream)
    finish = accumulate(list(r))[2] if stream else r.choices[0].finish_reason
    assert finish == "length"


def tiny_post(server: str, body: dict[str, Any], path: str = "chat/completions") -> httpx.Response:
    base: dict[str, Any] = {"max_tokens": 4, "temperature": 0}
    base |= {"messages": TINY_MESSAGES} if path == "chat/completions" else {"prompt": "the model"}
    return httpx.post(f"{server}/{path}", json={**base, **body}, timeout=60)


NO_NAME = {"type": "function", "function": {"description": "x", "parameters": {}}}
BAD_SCHEMA = function("f", "x", {"a": {"type": "integer", "minimum": "zero"}})
UNENFORCEABLE = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "not": {"required": ["a"]}}},
}

BAD_TOOL_REQUESTS = [
    (
        {"tools": TINY_TOOLS, "tool_choice": named("get_news")},
        "tool_choice",
        ["get_news", "not in tools"],
    ),
    ({"tools": [NO_NAME]}, "tools", ["name"]),
    ({"tools": [BAD_SCHEMA]}, "tools", ["not a valid JSON schema"]),
    ({"tools": [UNENFORCEABLE]}, "tools", ["not supported by the grammar engine", "not"]),
    ({"tools": [{"type": "retrieval"}]}, "tools", ["function"]),
    ({"tools": [*TINY_TOOLS, TINY_TOOLS[0]]}, "tools", ["get_weather", "unique"]),
    ({"tools": TINY_TOOLS, "tool_choice": "sometimes"}, "tool_choice", ["sometimes"]),
    ({"tool_choice": "required"}, "tool_choice", ["needs tools"]),
    ({"tools": TINY_TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", ["true or false"]),
]


@pytest.mark.parametrize(("body", "param", "fragments"), BAD_TOOL_REQUESTS)
def test_bad_tool_requests_are_openai_400s(
    tiny_server: str, body: dict[str, Any], param: str, fragments: list[str]
) -> None:
    bad_request(tiny_post(tiny_server, body), param, *fragments)


@pytest.mark.parametrize("field", ["tools", "tool_choice"])
def test_tools_on_completions_are_400(tiny_server: str, field: str) -> None:
    value = TINY_TOOLS if field == "tools" else "auto"
    bad_request(tiny_post(tiny_server, {field: value}, "completions"), field, field)


def test_tools_and_a_response_format_together_are_400(tiny_server: str) -> None:
    body = {"tools": TINY_TOOLS, "response_format": {"type": "json_object"}}
    r = tiny_post(tiny_server, body)
    assert r.status_code == 400 and "tools" in r.json()["error"]["message"], r.text


def test_a_template_without_a_call_format_gets_the_generic_one(tiny_chat: Pyramid) -> None:
    """The tiny GGUF's own template writes no tool calls: tools are answered in llama.cpp's
    generic JSON format (a forced call comes back as a call), never ignored."""
    with live_server(tiny_chat, ServerSettings()) as live:
        forced = {"tools": TINY_TOOLS, "tool_choice": named("get_time"), "max_tokens": 120}
        r = tiny_post(live.v1, forced)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "get_time" and CALL_ID.fullmatch(call["id"])
        arguments = json.loads(call["function"]["arguments"])
        jsonschema.validate(arguments, TINY_TOOLS[1]["function"]["parameters"])
        none = tiny_post(live.v1, {"tools": TINY_TOOLS, "tool_choice": "none"})
        assert none.status_code == 200, none.text  # nothing to call: answered as plain chat


@pytest.mark.parametrize(("body", "param", "fragments"), BAD_TOOL_REQUESTS)
def test_create_chat_completion_refuses_bad_tools_in_one_line(
    tiny_chat: Pyramid, body: dict[str, Any], param: str, fragments: list[str]
) -> None:
    del param
    with pytest.raises(UserError) as e:
        create_chat_completion(
            tiny_chat,
            TINY_MESSAGES,
            SamplingConfig(max_tokens=4),
            chat_template=QWEN_TEMPLATE,
            **body,
        )
    assert all(f in str(e.value) for f in fragments) and "\n" not in str(e.value)


def test_create_chat_completion_answers_with_tool_calls(tiny_chat: Pyramid) -> None:
    out = create_chat_completion(
        tiny_chat,
        TINY_MESSAGES,
        SamplingConfig(temperature=0, max_tokens=120),
        chat_template=QWEN_TEMPLATE,
        tools=TINY_TOOLS,
        tool_choice=named("get_weather"),
    )
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and CALL_ID.fullmatch(call["id"])
    jsonschema.validate(
        json.loads(call["function"]["arguments"]), TINY_TOOLS[0]["function"]["parameters"]
    )
    assert out["timings"]["forced_n"] > 0
