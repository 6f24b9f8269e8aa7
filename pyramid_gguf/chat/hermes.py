"""The Hermes tool-call format (Qwen 2.5 and 3, Hermes 2 Pro and 3, Granite 4, ...).

Calls follow any text, one block per call::

    I'll look it up.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Oslo"}}
    </tool_call>
    <tool_call>
    ...

The text before the first block is the message's content; a block that does not hold a call
turns itself and the rest into content. A missing ``</tool_call>`` at the very end is forgiven.
"""

from __future__ import annotations

import re
from collections.abc import Container, Sequence

from ..core.grammar import Grammar, Trigger
from .calls import CallIds, Message, ToolCall
from .grammars import call_rules, grammar, marker
from .scan import call_object, held_back, partial_call, skip_space
from .tools import Tool

OPEN, CLOSE = "<tool_call>", "</tool_call>"
#: A Markdown code fence opening JSON, as some models wrap a call in one.
FENCE = re.compile(r"```(?:json)?[ \t]*\n\s*")


class HermesFormat:
    """``<tool_call>`` blocks holding ``{"name": ..., "arguments": ...}``."""

    name = "hermes"
    #: Texts that may be single special tokens of the vocabulary.
    markers = (OPEN, CLOSE)

    def parse(self, text: str, ids: CallIds | None = None) -> Message:
        """The finished answer ``text`` as content and calls."""
        return _parse(text, ids or CallIds(), final=True)

    def parse_partial(self, text: str, ids: CallIds) -> Message:
        """The answer so far: content up to where a call may be opening, the calls so far (the
        last one's arguments maybe unfinished). Later parses extend it."""
        return _parse(text, ids, final=False)

    def required_grammar(
        self, tools: Sequence[Tool], parallel: bool, special: Container[str]
    ) -> Grammar:
        """The whole answer: one call of any of ``tools`` (or several, if ``parallel``)."""
        start = f"{marker(OPEN, special)} {_calls(parallel, special)}"
        return grammar(start, _rules(tools, special))

    def triggers(
        self, tools: Sequence[Tool], parallel: bool, special: Container[str]
    ) -> tuple[Trigger, ...]:
        """``<tool_call>`` anywhere opens the constrained calls; so does an answer that starts
        as a call object of one of ``tools``, bare or in a ```` ```json ```` fence, as Qwen2.5
        models often write calls (llama.cpp's Hermes parser takes these too): from its name on,
        the call's arguments are constrained."""
        out = [Trigger(OPEN, grammar=grammar(_calls(parallel, special), _rules(tools, special)))]
        for tool in tools:
            head = r'\{\s*"name"\s*:\s*"' + re.escape(tool.name) + '"'
            rest = _rest(tool)
            for opening, close in (("", ""), ("\\{", ' WS? "}"')):  # {"name"...} or {{...}}
                fenced = grammar(f'call{close} WS? "```"', rest)
                plain = grammar(f"call{close}", rest)
                out.append(
                    Trigger(FENCE.pattern + opening + head, fenced, at_start=True, regex=True)
                )
                out.append(Trigger(opening + head, plain, at_start=True, regex=True))
        return tuple(out)


def _rest(tool: Tool) -> list[str]:
    """The rest of a call object after its name, the arguments as ``tool``'s schema: layout
    free up to them, as the model began the object in its own layout."""
    (args,) = [r for r in call_rules([tool], "arguments") if r.startswith("args_0")]
    return ['call: "," WS? "\\"arguments\\"" WS? ":" WS? args_0 WS? "}"', args, "WS: /[ \\t\\n]+/"]


def _calls(parallel: bool, special: Container[str]) -> str:
    """The calls after the first opening marker (one, or one and more), and a last newline."""
    more = f' ("\\n" {marker(OPEN, special)} block)*' if parallel else ""
    return f'block{more} "\\n"?'


def _rules(tools: Sequence[Tool], special: Container[str]) -> list[str]:
    """A block's rule (the call between the markers, a line of its own) and the calls'."""
    return [f'block: "\\n" call "\\n" {marker(CLOSE, special)}', *call_rules(tools, "arguments")]


def _parse(text: str, ids: CallIds, *, final: bool) -> Message:
    start = text.find(OPEN)
    if start < 0:
        bare = _bare(text, ids, final=final)
        if bare is not None:
            return bare
        return Message(text if final else text[: len(text) - held_back(text, OPEN)].rstrip())
    before = text[:start].rstrip()
    calls: list[ToolCall] = []
    pos = start
    while True:
        body = pos + len(OPEN)
        close = text.find(CLOSE, body)
        if close < 0 and not final:
            partial = partial_call(text, body)
            if partial is not None:
                calls.append(ToolCall(ids(len(calls)), *partial))
            return Message(before, tuple(calls))
        found = call_object(text, body)
        end = len(text) if close < 0 else close
        if found is None or skip_space(text, found[2]) != end:
            break  # not a call: this block and what follows are text
        calls.append(ToolCall(ids(len(calls)), found[0], found[1]))
        pos = skip_space(text, end + len(CLOSE) if close >= 0 else end)
        if not text.startswith(OPEN, pos):
            break
    if not final:
        return Message(before, tuple(calls))
    if not calls:
        return Message(text)
    rest = text[pos:].strip()
    return Message("\n\n".join(p for p in (before, rest) if p) or None, tuple(calls))


def _bare(text: str, ids: CallIds, *, final: bool) -> Message | None:
    """An answer that is one call object (its braces maybe doubled), bare or in a ```` ```json
    ```` fence, read as that call; None when it is not one. While streaming, an answer that starts
    like a fence or an object is held back until it is a call or has ended (then it is text,
    sent at the end)."""
    lead = skip_space(text, 0)
    start = text[lead:]
    fence = FENCE.match(text, lead)
    body = fence.end() if fence is not None else lead
    doubled = text.startswith("{{", body)  # {{"name": ...}}, as Qwen2.5 sometimes writes
    body += doubled
    if not final:
        if not start.startswith(("{", "```")) and not "```".startswith(start):
            return None
        partial = partial_call(text, body)
        return Message(None, (ToolCall(ids(0), *partial),)) if partial else Message("")
    found = call_object(text, body)
    if found is None:
        return None
    end = skip_space(text, found[2])
    if doubled:
        if not text.startswith("}", end):
            return None
        end = skip_space(text, end + 1)
    if fence is not None:
        if not text.startswith("```", end):
            return None
        end = skip_space(text, end + 3)
    if text[end:].strip():
        return None
    return Message(None, (ToolCall(ids(0), found[0], found[1]),))
