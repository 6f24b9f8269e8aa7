"""Anthropic's Messages API: ``POST /v1/messages`` (streamed as Anthropic's server-sent events
when ``stream`` is true) and ``POST /v1/messages/count_tokens``.

A request is a chat like any other: its ``system`` and text blocks become the chat template's
messages, :meth:`Pyramid.prepare_chat <pyramid_gguf.api.Pyramid.prepare_chat>` renders them, and
the :class:`~.service.Service` answers it (the slots, the queue's 503, the API key of the
server's middleware apply as on OpenAI's routes). ``max_tokens``, ``stop_sequences``,
``temperature``, ``top_p``, ``top_k`` map onto
:class:`~pyramid_gguf.core.sampling.SamplingConfig`, ``output_config.format`` (a JSON schema) onto
the answer's grammar; the speculative knobs (``mode``, ``l_d``...) are taken at the top level of
a body (an extension). What would change the answer and is not honoured here is a 400: server
tools, images and documents, a last assistant message (prefill). Client ``tools``
(``input_schema``) and ``tool_choice`` (``auto``, ``any``, ``tool``, ``none``) are the chat's
tools: the model's calls come back as ``tool_use`` blocks (``stop_reason: "tool_use"``; streamed
whole after the text, each as one ``input_json_delta``), and ``tool_use`` / ``tool_result``
blocks of earlier turns are rendered as the template's calls and results.

Extended thinking is the template's: ``thinking`` ``enabled`` (or ``adaptive``) renders the
chat with ``enable_thinking`` true, ``disabled`` with it false, as thinking models' templates
(Qwen3's...) read it, and with thinking asked the answer's ``<think>`` part comes back as a
``thinking`` block before the text (:mod:`.thinking`; its ``signature`` empty: there is nothing
to sign). A model whose template has no thinking answers without one, within any budget.
``thinking`` blocks of earlier assistant turns are their ``reasoning_content``, which thinking
templates render and others leave out, for ``count_tokens`` as for ``messages``.

A streamed answer is ``message_start``, its content blocks (``content_block_start``,
``content_block_delta`` thinking, text or input deltas, ``content_block_stop``), then
``message_delta`` (stop reason, output tokens) and ``message_stop``. Only Anthropic's fields:
no ``timings`` (speculation's statistics are on ``/metrics`` and ``/slots``), as a client that
validates Anthropic's shape expects. Errors are Anthropic's shape, ``{"type": "error",
"error": {"type": ..., "message": ...}}`` (an ``error`` event once a stream has begun).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response as HTTPResponse

from ..api import ChatPrompt, GenerationStats, Response
from ..chat import CallStream, Message, ToolRequest, parse_tool_request
from ..core.errors import UserError
from ..core.grammar import Grammar
from ..core.sampling import SamplingConfig
from ..grammar import check_grammar
from .errors import ApiError, validation_error
from .http_errors import ANTHROPIC, json_body, router
from .jobs import Reader
from .schemas import samplers
from .service import Service, service_of, sse, stream
from .thinking import OPEN, Thoughts, split

#: Prompt tokens whose text tells whether the template opened the answer's thinking.
PROMPT_TAIL = 16


class MessagesRequest(BaseModel):
    """The fields of ``/v1/messages`` (and, without ``max_tokens``, of ``count_tokens``) that
    we read; others are ignored unless :meth:`check_supported` refuses them."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    max_tokens: int | None = Field(None, ge=1)
    stop_sequences: list[str] | None = None
    # temperature, top_p, top_k: SAMPLER_FIELDS' with an Anthropic name, read from model_extra
    stream: bool = False
    tools: Any = None
    tool_choice: Any = None
    thinking: dict[str, Any] | None = None
    #: Structured output: ``{"format": {"type": "json_schema", "schema": {...}}}``.
    output_config: dict[str, Any] | None = None

    def check_supported(self) -> None:
        """A 400 for what would change the answer and that we do not honour."""
        if any(not s for s in self.stop_sequences or ()):
            raise ApiError(400, "stop_sequences: a stop sequence must not be empty")

    def thinks(self) -> bool | None:
        """Extended thinking: True (``enabled`` or ``adaptive``), False (``disabled``), None
        (not asked: the template's default); a 400 for a bad ``thinking``. ``budget_tokens``
        must be under ``max_tokens``, as Anthropic requires; like Anthropic's, it is a target
        for the model, and ``max_tokens`` bounds thinking and answer together."""
        if self.thinking is None:
            return None
        kind = self.thinking.get("type")
        if kind == "disabled":
            return False
        if kind not in ("enabled", "adaptive"):
            raise ApiError(400, 'thinking.type: must be "enabled", "adaptive" or "disabled"')
        budget = self.thinking.get("budget_tokens")
        if kind == "adaptive" and budget is None:
            return True
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise ApiError(400, "thinking.budget_tokens: must be a positive integer")
        if self.max_tokens is not None and budget >= self.max_tokens:
            raise ApiError(400, "thinking.budget_tokens: must be less than max_tokens")
        return True

    def template_kwargs(self) -> dict[str, Any]:
        """The template variables of :meth:`thinks`: ``enable_thinking``, when asked."""
        thinks = self.thinks()
        return {} if thinks is None else {"enable_thinking": thinks}

    def turns(self) -> list[dict[str, Any]]:
        """The chat template's messages: the system prompt first, each turn's text blocks
        joined (a 400 for any other block, an unknown role or a last assistant turn)."""
        out: list[dict[str, Any]] = []
        if self.system:
            out.append({"role": "system", "content": _text(self.system, "system")})
        for i, m in enumerate(self.messages):
            role = m.get("role")
            if role not in ("user", "assistant"):
                raise ApiError(400, f'messages.{i}.role: must be "user" or "assistant"')
            out += _turns(role, m.get("content"), f"messages.{i}.content")
        if out[-1]["role"] == "assistant":
            raise ApiError(400, "a last assistant message (prefill) is not supported")
        return out

    def tool_request(self) -> ToolRequest | None:
        """Anthropic's ``tools`` and ``tool_choice`` as the chat's tool request (a 400 naming
        the field for a server tool, a bad schema, a choice naming no tool...)."""
        tools, choice, parallel = openai_tools(self.tools, self.tool_choice)
        try:
            return parse_tool_request(tools, choice, parallel)
        except UserError as e:
            field = "tool_choice" if "tool_choice" in str(e) else "tools"
            raise ApiError(400, f"{field}: {e}") from None

    def sampling(self, base: SamplingConfig) -> SamplingConfig:
        changes: dict[str, Any] = {
            k: v
            for k, v in (
                *samplers(self.model_extra or {}, "anthropic").items(),
                ("max_tokens", self.max_tokens),
            )
            if v is not None
        }
        if self.stop_sequences:
            changes["stop"] = tuple(self.stop_sequences)
        grammar = self.grammar()
        if grammar is not None:
            changes["grammar"] = grammar
        return base.with_(**changes) if changes else base

    def grammar(self) -> Grammar | None:
        """``output_config.format``'s JSON schema as the answer's grammar, checked (a 400)."""
        fmt = (self.output_config or {}).get("format")
        if fmt is None:
            return None
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
            raise ApiError(400, 'output_config.format: type must be "json_schema"')
        if not isinstance(fmt.get("schema"), dict):
            raise ApiError(400, "output_config.format.schema: must be a JSON schema object")
        grammar = Grammar.json_schema(fmt["schema"])
        try:
            check_grammar(grammar)
        except UserError as e:
            raise ApiError(400, f"output_config.format.schema: {e}") from None
        return grammar


