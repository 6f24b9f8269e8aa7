"""Ollama's routes: ``POST /api/chat`` and ``POST /api/generate`` (NDJSON lines by default,
one JSON object with ``"stream": false``), ``GET /api/tags``, ``POST /api/show``,
``GET /api/ps`` and ``GET /api/version``.

Any model name means the ladder the server loaded (the one ``/api/tags`` lists). Every
generation takes the one request path: a chat (``/api/generate`` without ``raw`` is a
chat of its ``system`` and ``prompt``) is prepared by :meth:`Pyramid.prepare_chat
<pyramid_gguf.api.Pyramid.prepare_chat>` and admitted by the :class:`~.service.Service`, so the
slots, the queue's 503 and the speculative knobs apply as on OpenAI's routes. ``options`` map
onto :class:`~pyramid_gguf.core.sampling.SamplingConfig` (``temperature``, ``top_k``,
``top_p``, ``min_p``, ``typical_p``, the penalties ``repeat_penalty``, ``presence_penalty``,
``frequency_penalty`` over the last ``repeat_last_n`` tokens, ``seed``, ``num_predict``,
``stop``); an option that would change the answer and that we do not honour (``mirostat``,
``tfs_z``) is a 400 unless it has its neutral value; load-time options (``num_ctx``,
``num_gpu``...) are the server's and ignored, as are names Ollama does not know (Ollama only
warns of them; ``penalize_newline`` too, which llama.cpp's samplers no longer have).
``format`` (``"json"`` or a JSON schema) is the answer's grammar; ``tools`` are answered as
``message.tool_calls`` with ``arguments`` as objects (the calls come whole in the last line of
a stream). The speculative knobs (``mode``, ``l_d``...) and ``tool_choice`` are taken at the
top level of a body, as on OpenAI's routes (extensions: Ollama has neither). Each answer's
last object carries Ollama's counts and durations (nanoseconds) and llama-server's
``timings``.

Errors are Ollama's shape, ``{"error": "..."}`` (a streamed one is a last line of that shape);
the server's API key, when set, is checked here too. Ollama's model management (pull, push,
create, copy, delete) is a clear error: the server serves the ladder it loaded, and
pyramid-gguf fetches models by its own names (``pyramid-gguf pull``). ``/api/embed`` and
``/api/embeddings`` are :mod:`.embeddings`' (``serve --embedding-model``).
"""

from __future__ import annotations

import hmac
import json
import re
import time
from collections.abc import AsyncGenerator
from datetime import datetime, timezone
from importlib import metadata
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.responses import Response as HTTPResponse

from ..api import ChatPrompt, GenerationStats, Response
from ..chat import CallStream, Message, parse_tool_request
from ..core.errors import UserError
from ..core.grammar import Grammar
from ..core.sampling import SamplingConfig
from ..grammar import check_grammar
from .errors import ApiError, error_of
from .jobs import Reader
from .openai import timings
from .schemas import GenerationRequest
from .service import Handler, Service, json_route

NDJSON = "application/x-ndjson"

