"""llama.cpp's generic tool-call format: tools with any chat template, as llama-server answers
them where the template writes no calls of its own (ChatML, SmolLM2, Llama 2, Gemma...).

The answer is one JSON object and nothing else (the grammar allows nothing else)::

    {"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "call_1___"}]}
    {"response": "It is sunny in Oslo."}

``tool_calls`` where calls may come in parallel (each with an ``id`` of the model's, as
llama.cpp's schema asks; the calls get our own ids all the same: they must be unique, and the
model writes its id after the arguments, too late for a stream's first delta), ``tool_call``
where one call is asked for; ``response`` (the message's content) where ``tool_choice`` lets the
model answer in text (``auto``). An answer that is not such an object is content.

The model learns the format from the system message (:func:`prompt_messages`): llama.cpp's
instruction and, where the template does not render them itself (:func:`probe_caps`), minja's
polyfills: the tools as JSON with an example call, past calls as ``{"tool_calls": [...]}``
JSON, tool results as user messages, system messages folded into the next user message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.errors import UserError
from ..core.grammar import Grammar, Trigger
from .calls import CallIds, Message, ToolCall
from .grammars import call_rules, grammar, literal
from .scan import compact_json, skip_space
from .tools import Tool

#: llama.cpp's instruction, added to the system message (common/chat.cpp).
INSTRUCTION = (
    "Respond in JSON format, either with `tool_call` (a request to call tools) or with "
    "`response` reply to the user's request"
)
#: minja's tools polyfill opens the list of tools with this.
TOOLS_INTRO = "You can call any of the following tools to satisfy the user's requests: "
#: The example call minja renders for a template without tool calls of its own.
EXAMPLE = {
    "tool_calls": [{"name": "tool_name", "arguments": {"arg1": "some_value"}, "id": "call_1___"}]
}
#: The schema of a parallel call's ``id`` (llama.cpp's).
CALL_ID = {"type": "string", "minLength": 4}

#: Renders OpenAI messages (and tools) with the chat template, no generation prompt.
Render = Callable[[list[dict[str, Any]], Sequence[Tool] | None], str]

#: How the answer's object opens, and a parallel call's id.
_ONE, _MANY, _RESPONSE, _ID = '{"tool_call": ', '{"tool_calls": [', '{"response": ', ', "id": '
_DECODER = json.JSONDecoder()
_KEY = re.compile(r'"((?:[^"\\]|\\.)*)"\s*:\s*')
_STRING_START = re.compile(r'"((?:[^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*)')


class GenericFormat:
    """``{"tool_call": ...}``, ``{"tool_calls": [...]}`` or ``{"response": ...}``, the whole
    answer."""

    name = "generic"
    #: The format has no special tokens.
    markers: tuple[str, ...] = ()

    def parse(self, text: str, ids: CallIds | None = None) -> Message:
        """The finished answer ``text`` as content and calls."""
        return _parse(text, ids or CallIds(), final=True)

    def parse_partial(self, text: str, ids: CallIds) -> Message:
        """The answer so far: the response's text so far, or the calls so far (the last one's
        arguments maybe unfinished); an object that may still become neither is held back.
        Later parses extend it."""
        return _parse(text, ids, final=False)

    def required_grammar(
        self, tools: Sequence[Tool], parallel: bool, special: Container[str]
    ) -> Grammar:
        """The whole answer: one call of any of ``tools`` (``tool_call``), or one and more
        (``tool_calls``) if ``parallel``."""
        return grammar("calls", _call_rules(tools, parallel))

    def auto_grammar(self, tools: Sequence[Tool], parallel: bool) -> Grammar:
        """The whole answer: :meth:`required_grammar`'s calls, or ``{"response": <text>}``."""
        response = [
            f"response: {literal(_RESPONSE)} text {literal('}')}",
            'text: %json {"type": "string"}',
        ]
        return grammar("calls | response", [*_call_rules(tools, parallel), *response])

    def triggers(
        self, tools: Sequence[Tool], parallel: bool, special: Container[str]
    ) -> tuple[Trigger, ...]:
        """None: the answer is JSON from its first character, under ``auto`` too
        (:meth:`auto_grammar`), as in llama.cpp."""
        return ()


def _call_rules(tools: Sequence[Tool], parallel: bool) -> list[str]:
    """Rule ``calls``: the object around one call, or a list of calls each with an ``id``."""
    if not parallel:
        return [f"calls: {literal(_ONE)} call {literal('}')}", *call_rules(tools, "arguments")]
    calls = f"calls: {literal(_MANY)} call ({literal(', ')} call)* {literal(']}')}"
    tail = f"{literal(_ID)} call_id"
    id_rule = f"call_id: %json {json.dumps(CALL_ID)}"
    return [calls, *call_rules(tools, "arguments", tail=tail), id_rule]


