"""An OpenAI-compatible HTTP server over one loaded :class:`~pyramid_gguf.api.Pyramid`.

``create_app(pyramid, settings)`` returns a FastAPI app with ``GET /health``,
``GET /v1/models``, ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed as
server-sent events when ``stream`` is true). Responses carry OpenAI's ``usage`` and an extra
``timings`` object (llama-server names, per-stage ``draft_n`` / ``draft_n_accepted``).

One engine serves requests one at a time: every request takes a slot of a bounded queue
(``queue_size`` requests admitted at once, the running one included; a full queue answers 503
with ``Retry-After``) and runs on a single worker thread, so the event loop stays free. A client
that disconnects cancels its generation; the next request is unaffected.

Extra request fields: ``top_k``, ``min_p``, ``ignore_eos`` and the speculative knobs ``mode``,
``tau_T``, ``tau_Q``, ``l_D``, ``l_Q`` (lowercase accepted too), ``divergence``,
``fuzzy_variant``, ``p_min``; they override the server's defaults for that request only.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response as HTTPResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .api import Prompt, Pyramid, Response, timings, usage
from .config import Divergence, FuzzyVariant, Mode, SamplingConfig, SpecConfig
from .errors import UserError
from .stats import GenerationStats

#: Seconds between disconnect checks while a request waits for the engine.
POLL_SECONDS = 0.1
#: ``Retry-After`` (seconds) of a 503 answered when the queue is full.
RETRY_AFTER_SECONDS = 1

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Named chat formats for ``--chat-format`` (a Jinja file or template text works too).
CHAT_FORMATS: dict[str, str] = {"chatml": CHATML_TEMPLATE}


def resolve_chat_format(value: str | None) -> str | None:
    """A Jinja chat template from a format name, a template file or template text."""
    if value is None:
        return None
    if value in CHAT_FORMATS:
        return CHAT_FORMATS[value]
    if "{%" in value or "{{" in value:
        return value
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    raise UserError(
        f"unknown chat format {value!r}: give one of {', '.join(CHAT_FORMATS)}, "
        "a Jinja template file or template text"
    )


@dataclass(frozen=True)
class ServerSettings:
    """How the server answers: auth, queue bound, model name and default configs.

    ``spec=None`` uses the loaded ladder's own :class:`SpecConfig`; ``chat_template=None``
    uses the target GGUF's template.
    """

    api_key: str | None = None
    queue_size: int = 16
    model_name: str | None = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    spec: SpecConfig | None = None
    chat_template: str | None = None

    def __post_init__(self) -> None:
        if self.queue_size < 1:
            raise UserError(f"--queue-size must be at least 1, got {self.queue_size}")


# --- errors ------------------------------------------------------------------------------------


class ApiError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _validation_error(exc: RequestValidationError) -> ApiError:
    """The first pydantic error as a 400 naming the offending field."""
    errors = exc.errors()
    if not errors:
        return ApiError(400, "invalid request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return ApiError(400, "We could not parse the JSON body of your request.")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = loc[0] if loc else None  # the top-level field
    if first.get("type") == "missing" and param is None:
        return ApiError(400, "the request body must be a JSON object")
    message = str(first.get("msg", "invalid value"))
    return ApiError(400, f"{'.'.join(loc)}: {message}" if loc else message, param=param)


class ApiKeyMiddleware:
    """401 for ``/v1`` requests without ``Authorization: Bearer <api_key>`` (pure ASGI)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = ApiError(
                    401,
                    "Incorrect or missing API key (send Authorization: Bearer KEY).",
                    code="invalid_api_key",
                )
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


# --- request bodies ----------------------------------------------------------------------------


class StreamOptions(BaseModel):
    """OpenAI ``stream_options``."""

    include_usage: bool = False


