"""Benchmark prompts: the shipped sets and user files.

Shipped sets (``data/prompts/<set>.json``): ``code`` (write a function), ``edit`` (the answer
returns the prompt's code with a change), ``chat``, ``qa``, ``summarize`` (a news article of
500-600 words, then a request to summarize it) and ``rag`` (four retrieved passages, then a
question whose answer quotes them). All are original text written for this project (the
articles and passages are fictional) and ship under its MIT licence. ``json``: structured
output, each prompt with the JSON schema its answer must match (extraction, classification,
nested records), decoded under that schema.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import UserError
from ..core.grammar import Grammar

#: The free-text sets: what runs when no set is named.
TEXT_SETS = ("code", "edit", "chat", "qa", "summarize", "rag")
#: Every shipped set: the free-text ones and ``json`` (structured output).
PROMPT_SETS = (*TEXT_SETS, "json")
_DATA = Path(__file__).resolve().parent.parent / "data" / "prompts"


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark prompt: its set (``code``, ``edit``...), an id and the text; ``schema``
    (JSON text): the answer is decoded under this JSON schema."""

    set: str
    id: str
    text: str
    schema: str | None = None

    @property
    def grammar(self) -> Grammar | None:
        """The grammar the answer is decoded under, if any."""
        return None if self.schema is None else Grammar.json_schema(self.schema)

    @property
    def key(self) -> str:
        return f"{self.set}/{self.id}"


def _prompts_from_json(data: Any, set_name: str, where: str) -> list[BenchPrompt]:
    if isinstance(data, dict):  # {"set": [...], ...}
        return [p for name, items in data.items() for p in _prompts_from_json(items, name, where)]
    if not isinstance(data, list):
        raise UserError(f"{where}: expected a JSON list of prompts or an object of lists")
    out = []
    for i, item in enumerate(data):
        if isinstance(item, str):
            out.append(BenchPrompt(set_name, str(i), item))
        elif isinstance(item, dict) and isinstance(item.get("text"), str):
            schema = item.get("schema")
            if schema is not None and not isinstance(schema, dict):
                raise UserError(f"{where}: prompt {i}'s schema is not a JSON object")
            text = None if schema is None else json.dumps(schema)
            out.append(BenchPrompt(set_name, str(item.get("id", i)), item["text"], text))
        else:
            raise UserError(f"{where}: prompt {i} is neither a string nor an object with 'text'")
    return out


def load_prompt_sets(names: Sequence[str] | None = None) -> list[BenchPrompt]:
    """Shipped prompt sets by name (:data:`PROMPT_SETS`); the free-text ones by default."""
    names = list(names) if names else list(TEXT_SETS)
    unknown = [n for n in names if n not in PROMPT_SETS]
    if unknown:
        raise UserError(f"unknown prompt set {unknown[0]!r}; valid: {', '.join(PROMPT_SETS)}")
    out: list[BenchPrompt] = []
    for name in dict.fromkeys(names):
        data = json.loads(_DATA.joinpath(f"{name}.json").read_text(encoding="utf-8"))
        out += _prompts_from_json(data, name, f"prompt set {name}")
    return out


def load_prompt_file(path: str | Path) -> list[BenchPrompt]:
    """Prompts of a user file: JSON (a list of strings / ``{"id", "text"}`` objects, or an object
    of such lists keyed by set name), or plain text with prompts separated by blank lines."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot read prompt file {p}: {e.strerror or e}") from None
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{p}: invalid JSON ({e.msg} at line {e.lineno})") from None
        prompts = _prompts_from_json(data, p.stem, str(p))
    else:
        chunks = [c.strip("\n") for c in text.split("\n\n")]
        kept = [c for c in chunks if c.strip()]
        prompts = [BenchPrompt(p.stem, str(i), c) for i, c in enumerate(kept)]
    if not prompts:
        raise UserError(f"{p}: no prompts found")
    return prompts
