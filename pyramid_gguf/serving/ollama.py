"""Ollama's routes: ``POST /api/chat`` and ``POST /api/generate`` (NDJSON lines by default,
one JSON object with ``"stream": false``), ``GET /api/tags``, ``POST /api/show``,
``GET /api/ps`` and ``GET /api/version``.

Any model name means the ladder the server loaded (the one ``/api/tags`` lists). Every
generation takes the one request path: a chat (``/api/generate`` without ``raw`` is a
chat of its ``system`` and ``prompt``) is prepared by :meth:`Pyramid.prepare_chat
<pyramid_gguf.api.Pyramid.prepare_chat>` and admitted by the :class:`~.service.Service`, so the
slots, the queue's 503 and the speculative knobs apply as on OpenAI's routes. ``options`` map
onto :class:`~pyramid_gguf.core.sampling.SamplingConfig` (the sampler table's ``ollama``
names: ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``typical_p``, the penalties
``repeat_penalty``, ``presence_penalty``, ``frequency_penalty`` over the last
``repeat_last_n`` tokens; then ``seed``, ``num_predict``, ``stop``); an option that would
change the answer and that we do not honour (``mirostat``, ``tfs_z``) is a 400 unless it has
its neutral value; load-time options (``num_ctx``, ``num_gpu``...) are the server's and
ignored, as are names Ollama does not know (Ollama only warns of them; ``penalize_newline``
too, which llama.cpp's samplers no longer have).
``format`` (``"json"`` or a JSON schema) is the answer's grammar; ``tools`` are answered as
``message.tool_calls`` with ``arguments`` as objects (the calls come whole in the last line of
a stream). The speculative knobs (``mode``, ``l_d``...) and ``tool_choice`` are taken at the
top level of a body, as on OpenAI's routes (extensions: Ollama has neither). Each answer's
last object carries Ollama's counts and durations (nanoseconds) and llama-server's
``timings``.

Errors are Ollama's shape, ``{"error": "..."}`` (a streamed one is a last line of that shape),
the server's API key's 401 too; a prompt over a slot's context is refused before admission.
Ollama's model management (pull, push,
create, copy, delete) is a clear error: the server serves the ladder it loaded, and
pyramid-gguf fetches models by its own names (``pyramid-gguf pull``). ``/api/embed`` and
``/api/embeddings`` are :mod:`.embeddings`' (``serve --embedding-model``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from importlib import metadata
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response as HTTPResponse

from ..api import ChatPrompt, GenerationStats, Response
from ..chat import CallStream, Message, parse_tool_request
from ..core.errors import UserError
from ..core.grammar import Grammar
from ..core.sampling import SAMPLER_FIELDS, SamplingConfig, sampler_changes
from ..grammar import check_grammar
from .errors import ApiError
from .http_errors import OLLAMA, json_body, router
from .jobs import Reader
from .openai import timings
from .service import Service, service_of, stream

NDJSON = "application/x-ndjson"

#: Options that change the answer and that we do not honour, with their neutral values.
UNHONOURED: dict[str, tuple[Any, ...]] = {
    "tfs_z": (1, 1.0),
    "mirostat": (0,),
}
#: Options beside the sampler table's (:data:`~pyramid_gguf.core.sampling.SAMPLER_FIELDS`,
#: its ``ollama`` names): name -> the SamplingConfig field.
OTHER_OPTIONS = {"seed": "seed", "num_predict": "max_tokens"}
#: A SamplingConfig error's flag -> the option it came as.
OPTION_OF_FLAG = {f.flag: f.ollama for f in SAMPLER_FIELDS if f.ollama} | {
    "--seed": "seed",
    "--max-tokens": "num_predict",
}
MANAGED = ("pull", "push", "create", "copy", "delete")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _version() -> str:
    try:
        return metadata.version("pyramid-gguf")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def _same(value: Any, neutral: tuple[Any, ...]) -> bool:
    return not isinstance(value, bool) and any(value == v for v in neutral)


def sampling_of(options: Any, base: SamplingConfig, num_ctx: int) -> SamplingConfig:
    """``base`` with Ollama's ``options`` applied (an :class:`ApiError` 400 naming the option
    for a bad value or one we do not honour): the sampler table's options, ``seed``,
    ``num_predict`` (-1 or -2, no limit or fill the context: ``num_ctx`` tokens) and ``stop``."""
    if options is None:
        return base
    if not isinstance(options, dict):
        raise ApiError(400, "options must be an object")
    for name, value in options.items():
        if name in UNHONOURED and value is not None and not _same(value, UNHONOURED[name]):
            neutral = UNHONOURED[name][0]
            raise ApiError(400, f"option {name} is not supported (send {neutral} or omit it)")
    try:
        changes = sampler_changes(options, "ollama", prefix="option ")
    except UserError as e:
        raise ApiError(400, str(e)) from None
    for name, field in OTHER_OPTIONS.items():
        value = options.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApiError(400, f"option {name} must be an integer, got {value!r}")
        changes[field] = num_ctx if name == "num_predict" and value in (-1, -2) else value
    stop = options.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise ApiError(400, "option stop must be a string or a list of strings")
        changes["stop"] = tuple(stops)
    try:
        return base.with_(**changes) if changes else base
    except UserError as e:  # "--max-tokens must be at least 1": name the option, not the flag
        flag = re.match(r"--[a-z-]+", str(e))
        option = OPTION_OF_FLAG.get(flag.group(0)) if flag else None
        message = f"option {option}{str(e)[flag.end() :]}" if flag and option else str(e)
        raise ApiError(400, message) from None


def grammar_of(fmt: Any) -> Grammar | None:
    """Ollama's ``format``: ``"json"``, a JSON schema, or nothing; checked (a 400)."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        grammar = Grammar.json_object()
    elif isinstance(fmt, dict):
        grammar = Grammar.json_schema(fmt)
    else:
        raise ApiError(400, f'format must be "json" or a JSON schema object, got {fmt!r}')
    try:
        check_grammar(grammar)
    except UserError as e:
        raise ApiError(400, f"format: {e}") from None
    return grammar


