"""Chat templates with tools: real Qwen2.5 and Llama 3.1 templates (tests/data/templates) and
the built-in ChatML render tools, calls and results as each family expects; messages are
normalised as Hugging Face templates need; template failures are one-line user errors."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from pyramid_gguf.chat import ChatTemplate, Tool, parse_tool_request
from pyramid_gguf.chat.calls import CallIds
from pyramid_gguf.chat.templates import BUILTIN_CHATML, normalise_messages
from pyramid_gguf.core.errors import UserError

TEMPLATES = Path(__file__).parent / "data" / "templates"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Température actuelle d'une ville",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
}
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "10°C"},
]


def tools() -> tuple[Tool, ...]:
    request = parse_tool_request([WEATHER])
    assert request is not None
    return request.tools


def gguf(name: str) -> ChatTemplate:
    return ChatTemplate.from_gguf((TEMPLATES / name).read_text(encoding="utf-8"))


def render(template: ChatTemplate, messages: list[dict[str, Any]], **kw: Any) -> str:
    return template.render(messages, bos_token="<BOS>", eos_token="<EOS>", **kw)


def test_names_say_which_template_and_which_tool_calls() -> None:
    assert gguf("qwen2.5-instruct.jinja").name == "gguf (tool calls: hermes)"
    assert gguf("llama3.1-instruct.jinja").name == "gguf (tool calls: llama3-json)"
    assert ChatTemplate.from_gguf(None).name == "builtin chatml (tool calls: hermes)"
    assert ChatTemplate.from_gguf("").source == BUILTIN_CHATML
    plain = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert ChatTemplate.from_gguf(plain).name == "gguf (tool calls: generic)"


def test_qwen_lists_the_tools_in_its_system_message() -> None:
    prompt = render(gguf("qwen2.5-instruct.jinja"), CONVERSATION[:2], tools=tools())
    # tojson as transformers: json.dumps separators, non-ASCII text kept
    line = json.dumps(WEATHER, ensure_ascii=False)
    assert "Température" in line
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert f"<tools>\n{line}\n</tools>" in prompt
    assert prompt.endswith("<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n")


def test_qwen_renders_past_calls_and_their_results() -> None:
    results = [*CONVERSATION, {"role": "tool", "tool_call_id": "call_1", "content": "windy"}]
    prompt = render(gguf("qwen2.5-instruct.jinja"), results, tools=tools())
    assert (
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n10°C\n</tool_response>\n"
        "<tool_response>\nwindy\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ) in prompt


def test_without_tools_qwen_renders_its_plain_prompt() -> None:
    prompt = render(gguf("qwen2.5-instruct.jinja"), [{"role": "user", "content": "Hi"}])
    assert prompt == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_llama_puts_the_tools_in_the_first_user_message() -> None:
    prompt = render(gguf("llama3.1-instruct.jinja"), CONVERSATION, tools=tools())
    assert prompt.startswith(
        "<BOS><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
    )
    user = prompt.split("<|start_header_id|>user<|end_header_id|>\n\n", 1)[1]
    assert user.startswith("Given the following functions, please respond with a JSON")
    assert json.dumps(WEATHER, ensure_ascii=False, indent=4) + "\n\nWeather in Oslo?" in user
    assert (
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}<|eot_id|>'
        # a string result is iterable to Jinja, so this template quotes it (as transformers does)
        '<|start_header_id|>ipython<|end_header_id|>\n\n"10°C"<|eot_id|>'
    ) in prompt
    assert prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_llama_refuses_two_calls_in_one_message_in_one_line() -> None:
    two = dict(CONVERSATION[2], tool_calls=[CALL, dict(CALL, id="call_2")])
    with pytest.raises(UserError, match="only supports single tool-calls") as e:
        render(gguf("llama3.1-instruct.jinja"), [*CONVERSATION[:2], two], tools=tools())
    assert "\n" not in str(e.value)


def test_the_builtin_chatml_renders_chats_without_and_with_tools() -> None:
    builtin = ChatTemplate.from_gguf(None)
    assert render(builtin, CONVERSATION[:2]) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n"
    )
    prompt = render(builtin, CONVERSATION, tools=tools())
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert f"<tools>\n{json.dumps(WEATHER, ensure_ascii=False)}\n</tools>" in prompt
    assert "<|im_start|>user\n<tool_response>\n10°C\n</tool_response><|im_end|>\n" in prompt


@pytest.mark.parametrize("name", ["qwen2.5-instruct.jinja", "builtin"])
def test_a_rendered_call_parses_back_to_itself(name: str) -> None:
    """What a Hermes template renders for a past call is what the parser reads as that call."""
    template = ChatTemplate.from_gguf(None) if name == "builtin" else gguf(name)
    said = {"role": "assistant", "content": "Checking.", "tool_calls": [CALL, dict(CALL, id="c2")]}
    prompt = render(template, [CONVERSATION[1], said], tools=tools(), add_generation_prompt=False)
    answer = prompt.rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
    fmt = template.tool_format
    message = fmt.parse(answer, CallIds(lambda i: f"id{i}"))
    assert message.content == "Checking."
    assert [(c.name, json.loads(c.arguments)) for c in message.calls] == [
        ("get_weather", {"city": "Oslo"})
    ] * 2


def test_messages_are_normalised_for_templates_and_not_changed() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "10°C"},
        {"role": "tool", "tool_call_id": "other", "content": "?"},
    ]
    before = json.dumps(messages)
    out = normalise_messages(messages)
    assert json.dumps(messages) == before
    assert out[0]["content"] == "a\nb"
    assert "tool_calls" not in out[1]
    assert out[2]["content"] == ""
    assert out[2]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": {"city": "Oslo"},
    }
    assert out[3]["name"] == "get_weather" and out[3]["tool_call_id"] == "call_1"
    assert "name" not in out[4]


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ([{"content": "no role"}], r"messages\[0\] must be an object with a role"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            "only text parts are supported, got 'image_url'",
        ),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}],
            r"messages\[0\].tool_calls\[0\].function.arguments is not valid JSON",
        ),
    ],
)
def test_bad_messages_are_user_errors(messages: list[dict[str, Any]], says: str) -> None:
    with pytest.raises(UserError, match=says):
        render(ChatTemplate.from_gguf(None), messages)


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("{% for m in messages %}{{ m.content }}", "does not compile"),
        ("{{ raise_exception('no system role,\nsorry') }}", "no system role, sorry"),
        ("{{ messages[0].content + 1 }}", "chat template failed"),
        ("{% set x = [] %}{{ x.append(1) }}", "chat template failed"),  # immutable sandbox
        ("{{ ''.__class__.__mro__ }}", "chat template failed"),
    ],
)
def test_template_failures_are_one_line_user_errors(source: str, says: str) -> None:
    with pytest.raises(UserError, match=says) as e:
        render(ChatTemplate(source, "test"), [{"role": "user", "content": "hi"}])
    assert "\n" not in str(e.value)


def test_the_helpers_hugging_face_templates_call() -> None:
    source = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{% generation %}{{ m | tojson }}|{{ m | tojson(indent=2) }}|"
        "{{ m | tojson(separators=(',', ':')) }}{% endgeneration %}{% endfor %}"
        "|{{ strftime_now('%Y') | length }}{{ bos_token }}{{ eos_token }}"
    )
    out = render(ChatTemplate(source, "test"), [{"role": "u", "content": "é"}, {"role": "x"}])
    m = {"role": "u", "content": "é"}
    assert out == "|".join(
        [
            json.dumps(m, ensure_ascii=False),
            json.dumps(m, ensure_ascii=False, indent=2),
            json.dumps(m, ensure_ascii=False, separators=(",", ":")),
            "4<BOS><EOS>",
        ]
    )


def test_the_context_is_llama_servers_and_kwargs_override_it() -> None:
    """llama-server's variables: thinking on, today's date two ways; a request's
    ``chat_template_kwargs`` override them but never the messages."""
    source = "{{ enable_thinking }}|{{ date_string }}|{{ datetime }}|{{ messages | length }}"
    template = ChatTemplate(source, "test")
    today = datetime.date.today()
    assert render(template, []) == f"True|{today:%d %b %Y}|{today:%b %d %Y}|0"
    kwargs = {"enable_thinking": False, "date_string": "x", "messages": [1, 2]}
    out = template.render([], bos_token="", eos_token="", kwargs=kwargs)
    assert out == f"False|x|{today:%b %d %Y}|0"


def test_strings_join_an_undefined_or_none_value_as_llama_cpp() -> None:
    """firefunction's template adds an undefined ``functions`` to its system prompt."""
    source = "{{ 'a' + functions + 'b' }}|{{ none + 'c' }}|{{ 1 + 2 }}"
    assert render(ChatTemplate(source, "test"), []) == "ab|c|3"


def test_templates_compile_once() -> None:
    from pyramid_gguf.chat.templates import _compile

    template = ChatTemplate("{{ messages | length }} messages", "test")
    render(template, [])
    hits = _compile.cache_info().hits
    assert render(template, [{"role": "user", "content": ""}]) == "1 messages"
    assert _compile.cache_info().hits == hits + 1


@pytest.mark.real
def test_the_qwen_gguf_carries_the_fixture(qwen_draft_path: Path) -> None:
    """The preset's Qwen2.5-Coder GGUF has the Qwen2.5 template these tests render."""
    from pyramid_gguf.core.gguf_header import read_header

    source = read_header(qwen_draft_path).metadata["tokenizer.chat_template"]
    assert source == (TEMPLATES / "qwen2.5-instruct.jinja").read_text(encoding="utf-8")
    assert ChatTemplate.from_gguf(source).name == "gguf (tool calls: hermes)"
