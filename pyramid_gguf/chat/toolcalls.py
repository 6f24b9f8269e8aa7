"""Tool-call formats per model family, detected from the chat template's text.

A format parses an answer into content and calls (whole, or partially while it streams) and
writes the grammars that constrain calls. :func:`detect_tool_format` picks one from the
template; where it finds none, llama.cpp's generic JSON format (:mod:`.generic`, taught in the
system message) serves any template. :func:`constraint` builds what a request's
``tool_choice`` asks for.

Integration notes: ``special`` is the set of a format's ``markers`` that are single special
tokens of the model's vocabulary (llguidance's ``<name>`` syntax matches only those); the text
parsed must render special tokens (``<|python_tag|>`` is a control token). The other control
tokens it then shows (``<|im_start|>``, ``<|im_end|>``...) are never content: :class:`CallStream`
drops them (``controls``) before the format reads the text, so a call written after one is
still a call.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Container, Sequence
from typing import Protocol

from ..core.grammar import Grammar, Trigger
from .calls import CallIds, Delta, Message, diff
from .generic import GenericFormat
from .grammars import ToolConstraint
from .hermes import HermesFormat
from .llama3 import Llama3Format
from .tools import Tool, ToolRequest

#: A JSON object with a "name" key in the template (quotes maybe escaped inside a string).
_NAME_KEY = re.compile(r'\{\\?"name\\?"')
_PARAMETERS_KEY = re.compile(r'\\?"parameters\\?"')


class ToolCallFormat(Protocol):
    """How one model family writes tool calls."""

    @property
    def name(self) -> str:
        """A short name for ``run -v``: ``hermes``, ``llama3-json``, ``generic``."""
        ...

    @property
    def markers(self) -> tuple[str, ...]:
        """Texts of the format that may be single special tokens of a vocabulary."""
        ...

    def parse(self, text: str, ids: CallIds | None = None) -> Message:
        """A finished answer as content and calls; a call that does not parse is content."""
        ...

    def parse_partial(self, text: str, ids: CallIds) -> Message:
        """An answer so far, text that may open a call held back; later parses extend it."""
        ...

    def required_grammar(
        self, tools: Sequence[Tool], parallel: bool, special: Container[str]
    ) -> Grammar:
        """A Lark grammar of an answer made of calls only: one, or more if ``parallel``."""
        ...

    def triggers(
        self, tools: Sequence[Tool], parallel: bool, special: Container[str]
    ) -> tuple[Trigger, ...]:
        """What opens a call in free text, and the grammar of the answer from there on."""
        ...


def detect_tool_format(template: str) -> ToolCallFormat | None:
    """The tool-call format a chat template renders calls in; None for a template without one
    we parse (Qwen3-Coder's XML ``<function=...>`` calls, say): :class:`GenericFormat` then."""
    if "<tool_call>" in template and _NAME_KEY.search(template) and "<function=" not in template:
        return HermesFormat()
    if "<|start_header_id|>" in template and _PARAMETERS_KEY.search(template):
        return Llama3Format()
    return None


def constraint(
    fmt: ToolCallFormat, request: ToolRequest, special: Container[str]
) -> ToolConstraint | None:
    """What constrains the answer to ``request``: a grammar for all of it (``required``, a named
    function), triggers for calls in free text (``auto``; the generic format's answer is JSON
    from the start, a call or a response), or nothing (``none``)."""
    tools = request.callable
    if not tools:
        return None
    if request.choice.mode == "auto":
        if isinstance(fmt, GenericFormat):
            return ToolConstraint(fmt.auto_grammar(tools, request.parallel))
        return ToolConstraint(None, fmt.triggers(tools, request.parallel, special))
    parallel = request.parallel and request.choice.mode == "required"
    return ToolConstraint(fmt.required_grammar(tools, parallel, special))


class CallStream:
    """One answer's text read as content and tool calls by ``fmt``: :meth:`feed` each text
    delta (streaming), :meth:`finish` at the end. Call ids are drawn once per call.

    ``controls``: texts of control tokens that are not the format's own markers; they are
    dropped from the text before it is parsed (and, while streaming, text that may be the start
    of one is held back), so no content carries them."""

    def __init__(
        self, fmt: ToolCallFormat, ids: CallIds | None = None, controls: Collection[str] = ()
    ) -> None:
        self.fmt = fmt
        self.ids = ids or CallIds()
        self.text = ""
        self._sent = Message("")
        kept = sorted(set(controls) - set(fmt.markers) - {""}, key=len, reverse=True)
        self._controls = re.compile("|".join(map(re.escape, kept))) if kept else None
        self._prefixes = {c[:n] for c in kept for n in range(1, len(c))}
        self._longest = max(map(len, kept), default=0)

    def feed(self, delta: str) -> Delta:
        """What the answer so far adds to what was sent: content, then call deltas."""
        self.text += delta
        text = self._clean(self.text)
        for n in range(min(self._longest - 1, len(text)), 0, -1):
            if text[-n:] in self._prefixes:
                text = text[:-n]
                break
        return self._send(self.fmt.parse_partial(text, self.ids))

    def finish(self) -> tuple[Message, Delta]:
        """The whole answer parsed, and what it adds to what was sent."""
        final = self.parse(self.text)
        return final, self._send(final)

    def parse(self, text: str) -> Message:
        """A whole answer ``text`` as content and calls, control tokens dropped."""
        return self.fmt.parse(self._clean(text), self.ids)

    def _clean(self, text: str) -> str:
        return self._controls.sub("", text) if self._controls is not None else text

    def _send(self, current: Message) -> Delta:
        out = diff(self._sent, current)
        self._sent = current
        return out
