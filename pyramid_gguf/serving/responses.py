"""OpenAI's Responses API: ``POST /v1/responses`` (and llama-server's unprefixed ``/responses``),
answered whole or streamed as the Responses API's typed server-sent events.

A request is a chat like any other: ``instructions`` and the ``input`` items (messages of role
``user``, ``assistant``, ``system`` or ``developer`` with text or ``input_text`` /
``output_text`` parts; ``function_call`` and ``function_call_output`` items of earlier turns)
become the chat template's messages, :meth:`Pyramid.prepare_chat
<pyramid_gguf.api.Pyramid.prepare_chat>` renders them with the flat function ``tools``
(``tool_choice``, ``parallel_tool_calls``) and the answer's grammar (``text.format``:
``json_schema``, ``json_object`` or ``text``), and the :class:`~.service.Service` admits the
generation (the slots, the queue's 503, the API key, CORS and ``/metrics`` apply as on every
route). ``max_output_tokens``, ``temperature`` and ``top_p`` map onto
:class:`~pyramid_gguf.core.sampling.SamplingConfig`; the speculative knobs (``mode``, ``l_d``...)
and llama-server's sampling extensions (``top_k``, ``min_p``, ``seed``, ``stop``, the
penalties, ``logit_bias``, ``samplers``...) are taken at the top level of a body, as on chat
completions, whose refusals (``mirostat``, ``best_of``...) apply too. ``metadata`` and
``user`` are echoed and change nothing.

Nothing is stored: ``store`` (true by the clients' default) is accepted and ignored, and the
answer says ``store: false``; ``previous_response_id``, ``conversation`` and ``item_reference``
inputs, which need stored state, are 400s. So is every other field that would change the
answer and that we do not honour (:data:`REFUSED`; ``reasoning`` with an effort, built-in tools
such as ``web_search``, ``include``, ``truncation: "auto"``, ``background: true``), and chat
completions' names for Responses fields (:data:`CHAT_NAMES`).

The answer is a ``response`` object: ``status`` ``completed``, or ``incomplete`` with
``incomplete_details.reason = "max_output_tokens"``; ``output`` a ``message`` item (one
``output_text`` part, ``annotations: []``) and a ``function_call`` item per call (``arguments`` a
JSON string, ``call_id`` the id a ``function_call_output`` answers); ``usage`` in input and output
tokens, with llama-server's ``timings`` as an extra. ``output_text`` is the client's to compute.
Streamed: ``response.created``, ``response.in_progress``, then per output item
``response.output_item.added``, its text (``response.content_part.added``,
``response.output_text.delta``..., ``.done``, ``response.content_part.done``) or its arguments
(``response.function_call_arguments.delta``..., ``.done``) and ``response.output_item.done``,
then ``response.completed`` (or ``response.incomplete``, as OpenAI's API ends an answer cut by
``max_output_tokens``), each with its ``sequence_number``; the last carries llama-server's
``timings`` beside its response. llama-server's stream telemetry is taken too: with
``timings_per_token`` each ``response.output_text.delta`` carries ``timings``, with
``return_progress`` a ``response.in_progress`` event carries ``prompt_progress`` once the prompt
is read.
Errors are OpenAI's shape (an ``error`` event once a stream has begun), never a traceback.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.responses import Response as HTTPResponse

from ..api import GenerationStats, Response
from ..chat import CallStream, Delta, Message, ToolRequest, parse_tool_request
from ..core.errors import UserError
from ..core.grammar import Grammar
from ..core.sampling import SamplingConfig
from ..grammar import check_grammar
from .errors import ApiError, validation_error
from .http_errors import OPENAI, json_body, router
from .jobs import Reader
from .openai import timings
from .schemas import GenerationRequest
from .service import service_of, sse, stream

#: Fields that change the answer and that we do not honour, with the values that change
#: nothing (clients send some as defaults) and what to say instead.
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "previous_response_id": (
        (None,),
        "previous_response_id: this server keeps no responses (store is accepted and ignored); "
        "send the whole conversation as input",
    ),
    "conversation": (
        (None,),
        "conversation: this server keeps no conversations; send the whole conversation as input",
    ),
    "prompt": ((None,), "prompt: stored prompt templates are not supported"),
    "include": ((None, []), "include: extra output (logprobs, reasoning...) is not supported"),
    "truncation": (
        (None, "disabled"),
        'truncation: only "disabled" is supported (a prompt longer than the context is a 400)',
    ),
    "background": ((None, False), "background: responses run in the foreground only"),
    "max_tool_calls": ((None,), "max_tool_calls is not supported"),
    "top_logprobs": ((None, 0), "top_logprobs is not supported"),
    "context_management": ((None, []), "context_management is not supported"),
}

#: Chat completions' fields sent here, and the Responses field that says it.
CHAT_NAMES = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "n_predict": "max_output_tokens",
    "response_format": "text.format",
    "json_schema": "text.format",
    "grammar": "text.format",
}


class ResponsesRequest(BaseModel):
    """The fields of ``/v1/responses`` that we read; others go to :meth:`extensions` (the
    speculative knobs, llama-server's sampling fields) unless :data:`REFUSED` refuses them."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    #: ``{"format": {"type": "json_schema" | "json_object" | "text", ...}, "verbosity": ...}``.
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    #: Accepted and ignored: nothing is stored.
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    #: llama-server's telemetry in a stream: ``timings`` on each text delta.
    timings_per_token: bool = False
    #: llama-server's telemetry in a stream: the prompt's ``prompt_progress``.
    return_progress: bool = False

    @field_validator("input")
    @classmethod
    def _some_input(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("must hold at least one item")
        return value

    def check_supported(self) -> None:
        """A 400 for what would change the answer and that we do not honour."""
        extra = self.model_extra or {}
        for name, (neutral, message) in REFUSED.items():
            if name in extra and not any(extra[name] == v for v in neutral):
                raise ApiError(400, message, param=name)
        for name, instead in CHAT_NAMES.items():
            if name in extra:
                raise ApiError(400, f"{name} is not a Responses field: send {instead}", param=name)
        effort = (self.reasoning or {}).get("effort")
        if effort not in (None, "none"):
            raise ApiError(400, "reasoning: a reasoning effort is not supported", param="reasoning")
        verbosity = (self.text or {}).get("verbosity")
        if verbosity not in (None, "medium"):
            raise ApiError(400, "text.verbosity: only medium is supported", param="text")

    def extensions(self) -> GenerationRequest:
        """The body's other fields read as chat completions reads them: the speculative knobs,
        llama-server's sampling fields, and a 400 for those it refuses."""
        extra = {k: v for k, v in (self.model_extra or {}).items() if k not in REFUSED}
        try:
            return GenerationRequest.model_validate(extra)
        except ValidationError as e:
            raise validation_error(e.errors()) from None

    def turns(self) -> list[dict[str, Any]]:
        """The chat template's messages (OpenAI chat's shape): ``instructions`` as the system
        prompt, then each input item (a 400 naming the item for any other kind)."""
        out: list[dict[str, Any]] = []
        if self.instructions:
            out.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            return [*out, {"role": "user", "content": self.input}]
        for i, item in enumerate(self.input):
            _add_item(out, item, f"input.{i}")
        return out

    def tool_request(self) -> ToolRequest | None:
        """The flat function ``tools`` and ``tool_choice`` as the chat's tool request."""
        tools, choice = chat_tools(self.tools, self.tool_choice)
        try:
            return parse_tool_request(tools, choice, self.parallel_tool_calls)
        except UserError as e:
            param = "tool_choice" if "tool_choice" in str(e) else "tools"
            raise ApiError(400, str(e), param=param) from None

    def sampling(self, base: SamplingConfig) -> SamplingConfig:
        """``base`` (the :meth:`extensions`' sampling: temperature, top-p and every other
        sampler field under OpenAI's names) with this request's token limit and grammar."""
        changes: dict[str, Any] = {}
        if self.max_output_tokens is not None:
            changes["max_tokens"] = self.max_output_tokens
        grammar = self.grammar()
        if grammar is not None:
            changes["grammar"] = grammar
        return base.with_(**changes) if changes else base

    def grammar(self) -> Grammar | None:
        """``text.format`` as the answer's grammar, checked (a 400 naming the field)."""
        fmt = (self.text or {}).get("format")
        if fmt is None:
            return None
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "text":
            return None
        if kind == "json_object":
            return Grammar.json_object()
        if kind != "json_schema":
            raise ApiError(
                400,
                'text.format.type: must be "text", "json_object" or "json_schema"',
                param="text",
            )
        assert isinstance(fmt, dict)
        if not isinstance(fmt.get("schema"), dict):
            raise ApiError(400, "text.format.schema: must be a JSON schema object", param="text")
        try:
            grammar = Grammar.json_schema(fmt["schema"], strict=fmt.get("strict") is not False)
            check_grammar(grammar)
        except UserError as e:
            raise ApiError(400, f"text.format.schema: {e}", param="text") from None
        return grammar

    def echo(self) -> dict[str, Any]:
        """The request's settings as a ``response`` object repeats them."""
        return {
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "metadata": self.metadata or {},
            "parallel_tool_calls": self.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "text": {"format": (self.text or {}).get("format") or {"type": "text"}},
            "tool_choice": self.tool_choice or "auto",
            "tools": self.tools or [],
            "truncation": "disabled",
            "user": self.user,
        }


def _text(content: Any, where: str) -> str:
    """A string, or the text of a list of ``input_text`` / ``output_text`` parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where}: must be a string or a list of content parts", param="input")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text") or not isinstance(part.get("text"), str):
            message = f"{where}.{j}: content parts of type {kind!r} are not supported"
            raise ApiError(400, message, param="input")
        parts.append(part["text"])
    return "".join(parts)


def _field(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise ApiError(400, f"{where}.{name}: must be a non-empty string", param="input")
    return value


def _add_item(out: list[dict[str, Any]], item: Any, where: str) -> None:
    """Append one input item to ``out`` as chat turns: a message; a ``function_call`` joins
    the assistant turn before it (or opens one); a ``function_call_output`` is a ``tool``
    turn."""
    if not isinstance(item, dict):
        raise ApiError(400, f"{where}: must be an object", param="input")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            message = f'{where}.role: must be "user", "assistant", "system" or "developer"'
            raise ApiError(400, message, param="input")
        text = _text(item.get("content"), f"{where}.content")
        out.append({"role": "system" if role == "developer" else role, "content": text})
    elif kind == "function_call":
        name, call_id = _field(item, "name", where), _field(item, "call_id", where)
        try:
            arguments = json.loads(item.get("arguments") or "{}")
        except (TypeError, json.JSONDecodeError):
            raise ApiError(400, f"{where}.arguments: not a JSON string", param="input") from None
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        if not out or out[-1]["role"] != "assistant":
            out.append({"role": "assistant", "content": ""})
        out[-1].setdefault("tool_calls", []).append(call)
    elif kind == "function_call_output":
        call_id = _field(item, "call_id", where)
        text = _text(item.get("output", ""), f"{where}.output")
        out.append({"role": "tool", "tool_call_id": call_id, "content": text})
    elif kind == "item_reference":
        message = f"{where}: item_reference needs stored items, and this server keeps none"
        raise ApiError(400, message, param="input")
    else:
        raise ApiError(
            400, f"{where}: input items of type {kind!r} are not supported", param="input"
        )


def chat_tools(tools: Any, choice: Any) -> tuple[Any, Any]:
    """The Responses API's flat function ``tools`` and ``tool_choice`` in chat completions'
    terms (a 400 for built-in tools such as ``web_search``, or another kind of choice)."""
    if tools is not None and not isinstance(tools, list):
        raise ApiError(400, "tools: must be a list of function tools", param="tools")
    out = []
    for i, tool in enumerate(tools or ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            message = f"tools.{i}: tools of type {kind!r} are not supported (only function tools)"
            raise ApiError(400, message, param="tools")
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        out.append({"type": "function", "function": function})
    if not isinstance(choice, dict):
        return out if tools is not None else None, choice
    if choice.get("type") != "function":
        message = f"tool_choice: a choice of type {choice.get('type')!r} is not supported"
        raise ApiError(400, message, param="tool_choice")
    return out, {"type": "function", "function": {"name": choice.get("name")}}


def usage(stats: GenerationStats) -> dict[str, Any]:
    """The Responses API's ``usage``: ``cached_tokens`` were reused from the slot's cache;
    nothing is written to a cache that a later request could name, so ``cache_write_tokens``
    is 0, and the models do not reason apart from their answer (``reasoning_tokens`` 0)."""
    return {
        "input_tokens": stats.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": stats.prompt_tokens - stats.prompt_evaluated,
            "cache_write_tokens": 0,
        },
        "output_tokens": stats.generated_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
    }


#: One streamed event before its sequence number: ``(type, fields)``.
Event = tuple[str, dict[str, Any]]


class Output:
    """One answer's ``output`` items, built as its text arrives: :meth:`feed` each text delta,
    :meth:`finish` at the end; each returns the events that build the items (a whole answer
    feeds its text once and keeps only :attr:`items`). Without tools the answer is one message;
    with them a message opens at the first content text and a ``function_call`` item at each
    call, whose arguments follow as they are read."""

    def __init__(self, calls: CallStream | None) -> None:
        self.calls = calls
        self.items: list[dict[str, Any]] = []
        self.message: int | None = None  # the message item's output index
        self.opened: dict[int, int] = {}  # a call's index in the answer -> its output index

    def start(self) -> list[Event]:
        """The message item of an answer without tools, opened before its first text."""
        return self._open_message() if self.calls is None else []

    def feed(self, text: str) -> list[Event]:
        delta = self.calls.feed(text) if self.calls is not None else Delta(text, ())
        return self._apply(delta)

    def finish(self, incomplete: bool) -> list[Event]:
        """The rest of the answer, then every item closed with its final content (the whole
        answer parsed once more: calls and content as a whole parse reads them)."""
        events: list[Event] = []
        final: Message | None = None
        if self.calls is not None:
            final, rest = self.calls.finish()
            events += self._apply(rest)
        status = "incomplete" if incomplete else "completed"
        for index, item in enumerate(self.items):
            if item["type"] == "message":
                events += self._close_message(index, item, final, status)
            else:
                events += self._close_call(index, item, final, status)
        return events

    def _apply(self, delta: Delta) -> list[Event]:
        events: list[Event] = []
        if delta.content:
            if self.message is None:
                events += self._open_message()
            assert self.message is not None
            item = self.items[self.message]
            item["content"][0]["text"] += delta.content
            fields = {**self._where(self.message), "content_index": 0, "logprobs": []}
            events.append(("response.output_text.delta", fields | {"delta": delta.content}))
        for call in delta.tool_calls:
            if call["index"] not in self.opened:
                events += self._open_call(call)
            index = self.opened[call["index"]]
            piece = call["function"].get("arguments") or ""
            if piece:
                self.items[index]["arguments"] += piece
                fields = self._where(index) | {"delta": piece}
                events.append(("response.function_call_arguments.delta", fields))
        return events

    def _where(self, index: int) -> dict[str, Any]:
        return {"item_id": self.items[index]["id"], "output_index": index}

    def _open_message(self) -> list[Event]:
        self.message = len(self.items)
        part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": []}
        item: dict[str, Any] = {
            "id": f"msg_{uuid.uuid4().hex}",
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [dict(part)],
        }
        self.items.append(item)
        added = {"output_index": self.message, "item": {**item, "content": []}}
        opened = {**self._where(self.message), "content_index": 0, "part": part}
        return [("response.output_item.added", added), ("response.content_part.added", opened)]

    def _open_call(self, call: dict[str, Any]) -> list[Event]:
        index = len(self.items)
        self.opened[call["index"]] = index
        item = {
            "id": f"fc_{uuid.uuid4().hex}",
            "type": "function_call",
            "call_id": call["id"],
            "name": call["function"]["name"],
            "arguments": "",
            "status": "in_progress",
        }
        self.items.append(item)
        return [("response.output_item.added", {"output_index": index, "item": dict(item)})]

    def _close_message(
        self, index: int, item: dict[str, Any], final: Message | None, status: str
    ) -> list[Event]:
        part = item["content"][0]
        if final is not None:
            part["text"] = final.content or ""
        item["status"] = status
        where = {**self._where(index), "content_index": 0}
        text = {**where, "text": part["text"], "logprobs": []}
        return [
            ("response.output_text.done", text),
            ("response.content_part.done", where | {"part": part}),
            ("response.output_item.done", {"output_index": index, "item": item}),
        ]

    def _close_call(
        self, index: int, item: dict[str, Any], final: Message | None, status: str
    ) -> list[Event]:
        number = next(k for k, v in self.opened.items() if v == index)
        if final is not None and number < len(final.calls):
            item["arguments"] = final.calls[number].arguments
        item["status"] = status
        done = self._where(index) | {"name": item["name"], "arguments": item["arguments"]}
        return [
            ("response.function_call_arguments.done", done),
            ("response.output_item.done", {"output_index": index, "item": item}),
        ]


class Shape:
    """One answer's id, settings and how its ``response`` objects look."""

    def __init__(
        self,
        request: ResponsesRequest,
        model: str,
        sampling: SamplingConfig,
        calls: CallStream | None,
    ) -> None:
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.model = model
        self.calls = calls
        self.per_token = request.timings_per_token
        self.progress = request.return_progress
        self.settings = request.echo() | {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }

    def body(self, output: list[dict[str, Any]], last: Response | None = None) -> dict[str, Any]:
        """The ``response`` object: in progress without its ``last`` step, else finished."""
        incomplete = last is not None and last.finish_reason != "stop"
        status = "in_progress" if last is None else "incomplete" if incomplete else "completed"
        out = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "model": self.model,
            "output": output,
            **self.settings,
            "usage": None if last is None else usage(last.stats),
        }
        return out if last is None else out | {"timings": timings(last.stats)}

    def whole(self, steps: list[Response]) -> dict[str, Any]:
        last = steps[-1]
        output = Output(self.calls)
        output.start()
        output.feed("".join(s.text for s in steps))
        output.finish(last.finish_reason != "stop")
        return self.body(output.items, last)

    def events(self, reader: Reader, first: Response) -> AsyncIterator[str]:
        """The typed events; an error after the headers went out is an ``error`` event."""
        numbers = itertools.count()

        def emit(kind: str, fields: dict[str, Any]) -> str:
            return sse({"type": kind, "sequence_number": next(numbers), **fields}, kind)

        def late(error: ApiError) -> str:
            return emit(
                "error", {"code": error.code, "message": error.message, "param": error.param}
            )

        async def events(steps: AsyncIterator[Response]) -> AsyncIterator[str]:
            yield emit("response.created", {"response": self.body([])})
            yield emit("response.in_progress", {"response": self.body([])})
            if self.progress:
                progress = {"response": self.body([]), "prompt_progress": prompt_progress(first)}
                yield emit("response.in_progress", progress)
            output = Output(self.calls)
            for kind, fields in output.start():
                yield emit(kind, fields)
            last = first
            async for step in steps:
                last = step
                for kind, fields in output.feed(step.text):
                    if self.per_token and kind == "response.output_text.delta":
                        fields = fields | {"timings": timings(step.stats)}
                    yield emit(kind, fields)
            for kind, fields in output.finish(last.finish_reason != "stop"):
                yield emit(kind, fields)
            body = self.body(output.items, last)
            done = "response.completed" if body["status"] == "completed" else "response.incomplete"
            yield emit(done, {"response": body, "timings": body["timings"]})

        return stream(reader, first, events, late)


def prompt_progress(first: Response) -> dict[str, Any]:
    """llama-server's ``prompt_progress`` once the prompt is read (its first step): tokens in
    all, reused from the cache, processed (cached ones included), and the milliseconds taken."""
    stats = first.stats
    return {
        "total": stats.prompt_tokens,
        "cache": stats.prompt_tokens - stats.prompt_evaluated,
        "processed": stats.prompt_tokens,
        "time_ms": round(stats.prompt_seconds * 1000, 2),
    }


def routes() -> APIRouter:
    """The Responses API's routes, under ``/v1`` and unprefixed."""
    out = router(OPENAI)
    for prefix in ("/v1", ""):
        out.add_api_route(f"{prefix}/responses", create, methods=["POST"])
        out.add_api_route(f"{prefix}/responses/{{response_id}}", stored, methods=["GET", "DELETE"])
    return out


async def create(request: Request) -> HTTPResponse:
    """``POST /v1/responses``: a chat answered as a response (or its typed events)."""
    service = service_of(request)
    try:
        parsed = ResponsesRequest.model_validate(await json_body(request))
    except ValidationError as e:
        raise validation_error(e.errors()) from None
    parsed.check_supported()
    extensions = parsed.extensions()
    settings = service.settings
    sampling = parsed.sampling(extensions.sampling(settings.sampling))
    spec = extensions.spec(service.spec)
    chat = service.pyramid.prepare_chat(
        parsed.turns(), sampling, parsed.tool_request(), settings.chat_template
    )
    service.check_context(chat.tokens)
    shape = Shape(parsed, service.model_name, chat.sampling, chat.reader())
    return await service.answer(request, service.chat_submit(chat, spec), shape, parsed.stream)


async def stored(response_id: str) -> HTTPResponse:
    """A stored response: none is kept (a 404)."""
    message = f"no response {response_id!r}: this server keeps no responses (store is ignored)"
    raise ApiError(404, message, param="response_id")