class GenerationRequest(BaseModel):
    """Fields shared by completions and chat completions (unknown fields are ignored)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None
    n: int = 1
    mode: Mode | None = None
    tau_t: float | None = Field(None, validation_alias=AliasChoices("tau_T", "tau_t"))
    tau_q: float | None = Field(None, validation_alias=AliasChoices("tau_Q", "tau_q"))
    l_d: int | None = Field(None, validation_alias=AliasChoices("l_D", "l_d"))
    l_q: int | None = Field(None, validation_alias=AliasChoices("l_Q", "l_q"))
    divergence: Divergence | None = None
    fuzzy_variant: FuzzyVariant | None = None
    p_min: float | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def token_limit(self) -> int | None:
        return self.max_tokens

    def sampling(self, base: SamplingConfig) -> SamplingConfig:
        """``base`` with the fields this request sets (UserError on bad values)."""
        changes: dict[str, object] = {
            k: v
            for k, v in (
                ("temperature", self.temperature),
                ("top_p", self.top_p),
                ("top_k", self.top_k),
                ("min_p", self.min_p),
                ("seed", self.seed),
                ("max_tokens", self.token_limit()),
                ("ignore_eos", self.ignore_eos),
            )
            if v is not None
        }
        if self.stop is not None:
            changes["stop"] = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        return base.with_(**changes) if changes else base

    def spec(self, base: SpecConfig) -> SpecConfig:
        """``base`` with the speculative knobs this request sets (UserError on bad values)."""
        names = ("mode", "tau_t", "tau_q", "l_d", "l_q", "divergence", "fuzzy_variant", "p_min")
        changes = {k: getattr(self, k) for k in names if getattr(self, k) is not None}
        return base.with_(**changes) if changes else base


class CompletionRequest(GenerationRequest):
    """``POST /v1/completions``: one prompt, as text or token ids."""

    prompt: str | list[int] | list[str] | list[list[int]]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> Any:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ValueError("exactly one prompt per request is supported")
            return prompt[0]
        return prompt


class ChatMessage(BaseModel):
    """One chat message; content as text or a list of text parts."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The message for the chat template, content flattened to text."""
        out = self.model_dump(exclude_none=True)
        out["content"] = _text_content(self.content)
        return out


