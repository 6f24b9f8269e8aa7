"""llama.cpp's generic tool-call format: tools with a chat template that writes no calls.

- Parsing: whole answers (a call, parallel calls, a response; malformed JSON and other objects
  are content), streamed answers rebuilt by the openai client at every split, text held back
  while it may still become a call or a response.
- Grammars (llguidance, on a byte-level tokenizer): ``tool_call`` or ``tool_calls`` with ids as
  llama.cpp's schema has them, ``response`` only under ``auto``, arguments under each tool's
  own schema, fixed layout.
- The prompt: llama.cpp's instruction and minja's polyfills (the tools' listing and example
  call word for word as minja's tests have them, past calls, tool results, no system role),
  and each template's capabilities found by rendering.
- End to end, the tiny ladder behind its own ChatML-like template (no tool format): constrained
  calls through OpenAI's chat (whole and streamed), Anthropic's ``tool_use``, Ollama's
  ``tool_calls`` and the Responses API's ``function_call``; ``auto`` answers parse to a call or
  to text; no control-token text anywhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from llguidance import LLTokenizer, TokenizerWrapper
from serving_support import live_server
from synth import CHATML_TEMPLATE
from tool_support import CALL_ID, TINY_MESSAGES, TINY_TOOLS, checked_calls, named, same_calls
from toolcall_support import ADD, WEATHER, ByteTokenizer, accepts, ids, rebuild

from pyramid_gguf import Pyramid
from pyramid_gguf.chat import (
    ChatTemplate,
    GenericFormat,
    Message,
    TemplateCaps,
    Tool,
    ToolCall,
    constraint,
    parse_tool_request,
    probe_caps,
    prompt_messages,
)
from pyramid_gguf.chat.generic import INSTRUCTION
from pyramid_gguf.chat.templates import BUILTIN_CHATML
from pyramid_gguf.serving.settings import ServerSettings

GENERIC = GenericFormat()


# --- parsing ----------------------------------------------------------------------------------

ONE = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}}'
MANY = (
    '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Br\\u00f8nn\\u00f8y"}, '
    '"id": "call_1___"}, {"name": "add", "arguments": {"a": 1, "b": 2.50}, "id": "abcd"}]}'
)
#: Answers that are not the format's: content, as written (a call cut short by max_tokens too).
AS_TEXT = [
    "Just text, no JSON.",
    '{"tool_call": {"name": "get_weather", "arguments": ',
    '{"tool_call": {"name": "get_weather", "arguments": "Oslo"}}',
    '{"tool_calls": []}',
    '{"answer": 42}',
    "{not json at all}",
]
WHOLE: list[tuple[str, Message]] = [
    (ONE, Message(None, (ToolCall("call_0", "get_weather", '{"city":"Oslo","unit":"c"}'),))),
    (
        MANY,
        Message(
            None,
            (
                ToolCall("call_0", "get_weather", '{"city":"Br\\u00f8nn\\u00f8y"}'),
                ToolCall("call_1", "add", '{"a":1,"b":2.50}'),
            ),
        ),
    ),
    ('{"response": "It is \\"sunny\\"\\n\\u263a \\ud83d\\ude00"}', Message('It is "sunny"\n☺ 😀')),
    ('  {\n  "response" :"spaced"\n}\n', Message("spaced")),
    ('{"response": {"a": [1, 2]}}', Message('{\n  "a": [\n    1,\n    2\n  ]\n}')),
    ('{"response": "cut by max_tok', Message("cut by max_tok")),
    ('{"response": "Hi."} and more', Message("Hi.\n\nand more")),
    *((text, Message(text)) for text in AS_TEXT),
]


@pytest.mark.parametrize(("text", "expected"), WHOLE)
def test_whole_answers_parse(text: str, expected: Message) -> None:
    assert GENERIC.parse(text, ids()) == expected


@pytest.mark.parametrize(("text", "expected"), WHOLE)
def test_streamed_deltas_rebuild_the_whole_parse_at_every_split(
    text: str, expected: Message
) -> None:
    for step in (1, 3, 7):
        for offset in range(step):
            message, _ = rebuild(GENERIC, list(range(offset, len(text), step)), text)
            assert message.content == (expected.content or None)
            calls = [
                (c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []
            ]
            assert calls == [(c.id, c.name, c.arguments) for c in expected.calls]


def test_calls_and_responses_stream_as_they_are_written() -> None:
    _, sent = rebuild(GENERIC, list(range(len(ONE))), ONE)
    assert sent[0] == {
        "index": 0,
        "id": "call_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert len(sent) > 10  # the arguments in fragments, not at the end
    partial = GENERIC.parse_partial
    assert partial('{"response": "Hello, wor', ids()) == Message("Hello, wor")
    assert partial('{"tool_calls": [{"name": "add", "arguments": {"a": 1', ids()) == Message(
        None, (ToolCall("call_0", "add", '{"a":1'),)
    )


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("  ", ""),
        ("{", ""),
        ('{"tool_ca', ""),
        ('{"tool_call": {"name": "get_wea', ""),
        ('{"answer": "not ours: sent whole at the end', ""),
        ('{"response": "caf\\u00', "caf"),  # half an escape
        ('{"response": "smile \\ud83d', "smile "),  # half a surrogate pair
        ('{"response": "a\\', "a"),
        ("Plain text streams at once", "Plain text streams at once"),
    ],
)
def test_text_that_may_still_become_an_answer_is_held_back(text: str, shown: str) -> None:
    assert GENERIC.parse_partial(text, ids()) == Message(shown)


# --- grammars ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer() -> LLTokenizer:
    return LLTokenizer(TokenizerWrapper(ByteTokenizer()))


def generic_grammar(choice: Any = None, parallel: Any = None) -> Any:
    request = parse_tool_request([WEATHER, ADD], choice, parallel)
    assert request is not None
    found = constraint(GENERIC, request, set())
    assert found is not None and found.grammar is not None and not found.triggers
    return found.grammar


WEATHER_CALL = '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}'
ADD_CALL = '{"name": "add", "arguments": {"a": 1, "b": 2.5}}'


def test_a_required_call_is_one_tool_call_object(tokenizer: LLTokenizer) -> None:
    g = generic_grammar("required", False)
    assert accepts(tokenizer, g, f'{{"tool_call": {WEATHER_CALL}}}', set())
    assert accepts(tokenizer, g, f'{{"tool_call": {ADD_CALL}}}', set())
    assert not accepts(tokenizer, g, '{"response": "No."}', set())
    assert not accepts(tokenizer, g, f'{{"tool_calls": [{ADD_CALL}]}}', set())
    quoted = ADD_CALL.replace("1", '"1"')  # a: integer
    assert not accepts(tokenizer, g, f'{{"tool_call": {quoted}}}', set())
    missing = '{"name": "add", "arguments": {"a": 1}}'  # b is required
    assert not accepts(tokenizer, g, f'{{"tool_call": {missing}}}', set())
    assert not accepts(tokenizer, g, f'{{"tool_call":{ADD_CALL}}}', set())  # the layout is fixed
    assert not accepts(tokenizer, g, f'Sure. {{"tool_call": {ADD_CALL}}}', set())


def test_parallel_calls_are_a_list_with_ids(tokenizer: LLTokenizer) -> None:
    g = generic_grammar("required")
    one = WEATHER_CALL[:-1] + ', "id": "call_1___"}'
    two = ADD_CALL[:-1] + ', "id": "abcd"}'
    assert accepts(tokenizer, g, f'{{"tool_calls": [{one}]}}', set())
    assert accepts(tokenizer, g, f'{{"tool_calls": [{one}, {two}]}}', set())
    assert not accepts(tokenizer, g, '{"tool_calls": []}', set())
    assert not accepts(tokenizer, g, f'{{"tool_calls": [{WEATHER_CALL}]}}', set())  # no id
    short = ADD_CALL[:-1] + ', "id": "abc"}'
    assert not accepts(tokenizer, g, f'{{"tool_calls": [{short}]}}', set())  # minLength 4


def test_auto_answers_a_call_or_a_response_and_a_named_function_only_itself(
    tokenizer: LLTokenizer,
) -> None:
    auto = generic_grammar("auto", False)
    assert accepts(tokenizer, auto, f'{{"tool_call": {ADD_CALL}}}', set())
    assert accepts(tokenizer, auto, '{"response": "Four. \\"Quoted\\" too."}', set())
    assert not accepts(tokenizer, auto, "Four.", set())
    assert not accepts(tokenizer, auto, '{"response": 4}', set())
    add = generic_grammar(named("add"))
    assert accepts(tokenizer, add, f'{{"tool_call": {ADD_CALL}}}', set())
    assert not accepts(tokenizer, add, f'{{"tool_call": {WEATHER_CALL}}}', set())
    assert not accepts(tokenizer, add, '{"response": "No."}', set())
    request = parse_tool_request([WEATHER, ADD], "none")
    assert request is not None and constraint(GENERIC, request, set()) is None


# --- the prompt -------------------------------------------------------------------------------

#: minja's ToolsPolyfill test (tests/test-polyfills.cpp): the tool and the system message it
#: renders for a ChatML template, word for word.
SPECIAL = Tool(
    "special_function",
    "I'm special",
    {
        "type": "object",
        "properties": {"arg1": {"type": "integer", "description": "The arg."}},
        "required": ["arg1"],
    },
)
MINJA_TOOLS_SYSTEM = (
    "You can call any of the following tools to satisfy the user's requests: [\n"
    "  {\n"
    '    "type": "function",\n'
    '    "function": {\n'
    '      "name": "special_function",\n'
    '      "description": "I\'m special",\n'
    '      "parameters": {\n'
    '        "type": "object",\n'
    '        "properties": {\n'
    '          "arg1": {\n'
    '            "type": "integer",\n'
    '            "description": "The arg."\n'
    "          }\n"
    "        },\n"
    '        "required": [\n'
    '          "arg1"\n'
    "        ]\n"
    "      }\n"
    "    }\n"
    "  }\n"
    "]\n"
    "\n"
    "Example tool call syntax:\n"
    "\n"
    "{\n"
    '  "tool_calls": [\n'
    "    {\n"
    '      "name": "tool_name",\n'
    '      "arguments": {\n'
    '        "arg1": "some_value"\n'
    "      },\n"
    '      "id": "call_1___"\n'
    "    }\n"
    "  ]\n"
    "}\n"
    "\n"
)
CHATML_CAPS = TemplateCaps(system_role=True, tools=False, tool_calls=False, tool_responses=True)
PAST_CALL = {
    "id": "123456789",
    "type": "function",
    "function": {"name": "special_function", "arguments": {"arg1": 1}},
}


def test_the_system_message_says_llama_cpps_instruction_and_lists_the_tools() -> None:
    user = {"role": "user", "content": "I need help"}
    (system, asked) = prompt_messages([user], [SPECIAL], CHATML_CAPS)
    assert system == {"role": "system", "content": f"{INSTRUCTION}\n\n{MINJA_TOOLS_SYSTEM}"}
    assert asked == user
    own = prompt_messages(
        [{"role": "system", "content": "Be brief."}, user], [SPECIAL], CHATML_CAPS
    )
    assert own[0]["content"] == f"Be brief.\n\n{INSTRUCTION}\n\n{MINJA_TOOLS_SYSTEM}"
    native = TemplateCaps(system_role=True, tools=True, tool_calls=True, tool_responses=True)
    assert prompt_messages([user], [SPECIAL], native)[0]["content"] == INSTRUCTION


def test_past_calls_and_results_are_polyfilled_as_minja_does() -> None:
    said = {"role": "assistant", "content": "", "tool_calls": [PAST_CALL]}
    result = {
        "role": "tool",
        "tool_call_id": "123456789",
        "name": "special_function",
        "content": "42",
    }
    caps = TemplateCaps(system_role=True, tools=True, tool_calls=False, tool_responses=False)
    (_, call, answer) = prompt_messages([said, result], [SPECIAL], caps)
    # minja's ToolCallPolyfill test renders exactly this as the assistant's content
    assert call == {
        "role": "assistant",
        "content": '{\n  "tool_calls": [\n    {\n      "name": "special_function",\n'
        '      "arguments": {\n        "arg1": 1\n      },\n      "id": "123456789"\n'
        "    }\n  ]\n}",
    }
    assert answer["role"] == "user" and "name" not in answer
    assert json.loads(answer["content"]) == {
        "tool_response": {"tool": "special_function", "content": "42", "tool_call_id": "123456789"}
    }
    assert GENERIC.parse(call["content"], ids()).calls[0].name == "special_function"


def test_a_template_without_a_system_role_gets_it_in_the_first_user_message() -> None:
    caps = TemplateCaps(system_role=False, tools=True, tool_calls=True, tool_responses=True)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert prompt_messages(messages, [SPECIAL], caps) == [
        {"role": "user", "content": f"Be brief.\n\n{INSTRUCTION}\nHi"}
    ]


NO_SYSTEM = (
    "{% for m in messages %}{% if m.role == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<{{ m.role }}>{{ m.content }}\n{% endfor %}"
)


@pytest.mark.parametrize(
    ("source", "caps"),
    [
        (CHATML_TEMPLATE, CHATML_CAPS),
        (BUILTIN_CHATML, TemplateCaps(True, True, True, True)),
        (NO_SYSTEM, TemplateCaps(False, False, False, True)),
    ],
    ids=["tiny", "builtin-chatml", "no-system"],
)
def test_template_capabilities_are_found_by_rendering(source: str, caps: TemplateCaps) -> None:
    template = ChatTemplate(source, "test")

    def render(messages: list[dict[str, Any]], tools: Any) -> str:
        return template.render(messages, tools=tools, bos_token="", eos_token="")

    assert probe_caps(render) == caps


# --- end to end: the tiny ladder behind its own template ------------------------------------


@pytest.fixture(scope="module")
def url(tiny_chat: Pyramid) -> Iterator[str]:
    """The tiny ladder served with its GGUF's template, which writes no tool calls."""
    assert isinstance(ChatTemplate.from_gguf(tiny_chat.chat_template).tool_format, GenericFormat)
    with live_server(tiny_chat, ServerSettings()) as live:
        yield live.url


