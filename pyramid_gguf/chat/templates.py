"""Chat templates: a GGUF's Jinja ``tokenizer.chat_template``, a built-in ChatML, or one of
llama.cpp's named templates (:mod:`.named`), rendered the way Hugging Face transformers renders
them, tools included.

The environment is transformers': a sandboxed, immutable jinja2 environment with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a ``{% generation %}``
tag that renders its body, a ``tojson`` filter that keeps non-ASCII text, and the
``raise_exception`` and ``strftime_now`` functions; as in llama.cpp's Jinja engine, ``+``
joins a string with an undefined or ``none`` value as if that were empty. The context is
llama-server's: ``enable_thinking`` (true), ``date_string`` ("26 Nov 2026") and ``datetime``
("Nov 26 2026"), today in local time, each overridden by a request's
``chat_template_kwargs``. OpenAI messages are normalised first:
assistant ``tool_calls`` get their ``arguments`` as objects, ``role: "tool"`` results their
function's ``name``, and text content parts are joined.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, NoReturn

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..core.errors import UserError
from .generic import GenericFormat
from .named import named_template
from .toolcalls import ToolCallFormat, detect_tool_format
from .tools import Tool

#: The fallback for a GGUF without a template: ChatML, tools rendered in the Hermes format.
BUILTIN_CHATML = """\
{%- set system = messages[0].content if messages and messages[0].role == 'system' else none %}
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if system %}
        {{- system + '\\n\\n' }}
    {%- endif %}
    {{- '# Tools\\n\\nYou may call functions to answer. Their signatures, one a line:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + tool | tojson }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nTo call functions, answer with one block per call:\\n<tool_call>\\n' }}
    {{- '{"name": <function name>, "arguments": <arguments object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif system %}
    {{- '<|im_start|>system\\n' + system + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- elif not (loop.first and message.role == 'system') %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content }}
        {%- for call in message.tool_calls or [] %}
            {%- if message.content or not loop.first %}
                {{- '\\n' }}
            {%- endif %}
            {{- '<tool_call>\\n{"name": "' + call.function.name + '", "arguments": ' }}
            {{- call.function.arguments | tojson + '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template and where it came from (``gguf``, ``builtin chatml``, a path)."""

    source: str
    origin: str

    @classmethod
    def from_gguf(cls, source: str | None) -> ChatTemplate:
        """A GGUF's ``tokenizer.chat_template``, or the built-in ChatML when it has none."""
        return cls(source, "gguf") if source else cls(BUILTIN_CHATML, "builtin chatml")

    @classmethod
    def named(cls, name: str) -> ChatTemplate:
        """llama.cpp's named template ``name`` (:mod:`.named`; a one-line UserError listing the
        known names for any other)."""
        return cls(named_template(name), f"llama.cpp {name}")

    @property
    def tool_format(self) -> ToolCallFormat:
        """The format the template renders tool calls in; llama.cpp's generic JSON format
        (taught in the system message) when it renders none we read."""
        return detect_tool_format(self.source) or GenericFormat()

    @property
    def name(self) -> str:
        """Which template, and which tool calls, for ``run -v``."""
        return f"{self.origin} (tool calls: {self.tool_format.name})"

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Tool] | None = None,
        add_generation_prompt: bool = True,
        bos_token: str,
        eos_token: str,
        kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text of OpenAI ``messages`` (and ``tools``); ``kwargs`` (a request's
        ``chat_template_kwargs``) set or override template variables. A one-line UserError if
        the template fails or refuses them."""
        template = _compile(self.source)
        context = {
            **llama_server_context(datetime.now()),
            **(kwargs or {}),
            "messages": normalise_messages(messages),
            "tools": [t.to_openai() for t in tools or ()] or None,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": bos_token,
            "eos_token": eos_token,
        }
        try:
            return template.render(context)
        except Exception as e:  # templates raise anything: TypeError for None + str, ...
            raise UserError(f"chat template failed: {_one_line(e)}") from None


def llama_server_context(now: datetime) -> dict[str, Any]:
    """The variables llama-server adds to every template's context (common/chat.cpp): thinking
    on, and ``now``'s date as ``date_string`` (``%d %b %Y``) and ``datetime`` (``%b %d %Y``)."""
    return {
        "enable_thinking": True,
        "date_string": now.strftime("%d %b %Y"),
        "datetime": now.strftime("%b %d %Y"),
    }


def normalise_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI ``messages`` as Hugging Face templates expect them (copies; the input is kept)."""
    names: dict[str, str] = {}  # tool_call_id -> function name, from the assistant's calls
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise UserError(f"messages[{i}] must be an object with a role")
        m = dict(message)
        m["content"] = _text(m.get("content"), f"messages[{i}].content")
        if m.get("tool_calls"):
            m["tool_calls"] = [
                _call(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(m["tool_calls"])
            ]
            names.update((c["id"], c["function"]["name"]) for c in m["tool_calls"] if c["id"])
        else:
            m.pop("tool_calls", None)  # Llama's template tests `'tool_calls' in message`
        if m["role"] == "tool" and "name" not in m and m.get("tool_call_id") in names:
            m["name"] = names[m["tool_call_id"]]
        out.append(m)
    return out


def _text(content: Any, where: str) -> str:
    """Message content as text: None is empty, text parts are joined a line apart."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise UserError(f"{where}: only text parts are supported, got {kind!r}")
            parts.append(str(part.get("text", "")))
        return "\n".join(parts)
    raise UserError(f"{where} must be a string or a list of text parts")


def _call(call: Any, where: str) -> dict[str, Any]:
    """An assistant's tool call with its ``arguments`` as an object, as templates render it."""
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise UserError(f"{where} must be {{'type': 'function', 'function': {{'name': ...}}}}")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise UserError(f"{where}.function.arguments is not valid JSON") from None
    return {
        "id": call.get("id") or "",
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


class _GenerationTag(Extension):
    """transformers' ``{% generation %}...{% endgeneration %}``: renders its body as is."""

    tags = {"generation"}  # noqa: RUF012 (jinja2 declares it an instance attribute)

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson``: json.dumps, non-ASCII kept, its indent and separators."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Environment(ImmutableSandboxedEnvironment):
    """The sandbox, with llama.cpp's ``+``: a string and an undefined or ``none`` value join
    as if that value were empty (firefunction's template adds an undefined ``functions``)."""

    intercepted_binops = frozenset({"+"})

    def call_binop(
        self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any
    ) -> Any:
        if operator == "+":
            if isinstance(left, str) and _missing(right):
                return left
            if isinstance(right, str) and _missing(left):
                return right
        return super().call_binop(context, operator, left, right)


def _missing(value: Any) -> bool:
    return value is None or isinstance(value, jinja2.Undefined)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    """A template compiled once per source text."""
    env = _Environment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationTag]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise UserError(f"chat template does not compile: {_one_line(e)}") from None


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