def _text_content(content: str | list[dict[str, Any]] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ApiError(400, "only text content parts are supported", param="messages")
        parts.append(part["text"])
    return "".join(parts)


class ChatCompletionRequest(GenerationRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


# --- the engine: one worker thread behind a bounded queue --------------------------------------

_END = object()

Work = Callable[[threading.Event], Iterator[Response]]


class Job:
    """One admitted generation: runs on the worker thread, read from the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, work: Work) -> None:
        self.cancel = threading.Event()
        self._loop = loop
        self._work = work
        self._items: asyncio.Queue[object] = asyncio.Queue()
        #: Whether the generation was cancelled (or never started because it was).
        self.cancelled = False

    def run(self) -> None:
        """Worker thread: stream the generation into the queue (errors too), then the end."""
        try:
            if self.cancel.is_set():
                self.cancelled = True
                return
            for step in self._work(self.cancel):
                self.cancelled = step.finish_reason == "cancelled"
                self._post(step)
        except Exception as e:
            self._post(e)
        finally:
            self._post(_END)

    def _post(self, item: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the event loop is gone: nobody is listening
            self.cancel.set()

    async def next(self) -> Response | None:
        """The next step, None at the end; re-raises an error of the generation."""
        item = await self._items.get()
        if item is _END:
            return None
        if isinstance(item, Exception):
            raise item
        assert isinstance(item, Response)
        return item

    async def next_watching(self, request: Request) -> Response | None:
        """:meth:`next`, cancelling the job (and raising ClientGone) if the client leaves."""
        while True:
            try:
                return await asyncio.wait_for(self.next(), POLL_SECONDS)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    self.cancel.set()
                    raise ClientGone() from None


class ClientGone(Exception):
    """The client disconnected before its answer was sent."""


class Engine:
    """Admits at most ``queue_size`` jobs at once and runs them one by one on one thread."""

    def __init__(self, queue_size: int) -> None:
        self.queue_size = queue_size
        self.in_flight = 0
        self.completed = 0
        self.cancelled = 0
        self._lock = threading.Lock()
        self._jobs: set[Job] = set()
        self._executor: ThreadPoolExecutor | None = None

    def submit(self, work: Work) -> Job:
        """Queue ``work``; 503 :class:`ApiError` when the queue is full."""
        with self._lock:
            if self.in_flight >= self.queue_size:
                raise ApiError(
                    503,
                    f"the server is busy ({self.queue_size} requests queued); retry later",
                    type="server_error",
                    code="queue_full",
                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
                )
            self.in_flight += 1
            job = Job(asyncio.get_running_loop(), work)
            self._jobs.add(job)
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="pyramid-engine")
            executor = self._executor
        executor.submit(self._run, job)
        return job

    def _run(self, job: Job) -> None:
        try:
            job.run()
        finally:
            with self._lock:
                self.in_flight -= 1
                self._jobs.discard(job)
                if job.cancelled:
                    self.cancelled += 1
                else:
                    self.completed += 1

    def close(self) -> None:
        """Cancel every job and wait for the worker (before the models are freed)."""
        with self._lock:
            for job in self._jobs:
                job.cancel.set()
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


# --- response bodies ---------------------------------------------------------------------------


@dataclass
class Shape:
    """Ids and kind of one response, and how its chunks look."""

    chat: bool
    model: str
    include_usage: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def chunk(
        self, text: str | None, finish: str | None = None, *, role: bool = False
    ) -> dict[str, Any]:
        """One streamed chunk: a text delta, the role (chat's first), or the finish reason."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return self._envelope("text_completion", [choice])

    def usage_chunk(self, stats: GenerationStats) -> dict[str, Any]:
        """The last chunk when ``stream_options.include_usage``: no choices, only usage."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return self._envelope(obj, []) | {"usage": usage(stats)}

    def full(self, text: str, finish: str, stats: GenerationStats) -> dict[str, Any]:
        """A non-streamed response with ``usage`` and ``timings``."""
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        return self._envelope(obj, [choice]) | {"usage": usage(stats), "timings": timings(stats)}


def _sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"


def _finish(step: Response) -> str:
    """OpenAI's finish reason (a cancelled generation is never answered)."""
    return "stop" if step.finish_reason == "stop" else "length"


async def _events(job: Job, first: Response, shape: Shape) -> AsyncGenerator[str, None]:
    """The SSE body; leaving early (client gone) cancels the generation."""
    try:
        if shape.chat:
            yield _sse(shape.chunk("", role=True))
        step: Response | None = first
        while step is not None:
            if step.finish_reason is not None:
                yield _sse(_final_chunk(shape, step))
                if shape.include_usage:
                    yield _sse(shape.usage_chunk(step.stats))
            elif step.text:
                yield _sse(shape.chunk(step.text))
            step = await job.next()
    except Exception as e:  # an error after the headers went out: report it in the stream
        yield _sse(_error_of(e).body())
    finally:
        job.cancel.set()  # no-op once finished; stops the worker if the client left
    yield _sse("[DONE]")


def _final_chunk(shape: Shape, step: Response) -> dict[str, Any]:
    """The chunk with the finish reason (and the last text), plus ``timings``."""
    if shape.chat:
        chunk = shape.chunk(step.text or None, _finish(step))
    else:
        chunk = shape.chunk(step.text, _finish(step))
    return chunk | {"timings": timings(step.stats)}


def _error_of(e: Exception) -> ApiError:
    if isinstance(e, ApiError):
        return e
    if isinstance(e, UserError):
        return ApiError(400, str(e))
    return ApiError(500, f"internal error: {type(e).__name__}: {e}", type="server_error")


# --- the app -----------------------------------------------------------------------------------


def create_app(pyramid: Pyramid, settings: ServerSettings | None = None) -> FastAPI:
    """The FastAPI app serving ``pyramid`` (which the caller keeps and closes)."""
    settings = settings or ServerSettings()
    engine = Engine(settings.queue_size)
    model_name = settings.model_name or pyramid.name
    base_spec = settings.spec or pyramid.spec

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(engine.close)

    app = FastAPI(title="pyramid-gguf", lifespan=lifespan)
    app.state.engine = engine
    app.state.pyramid = pyramid
    _install_error_handlers(app)
    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": model_name,
            "mode": base_spec.mode,
            "in_flight": engine.in_flight,
            "queue_size": engine.queue_size,
            "completed": engine.completed,
            "cancelled": engine.cancelled,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        tiers = [t.name for t in pyramid.ladder.models]
        if isinstance(pyramid.ladder.draft, str):
            tiers.insert(0, pyramid.ladder.draft)
        card = {
            "id": model_name,
            "object": "model",
            "created": 0,
            "owned_by": "pyramid-gguf",
            "meta": {"mode": base_spec.mode, "tiers": tiers},
        }
        return {"object": "list", "data": [card]}

    async def serve(
        request: Request, body: GenerationRequest, shape: Shape, work: Work
    ) -> HTTPResponse:
        job = engine.submit(work)
        try:
            first = await job.next_watching(request)
        except ClientGone:
            return HTTPResponse(status_code=499)
        except BaseException:
            job.cancel.set()
            raise
        assert first is not None
        if body.stream:
            return StreamingResponse(
                _events(job, first, shape),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return await _collect(request, job, first, shape)

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> HTTPResponse:
        sampling, spec = body.sampling(settings.sampling), body.spec(base_spec)
        prompt: Prompt = body.prompt  # type: ignore[assignment]

        def work(cancel: threading.Event) -> Iterator[Response]:
            return pyramid.stream(prompt, sampling, spec, cancel=cancel)

        shape = Shape(chat=False, model=model_name, include_usage=body.include_usage)
        return await serve(request, body, shape, work)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> HTTPResponse:
        sampling, spec = body.sampling(settings.sampling), body.spec(base_spec)
        messages = [m.as_dict() for m in body.messages]

        def work(cancel: threading.Event) -> Iterator[Response]:
            tokens = pyramid.chat_tokens(messages, settings.chat_template)
            return pyramid.stream(tokens, sampling, spec, cancel=cancel)

        shape = Shape(chat=True, model=model_name, include_usage=body.include_usage)
        return await serve(request, body, shape, work)

    return app


async def _collect(request: Request, job: Job, first: Response, shape: Shape) -> HTTPResponse:
    """Join a whole generation into one JSON body (cancelled if the client leaves)."""
    texts: list[str] = []
    step: Response | None = first
    last = first
    try:
        while step is not None:
            texts.append(step.text)
            last = step
            step = await job.next_watching(request)
    except ClientGone:
        return HTTPResponse(status_code=499)
    finally:
        job.cancel.set()
    return JSONResponse(shape.full("".join(texts), _finish(last), last.stats))


def _install_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape; validation errors are 400, not FastAPI's 422."""

    async def api_error(request: Request, exc: Exception) -> HTTPResponse:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def validation(request: Request, exc: Exception) -> HTTPResponse:
        assert isinstance(exc, RequestValidationError)
        return _validation_error(exc).response()

    async def user_error(request: Request, exc: Exception) -> HTTPResponse:
        return ApiError(400, str(exc)).response()

    async def http_error(request: Request, exc: Exception) -> HTTPResponse:
        assert isinstance(exc, StarletteHTTPException)
        kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
        return ApiError(exc.status_code, str(exc.detail), type=kind).response()

    async def internal(request: Request, exc: Exception) -> HTTPResponse:
        return _error_of(exc).response()

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(UserError, user_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal)