# --- parsing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Item:
    """A member of a JSON object (``key``) or an element of an array (``key`` None): where its
    value starts, and ends (None: it runs past the end of the text)."""

    key: str | None
    start: int
    end: int | None


def _items(text: str, pos: int, *, keyed: bool) -> tuple[list[_Item], int | None]:
    """The members (``keyed``) or elements of the object or array opening at ``pos``, as far as
    ``text`` goes, and where it ends (None: not closed by the end of the text, or malformed)."""
    close = "}" if keyed else "]"
    items: list[_Item] = []
    at = skip_space(text, pos + 1)
    if text.startswith(close, at):
        return items, at + 1
    while at < len(text):
        key = None
        if keyed:
            match = _KEY.match(text, at)
            if match is None or match.end() == len(text):
                return items, None
            key, at = _string(match.group(1)), match.end()
        try:
            _, end = _DECODER.raw_decode(text, at)
        except ValueError:
            items.append(_Item(key, at, None))
            return items, None
        items.append(_Item(key, at, end))
        at = skip_space(text, end)
        if text.startswith(close, at):
            return items, at + 1
        if not text.startswith(",", at):
            return items, None
        at = skip_space(text, at + 1)
    return items, None


def _parse(text: str, ids: CallIds, *, final: bool) -> Message:
    start = skip_space(text, 0)
    if not text.startswith("{", start):
        return Message(text if final or start < len(text) else "")
    members, end = _items(text, start, keyed=True)
    whole = final and end is not None
    found = _read(text, {m.key: m for m in members}, ids, whole=whole)
    if not final:
        return found or Message("")
    if not whole:  # cut short (max_tokens): a response keeps its text so far, a call is content
        return found if found is not None and not found.calls else Message(text)
    if found is None:
        return Message(text)
    assert end is not None
    rest = text[end:].strip()
    return Message("\n\n".join(p for p in (found.content, rest) if p) or None, found.calls)


def _read(
    text: str, members: Mapping[str | None, _Item], ids: CallIds, *, whole: bool
) -> Message | None:
    """The answer the top object's ``members`` hold so far: the calls whose names are written
    (the last one's arguments maybe unfinished), or the response's text; None if neither yet,
    or (``whole``: the object is closed) if it is not an answer of the format."""
    if "tool_calls" in members:
        listed = members["tool_calls"]
        if not text.startswith("[", listed.start):
            return None
        elements, _ = _items(text, listed.start, keyed=False)
        calls: list[tuple[str, str]] = []
        for element in elements:
            call = _call(text, element)
            if call is None:
                break
            calls.append(call)
        if whole and (not calls or len(calls) < len(elements)):
            return None
        return Message(None, tuple(ToolCall(ids(i), *c) for i, c in enumerate(calls)))
    if "tool_call" in members:
        one = _call(text, members["tool_call"])
        return None if one is None else Message(None, (ToolCall(ids(0), *one),))
    if "response" in members:
        response = members["response"]
        if response.end is None:
            return Message(_string_so_far(text, response.start))
        value = json.loads(text[response.start : response.end])
        shown = json.dumps(value, indent=2, ensure_ascii=False)
        return Message(value if isinstance(value, str) else shown)
    return None


def _call(text: str, item: _Item) -> tuple[str, str] | None:
    """The name and compact arguments of the call object ``item`` (the arguments maybe
    unfinished, if the object is); None until its name is written and its arguments begun, or
    if it is not a call."""
    if not text.startswith("{", item.start):
        return None
    members = {m.key: m for m in _items(text, item.start, keyed=True)[0]}
    name, arguments = members.get("name"), members.get("arguments")
    if name is None or name.end is None or arguments is None:
        return None
    value = json.loads(text[name.start : name.end])
    if not isinstance(value, str) or not text.startswith("{", arguments.start):
        return None
    return value, compact_json(text[arguments.start : arguments.end or len(text)])


def _string(body: str) -> str | None:
    """A JSON string's ``body`` (between its quotes) decoded; None if it is not valid."""
    try:
        value = json.loads(f'"{body}"')
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _string_so_far(text: str, pos: int) -> str:
    """The text of the unfinished JSON string opening at ``pos``: what its complete characters
    and escapes decode to (a prefix of the finished string's)."""
    match = _STRING_START.match(text, pos)
    value = _string(match.group(1)) if match is not None else None
    if not value:
        return ""
    return value[:-1] if "\ud800" <= value[-1] <= "\udbff" else value  # half a surrogate pair


