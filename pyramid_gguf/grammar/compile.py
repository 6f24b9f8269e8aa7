"""Compiling a :class:`~pyramid_gguf.core.grammar.Grammar` for llguidance, and checking it.

:func:`compile_grammar` turns a grammar into llguidance's grammar string (cached per distinct
grammar, so a schema sent with every request compiles once) and :func:`check_grammar` raises a
one-line :class:`UserError` for anything llguidance cannot enforce. Neither needs a tokenizer,
so the server checks a request before any model is touched; this module imports llguidance,
never ``llama_cpp``.

JSON is compiled with fixed whitespace (``whitespace_flexible: false``), laid out as Python's
``json.dumps`` writes it: one line, separators ``", "`` and ``": "``. Fixed, so that everything
the schema decides is forced (with flexible whitespace nothing is); spaced, because models write
``": "`` far more often than ``":"``: on Qwen2.5-Coder 0.5B with a plain-text prompt, compact
separators turned greedy ``{"name": "Bob", ...`` into ``{"name":",", ...`` (the model wanted
``":`` then `` "``, and ``","`` was the closest allowed token), while the same number of model
decisions are left either way (the separators' extra tokens are forced).

For ``{"name": string, "age": integer, "city": string}`` (all required, no other keys) the
grammar forces the bytes ``{"name": "`` before the model chooses anything; on Qwen2.5's
vocabulary :meth:`~pyramid_gguf.grammar.Constraint.forced` offers the three tokens ``{"``,
``name``, ``":`` (`` "`` is forced text but not a forced token: `` ""`` or `` "'`` may also
begin the value). Later ``, "age": `` and ``, "city": "`` are forced as soon as the model closes
the previous value. A schema's own ``"x-guidance"`` options override these defaults.

A JSON schema is read as llama.cpp reads it (:func:`~pyramid_gguf.core.grammar.closed_schema`):
an object schema with ``properties`` and no ``additionalProperties`` allows no other keys.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import llguidance

from ..core.errors import UserError
from ..core.grammar import JSON_LAYOUT, Grammar, closed_schema


def compile_grammar(grammar: Grammar) -> str:
    """llguidance's grammar string for ``grammar`` (cached; not yet validated: a GBNF that does
    not convert is a :class:`UserError` here, everything else in :func:`check_grammar` or when
    a matcher is made)."""
    return _compile(grammar)


def check_grammar(grammar: Grammar) -> None:
    """Raise a one-line :class:`UserError` naming the problem unless llguidance can enforce
    ``grammar``: an unsupported schema keyword, an unknown type or format, a GBNF or Lark
    syntax error, a bad regex... Cached like :func:`compile_grammar`."""
    problem = _problem(grammar)
    if problem:
        raise UserError(f"invalid {grammar.what}: {problem}")


@functools.lru_cache(maxsize=256)
def _compile(grammar: Grammar) -> str:
    if grammar.kind in ("json_schema", "json_object"):
        defaults: Any = dict(JSON_LAYOUT, lenient=not grammar.strict)
        schema = json.dumps(closed_schema(json.loads(grammar.text)), ensure_ascii=False)
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=defaults)
    if grammar.kind == "gbnf":
        try:
            return llguidance.grammar_from("gbnf", grammar.text)
        except ValueError as e:
            message = str(e).removeprefix("Failed to convert the grammar from GBNF to Lark: ")
            raise UserError(f"invalid GBNF grammar: {one_line(message)}") from None
    if grammar.kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(grammar.text)
    return llguidance.LLMatcher.grammar_from_regex(grammar.text)


@functools.lru_cache(maxsize=256)
def _problem(grammar: Grammar) -> str:
    """llguidance's error for ``grammar`` on one line, or ``""`` when it is valid."""
    compiled = compile_grammar(grammar)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(compiled)
    return one_line(messages[0]) if is_error else ""


def one_line(message: str) -> str:
    """llguidance's multi-line diagnostics on one line: the first line, plus the ``error:``
    line of a regex parse error (source echoes and caret lines dropped)."""
    lines = [line.strip() for line in message.strip().splitlines()]
    if not lines:
        return "unknown error"
    detail = [line.removeprefix("error: ") for line in lines[1:] if line.startswith("error:")]
    return " ".join([lines[0], *detail])