def messages_of(messages: Any) -> list[dict[str, Any]]:
    """Ollama's chat messages as the chat template takes them (OpenAI's shape): tool calls
    with ids, a tool result's ``tool_name`` as its ``name``."""
    if not isinstance(messages, list):
        raise ApiError(400, "messages must be a list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a role")
        content = m.get("content") or ""
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string")
        if m.get("images"):
            raise ApiError(400, f"messages[{i}].images: images are not supported")
        turn: dict[str, Any] = {"role": m["role"], "content": content}
        calls = m.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise ApiError(400, f"messages[{i}].tool_calls must be a list")
            where = f"messages[{i}].tool_calls"
            turn["tool_calls"] = [
                _openai_call(c, f"{where}[{j}]", i, j) for j, c in enumerate(calls)
            ]
        if isinstance(m.get("tool_name"), str):
            turn["name"] = m["tool_name"]
        out.append(turn)
    return out


def _openai_call(call: Any, where: str, i: int, j: int) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ApiError(400, f"{where} must be {{'function': {{'name': ..., 'arguments': ...}}}}")
    return {
        "id": call.get("id") or f"call_{i}_{j}",
        "type": "function",
        "function": {"name": function["name"], "arguments": function.get("arguments") or {}},
    }


def tool_calls(message: Message) -> list[dict[str, Any]]:
    """Ollama's ``message.tool_calls`` of a parsed answer: arguments as objects."""
    out = []
    for index, call in enumerate(message.calls):
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError:
            arguments = {}
        out.append(
            {
                "id": call.id,
                "function": {"index": index, "name": call.name, "arguments": arguments},
            }
        )
    return out


def _durations(stats: GenerationStats, started: float) -> dict[str, Any]:
    return {
        "total_duration": int((time.monotonic() - started) * 1e9),
        "load_duration": 0,
        "prompt_eval_count": stats.prompt_tokens,
        "prompt_eval_duration": int(stats.prompt_seconds * 1e9),
        "eval_count": stats.generated_tokens,
        "eval_duration": int(stats.generation_seconds * 1e9),
        "timings": timings(stats),
    }


def _done_reason(reason: str | None) -> str:
    return "stop" if reason == "stop" else "length"


def _check(body: dict[str, Any], refused: dict[str, str]) -> None:
    """A 400 for a field we do not honour that is set to something other than nothing."""
    for name, message in refused.items():
        if body.get(name) not in (None, False, "", [], {}):
            raise ApiError(400, message)