@pytest.fixture()
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def no_controls(pyramid: Pyramid, *texts: str | None) -> None:
    """None of ``texts`` shows a control token of the vocabulary."""
    shown = [c for c in pyramid.control_texts for t in texts if t and c in t]
    assert not shown, (shown, texts)


def ask(client: openai.OpenAI, **kw: Any) -> Any:
    return client.chat.completions.create(
        model="tiny",
        messages=TINY_MESSAGES,  # type: ignore[arg-type]
        tools=kw.pop("tools", TINY_TOOLS),
        temperature=0,
        max_tokens=kw.pop("max_tokens", 160),
        **kw,
    )


def test_the_prompt_teaches_the_format(tiny_chat: Pyramid) -> None:
    request = parse_tool_request(TINY_TOOLS, "required")
    chat = tiny_chat.prepare_chat(list(TINY_MESSAGES), tools=request)
    prompt = tiny_chat.detokenize(chat.tokens)
    assert INSTRUCTION in prompt and '"name": "get_time"' in prompt
    assert "Example tool call syntax" in prompt
    assert isinstance(chat.calls, GenericFormat) and chat.sampling.grammar is not None
    said = {"role": "assistant", "content": None, "tool_calls": [PAST_CALL]}
    result = {"role": "tool", "tool_call_id": PAST_CALL["id"], "content": "12:00"}
    history = [*TINY_MESSAGES, said, result, *TINY_MESSAGES]
    turn = tiny_chat.detokenize(tiny_chat.prepare_chat(history, tools=request).tokens)
    assert '{\n  "tool_calls": [\n    {\n      "name": "special_function"' in turn
    assert "tool\n12:00" in turn  # the tiny template renders tool results itself
    none = parse_tool_request(TINY_TOOLS, "none")
    plain = tiny_chat.prepare_chat(list(TINY_MESSAGES), tools=none)
    assert INSTRUCTION not in tiny_chat.detokenize(plain.tokens)
    assert plain.calls is None and plain.sampling.grammar is None