def _text(content: Any, where: str) -> str:
    """A string, or the text of a list of ``{"type": "text", "text": ...}`` blocks."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where}: must be a string or a list of content blocks")
    parts = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text" or not isinstance(block.get("text"), str):
            raise ApiError(400, f"{where}.{j}: content blocks of type {kind!r} are not supported")
        parts.append(block["text"])
    return "".join(parts)


def _turns(role: str, content: Any, where: str) -> list[dict[str, Any]]:
    """One Anthropic message as the chat template's turns (OpenAI's shape): an assistant's
    ``tool_use`` blocks become its ``tool_calls`` and its ``thinking`` blocks its
    ``reasoning_content`` (which templates of thinking models render, and others leave out;
    ``redacted_thinking`` is Anthropic's encrypted thinking, which no model here can read, and
    is left out), a user's ``tool_result`` blocks ``tool`` turns (before the user's text, if
    any)."""
    if not isinstance(content, list):
        return [{"role": role, "content": _text(content, where)}]
    texts: list[dict[str, Any]] = []
    calls, results, thoughts = [], [], []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in ("thinking", "redacted_thinking") and role != "assistant":
            raise ApiError(400, f"{where}.{j}: {kind} blocks belong to assistant messages")
        if kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise ApiError(400, f"{where}.{j}.thinking: must be a string")
            thoughts.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use" and role == "assistant":
            name, arguments = block.get("name"), block.get("input", {})
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise ApiError(400, f"{where}.{j}: a tool_use block needs a name and an input")
            call = {"name": name, "arguments": arguments}
            calls.append(
                {"id": block.get("id") or f"toolu_{j}", "type": "function", "function": call}
            )
        elif kind == "tool_result" and role == "user":
            text = _text(block.get("content") or "", f"{where}.{j}.content")
            results.append(
                {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text}
            )
        else:
            texts.append(block)
    text = _text(texts, where)
    if role == "assistant":
        turn: dict[str, Any] = {"role": role, "content": text}
        if thoughts:
            turn["reasoning_content"] = "\n\n".join(thoughts)
        return [turn | {"tool_calls": calls}] if calls else [turn]
    return results + ([{"role": role, "content": text}] if text or not results else [])


def openai_tools(tools: Any, choice: Any) -> tuple[Any, Any, bool | None]:
    """Anthropic's ``tools`` and ``tool_choice`` in OpenAI's terms (a 400 for server tools)."""
    if tools is None:
        return None, None, None
    if not isinstance(tools, list):
        raise ApiError(400, "tools: must be a list of tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise ApiError(400, f"tools.{i}: tools of type {kind!r} are not supported")
        function = {
            "name": tool.get("name"),
            "description": tool.get("description") or "",
            "parameters": tool.get("input_schema"),
        }
        out.append({"type": "function", "function": function})
    if choice is None:
        return out, None, None
    kind = choice.get("type") if isinstance(choice, dict) else None
    parallel = None if not isinstance(choice, dict) else not choice.get("disable_parallel_tool_use")
    if kind in ("auto", "none"):
        return out, kind, parallel
    if kind == "any":
        return out, "required", parallel
    if kind == "tool":
        return out, {"type": "function", "function": {"name": choice.get("name")}}, parallel
    raise ApiError(400, 'tool_choice: type must be "auto", "any", "tool" or "none"')


def tool_uses(message: Message) -> list[dict[str, Any]]:
    """A parsed answer's calls as Anthropic's ``tool_use`` blocks (``input`` an object)."""
    out = []
    for call in message.calls:
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError:
            arguments = {}
        tool_id = "toolu_" + call.id.removeprefix("call_")
        out.append({"type": "tool_use", "id": tool_id, "name": call.name, "input": arguments})
    return out


class Shape:
    """One answer's id, model and how its parts look (a :class:`~.service.Shape`). ``calls``
    reads tool calls out of its text (None: no tools); with ``thinks`` the answer's thinking
    (:mod:`.thinking`; ``opened``: the prompt opened it) is a ``thinking`` block before the
    text."""

    def __init__(
        self,
        model: str,
        stops: tuple[str, ...],
        detokenize: Callable[..., str],
        calls: CallStream | None = None,
        *,
        thinks: bool = False,
        opened: bool = False,
    ) -> None:
        self.id = f"msg_{uuid.uuid4().hex}"
        self.model = model
        self.stops = stops
        self.detokenize = detokenize
        self.calls = calls
        self.opened = opened
        self.thoughts = Thoughts(opened) if thinks else None

    def stop(self, reason: str | None, text: str, tokens: list[int]) -> tuple[str, str | None]:
        """Anthropic's ``stop_reason`` and ``stop_sequence``. The answer's text ends where a
        stop sequence began; the text of its tokens goes on with the part of it that they hold
        (all of it, or the start held back before the token that completed it, which the steps
        leave out). Where they hold none of it (a stop sequence completed by one token), an
        end of turn is what we can tell."""
        if reason != "stop":
            return "max_tokens", None
        full = self.detokenize(tokens)
        tail = full[len(text) :] if full.startswith(text) else ""
        for stop in self.stops if tail else ():
            if tail.startswith(stop) or stop.startswith(tail):
                return "stop_sequence", stop
        return "end_turn", None

    def message(self, content: list[dict[str, Any]], stats: GenerationStats) -> dict[str, Any]:
        """The message object; ``usage`` as Anthropic counts it: ``input_tokens`` the prompt
        tokens evaluated, ``cache_read_input_tokens`` those reused from the prompt cache."""
        cached = stats.prompt_tokens - stats.prompt_evaluated
        usage = {
            "input_tokens": stats.prompt_tokens - cached,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "output_tokens": 0,
        }
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }

    def whole(self, steps: list[Response]) -> dict[str, Any]:
        raw = "".join(s.text for s in steps)
        tokens = [t for s in steps for t in s.token_ids]
        last = steps[-1]
        reason, sequence = self.stop(last.finish_reason, raw, tokens)
        content: list[dict[str, Any]] = []
        text = raw
        if self.thoughts is not None:
            thought, text = split(raw, self.opened)
            content += [_thinking(thought)] if thought else []
        if self.calls is None:
            content += [{"type": "text", "text": text}] if text or not content else []
        else:
            message = self.calls.parse(text)
            uses = tool_uses(message)
            content += [{"type": "text", "text": message.content}] if message.content else []
            content += uses
            if uses and reason == "end_turn":
                reason = "tool_use"
        out = self.message(content, last.stats)
        out |= {"stop_reason": reason, "stop_sequence": sequence}
        out["usage"]["output_tokens"] = last.stats.generated_tokens
        return out

    def events(self, reader: Reader, first: Response) -> AsyncIterator[str]:
        """The SSE body; an error after the headers went out is an ``error`` event."""

        def late(error: ApiError) -> str:
            return sse(error.anthropic_body(), "error")

        return stream(reader, first, self._events, late)

    async def _events(self, steps: AsyncIterator[Response]) -> AsyncIterator[str]:
        blocks = _Blocks()
        text, tokens = "", []
        last: Response | None = None
        async for step in steps:
            if last is None:  # the first step: the message opens
                start = self.message([], step.stats)
                yield sse({"type": "message_start", "message": start}, "message_start")
                if self.calls is None and self.thoughts is None:  # the text block opens at once
                    yield blocks.add("text", "")[0]
            last = step
            text += step.text
            tokens += step.token_ids
            for event in self._pieces(blocks, *self._split(step.text)):
                yield event
        assert last is not None
        uses: list[dict[str, Any]] = []
        if self.thoughts is not None:
            for event in self._pieces(blocks, *self.thoughts.finish()):
                yield event
        if self.calls is not None:
            message, rest = self.calls.finish()
            uses = tool_uses(message)
            for event in blocks.add("text", rest.content) if rest.content else ():
                yield event
        for event in blocks.close():
            yield event
        for use in uses:
            for event in blocks.tool_use(use):
                yield event
        reason, sequence = self.stop(last.finish_reason, text, tokens)
        if uses and reason == "end_turn":
            reason = "tool_use"
        yield sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": {"output_tokens": last.stats.generated_tokens},
            },
            "message_delta",
        )
        yield sse({"type": "message_stop"}, "message_stop")

    def _split(self, piece: str) -> tuple[str, str]:
        """A step's text as ``(thinking, text)``."""
        return self.thoughts.feed(piece) if self.thoughts is not None else ("", piece)

    def _pieces(self, blocks: _Blocks, thought: str, said: str) -> list[str]:
        """The events of a piece of thinking and of text (the text read for tool calls)."""
        events = blocks.add("thinking", thought) if thought else []
        content = self.calls.feed(said).content if self.calls is not None else said
        return events + (blocks.add("text", content) if content else [])