class Answer:
    """The shape (a :class:`~.service.Shape`) of one generation's answer: chat (``message``)
    or generate (``response``), streamed as NDJSON lines."""

    def __init__(self, model: str, chat: bool, calls: CallStream | None) -> None:
        self.model = model
        self.chat = chat
        self.calls = calls
        self.started = time.monotonic()

    def line(self, text: str, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        head: dict[str, Any] = {"model": self.model, "created_at": _now()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = calls
            return head | {"message": message, "done": False}
        return head | {"response": text, "done": False}

    def last(self, text: str, step: Response, calls: list[dict[str, Any]] | None = None) -> Any:
        end = {"done": True, "done_reason": _done_reason(step.finish_reason)}
        return self.line(text, calls) | end | _durations(step.stats, self.started)

    def whole(self, steps: list[Response]) -> dict[str, Any]:
        text = "".join(s.text for s in steps)
        calls = None
        if self.calls is not None:
            message = self.calls.parse(text)
            text, calls = message.content or "", tool_calls(message)
        return self.last(text, steps[-1], calls)

    def events(self, reader: Reader, first: Response) -> AsyncIterator[str]:
        """The NDJSON body; an error after the headers went out is its last line."""
        return stream(reader, first, self._lines, lambda error: _ndjson(error.ollama_body()))

    async def _lines(self, steps: AsyncIterator[Response]) -> AsyncIterator[str]:
        async for step in steps:
            if step.finish_reason is not None:
                text, calls = step.text, None
                if self.calls is not None:
                    delta = self.calls.feed(step.text)
                    message, last = self.calls.finish()
                    text, calls = delta.content + last.content, tool_calls(message)
                yield _ndjson(self.last(text, step, calls))
            else:
                text = self.calls.feed(step.text).content if self.calls else step.text
                if text:
                    yield _ndjson(self.line(text))


def _ndjson(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


def routes() -> APIRouter:
    """Ollama's routes."""
    out = router(OLLAMA)
    out.add_api_route("/api/chat", api_chat, methods=["POST"])
    out.add_api_route("/api/generate", api_generate, methods=["POST"])
    out.add_api_route("/api/tags", api_tags, methods=["GET"])
    out.add_api_route("/api/ps", api_ps, methods=["GET"])
    out.add_api_route("/api/show", api_show, methods=["POST"])
    out.add_api_route("/api/version", api_version, methods=["GET"])
    for action in MANAGED:
        method = "DELETE" if action == "delete" else "POST"
        out.add_api_route(f"/api/{action}", _managed(action), methods=[method])
    return out


def _sampling(service: Service, body: dict[str, Any]) -> SamplingConfig:
    """The request's sampling: its ``options`` and ``format`` on the server's."""
    base = sampling_of(body.get("options"), service.settings.sampling, service.n_ctx)
    grammar = grammar_of(body.get("format"))
    return base.with_(grammar=grammar) if grammar is not None else base


async def _run(
    request: Request, body: dict[str, Any], chat: ChatPrompt, answer: Answer
) -> HTTPResponse:
    """A prepared chat answered through the service, streamed unless ``stream`` is false."""
    service = service_of(request)
    service.check_context(chat.tokens)
    submit = service.chat_submit(chat, service.knobs(body))
    stream = body.get("stream") is not False
    return await service.answer(request, submit, answer, stream, media_type=NDJSON)


def _loaded(service: Service, body: dict[str, Any], chat: bool) -> JSONResponse:
    """Ollama's answer to an empty prompt: the model is loaded, nothing is generated."""
    out: dict[str, Any] = {"model": body.get("model") or service.model_name}
    out |= {"created_at": _now()}
    out |= {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return JSONResponse(out | {"done": True, "done_reason": "load"})


async def api_chat(request: Request) -> HTTPResponse:
    """``POST /api/chat``: a chat turn, NDJSON lines unless ``stream`` is false."""
    service = service_of(request)
    body = await json_body(request)
    _check(body, {"think": "think is not supported", "logprobs": "logprobs is not supported"})
    if not body.get("messages"):
        return _loaded(service, body, chat=True)
    messages = messages_of(body["messages"])
    try:
        tools = parse_tool_request(body.get("tools"), body.get("tool_choice"))
    except UserError as e:
        raise ApiError(400, str(e)) from None
    template = service.settings.chat_template
    prepared = service.pyramid.prepare_chat(messages, _sampling(service, body), tools, template)
    answer = Answer(str(body.get("model") or service.model_name), True, prepared.reader())
    return await _run(request, body, prepared, answer)


async def api_generate(request: Request) -> HTTPResponse:
    """``POST /api/generate``: a prompt answered as a chat of its ``system`` and ``prompt``
    (``raw``: continued as it is)."""
    service = service_of(request)
    body = await json_body(request)
    _check(
        body,
        {
            "suffix": "suffix (fill-in-the-middle) is not supported",
            "template": "template is not supported: the model's chat template is used",
            "context": "context is not supported: send the whole prompt",
            "images": "images are not supported",
            "think": "think is not supported",
            "logprobs": "logprobs is not supported",
        },
    )
    prompt, system = body.get("prompt") or "", body.get("system") or ""
    if not isinstance(prompt, str) or not isinstance(system, str):
        raise ApiError(400, "prompt and system must be strings")
    if not prompt:
        return _loaded(service, body, chat=False)
    answer = Answer(str(body.get("model") or service.model_name), False, None)
    pyramid, sampling = service.pyramid, _sampling(service, body)
    if body.get("raw") is True:
        prepared = ChatPrompt(pyramid.tokenize(prompt), sampling)
    else:
        turns = [{"role": "system", "content": system}] if system else []
        turns.append({"role": "user", "content": prompt})
        prepared = pyramid.prepare_chat(turns, sampling, None, service.settings.chat_template)
    return await _run(request, body, prepared, answer)


def _details(service: Service) -> dict[str, Any]:
    info = service.pyramid.metadata()
    arch = info.get("general.architecture", "")
    return {
        "parent_model": "",
        "format": "gguf",
        "family": arch,
        "families": [arch] if arch else None,
        "parameter_size": info.get("general.size_label", ""),
        "quantization_level": info.get("general.file_type", ""),
    }


def _card(service: Service) -> dict[str, Any]:
    size = sum(t.size for t in service.pyramid.tiers())
    name = service.model_name
    return {"name": name, "model": name, "size": size, "digest": "", "details": _details(service)}


async def api_tags(request: Request) -> HTTPResponse:
    """``GET /api/tags``: the ladder, and the embedding model when one is loaded."""
    service = service_of(request)
    models = [_card(service) | {"modified_at": _now()}]
    if service.embedding is not None:  # what /api/embed answers with
        e = service.embedding
        models.append(
            {"name": e.name, "model": e.name, "size": e.path.stat().st_size, "digest": ""}
            | {"details": {"format": "gguf", "family": "embedding"}, "modified_at": _now()}
        )
    return JSONResponse({"models": models})


async def api_ps(request: Request) -> HTTPResponse:
    """``GET /api/ps``: the loaded ladder."""
    loaded = _card(service_of(request)) | {"expires_at": "9999-12-31T23:59:59Z", "size_vram": 0}
    return JSONResponse({"models": [loaded]})


async def api_show(request: Request) -> HTTPResponse:
    """``POST /api/show``: the ladder's template, details and metadata."""
    service = service_of(request)
    await json_body(request)
    pyramid = service.pyramid
    template = pyramid.template(service.settings.chat_template)
    capabilities = ["completion", "tools"]  # any template: the generic format otherwise
    info = pyramid.metadata()
    return JSONResponse(
        {
            "modelfile": "",
            "parameters": "",
            "template": template.source,
            "details": _details(service),
            "model_info": {k: v for k, v in info.items() if k != "tokenizer.chat_template"},
            "capabilities": capabilities,
            "modified_at": _now(),
            "pyramid": {"mode": service.spec.mode, "tiers": pyramid.ladder.tier_names},
        }
    )


async def api_version() -> dict[str, str]:
    """``GET /api/version``."""
    return {"version": _version()}


def _managed(action: str) -> Any:
    async def refuse(request: Request) -> HTTPResponse:
        what = f"pyramid-gguf does not manage models by Ollama name ({action})"
        name = service_of(request).model_name
        raise ApiError(
            501,
            f"{what}: this server serves the ladder it loaded, {name!r}; "
            "fetch models with `pyramid-gguf pull` and start `pyramid-gguf serve` with them",
        )

    return refuse
