"""Reading tool-call JSON out of model text, whole or while it streams.

A call is a JSON object ``{"name": ..., "arguments": {...}}`` (``"parameters"`` in Llama's
format). Its arguments are returned as *compact* JSON made from the model's own text, whitespace
outside strings removed and every number and escape kept as written, so the arguments of a
partial object are a prefix of the arguments of the finished one: streamed fragments add up to
exactly what the whole text parses to.
"""

from __future__ import annotations

import json
import re

_DECODER = json.JSONDecoder()
#: The head of a call written the usual way: name first, then the arguments' key.
_HEAD = re.compile(
    r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*'
)
_ARGUMENT_KEYS = ("arguments", "parameters")
_STRING_OR_SPACE = re.compile(r'("(?:[^"\\]|\\.)*"?)|\s+', re.DOTALL)
_CLOSE = re.compile(r"\s*\}")
_SPACE = re.compile(r"\s*")


def compact_json(text: str) -> str:
    """``text`` without the whitespace outside JSON strings (a prefix gives a prefix)."""
    return _STRING_OR_SPACE.sub(lambda m: m.group(1) or "", text)


def held_back(text: str, opening: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``opening``."""
    for n in range(min(len(opening) - 1, len(text)), 0, -1):
        if opening.startswith(text[-n:]):
            return n
    return 0


def skip_space(text: str, pos: int) -> int:
    """The first position at or after ``pos`` that is not whitespace."""
    match = _SPACE.match(text, pos)
    assert match is not None  # \s* always matches
    return match.end()


def call_object(text: str, pos: int) -> tuple[str, str, int] | None:
    """The call object starting at ``pos`` (after whitespace): its name, compact arguments and
    end; None if no complete, well-formed call object starts there."""
    start = skip_space(text, pos)
    try:
        value, end = _DECODER.raw_decode(text, start)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    keys = [k for k in _ARGUMENT_KEYS if isinstance(value.get(k), dict)]
    if len(keys) != 1:
        return None
    head = _HEAD.match(text, pos)
    if head is not None and (args_end := _arguments_end(text, head.end(), end)) is not None:
        arguments = compact_json(text[head.end() : args_end])
    else:  # written another way (keys in another order, more keys): the value, re-encoded
        arguments = json.dumps(value[keys[0]], ensure_ascii=False, separators=(",", ":"))
    return value["name"], arguments, end


def partial_call(text: str, pos: int) -> tuple[str, str] | None:
    """The name and the compact arguments so far of a call object that starts at ``pos`` and
    may be unfinished; None until its name and the arguments' key have been written."""
    head = _HEAD.match(text, pos)
    if head is None:
        return None
    try:
        name = json.loads(f'"{head.group(1)}"')
    except ValueError:
        return None
    try:
        _, end = _DECODER.raw_decode(text, head.end())
    except ValueError:
        end = len(text)
    return name, compact_json(text[head.end() : end])


def _arguments_end(text: str, start: int, object_end: int) -> int | None:
    """Where the arguments starting at ``start`` end, if the object closes right after them."""
    try:
        _, end = _DECODER.raw_decode(text, start)
    except ValueError:
        return None
    close = _CLOSE.match(text, end)
    return end if close is not None and close.end() == object_end else None
