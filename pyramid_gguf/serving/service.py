"""What every route of the server shares: :class:`Service`, the one door onto the request path.

A dialect's route (OpenAI's, llama-server's, Anthropic's, Ollama's, the Responses API's) parses
its body into the pyramid's terms (a prompt or a :class:`~pyramid_gguf.api.ChatPrompt`, a
:class:`~pyramid_gguf.core.sampling.SamplingConfig`, a
:class:`~pyramid_gguf.core.spec.SpecConfig`), and hands :meth:`Service.answer` a ``submit`` (a
:meth:`Pyramid.submit <pyramid_gguf.api.Pyramid.submit>` call given the reader's ``deliver``)
and a :class:`Shape`, which says how the dialect's answer looks, streamed
(:meth:`Shape.events`) or whole (:meth:`Shape.whole`). Admission, the 499 of a client gone,
streaming or collecting, the server's shutdown and the ``/metrics`` totals are the same for all
of them; OpenAI's ``n`` answers several generations of one request through the same path
(:meth:`Service.answer_all`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.responses import Response as HTTPResponse

from ..api import END, ChatPrompt, Job, Pyramid, Response
from ..core.spec import SpecConfig
from .errors import ApiError, context_exceeded, error_of, validation_error
from .jobs import ClientGone, Deliver, Reader, Totals, shutting_down
from .schemas import GenerationRequest
from .settings import ServerSettings

Submit = Callable[[Deliver], Job]
#: A dialect's streamed events of a generation's steps (:func:`stream`).
Events = Callable[[AsyncIterator[Response]], AsyncIterator[str]]
#: A dialect's event of an error after the headers went out.
LateError = Callable[[ApiError], str]
#: Server-sent events, the media type of every streamed answer but Ollama's NDJSON lines.
SSE = "text/event-stream"
#: Several generations' streamed bodies made one (OpenAI's ``n``).
Merge = Callable[[Sequence[AsyncIterator[str]]], AsyncIterator[str]]
#: Several generations' whole bodies made one (OpenAI's ``n``).
Join = Callable[[Sequence[Any]], Any]
T = TypeVar("T")


@dataclass(frozen=True)
class _Done:
    """A task's value, as its reader gets it (:meth:`Service.run`)."""

    value: Any


class Shape(Protocol):
    """How a dialect answers one admitted generation."""

    def events(self, reader: Reader, first: Response) -> AsyncIterator[str]:
        """The streamed body from the ``first`` step on (server-sent events or NDJSON lines);
        it closes ``reader`` when it ends, and reports an error after the headers went out in
        the stream itself."""
        ...

    def whole(self, steps: list[Response]) -> Any:
        """The JSON body of a whole answer, from every step (the last has the finish reason
        and the statistics)."""
        ...


@dataclass(frozen=True)
class EmbeddingCard:
    """The embedding model a server answers ``/v1/embeddings`` with, as its model lists show it:
    ``name`` (the file's stem), the GGUF ``path`` and its vectors' length ``n_embd``."""

    name: str
    path: Path
    n_embd: int


def _only(parts: Sequence[Any]) -> Any:
    """One generation's body: the one part."""
    return parts[0]


async def steps(reader: Reader, first: Response) -> AsyncIterator[Response]:
    """An admitted generation's steps, ``first`` on, as its reader gets them."""
    step: Response | None = first
    while step is not None:
        yield step
        step = await reader.next()


async def stream(
    reader: Reader, first: Response, events: Events, late: LateError, end: str | None = None
) -> AsyncIterator[str]:
    """The one stream loop of every dialect: ``events`` of the generation's :func:`steps`,
    then ``end`` (OpenAI's ``[DONE]``); an error after the headers went out is answered in the
    stream by ``late``. The reader is closed however it ends, so a client that leaves early
    cancels the generation."""
    try:
        async for event in events(steps(reader, first)):
            yield event
    except Exception as e:
        yield late(error_of(e))
    finally:
        reader.close()  # no-op once finished; stops the generation if the client left
    if end is not None:
        yield end


