"""OpenAI tool-calling request fields: ``tools``, ``tool_choice``, ``parallel_tool_calls``.

:func:`parse_tool_request` turns them into frozen values once per request. Every mistake is
one :class:`~pyramid_gguf.errors.UserError` line (the server answers 400): a tool without a
name, a type other than ``function``, parameters that are not a JSON schema (Draft 2020-12) or
that the grammar engine (llguidance) cannot compile, a ``tool_choice`` naming a function that is
not in ``tools``, a ``tool_choice`` of another form.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from llguidance import LLMatcher

from ..core.errors import UserError

#: OpenAI's rule for function names; it also keeps names safe inside grammars.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: What OpenAI assumes when a function has no ``parameters``: no arguments.
_NO_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}
_CHOICE_FORMS = '"auto", "none", "required" or {"type": "function", "function": {"name": "..."}}'


@dataclass(frozen=True)
class Tool:
    """One function the model may call: its name, description and JSON-schema parameters."""

    name: str
    description: str | None
    parameters: Mapping[str, Any]

    def to_openai(self) -> dict[str, Any]:
        """The tool as OpenAI sends it (and as Hugging Face chat templates render it)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    """``auto`` (the model decides), ``none``, ``required`` (at least one call) or ``function``
    (exactly one call of the function named ``function``)."""

    mode: Literal["auto", "none", "required", "function"]
    function: str | None = None


_CHOICES: dict[str, ToolChoice] = {m: ToolChoice(m) for m in ("auto", "none", "required")}


@dataclass(frozen=True)
class ToolRequest:
    """The tools of one request, the choice among them and whether calls may come in parallel."""

    tools: tuple[Tool, ...]
    choice: ToolChoice
    parallel: bool

    @property
    def callable(self) -> tuple[Tool, ...]:
        """The tools the answer may call: all of them, the named one, or none."""
        if self.choice.mode == "none":
            return ()
        if self.choice.mode == "function":
            return tuple(t for t in self.tools if t.name == self.choice.function)
        return self.tools


def parse_tool_request(
    tools: Any, tool_choice: Any = None, parallel_tool_calls: Any = None
) -> ToolRequest | None:
    """The tool fields of an OpenAI chat request, validated; None when it sends no tools."""
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise UserError("parallel_tool_calls must be true or false")
    parsed = _parse_tools(tools)
    choice = _parse_choice(tool_choice, parsed)
    if not parsed:
        return None
    return ToolRequest(parsed, choice, parallel_tool_calls is not False)


def _parse_tools(tools: Any) -> tuple[Tool, ...]:
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise UserError('tools must be a list of {"type": "function", "function": {...}}')
    parsed = tuple(_parse_tool(t, f"tools[{i}]") for i, t in enumerate(tools))
    names = [t.name for t in parsed]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"tools name {', '.join(twice)} more than once: names must be unique")
    return parsed


def _parse_tool(tool: Any, where: str) -> Tool:
    if not isinstance(tool, Mapping):
        raise UserError(f'{where} must be an object {{"type": "function", "function": {{...}}}}')
    if tool.get("type") != "function":
        raise UserError(f'{where}.type must be "function", got {tool.get("type")!r}')
    function = tool.get("function")
    if not isinstance(function, Mapping):
        raise UserError(f"{where}.function must be an object with a name")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise UserError(f"{where}.function.name is missing: every tool needs a name")
    if not _NAME.fullmatch(name):
        raise UserError(
            f"{where}.function.name {name!r} is not valid: use 1-64 letters, digits, _ or -"
        )
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise UserError(f"{where}.function.description must be a string")
    parameters = function.get("parameters", _NO_PARAMETERS)
    _check_schema(parameters, f"{where}.function.parameters ({name})")
    return Tool(name, description, parameters)


def _check_schema(schema: Any, where: str) -> None:
    """A JSON schema (Draft 2020-12) that llguidance compiles, or a one-line UserError."""
    import jsonschema  # 0.2 s to import: only when a request sends tools

    if not isinstance(schema, Mapping):
        raise UserError(f"{where} must be a JSON schema object")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise UserError(f"{where} is not a valid JSON schema: {_one_line(e.message)}") from None
    error = LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(dict(schema)))
    if error:
        raise UserError(f"{where} is not supported by the grammar engine: {_one_line(error)}")


def _parse_choice(choice: Any, tools: tuple[Tool, ...]) -> ToolChoice:
    if choice is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(choice, str) and choice in _CHOICES:
        if choice == "required" and not tools:
            raise UserError('tool_choice "required" needs tools')
        return _CHOICES[choice]
    function = choice.get("function") if isinstance(choice, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(choice, Mapping) or choice.get("type") != "function" or not name:
        raise UserError(f"tool_choice must be {_CHOICE_FORMS}, got {_short(choice)}")
    if name not in {t.name for t in tools}:
        known = ", ".join(t.name for t in tools) or "no tools"
        raise UserError(f"tool_choice names function {name!r}, which is not in tools ({known})")
    return ToolChoice("function", name)


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _short(value: Any) -> str:
    text = _one_line(repr(value))
    return text if len(text) <= 80 else text[:77] + "..."