@pytest.mark.parametrize(
    ("choice", "parallel"),
    [("required", False), (named("get_time"), None), (named("get_weather"), None)],
    ids=["required-single", "named-time", "named-weather"],
)
def test_constrained_calls_parse_validate_and_stream(
    client: openai.OpenAI, tiny_chat: Pyramid, choice: Any, parallel: bool | None
) -> None:
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}
    whole = ask(client, tool_choice=choice, **extra)
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls" and message.content is None
    (call,) = checked_calls(message, TINY_TOOLS)
    if isinstance(choice, dict):
        assert call[0] == choice["function"]["name"]
    no_controls(tiny_chat, message.tool_calls[0].function.arguments)
    same_calls(whole, list(ask(client, tool_choice=choice, stream=True, **extra)), TINY_TOOLS)


def test_auto_answers_are_a_call_or_text(client: openai.OpenAI, tiny_chat: Pyramid) -> None:
    """Whatever the tiny model picks under ``auto``, the JSON it is held to is read back: a
    call, or the response's text (never the raw object)."""
    r = ask(client, tool_choice="auto", parallel_tool_calls=False, max_tokens=200)
    choice = r.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        assert len(checked_calls(choice.message, TINY_TOOLS)) == 1
    else:
        assert choice.finish_reason in ("stop", "length")
        assert not (choice.message.content or "").lstrip().startswith("{")
    no_controls(tiny_chat, choice.message.content)


