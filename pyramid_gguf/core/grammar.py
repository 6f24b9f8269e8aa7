"""What the user asked the output to match: a JSON schema, any JSON object, GBNF, Lark or a
regular expression (:class:`Grammar`), and a grammar that starts only once a trigger appears
(:class:`Trigger`, as tool calls open).

A frozen, hashable record of the request, with no library behind it: :mod:`pyramid_gguf.grammar`
compiles and checks it (llguidance), and every layer can carry it in a
:class:`~pyramid_gguf.core.sampling.SamplingConfig`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from .errors import UserError

GrammarKind = Literal["json_schema", "json_object", "gbnf", "lark", "regex"]

#: How every JSON grammar lays out whitespace (llguidance's ``x-guidance`` options): none free,
#: the separators ``json.dumps`` and the chat templates write, so that every key and brace the
#: schema decides is forced (pyramid_gguf/grammar/compile.py says why spaced, not compact).
JSON_LAYOUT: Mapping[str, Any] = MappingProxyType(
    {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
)

_WHAT: dict[GrammarKind, str] = {
    "json_schema": "JSON schema",
    "json_object": "JSON object grammar",
    "gbnf": "GBNF grammar",
    "lark": "Lark grammar",
    "regex": "regular expression",
}

#: Keywords whose value is one subschema, a list of them, or a map of names to them.
_ONE = ("items", "additionalItems", "not", "if", "then", "else", "contains", "propertyNames")
_LIST = ("anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def closed_schema(schema: Any) -> Any:
    """``schema`` read as llama.cpp's schema converter reads it: an object schema that lists
    ``properties`` and says nothing of ``additionalProperties`` allows no other keys (as if
    ``"additionalProperties": false``); ``true`` or a schema there still allows them, and an
    object without ``properties`` (``{"type": "object"}``) stays any object. Pydantic and the
    clients built on it (instructor, ``llm --schema``) rely on this; plain JSON Schema would let
    the model add keys until ``max_tokens``. The branches of an ``allOf`` are left open (closing
    each would refuse the keys the others declare). A new value; ``schema`` is not changed."""
    return _close(schema, close=True)


def _close(schema: Any, *, close: bool) -> Any:
    if isinstance(schema, list):
        return [_close(s, close=close) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if (
        close
        and isinstance(out.get("properties"), dict)
        and "additionalProperties" not in out
        and "patternProperties" not in out
    ):
        out["additionalProperties"] = False
    for key, value in schema.items():
        if key in _ONE or key in _LIST or key == "additionalProperties":
            out[key] = _close(value, close=True)
        elif key in _MAP and isinstance(value, dict):
            out[key] = {name: _close(sub, close=True) for name, sub in value.items()}
        elif key == "allOf" and isinstance(value, list):
            out[key] = [_close(sub, close=False) for sub in value]
    return out


@dataclass(frozen=True)
class Grammar:
    """A constraint on the generated text, as the user gave it.

    ``kind`` says how ``text`` reads: for ``json_schema`` and ``json_object`` it is the schema as
    JSON text (keys in the user's order: properties are generated in that order), otherwise the
    grammar or pattern itself. ``strict`` (JSON schemas only): an unsupported schema keyword is
    an error; with ``strict=False`` llguidance ignores it (``lenient``) and enforces the rest.
    Build one with the constructors, never from raw fields.
    """

    kind: GrammarKind
    text: str
    strict: bool = True

    @classmethod
    def json_schema(cls, schema: Any, *, strict: bool = True) -> Grammar:
        """Output valid under ``schema``: a dict, its JSON text, or a pydantic model class (its
        ``model_json_schema()``). Text that is not JSON, or JSON that is not an object, is a
        :class:`UserError`; everything else is left to
        :func:`pyramid_gguf.grammar.check_grammar`."""
        if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
            schema = schema.model_json_schema()
        elif isinstance(schema, (str, bytes)):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise UserError(f"the JSON schema is not JSON: {e}") from None
        if not isinstance(schema, dict):
            raise UserError(f"a JSON schema must be a JSON object, not {type(schema).__name__}")
        try:
            text = json.dumps(schema, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise UserError(f"the JSON schema cannot be written as JSON: {e}") from None
        return cls("json_schema", text, strict)

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
        return cls("json_object", '{"type": "object"}')

    @classmethod
    def gbnf(cls, text: str) -> Grammar:
        """A llama.cpp GBNF grammar (``root ::= ...``)."""
        return cls("gbnf", text)

    @classmethod
    def lark(cls, text: str) -> Grammar:
        """A llguidance Lark grammar (``start: ...``)."""
        return cls("lark", text)

    @classmethod
    def regex(cls, text: str) -> Grammar:
        """Output matching the regular expression ``text`` in full (Rust ``regex`` syntax)."""
        return cls("regex", text)

    @property
    def what(self) -> str:
        """How errors name this grammar: ``"JSON schema"``, ``"GBNF grammar"``..."""
        return _WHAT[self.kind]


@dataclass(frozen=True)
class Trigger:
    """A lazy grammar: the output is free until ``text`` appears (at the very start of the
    answer only, after any whitespace, with ``at_start``); ``grammar`` then constrains what
    follows it, as a tool call constrains its arguments once the model opens it."""

    text: str
    grammar: Grammar
    at_start: bool = False
    #: ``text`` is a regular expression (Python ``re`` syntax) rather than literal text.
    regex: bool = False