def sse(data: dict[str, Any] | str, event: str | None = None) -> str:
    """One server-sent event (``data:`` a JSON object or a literal such as ``[DONE]``)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n"


def event_stream(body: AsyncIterator[str], media_type: str = SSE) -> HTTPResponse:
    """A streamed HTTP answer of ``body`` (server-sent events, or NDJSON lines)."""
    return StreamingResponse(
        body,
        media_type=media_type,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@dataclass
class Service:
    """One app's view of the pyramid it serves: settings, the model's name and default spec,
    the open readers (its shutdown answers them) and the totals ``/metrics`` reports. Several
    apps may serve one pyramid, one after another (the tests do)."""

    pyramid: Pyramid
    settings: ServerSettings
    #: The ``--embedding-model``'s name and file, listed beside the ladder; None without one.
    embedding: EmbeddingCard | None = None
    totals: Totals = field(default_factory=Totals)
    readers: set[Reader] = field(default_factory=set)
    closing: bool = False
    #: The vocabulary's end-of-generation tokens, read once when first asked (llama-server's
    #: ``/completion`` lists them with ``ignore_eos``).
    eog: list[int] | None = None

    @property
    def model_name(self) -> str:
        return self.settings.model_name or self.pyramid.name

    @property
    def spec(self) -> SpecConfig:
        """The spec a request's knobs apply to: the server's, else the ladder's."""
        return self.settings.spec or self.pyramid.spec

    @property
    def n_ctx(self) -> int:
        """A slot's context in tokens (the smallest over the ladder's models): every dialect's
        prompt must leave room in it."""
        return self.pyramid.n_ctx

    def check_context(self, tokens: Sequence[int]) -> None:
        """A 400 (:func:`~.errors.context_exceeded`, in the route's dialect) when a prompt of
        ``tokens`` leaves no room in a slot's context: refused before admission."""
        if len(tokens) >= self.n_ctx:
            raise context_exceeded(len(tokens), self.n_ctx)

    def knobs(self, body: dict[str, Any]) -> SpecConfig:
        """The speculative knobs a dialect without them in its schema (Ollama's, Anthropic's)
        takes at the top level of ``body``, on :attr:`spec` (a 400 naming a bad one)."""
        extra = {k: v for k, v in body.items() if k not in GenerationRequest.model_fields}
        try:
            return GenerationRequest.model_validate(extra).spec(self.spec)
        except ValidationError as e:
            raise validation_error(e.errors()) from None

    def chat_submit(self, chat: ChatPrompt, spec: SpecConfig) -> Submit:
        """The ``submit`` of a prepared chat under ``spec`` (its answer's text with control
        tokens when its tools' format needs them)."""

        def submit(deliver: Deliver) -> Job:
            return self.pyramid.submit(
                chat.tokens, chat.sampling, spec, deliver=deliver, special=chat.special
            )

        return submit

    async def answer(
        self,
        request: Request,
        submit: Submit,
        shape: Shape,
        stream: bool,
        media_type: str = SSE,
    ) -> HTTPResponse:
        """A dialect's answer to one generation: admitted (:meth:`admit`), then streamed as
        ``shape``'s events in ``media_type``, or collected and answered as ``shape``'s whole
        JSON body; a bare 499 when the client leaves first."""
        return await self.answer_all(request, [submit], [shape], stream, media_type=media_type)

    async def answer_all(
        self,
        request: Request,
        submits: Sequence[Submit],
        shapes: Sequence[Shape],
        stream: bool,
        *,
        media_type: str = SSE,
        merge: Merge = _only,
        join: Join = _only,
    ) -> HTTPResponse:
        """:meth:`answer` of several generations of one request, ``shapes[i]`` answering
        ``submits[i]``'s: all admitted together (:meth:`admit_all`), their streams made one by
        ``merge`` or their whole bodies by ``join`` (the defaults take the one of one)."""
        admitted = await self.admit_all(request, submits)
        if admitted is None:
            return HTTPResponse(status_code=499)
        if stream:
            events = [s.events(r, f) for (r, f), s in zip(admitted, shapes, strict=True)]
            return event_stream(merge(events), media_type)
        try:
            collected = await asyncio.gather(*(self.collect(request, r, f) for r, f in admitted))
        except ClientGone:
            return HTTPResponse(status_code=499)
        return JSONResponse(join([s.whole(c) for s, c in zip(shapes, collected, strict=True)]))

    async def admit_all(
        self, request: Request, submits: Sequence[Submit]
    ) -> list[tuple[Reader, Response]] | None:
        """:meth:`admit` every generation (their first steps awaited together); if one is
        refused (a full queue) the others are closed and its error raised; None when the
        client left."""
        results = await asyncio.gather(
            *(self.admit(request, submit) for submit in submits), return_exceptions=True
        )
        admitted = [r for r in results if isinstance(r, tuple)]
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed or len(admitted) < len(submits):
            for reader, _ in admitted:
                reader.close()
            if failed:
                raise failed[0]
            return None
        return admitted

    def _open(self, submit: Submit) -> Reader:
        """A reader of ``submit``'s job, admitted to the pool's queue (a 503 when it is full or
        the server stops)."""
        if self.closing:
            raise shutting_down()
        return Reader(self.totals, self.readers).open(submit)

    async def admit(self, request: Request, submit: Submit) -> tuple[Reader, Response] | None:
        """Admit one generation and wait for its first step (a 503 when the queue is full or the
        server stops); None when the client left first (its job is cancelled)."""
        reader = self._open(submit)
        try:
            async with reader.watching(request):
                first = await reader.next()
        except ClientGone:
            return None
        except BaseException:
            reader.close()
            raise
        if first is None:  # ended before its first step, and not by its client
            raise shutting_down()
        return reader, first

    async def run(self, request: Request, task: Callable[[], T]) -> T:
        """``task``'s value, run on a worker thread of the pool (an embedding): admitted
        through the same bounded queue as every generation (a 503 when it is full or the
        server stops), cancelled when the client leaves first (:class:`ClientGone`; if it has
        not started, it never runs and its place is free at once), and tracked by the server's
        shutdown like any generation."""

        def submit(deliver: Deliver) -> Job:
            def work(job: Job) -> bool:
                if job.cancelled:
                    deliver(END)
                    return True
                try:
                    deliver(_Done(task()))
                except BaseException as e:  # the reader raises it
                    deliver(e)
                finally:
                    deliver(END)
                return False

            return self.pyramid.slots.submit((), work)

        reader = self._open(submit)
        try:
            async with reader.watching(request):
                done = await reader.result()
        finally:
            reader.close()
        if not isinstance(done, _Done):  # ended before it ran, and not by its client
            raise shutting_down()
        value: T = done.value
        return value

    async def collect(self, request: Request, reader: Reader, first: Response) -> list[Response]:
        """Every step of a generation (``first`` included), read while watching the client: a
        :class:`ClientGone` when it leaves (its job is cancelled)."""
        steps: list[Response] = []
        step: Response | None = first
        try:
            async with reader.watching(request):
                while step is not None:
                    steps.append(step)
                    step = await reader.next()
        finally:
            reader.close()
        return steps

    def stop(self) -> None:
        """Event loop, when the server starts to stop: refuse new requests and answer every
        open one with a 503 (its generation stops at its next token)."""
        self.closing = True
        for reader in list(self.readers):
            reader.abort(shutting_down())

    def wait(self) -> None:
        """Cancel every open generation and wait for each to end (before the models go)."""
        self.closing = True
        jobs = [r.job for r in list(self.readers) if r.job is not None]
        for job in jobs:
            job.cancel()
        for job in jobs:
            job.wait()


def service_of(request: Request) -> Service:
    """The :class:`Service` of the app a request came to (each route's one way to it)."""
    service = request.app.state.service
    assert isinstance(service, Service)
    return service