def test_tool_choice_none_is_plain_chat(client: openai.OpenAI) -> None:
    r = ask(client, tool_choice="none", max_tokens=8)
    assert r.choices[0].finish_reason == "length" and not r.choices[0].message.tool_calls


#: The tiny tools in Anthropic's shape.
ANTHROPIC_TOOLS = [
    {"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
    for f in (t["function"] for t in TINY_TOOLS)
]


def sse(r: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_anthropic_tool_use(url: str, tiny_chat: Pyramid, stream: bool) -> None:
    body = {
        "model": "tiny",
        "max_tokens": 160,
        "temperature": 0,
        "messages": [{"role": "user", "content": "the model"}],
        "tools": ANTHROPIC_TOOLS,
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "stream": stream,
    }
    r = httpx.post(f"{url}/v1/messages", json=body, timeout=60)
    assert r.status_code == 200, r.text
    if not stream:
        assert r.json()["stop_reason"] == "tool_use"
        (use,) = [b for b in r.json()["content"] if b["type"] == "tool_use"]
        assert use["name"] == "get_weather"
        jsonschema.validate(use["input"], ANTHROPIC_TOOLS[0]["input_schema"])
        return
    events = sse(r)
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [e["index"] for e in starts] == list(range(len(starts)))
    stops = {e["index"] for e in events if e["type"] == "content_block_stop"}
    assert stops == {e["index"] for e in starts}
    (use,) = [e["content_block"] for e in starts if e["content_block"]["type"] == "tool_use"]
    assert use["name"] == "get_weather"
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    arguments = "".join(d["partial_json"] for d in deltas if d["type"] == "input_json_delta")
    jsonschema.validate(json.loads(arguments), ANTHROPIC_TOOLS[0]["input_schema"])
    no_controls(tiny_chat, arguments, *(d.get("text") for d in deltas))


def test_ollama_tool_calls(url: str) -> None:
    body = {
        "model": "tiny",
        "messages": TINY_MESSAGES,
        "tools": TINY_TOOLS,
        "tool_choice": named("get_time"),
        "options": {"temperature": 0, "num_predict": 160},
        "stream": False,
    }
    r = httpx.post(f"{url}/api/chat", json=body, timeout=60)
    assert r.status_code == 200, r.text
    (call,) = r.json()["message"]["tool_calls"]
    assert call["function"]["name"] == "get_time"
    jsonschema.validate(call["function"]["arguments"], TINY_TOOLS[1]["function"]["parameters"])


def test_responses_function_call(client: openai.OpenAI) -> None:
    tools: Any = [{"type": "function", **t["function"]} for t in TINY_TOOLS]
    r = client.responses.create(
        model="tiny",
        input="the model",
        temperature=0,
        max_output_tokens=160,
        tools=tools,
        tool_choice={"type": "function", "name": "get_time"},
    )
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert call.name == "get_time" and CALL_ID.fullmatch(call.call_id)
    jsonschema.validate(json.loads(call.arguments), TINY_TOOLS[1]["function"]["parameters"])


def test_a_past_call_and_its_result_go_back_in(client: openai.OpenAI) -> None:
    first = ask(client, tool_choice=named("get_time"))
    call = first.choices[0].message.tool_calls[0]
    history: Any = [
        *TINY_MESSAGES,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "12:00"},
    ]
    again = client.chat.completions.create(
        model="tiny", messages=history, tools=TINY_TOOLS, tool_choice=named("get_weather"),  # type: ignore[arg-type]
        temperature=0, max_tokens=160,
    )  # fmt: skip
    assert checked_calls(again.choices[0].message, TINY_TOOLS)[0][0] == "get_weather"
    assert again.usage is not None and first.usage is not None
    assert again.usage.prompt_tokens > first.usage.prompt_tokens