# --- the prompt -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TemplateCaps:
    """What a chat template renders itself (minja's capabilities, found by rendering): a system
    message, the tools, an assistant's tool calls, tool results."""

    system_role: bool
    tools: bool
    tool_calls: bool
    tool_responses: bool


def probe_caps(render: Render) -> TemplateCaps:
    """The capabilities of the template behind ``render``: whether a needle of each kind shows
    in what it renders (a template that fails on one has not got it)."""

    def shows(needle: str, messages: list[dict[str, Any]], tools: Sequence[Tool] = ()) -> bool:
        try:
            return needle in render(messages, tools or None)
        except UserError:
            return False

    user = {"role": "user", "content": "Hey"}
    function = {"name": "tool_call_needle", "arguments": {"arg1": "some_value"}}
    call = {"id": "call_1___", "type": "function", "function": function}
    said = {"role": "assistant", "content": "", "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "call_1___", "content": "<tool result needle>"}
    system = {"role": "system", "content": "<system needle>"}
    tool = Tool("tool_needle", "A tool.", {"type": "object", "properties": {}})
    return TemplateCaps(
        system_role=shows("<system needle>", [system, user]),
        tools=shows("tool_needle", [user], [tool]),
        tool_calls=shows("tool_call_needle", [user, said]),
        tool_responses=shows("<tool result needle>", [user, said, result]),
    )


def prompt_messages(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool], caps: TemplateCaps
) -> list[dict[str, Any]]:
    """``messages`` (normalised: text content, call arguments as objects) as llama-server
    renders them for the generic format: :data:`INSTRUCTION` added to the system message, and
    minja's polyfills for what the template does not render itself (``caps``; the example call
    only where the template renders no calls of its own, where minja's example would be the
    template's own rendering). New dicts; the input is kept."""
    out = _add_system([dict(m) for m in messages], INSTRUCTION)
    if not caps.tools:
        listing = json.dumps([t.to_openai() for t in tools], indent=2, ensure_ascii=False)
        example = json.dumps(EXAMPLE, indent=2)
        shown = "" if caps.tool_calls else f"\n\nExample tool call syntax:\n\n{example}\n\n"
        out = _add_system(out, TOOLS_INTRO + listing + shown)
    out = [_polyfill(m, caps) for m in out]
    return out if caps.system_role else _fold_system(out)


def _add_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """``text`` after the first message's content if it is a system message, else a system
    message of its own first (minja's ``add_system``)."""
    if messages and messages[0].get("role") == "system":
        content = messages[0].get("content") or ""
        return [{"role": "system", "content": f"{content}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _polyfill(message: dict[str, Any], caps: TemplateCaps) -> dict[str, Any]:
    """An assistant's calls as ``{"tool_calls": [...]}`` JSON content, a tool result as a user
    message of ``{"tool_response": ...}`` JSON, where the template renders neither itself."""
    out = dict(message)
    if out.get("tool_calls") and not caps.tool_calls:
        calls = []
        for c in out.pop("tool_calls"):
            function = c["function"]
            calls.append({"name": function["name"], "arguments": function["arguments"]})
            if c.get("id"):
                calls[-1]["id"] = c["id"]
        body: dict[str, Any] = {"tool_calls": calls}
        if out.get("content"):
            body["content"] = out["content"]
        out["content"] = json.dumps(body, indent=2, ensure_ascii=False)
    if out.get("role") == "tool" and not caps.tool_responses:
        response: dict[str, Any] = {}
        if "name" in out:
            response["tool"] = out.pop("name")
        response["content"] = out.get("content")
        if "tool_call_id" in out:
            response["tool_call_id"] = out["tool_call_id"]
        content = json.dumps({"tool_response": response}, indent=2, ensure_ascii=False)
        out.update(role="user", content=content)
    return out


def _fold_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """System messages folded into the next user message (a user message of their own before
    any other), for a template without a system role (minja's polyfill)."""
    out: list[dict[str, Any]] = []
    pending = ""
    for message in messages:
        content = message.get("content") or ""
        if message.get("role") == "system":
            pending = f"{pending}\n{content}" if pending else content
            continue
        if pending and message.get("role") == "user":
            message = {**message, "content": f"{pending}\n{content}" if content else pending}
        elif pending:
            out.append({"role": "user", "content": pending})
        pending = ""
        out.append(message)
    if pending:
        out.append({"role": "user", "content": pending})
    return out
