"""Llama 3.1-3.3's JSON tool-call format (custom tools).

The answer is one call and nothing else, as the template renders past calls (it refuses more
than one per message)::

    {"name": "get_weather", "parameters": {"city": "Oslo"}}

sometimes behind ``<|python_tag|>``, the token that opens the built-in tools' calls; text before
that token is the message's content. Anything that does not parse as a call is content.
"""

from __future__ import annotations

import re
from collections.abc import Container, Sequence

from ..core.grammar import Grammar, Trigger
from .calls import CallIds, Message, ToolCall
from .grammars import call_rules, grammar, marker
from .scan import call_object, held_back, partial_call, skip_space
from .tools import Tool

TAG = "<|python_tag|>"
#: How an answer that is a call starts (llama.cpp's trigger too).
START = '{"name": "'
#: A JSON object whose first key is "name" or "type" opens a call at the start of an answer.
_OBJECT = re.compile(r'\{\s*"(?:name|type)"')


class Llama3Format:
    """``{"name": ..., "parameters": ...}`` as the whole answer, or behind ``<|python_tag|>``."""

    name = "llama3-json"
    #: Texts that may be single special tokens of the vocabulary.
    markers = (TAG,)

    def parse(self, text: str, ids: CallIds | None = None) -> Message:
        """The finished answer ``text`` as content and calls."""
        return _parse(text, ids or CallIds(), final=True)

    def parse_partial(self, text: str, ids: CallIds) -> Message:
        """The answer so far: content up to where a call may be opening, the call so far (its
        arguments maybe unfinished). Later parses extend it."""
        return _parse(text, ids, final=False)

    def required_grammar(
        self, tools: Sequence[Tool], parallel: bool, special: Container[str]
    ) -> Grammar:
        """The whole answer: one call of any of ``tools`` (the format has no parallel calls)."""
        return grammar(f"{marker(TAG, special)}? call", call_rules(tools, "parameters"))

    def triggers(
        self, tools: Sequence[Tool], parallel: bool, special: Container[str]
    ) -> tuple[Trigger, ...]:
        """``{"name": "`` at the start of the answer, or ``<|python_tag|>`` anywhere."""
        rules = call_rules(tools, "parameters")
        after_start = call_rules(tools, "parameters", after=START)
        return (
            Trigger(START, at_start=True, grammar=grammar("call", after_start)),
            Trigger(TAG, grammar=grammar("call", rules)),
        )


def _parse(text: str, ids: CallIds, *, final: bool) -> Message:
    lead = skip_space(text, 0)
    tag = text.find(TAG)
    if _OBJECT.match(text, lead) or tag == lead:
        before, body = "", lead + len(TAG) if tag == lead else lead
    elif tag >= 0:
        before, body = text[:tag].rstrip(), tag + len(TAG)
    elif final:
        return Message(text)
    elif _may_open(text[lead:]):
        return Message("")
    else:
        return Message(text[: len(text) - held_back(text, TAG)].rstrip())
    found = call_object(text, body)
    if found is None:
        if final:
            return Message(text)
        partial = partial_call(text, body)
        return Message(before, (ToolCall(ids(0), *partial),) if partial else ())
    call = ToolCall(ids(0), found[0], found[1])
    rest = text[found[2] :].strip() if final else ""
    return Message("\n\n".join(p for p in (before, rest) if p) or None, (call,))


def _may_open(text: str) -> bool:
    """Whether the start of an answer may still become a call object or the tag."""
    if TAG.startswith(text):
        return True
    if not text.startswith("{"):
        return False
    key = text[1:].lstrip()
    return '"name"'.startswith(key) or '"type"'.startswith(key)