def _thinking(thought: str) -> dict[str, Any]:
    """A ``thinking`` block. Its ``signature`` is empty: Anthropic signs its thinking so that it
    may check it when it comes back; a local model's thinking has nothing to check."""
    return {"type": "thinking", "thinking": thought, "signature": ""}


class _Blocks:
    """A streamed message's content blocks, opened and closed in order, indexed from 0."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None  # the open block's type

    def add(self, kind: str, piece: str) -> list[str]:
        """The events adding ``piece`` to a ``thinking`` or ``text`` block: that block opened
        first (the one before closed) unless it is the open one."""
        events = []
        if self.kind != kind:
            events += self.close()
            self.index += 1
            self.kind = kind
            empty = _thinking("") if kind == "thinking" else {"type": "text", "text": ""}
            events.append(_block_start(self.index, empty))
        if piece:
            events.append(_block_delta(self.index, {"type": f"{kind}_delta", kind: piece}))
        return events

    def close(self) -> list[str]:
        """The open block's end (a thinking block's signature first), if one is open."""
        if self.kind is None:
            return []
        events = []
        if self.kind == "thinking":
            events.append(_block_delta(self.index, {"type": "signature_delta", "signature": ""}))
        events.append(
            sse({"type": "content_block_stop", "index": self.index}, "content_block_stop")
        )
        self.kind = None
        return events

    def tool_use(self, use: dict[str, Any]) -> list[str]:
        """A whole ``tool_use`` block: opened, its input as one delta, closed."""
        events = self.close()
        self.index += 1
        arguments = json.dumps(use["input"], ensure_ascii=False)
        events.append(_block_start(self.index, use | {"input": {}}))
        events.append(
            _block_delta(self.index, {"type": "input_json_delta", "partial_json": arguments})
        )
        events.append(
            sse({"type": "content_block_stop", "index": self.index}, "content_block_stop")
        )
        return events


def _block_start(index: int, block: dict[str, Any]) -> str:
    event = {"type": "content_block_start", "index": index, "content_block": block}
    return sse(event, "content_block_start")


def _block_delta(index: int, delta: dict[str, Any]) -> str:
    return sse(
        {"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta"
    )


def routes() -> APIRouter:
    """Anthropic's routes."""
    out = router(ANTHROPIC)
    out.add_api_route("/v1/messages", messages, methods=["POST"])
    out.add_api_route("/v1/messages/count_tokens", count_tokens, methods=["POST"])
    return out


