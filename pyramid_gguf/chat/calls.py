"""What a tool-calling answer parses to, and the OpenAI stream deltas between two parses.

A streamed answer is re-parsed after every step into a partial :class:`Message`; :func:`diff`
turns two successive parses into what OpenAI streams: content text, then for each call its id
and name first (``arguments: ""``) and its argument fragments after, which the openai client
concatenates. Deltas only ever add: the parses of one answer extend each other.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_ID_CHARS = string.ascii_letters + string.digits


@dataclass(frozen=True)
class ToolCall:
    """One call: ``arguments`` is compact JSON text (a prefix of it while streaming)."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """The call as OpenAI's ``message.tool_calls`` holds it."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class Message:
    """An answer split into its text and its calls (``content`` None: calls and no text)."""

    content: str | None
    calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class Delta:
    """What one streaming step adds: content text and ``delta.tool_calls`` entries."""

    content: str
    tool_calls: tuple[dict[str, Any], ...]


def random_call_id(index: int) -> str:
    """``call_`` and 24 random letters and digits, as OpenAI's ids look (``index`` unused)."""
    return "call_" + "".join(secrets.choice(_ID_CHARS) for _ in range(24))


class CallIds:
    """The ids of one answer's calls, drawn once per call index and then kept, so that every
    re-parse of a streaming answer gives a call the same id. Tests pass ``make`` to get
    deterministic ids."""

    def __init__(self, make: Callable[[int], str] = random_call_id) -> None:
        self._make = make
        self._ids: dict[int, str] = {}

    def __call__(self, index: int) -> str:
        if index not in self._ids:
            self._ids[index] = self._make(index)
        return self._ids[index]


def diff(previous: Message, current: Message) -> Delta:
    """The stream delta from one parse of an answer to the next (a later, longer one)."""
    before, now = previous.content or "", current.content or ""
    content = now[len(before) :] if now.startswith(before) else ""
    deltas: list[dict[str, Any]] = []
    for index, call in enumerate(current.calls):
        if index >= len(previous.calls):
            deltas.append(
                {
                    "index": index,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }
            )
            sent = ""
        else:
            sent = previous.calls[index].arguments
        if len(call.arguments) > len(sent) and call.arguments.startswith(sent):
            deltas.append({"index": index, "function": {"arguments": call.arguments[len(sent) :]}})
    return Delta(content, tuple(deltas))
