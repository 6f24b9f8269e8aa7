"""The OpenAI-compatible HTTP app over one loaded :class:`~pyramid_gguf.api.Pyramid`.

``create_app(pyramid, settings)`` returns a FastAPI app with ``GET /health``, ``GET /metrics``
(Prometheus), ``GET /v1/models``, ``POST /v1/completions`` and ``POST /v1/chat/completions``
(streamed as server-sent events when ``stream`` is true). Requests are parsed by
:mod:`.schemas`, chats prepared by :meth:`Pyramid.prepare_chat`, and every generation is
admitted by :meth:`Pyramid.submit` (the pyramid's bounded queue; its slots' model calls are
batched together) and read back by a :class:`~.jobs.Reader`; bodies come from :mod:`.openai`,
and every error is answered in OpenAI's shape (:mod:`.http_errors`). :class:`Server` runs it
on uvicorn.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.responses import Response as HTTPResponse

from ..api import Job, Prompt, Pyramid, Response, TokenLogprob
from ..chat import CallStream
from .errors import ApiError, error_of
from .http_errors import ApiKeyMiddleware, install_error_handlers
from .jobs import ClientGone, Deliver, Reader, Totals, shutting_down
from .metrics import CONTENT_TYPE as METRICS_TYPE
from .metrics import render as render_metrics
from .openai import ResponseShape
from .schemas import ChatCompletionRequest, CompletionRequest, GenerationRequest
from .settings import ServerSettings

Submit = Callable[[Deliver], Job]


def _sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"


async def _events(
    reader: Reader, first: Response, shape: ResponseShape, calls: CallStream | None
) -> AsyncGenerator[str, None]:
    """The SSE body; leaving early (client gone) cancels the generation. With ``calls`` the
    text is read as content and tool calls, streamed as ``delta.tool_calls``."""
    try:
        if shape.chat:
            yield _sse(shape.chunk("", role=True))
        step: Response | None = first
        held: list[TokenLogprob] = []  # tokens whose text is held back (half a character)
        while step is not None:
            held += step.logprobs
            if step.finish_reason is not None:
                text, called = step.text, False
                deltas: tuple[dict[str, Any], ...] = ()
                if calls is not None:
                    calls.feed(step.text)
                    message, last = calls.finish()
                    text, deltas, called = last.content, last.tool_calls, bool(message.calls)
                yield _sse(
                    shape.final_chunk(
                        text, step.finish_reason, step.stats, held, tool_calls=deltas, called=called
                    )
                )
                if shape.include_usage:
                    yield _sse(shape.usage_chunk(step.stats))
            elif calls is not None:
                delta = calls.feed(step.text)
                if delta.content or delta.tool_calls or held:
                    content = delta.content or None
                    yield _sse(shape.chunk(content, logprobs=held, tool_calls=delta.tool_calls))
                    held = []
            elif step.text:
                yield _sse(shape.chunk(step.text, logprobs=held))
                held = []
            step = await reader.next()
    except Exception as e:  # an error after the headers went out: report it in the stream
        yield _sse(error_of(e).body())
    finally:
        reader.close()  # no-op once finished; stops the generation if the client left
    yield _sse("[DONE]")


class _Doors:
    """The app's open readers and whether it is stopping (its own: several apps may serve one
    pyramid, one after another in tests)."""

    def __init__(self) -> None:
        self.readers: set[Reader] = set()
        self.closing = False

    def stop(self) -> None:
        """Event loop, when the server starts to stop: refuse new requests and answer every
        open one with a 503 (its generation stops at its next token)."""
        self.closing = True
        for reader in list(self.readers):
            reader.abort(shutting_down())

    def wait(self) -> None:
        """Cancel every open generation and wait for each to end (before the models go)."""
        jobs = [r.job for r in list(self.readers) if r.job is not None]
        for job in jobs:
            job.cancel()
        for job in jobs:
            job.wait()


def create_app(pyramid: Pyramid, settings: ServerSettings | None = None) -> FastAPI:
    """The FastAPI app serving ``pyramid`` (which the caller keeps and closes); it bounds the
    pyramid's queue to ``settings.queue_size``."""
    settings = settings or ServerSettings()
    pyramid.queue_size = settings.queue_size
    totals = Totals()
    doors = _Doors()
    model_name = settings.model_name or pyramid.name
    base_spec = settings.spec or pyramid.spec

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        doors.closing = True
        await asyncio.to_thread(doors.wait)

    app = FastAPI(title="pyramid-gguf", lifespan=lifespan)
    app.state.doors = doors
    app.state.pyramid = pyramid
    install_error_handlers(app)
    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        now = pyramid.snapshot()
        return {
            "status": "ok",
            "model": model_name,
            "mode": base_spec.mode,
            "in_flight": now.busy + now.queued,
            "slots_idle": now.slots - now.busy,
            "slots_processing": now.busy,
            "queue_size": now.queue_size,
            "completed": now.completed,
            "cancelled": now.cancelled,
        }

    @app.get("/metrics")
    async def metrics() -> HTTPResponse:
        body = render_metrics(pyramid.snapshot(), totals)
        return HTTPResponse(body, media_type=METRICS_TYPE)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        tiers = pyramid.ladder.tier_names
        card = {
            "id": model_name,
            "object": "model",
            "created": 0,
            "owned_by": "pyramid-gguf",
            "meta": {"mode": base_spec.mode, "tiers": tiers},
        }
        return {"object": "list", "data": [card]}

    async def serve(
        request: Request,
        body: GenerationRequest,
        shape: ResponseShape,
        submit: Submit,
        calls: CallStream | None = None,
    ) -> HTTPResponse:
        if doors.closing:
            raise shutting_down()
        reader = Reader(totals, doors.readers).open(submit)
        try:
            async with reader.watching(request):
                first = await reader.next()
        except ClientGone:
            return HTTPResponse(status_code=499)
        except BaseException:
            reader.close()
            raise
        if first is None:  # ended before its first step, and not by its client
            raise shutting_down()
        if body.stream:
            return StreamingResponse(
                _events(reader, first, shape, calls),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return await _collect(request, reader, first, shape, calls)

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> HTTPResponse:
        sampling, spec = body.sampling(settings.sampling), body.spec(base_spec)
        prompt: Prompt = body.prompt  # type: ignore[assignment]
        if not isinstance(prompt, str):
            _check_token_ids(prompt, pyramid.ladder.target.n_vocab)

        top = body.top_logprobs()

        def submit(deliver: Deliver) -> Job:
            return pyramid.submit(prompt, sampling, spec, deliver=deliver, logprobs=top)

        shape = ResponseShape(
            chat=False, model=model_name, include_usage=body.include_usage, logprobs=top is not None
        )
        return await serve(request, body, shape, submit)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> HTTPResponse:
        sampling, spec = body.sampling(settings.sampling), body.spec(base_spec)
        messages = [m.as_dict() for m in body.messages]
        tools = body.tool_request()
        top = body.top_logprobs()
        chat = pyramid.prepare_chat(messages, sampling, tools, settings.chat_template)

        def submit(deliver: Deliver) -> Job:
            return pyramid.submit(
                chat.tokens, chat.sampling, spec, deliver=deliver, logprobs=top,
                special=chat.special,
            )  # fmt: skip

        shape = ResponseShape(
            chat=True, model=model_name, include_usage=body.include_usage, logprobs=top is not None
        )
        return await serve(request, body, shape, submit, chat.reader())

    return app


def _check_token_ids(prompt: Sequence[int], n_vocab: int) -> None:
    """A 400 naming the first prompt token id outside the target's vocabulary."""
    bad = next((t for t in prompt if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise ApiError(
            400,
            f"prompt: token id {bad} is not in the model's vocabulary (0 to {n_vocab - 1})",
            param="prompt",
        )


async def _collect(
    request: Request,
    reader: Reader,
    first: Response,
    shape: ResponseShape,
    calls: CallStream | None,
) -> HTTPResponse:
    """Join a whole generation into one JSON body (its text read as content and tool calls
    with ``calls``); a client that leaves cancels it at once."""
    texts: list[str] = []
    logprobs: list[TokenLogprob] = []
    step: Response | None = first
    last = first
    try:
        async with reader.watching(request):
            while step is not None:
                texts.append(step.text)
                logprobs += step.logprobs
                last = step
                step = await reader.next()
    except ClientGone:
        return HTTPResponse(status_code=499)
    finally:
        reader.close()
    text = "".join(texts)
    message = calls.fmt.parse(text, calls.ids) if calls is not None else None
    return JSONResponse(shape.full(text, last.finish_reason, last.stats, logprobs, message))


class Server(uvicorn.Server):
    """uvicorn's server for an app of :func:`create_app`.

    When it stops (Ctrl-C, SIGTERM) it first cancels every admitted generation, which is
    answered with a 503 in OpenAI's shape (an error event on a stream), then waits for the
    connections as uvicorn does: nobody waits for generations that nobody will read.
    """

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        doors = getattr(getattr(self.config.app, "state", None), "doors", None)
        if isinstance(doors, _Doors):
            doors.stop()
        await super().shutdown(sockets)