def _parse(service: Service, body: dict[str, Any]) -> tuple[MessagesRequest, ChatPrompt]:
    """The request and its chat, prepared."""
    try:
        request = MessagesRequest.model_validate(body)
    except ValidationError as e:
        raise validation_error(e.errors()) from None
    request.check_supported()
    turns, tools = request.turns(), request.tool_request()
    settings = service.settings
    sampling = request.sampling(settings.sampling)
    kwargs = request.template_kwargs()
    chat = service.pyramid.prepare_chat(turns, sampling, tools, settings.chat_template, kwargs)
    return request, chat


async def messages(request: Request) -> HTTPResponse:
    """``POST /v1/messages``: a chat answered as Anthropic's message (or its events)."""
    service = service_of(request)
    body = await json_body(request, empty=b"null")
    if body.get("max_tokens") is None:
        raise ApiError(400, "max_tokens: Field required")
    parsed, chat = _parse(service, body)
    service.check_context(chat.tokens)
    spec = service.knobs(body)
    vocab = service.pyramid.vocab

    def detokenize(tokens: list[int], special: bool = chat.special) -> str:
        """As the steps' text is made, piece by piece."""
        pieces = b"".join(vocab.token_bytes(t, special=special) for t in tokens)
        return pieces.decode("utf-8", errors="replace")

    opened = detokenize(chat.tokens[-PROMPT_TAIL:], True).rstrip().endswith(OPEN)
    shape = Shape(
        parsed.model,
        chat.sampling.stop,
        detokenize,
        chat.reader(),
        thinks=bool(parsed.thinks()),
        opened=opened,
    )
    return await service.answer(request, service.chat_submit(chat, spec), shape, parsed.stream)


async def count_tokens(request: Request) -> HTTPResponse:
    """``POST /v1/messages/count_tokens``: the chat's prompt length."""
    _, chat = _parse(service_of(request), await json_body(request, empty=b"null"))
    return JSONResponse({"input_tokens": len(chat.tokens)})
