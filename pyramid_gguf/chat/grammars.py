"""Constraint grammars for tool calls, as Lark text for llguidance.

Each call is ``{"name": "<name>", "<arguments key>": <arguments>}``: the name and the keys are
literal text (forced tokens), the arguments an inline ``%json`` schema (the tool's
``parameters``, whose ``$ref``s resolve against it; no keys beyond its ``properties`` unless
it says so, as llama.cpp reads a schema: ``closed_schema``) with fixed whitespace: the
separators the chat templates render (``", "`` and ``": "``, json.dumps's), never anything
else, so that every key and brace is forced.

A format's markers (``<tool_call>``, ``<|python_tag|>``) are written as special tokens
(``<tool_call>``) where they are single special tokens of the model's vocabulary (the caller
says which: ``special``), else as literal text.
"""

from __future__ import annotations

import json
from collections.abc import Container, Sequence
from dataclasses import dataclass

from ..core.grammar import JSON_LAYOUT, Grammar, Trigger, closed_schema
from .tools import Tool


@dataclass(frozen=True)
class ToolConstraint:
    """How to constrain an answer: ``grammar`` for all of it (``tool_choice`` required or a
    named function), or free text until one of ``triggers`` opens a call (``auto``)."""

    grammar: Grammar | None
    triggers: tuple[Trigger, ...] = ()


def literal(text: str) -> str:
    """A Lark string literal matching ``text`` (JSON escapes are Lark escapes)."""
    return json.dumps(text, ensure_ascii=False)


def marker(text: str, special: Container[str]) -> str:
    """``text`` as a special token where the vocabulary has it as one, else as a literal."""
    return text if text in special else literal(text)


def call_rules(
    tools: Sequence[Tool], arguments_key: str, *, after: str = "", tail: str = ""
) -> list[str]:
    """Rule ``call`` (a call of any of ``tools``) and its parts, minus the text ``after`` that
    opened it already (a lazy trigger's text); ``tail``, a Lark expression, comes after the
    arguments, before the call's closing brace (the generic format's ``, "id": ...``)."""
    lines = ["call: " + " | ".join(f"call_{i}" for i in range(len(tools)))]
    for i, tool in enumerate(tools):
        head = f'{{"name": "{tool.name}", "{arguments_key}": '
        assert head.startswith(after), (head, after)
        schema = {**closed_schema(dict(tool.parameters)), "x-guidance": dict(JSON_LAYOUT)}
        parts = [literal(head[len(after) :]), f"args_{i}", *([tail] if tail else []), '"}"']
        lines.append(f"call_{i}: {' '.join(parts)}")
        lines.append(f"args_{i}: %json {json.dumps(schema, ensure_ascii=False)}")
    return lines


def grammar(start: str, rules: Sequence[str]) -> Grammar:
    """A Lark grammar: ``start: <start>`` and ``rules``, one a line."""
    return Grammar.lark("\n".join([f"start: {start}", *rules]) + "\n")
