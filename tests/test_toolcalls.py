"""Tool calls: request validation, format detection, parsing whole and streamed answers (the
openai client's own accumulation of our deltas rebuilds the whole parse at every split), and
the llguidance grammars that constrain calls, checked on a byte-level tokenizer."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper
from toolcall_support import ADD, WEATHER, ByteTokenizer, accepts, ids, rebuild

from pyramid_gguf.chat import (
    CallIds,
    CallStream,
    Message,
    ToolCall,
    ToolCallFormat,
    ToolRequest,
    constraint,
    detect_tool_format,
    parse_tool_request,
)
from pyramid_gguf.chat.hermes import HermesFormat
from pyramid_gguf.chat.llama3 import Llama3Format
from pyramid_gguf.core.errors import UserError

TEMPLATES = Path(__file__).parent / "data" / "templates"
HERMES, LLAMA = HermesFormat(), Llama3Format()


def request(choice: Any = None, parallel: Any = None) -> ToolRequest:
    parsed = parse_tool_request([WEATHER, ADD], choice, parallel)
    assert parsed is not None
    return parsed


# --- requests ---------------------------------------------------------------------------------


def test_a_request_takes_openai_defaults() -> None:
    r = request()
    assert r.choice.mode == "auto" and r.parallel
    assert [t.name for t in r.callable] == ["get_weather", "add"]
    assert r.tools[1].to_openai() == ADD
    bare = parse_tool_request([{"type": "function", "function": {"name": "now"}}])
    assert bare is not None and bare.tools[0].parameters == {"type": "object", "properties": {}}
    assert parse_tool_request(None) is None and parse_tool_request([], "none") is None
    named = request({"type": "function", "function": {"name": "add"}}, False)
    assert [t.name for t in named.callable] == ["add"] and not named.parallel
    assert request("none").callable == ()


def fn(**function: Any) -> dict[str, Any]:
    return {"type": "function", "function": function}


@pytest.mark.parametrize(
    ("tools", "choice", "parallel", "says"),
    [
        ("get_weather", None, None, "tools must be a list"),
        ([fn(description="no name")], None, None, r"tools\[0\].function.name is missing"),
        ([fn(name="get weather")], None, None, "is not valid: use 1-64 letters"),
        ([{"type": "retrieval"}], None, None, r'tools\[0\].type must be "function"'),
        ([{"function": {"name": "f"}}], None, None, r'tools\[0\].type must be "function"'),
        ([fn(name="f", parameters={"type": "strng"})], None, None, "is not a valid JSON schema"),
        ([fn(name="f", parameters=[])], None, None, "must be a JSON schema object"),
        (
            [fn(name="f", parameters={"properties": {"x": {"not": {"type": "string"}}}})],
            None,
            None,
            r'not supported by the grammar engine: Unimplemented keys: \["not"\]',
        ),
        ([fn(name="f"), fn(name="f")], None, None, "tools name f more than once"),
        ([WEATHER], {"type": "function", "function": {"name": "add"}}, None, "not in tools"),
        ([WEATHER], "always", None, 'tool_choice must be "auto", "none", "required" or'),
        ([WEATHER], {"type": "function"}, None, "tool_choice must be"),
        ([WEATHER], None, "yes", "parallel_tool_calls must be true or false"),
        (None, "required", None, 'tool_choice "required" needs tools'),
    ],
)
def test_bad_requests_are_one_line_user_errors(
    tools: Any, choice: Any, parallel: Any, says: str
) -> None:
    with pytest.raises(UserError, match=says) as e:
        parse_tool_request(tools, choice, parallel)
    assert "\n" not in str(e.value)


# --- formats ----------------------------------------------------------------------------------


def test_formats_are_detected_from_the_template() -> None:
    qwen = (TEMPLATES / "qwen2.5-instruct.jinja").read_text(encoding="utf-8")
    llama = (TEMPLATES / "llama3.1-instruct.jinja").read_text(encoding="utf-8")
    assert isinstance(detect_tool_format(qwen), HermesFormat)
    assert isinstance(detect_tool_format(llama), Llama3Format)
    # Qwen3-Coder's XML calls share the tag, not the JSON: not ours to parse
    xml = "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
    assert detect_tool_format(xml) is None
    assert detect_tool_format("{{ messages[0].content }}") is None


WHOLE: list[tuple[ToolCallFormat, str, Message]] = [
    (
        HERMES,
        "Let me check.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Zürich", "n": 1.5e3, "s": "a\\"b }"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": [1, 2]}}\n</tool_call>',
        Message(
            "Let me check.",
            (
                ToolCall("call_0", "get_weather", '{"city":"Zürich","n":1.5e3,"s":"a\\"b }"}'),
                ToolCall("call_1", "add", '{"a":[1,2]}'),
            ),
        ),
    ),
    (HERMES, "No calls. <tool_ is not a tag\n", Message("No calls. <tool_ is not a tag\n")),
    (
        HERMES,  # keys in another order: the arguments re-encoded
        '<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>',
        Message(None, (ToolCall("call_0", "f", '{"x":1}'),)),
    ),
    (
        HERMES,  # no closing tag at the very end: forgiven
        '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n',
        Message(None, (ToolCall("call_0", "f", '{"x":1}'),)),
    ),
    (
        HERMES,  # a block that holds no call is text, never an error
        "Hm <tool_call>\nnot json\n</tool_call> then",
        Message("Hm <tool_call>\nnot json\n</tool_call> then"),
    ),
    (
        HERMES,  # text after the calls, and a bad second block, join the content
        'A\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<tool_call>\n{"x": 1}',
        Message('A\n\n<tool_call>\n{"x": 1}', (ToolCall("call_0", "f", "{}"),)),
    ),
    (
        LLAMA,
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
        Message(None, (ToolCall("call_0", "get_weather", '{"city":"Oslo"}'),)),
    ),
    (
        LLAMA,
        'Sure. <|python_tag|>{"name": "f", "arguments": {"q": "x y"}}',
        Message("Sure.", (ToolCall("call_0", "f", '{"q":"x y"}'),)),
    ),
    (
        LLAMA,
        '\n{"type": "function", "name": "f", "parameters": {"a": 1}}\n',
        Message(None, (ToolCall("call_0", "f", '{"a":1}'),)),
    ),
    (LLAMA, '{"name": "Ada", "age": 36}', Message('{"name": "Ada", "age": 36}')),
    (LLAMA, "Use {braces} freely.", Message("Use {braces} freely.")),
]


@pytest.mark.parametrize(("fmt", "text", "expected"), WHOLE)
def test_whole_answers_parse(fmt: ToolCallFormat, text: str, expected: Message) -> None:
    message = fmt.parse(text, ids())
    assert message == expected
    for call in message.calls:
        assert json.loads(call.arguments) is not None


def test_ids_look_like_openai_ids_and_stay_fixed_per_call() -> None:
    text = WHOLE[0][1]
    calls = HERMES.parse(text).calls
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in calls)
    assert calls[0].id != calls[1].id
    shared = CallIds()
    assert (
        HERMES.parse_partial(text[:80], shared).calls[0].id
        == HERMES.parse(text, shared).calls[0].id
    )


def test_calls_have_openais_message_shape() -> None:
    openai_types = pytest.importorskip("openai.types.chat")
    message = HERMES.parse(WHOLE[0][1], ids())
    body = {"role": "assistant", "content": message.content}
    body["tool_calls"] = [c.to_openai() for c in message.calls]
    parsed = openai_types.ChatCompletionMessage.model_validate(body)
    assert parsed.tool_calls is not None and parsed.tool_calls[1].function.name == "add"
    assert json.loads(parsed.tool_calls[1].function.arguments) == {"a": [1, 2]}


@pytest.mark.parametrize(("fmt", "text", "expected"), WHOLE)
def test_streamed_deltas_rebuild_the_whole_parse_at_every_split(
    fmt: ToolCallFormat, text: str, expected: Message
) -> None:
    pytest.importorskip("openai")
    for step in (1, 3, 7):
        for offset in range(step):
            cuts = list(range(offset, len(text), step))
            message, _ = rebuild(fmt, cuts, text)
            assert message.content == (expected.content or None)
            calls = [
                (c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []
            ]
            assert calls == [(c.id, c.name, c.arguments) for c in expected.calls]


def test_stream_deltas_have_openais_shape_and_arrive_as_written() -> None:
    pytest.importorskip("openai")
    text = WHOLE[0][1]
    _, sent = rebuild(HERMES, list(range(len(text))), text)
    first = sent[0]
    assert first == {
        "index": 0,
        "id": "call_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    fragments = [d for d in sent if d["index"] == 0 and "id" not in d]
    assert all(set(d) == {"index", "function"} for d in fragments)
    assert len(fragments) > 10  # arguments stream as the model writes them, not at the end


@pytest.mark.parametrize(
    ("fmt", "text", "shown"),
    [
        (HERMES, "Checking <tool_", "Checking"),
        (HERMES, "Checking <tool_call>\n{", "Checking"),
        (HERMES, "a <b> c", "a <b> c"),
        (LLAMA, '  {"na', ""),
        (LLAMA, "{ no", "{ no"),
        (LLAMA, "Sure <|python_", "Sure"),
    ],
)
def test_text_that_may_open_a_call_is_held_back(fmt: ToolCallFormat, text: str, shown: str) -> None:
    assert fmt.parse_partial(text, ids()) == Message(shown)


# --- control tokens never reach content ------------------------------------------------------

QWEN_CONTROLS = frozenset(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>"])
CALL = '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}'
ARGS = '{"city":"Oslo","unit":"c"}'


def stream_all(fmt: ToolCallFormat, pieces: list[str]) -> tuple[Message, str, list[Any]]:
    """``pieces`` fed to a CallStream with Qwen's control tokens: the final message, the
    content streamed, and the streamed call deltas."""
    stream = CallStream(fmt, ids(), QWEN_CONTROLS)
    content, deltas = "", []
    for piece in pieces:
        d = stream.feed(piece)
        content += d.content
        deltas += d.tool_calls
    final, last = stream.finish()
    return final, content + last.content, [*deltas, *last.tool_calls]


@pytest.mark.parametrize(
    "pieces",
    [
        ["<|im_start|>", "\n", *CALL],  # the openai-agents answer of the issue
        ["<|im_start|>", "assistant\n", "<tool_call>", "\n", CALL, "\n", "</tool_call>"],
        ["<|im_end|>", "\n", "<tool_call>", "\n", *CALL, "\n</tool_call>", "<|im_end|>"],
    ],
)
def test_a_call_after_a_control_token_is_parsed_and_no_content_carries_it(
    pieces: list[str],
) -> None:
    final, streamed, deltas = stream_all(HERMES, pieces)
    assert [(c.name, c.arguments) for c in final.calls] == [("get_weather", ARGS)]
    assert "<|" not in (final.content or "") and "<|" not in streamed
    assert "".join(d["function"]["arguments"] for d in deltas if "function" in d) == ARGS
    whole = CallStream(HERMES, ids(), QWEN_CONTROLS).parse("".join(pieces))
    assert whole == final


@pytest.mark.parametrize("fmt", [HERMES, LLAMA])
def test_control_tokens_are_dropped_from_plain_content_at_every_split(
    fmt: ToolCallFormat,
) -> None:
    text = "<|im_start|>Hello<|im_end|> there, <|endoftext|>friend.<|im_end|>"
    for step in (1, 2, 5):
        pieces = [text[i : i + step] for i in range(0, len(text), step)]
        final, streamed, deltas = stream_all(fmt, pieces)
        assert final.content == streamed == "Hello there, friend." and not deltas
    # a format's own marker is not a control to drop: it still opens a call
    final, _, _ = stream_all(HERMES, ["Sure.", "<tool_call>", "\n", CALL])
    assert final.content == "Sure." and len(final.calls) == 1


def test_text_that_may_be_a_control_token_is_held_back() -> None:
    stream = CallStream(HERMES, ids(), QWEN_CONTROLS)
    assert stream.feed("Hi <|im_").content == "Hi"
    assert stream.feed("end|>").content == ""
    assert stream.finish()[0].content == "Hi "


# --- grammars ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer() -> LLTokenizer:
    return LLTokenizer(TokenizerWrapper(ByteTokenizer()))


WEATHER_CALL = '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}'
ADD_CALL = '{"name": "add", "arguments": {"a": 1, "b": 2.5}}'


def block(call: str) -> str:
    return f"<tool_call>\n{call}\n</tool_call>"


@pytest.mark.parametrize("special", [{"<tool_call>", "</tool_call>"}, set()])
def test_hermes_required_grammar(tokenizer: LLTokenizer, special: set[str]) -> None:
    grammar = constraint(HERMES, request("required"), special)
    assert grammar is not None and grammar.grammar is not None and not grammar.triggers
    g = grammar.grammar
    assert accepts(tokenizer, g, block(WEATHER_CALL), special)
    assert accepts(tokenizer, g, block(ADD_CALL) + "\n" + block(WEATHER_CALL), special)
    assert not accepts(tokenizer, g, "Sure. " + block(ADD_CALL), special)
    assert not accepts(
        tokenizer, g, block(WEATHER_CALL.replace("get_weather", "get_wether")), special
    )
    assert not accepts(tokenizer, g, block(ADD_CALL.replace("1", '"1"')), special)  # a: integer
    loose = '{"name": "add", "arguments": { "a": 1,  "b": 2.5}}'  # whitespace is fixed: forced
    assert not accepts(tokenizer, g, block(loose), special)
    assert not accepts(tokenizer, g, block('{"name": "add", "arguments": {"a": 1}}'), special)


def test_hermes_single_and_named_calls(tokenizer: LLTokenizer) -> None:
    special = {"<tool_call>", "</tool_call>"}
    single = constraint(HERMES, request("required", False), special)
    assert single is not None and single.grammar is not None
    assert accepts(tokenizer, single.grammar, block(ADD_CALL), special)
    assert not accepts(tokenizer, single.grammar, block(ADD_CALL) + "\n" + block(ADD_CALL), special)
    named = constraint(HERMES, request({"type": "function", "function": {"name": "add"}}), special)
    assert named is not None and named.grammar is not None
    assert accepts(tokenizer, named.grammar, block(ADD_CALL), special)
    assert not accepts(tokenizer, named.grammar, block(WEATHER_CALL), special)
    assert not accepts(tokenizer, named.grammar, block(ADD_CALL) + "\n" + block(ADD_CALL), special)


def test_hermes_auto_is_lazy_from_the_opening_tag(tokenizer: LLTokenizer) -> None:
    special = {"<tool_call>", "</tool_call>"}
    lazy = constraint(HERMES, request("auto"), special)
    assert lazy is not None and lazy.grammar is None
    trigger, *bare = lazy.triggers
    assert (trigger.text, trigger.at_start) == ("<tool_call>", False)
    rest = block(ADD_CALL).removeprefix("<tool_call>")  # the grammar starts after the trigger
    assert accepts(tokenizer, trigger.grammar, rest, special)
    assert accepts(tokenizer, trigger.grammar, rest + "\n" + block(WEATHER_CALL), special)
    assert accepts(tokenizer, trigger.grammar, rest + "\n", special)
    assert not accepts(tokenizer, trigger.grammar, rest + "\nDone.", special)
    assert not accepts(tokenizer, trigger.grammar, rest.replace('"add"', '"sub"'), special)
    # A call object at the start of an answer, bare or fenced, its braces maybe doubled (as
    # Qwen2.5 models answer), is a call too: four triggers per tool, the arguments constrained
    # after the name.
    assert len(bare) == 4 * len(request("auto").callable) and all(t.at_start for t in bare)
    fenced, plain, fenced2, plain2 = bare[4:8]  # those of "add"
    answer = '```json\n{\n  "name": "add",\n  "arguments": {"a": 1, "b": 2}\n}\n```'
    head = re.match(fenced.text, answer)
    assert head is not None and re.match(plain.text, answer[8:]) is not None
    assert accepts(tokenizer, fenced.grammar, answer[head.end() :], special)
    assert not accepts(tokenizer, fenced.grammar, ', "arguments": {"a": "x"}}\n```', special)
    assert accepts(tokenizer, plain.grammar, ',\n "arguments": {"a": 1, "b": 2}}', special)
    doubled = '{{"name": "add", "arguments": {"a": 1, "b": 2}}}'
    head = re.match(plain2.text, doubled)
    assert head is not None and re.match(plain.text, doubled) is None
    assert accepts(tokenizer, plain2.grammar, doubled[head.end() :], special)
    assert fenced2.text.startswith(fenced.text[: fenced.text.index("\\{")])
    assert HERMES.parse(doubled).calls[0].arguments == '{"a":1,"b":2}'
    assert constraint(HERMES, request("none"), special) is None


def test_llama_grammars(tokenizer: LLTokenizer) -> None:
    special = {"<|python_tag|>"}
    call = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
    required = constraint(LLAMA, request("required"), special)
    assert required is not None and required.grammar is not None
    assert accepts(tokenizer, required.grammar, call, special)
    assert accepts(tokenizer, required.grammar, "<|python_tag|>" + call, special)
    assert not accepts(tokenizer, required.grammar, call + " " + call, special)
    assert not accepts(tokenizer, required.grammar, call.replace('"Oslo"', "7"), special)
    lazy = constraint(LLAMA, request("auto"), special)
    assert lazy is not None and lazy.grammar is None
    start, tag = lazy.triggers
    assert (start.text, start.at_start, tag.text, tag.at_start) == (
        '{"name": "',
        True,
        "<|python_tag|>",
        False,
    )
    assert accepts(tokenizer, start.grammar, call.removeprefix(start.text), special)
    assert not accepts(tokenizer, start.grammar, 'add", "parameters": {"a": 1.5, "b": 1}}', special)
    assert accepts(tokenizer, tag.grammar, call, special)


@pytest.mark.real
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # llguidance: llama_token_get_attr
def test_hermes_grammar_on_the_qwen_vocabulary(qwen_draft_path: Path) -> None:
    """With Qwen2.5-Coder's own vocabulary: ``<tool_call>`` is one special token there, the
    grammar takes a right call tokenized as the model would write it, refuses a wrong name or
    argument type, and forces the opening, the name of a single tool and the keys."""
    import llama_cpp
    from llguidance.llamacpp import lltokenizer_from_vocab

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(qwen_draft_path).encode(), params)
    assert model
    try:  # the tokenizer calls into the vocabulary: the model must outlive it
        check_qwen_grammar(lltokenizer_from_vocab(llama_cpp.llama_model_get_vocab(model)))
    finally:
        llama_cpp.llama_model_free(model)


def check_qwen_grammar(tokenizer: LLTokenizer) -> None:
    single = {m: tokenizer.tokenize_str(m, parse_special=True) for m in HERMES.markers}
    special = {m for m, ts in single.items() if len(ts) == 1 and tokenizer.is_special_token(ts[0])}
    assert special == {"<tool_call>", "</tool_call>"}
    only = parse_tool_request([WEATHER], "required")
    assert only is not None
    found = constraint(HERMES, only, special)
    assert found is not None and found.grammar is not None
    grammar = LLMatcher.grammar_from_lark(found.grammar.text)
    assert LLMatcher.validate_grammar(grammar, tokenizer) == ""

    def takes(call: str) -> bool:
        sequence = [*tokenizer.tokenize_str(block(call), parse_special=True), tokenizer.eos_token]
        return LLMatcher(tokenizer, grammar).validate_tokens(sequence) == len(sequence)

    assert takes(WEATHER_CALL)
    assert not takes(WEATHER_CALL.replace('"Oslo"', "5"))
    assert not takes(WEATHER_CALL.replace("get_weather", "get_wether"))
    forced = tokenizer.decode_str(LLMatcher(tokenizer, grammar).compute_ff_tokens())
    assert forced.startswith('<tool_call>\n{"name": "get_weather", "arguments": {"city":')