#: Options that change the answer and that we do not honour, with their neutral values.
UNHONOURED: dict[str, tuple[Any, ...]] = {
    "tfs_z": (1, 1.0),
    "mirostat": (0,),
}
#: Options of the load or of features that change nothing here: accepted and ignored.
IGNORED = frozenset(
    {
        "numa", "num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv",
        "logits_all", "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread",
        "num_keep", "mirostat_tau", "mirostat_eta", "penalize_newline",
    }
)  # fmt: skip
#: Options we map: name -> (the SamplingConfig field, the type it must have).
MAPPED: dict[str, tuple[str, type | tuple[type, ...]]] = {
    "temperature": ("temperature", (int, float)),
    "top_k": ("top_k", int),
    "top_p": ("top_p", (int, float)),
    "min_p": ("min_p", (int, float)),
    "typical_p": ("typical_p", (int, float)),
    "repeat_penalty": ("repeat_penalty", (int, float)),
    "presence_penalty": ("presence_penalty", (int, float)),
    "frequency_penalty": ("frequency_penalty", (int, float)),
    "repeat_last_n": ("repeat_last_n", int),
    "seed": ("seed", int),
    "num_predict": ("max_tokens", int),
}
MANAGED = ("pull", "push", "create", "copy", "delete")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """An error in Ollama's shape."""
    return JSONResponse({"error": message}, status_code=status, headers=headers)


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
    for a bad value or one we do not honour). ``num_predict`` -1 or -2 (no limit, fill the
    context) is ``num_ctx`` tokens."""
    if options is None:
        return base
    if not isinstance(options, dict):
        raise ApiError(400, "options must be an object")
    changes: dict[str, Any] = {}
    for name, value in options.items():
        if value is None or name in IGNORED:
            continue
        if name in UNHONOURED:
            if not _same(value, UNHONOURED[name]):
                neutral = UNHONOURED[name][0]
                raise ApiError(400, f"option {name} is not supported (send {neutral} or omit it)")
        elif name in MAPPED:
            field, kind = MAPPED[name]
            if isinstance(value, bool) or not isinstance(value, kind):
                raise ApiError(400, f"option {name} must be a number, got {value!r}")
            if name == "num_predict" and value in (-1, -2):
                value = num_ctx
            changes[field] = value
        elif name == "stop":
            stops = [value] if isinstance(value, str) else value
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise ApiError(400, "option stop must be a string or a list of strings")
            changes["stop"] = tuple(stops)
    try:
        return base.with_(**changes) if changes else base
    except UserError as e:  # "--top-p must be in (0, 1]": name the option, not the flag
        flag = re.match(r"--([a-z-]+)", str(e))
        name = flag.group(1).replace("-", "_") if flag else ""
        option = {"max_tokens": "num_predict", "typical": "typical_p"}.get(name, name)
        message = f"option {option}{str(e)[flag.end() :]}" if flag else str(e)
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

    async def events(self, reader: Reader, first: Response) -> AsyncGenerator[str, None]:
        """The NDJSON body; leaving early (client gone) cancels the generation."""
        try:
            step: Response | None = first
            while step is not None:
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
                step = await reader.next()
        except Exception as e:  # after the headers went out: the error is the last line
            yield _ndjson({"error": error_of(e).message})
        finally:
            reader.close()


def _ndjson(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


def routes(service: Service) -> APIRouter:
    """Ollama's routes over ``service``."""
    router = APIRouter()
    pyramid = service.pyramid
    settings = service.settings
    key = settings.api_key.encode() if settings.api_key else None

    def authorized(request: Request) -> bool:
        """The server's API key, as ``Authorization: Bearer KEY`` or ``X-Api-Key: KEY``."""
        if key is None:
            return True
        bearer = request.headers.get("authorization", "").encode()
        given = request.headers.get("x-api-key", "").encode()
        return hmac.compare_digest(bearer, b"Bearer " + key) or hmac.compare_digest(given, key)

    async def guarded(request: Request, handler: Handler) -> HTTPResponse:
        """Run ``handler`` on the JSON body, every error answered in Ollama's shape."""
        if not authorized(request):
            return _error(401, "incorrect or missing API key (send Authorization: Bearer KEY)")
        return await json_route(request, handler, _error)

    def knobs(body: dict[str, Any]) -> Any:
        """The speculative knobs set at the top level of ``body``, on the server's spec."""
        extra = {k: v for k, v in body.items() if k not in GenerationRequest.model_fields}
        try:
            request = GenerationRequest.model_validate(extra)
        except ValidationError as e:
            raise ApiError(400, str(e.errors()[0].get("msg"))) from None
        return request.spec(service.spec)

    def sampling(body: dict[str, Any]) -> SamplingConfig:
        n_ctx = pyramid.ladder.target.n_ctx
        base = sampling_of(body.get("options"), settings.sampling, n_ctx)
        grammar = grammar_of(body.get("format"))
        return base.with_(grammar=grammar) if grammar is not None else base

    async def run(
        request: Request, body: dict[str, Any], chat: ChatPrompt, answer: Answer
    ) -> HTTPResponse:
        submit = service.chat_submit(chat, knobs(body))
        stream = body.get("stream") is not False
        return await service.answer(request, submit, answer, stream, media_type=NDJSON)

    def loaded(body: dict[str, Any], chat: bool) -> JSONResponse:
        """Ollama's answer to an empty prompt: the model is loaded, nothing is generated."""
        out: dict[str, Any] = {"model": body.get("model") or service.model_name}
        out |= {"created_at": _now()}
        out |= {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
        return JSONResponse(out | {"done": True, "done_reason": "load"})

    async def chat_route(request: Request, body: dict[str, Any]) -> HTTPResponse:
        _check(body, {"think": "think is not supported", "logprobs": "logprobs is not supported"})
        if not body.get("messages"):
            return loaded(body, chat=True)
        messages = messages_of(body["messages"])
        try:
            tools = parse_tool_request(body.get("tools"), body.get("tool_choice"))
        except UserError as e:
            raise ApiError(400, str(e)) from None
        prepared = pyramid.prepare_chat(messages, sampling(body), tools, settings.chat_template)
        answer = Answer(str(body.get("model") or service.model_name), True, prepared.reader())
        return await run(request, body, prepared, answer)

    async def generate_route(request: Request, body: dict[str, Any]) -> HTTPResponse:
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
            return loaded(body, chat=False)
        answer = Answer(str(body.get("model") or service.model_name), False, None)
        if body.get("raw") is True:
            prepared = ChatPrompt(pyramid.tokenize(prompt), sampling(body))
        else:
            turns = [{"role": "system", "content": system}] if system else []
            turns.append({"role": "user", "content": prompt})
            prepared = pyramid.prepare_chat(turns, sampling(body), None, settings.chat_template)
        return await run(request, body, prepared, answer)

    def details() -> dict[str, Any]:
        info = pyramid.ladder.target.loaded.metadata()
        arch = info.get("general.architecture", "")
        return {
            "parent_model": "",
            "format": "gguf",
            "family": arch,
            "families": [arch] if arch else None,
            "parameter_size": info.get("general.size_label", ""),
            "quantization_level": info.get("general.file_type", ""),
        }

    def card() -> dict[str, Any]:
        size = sum(t.loaded.path.stat().st_size for t in pyramid.ladder.models)
        name = service.model_name
        return {"name": name, "model": name, "size": size, "digest": "", "details": details()}

    @router.post("/api/chat")
    async def api_chat(request: Request) -> HTTPResponse:
        return await guarded(request, chat_route)

    @router.post("/api/generate")
    async def api_generate(request: Request) -> HTTPResponse:
        return await guarded(request, generate_route)

    @router.get("/api/tags")
    async def api_tags(request: Request) -> HTTPResponse:
        if not authorized(request):
            return _error(401, "incorrect or missing API key (send Authorization: Bearer KEY)")
        models = [card() | {"modified_at": _now()}]
        if service.embedding is not None:  # what /api/embed answers with
            e = service.embedding
            models.append(
                {"name": e.name, "model": e.name, "size": e.path.stat().st_size, "digest": ""}
                | {"details": {"format": "gguf", "family": "embedding"}, "modified_at": _now()}
            )
        return JSONResponse({"models": models})

    @router.get("/api/ps")
    async def api_ps(request: Request) -> HTTPResponse:
        if not authorized(request):
            return _error(401, "incorrect or missing API key (send Authorization: Bearer KEY)")
        loaded_card = card() | {"expires_at": "9999-12-31T23:59:59Z", "size_vram": 0}
        return JSONResponse({"models": [loaded_card]})

    async def show_route(request: Request, body: dict[str, Any]) -> HTTPResponse:
        template = pyramid.template(settings.chat_template)
        capabilities = ["completion", "tools"]  # any template: the generic format otherwise
        info = pyramid.ladder.target.loaded.metadata()
        return JSONResponse(
            {
                "modelfile": "",
                "parameters": "",
                "template": template.source,
                "details": details(),
                "model_info": {k: v for k, v in info.items() if k != "tokenizer.chat_template"},
                "capabilities": capabilities,
                "modified_at": _now(),
                "pyramid": {"mode": service.spec.mode, "tiers": pyramid.ladder.tier_names},
            }
        )

    @router.post("/api/show")
    async def api_show(request: Request) -> HTTPResponse:
        return await guarded(request, show_route)

    @router.get("/api/version")
    async def api_version() -> dict[str, str]:
        return {"version": _version()}

    def managed(action: str) -> Any:
        async def refuse(request: Request) -> HTTPResponse:
            what = f"pyramid-gguf does not manage models by Ollama name ({action})"
            return _error(
                501,
                f"{what}: this server serves the ladder it loaded, {service.model_name!r}; "
                "fetch models with `pyramid-gguf pull` and start `pyramid-gguf serve` with them",
            )

        return refuse

    for action in MANAGED:
        method = "DELETE" if action == "delete" else "POST"
        router.add_api_route(f"/api/{action}", managed(action), methods=[method])
    return router
