"""OpenAI's ``n``: several independent answers to one request, as ``choices`` with an index.

Each choice is its own generation (its own job in the slots' queue, so they share the slots
like any other requests), seeded ``seed + index`` when the request has a seed so that the
answers differ and still repeat. Whole answers are read together and joined into one body
(``usage.completion_tokens`` sums the choices'); streamed ones interleave their chunks, each
carrying its choice's ``index``, with one ``usage`` chunk and one ``[DONE]`` at the end.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.responses import Response as HTTPResponse

from ..api import Job, Response
from ..chat import CallStream
from ..core.sampling import SamplingConfig
from .jobs import ClientGone, Deliver, Reader
from .openai import ResponseShape
from .service import Service, event_stream, sse

#: Admits choice ``i``'s generation, given its reader's ``deliver``.
ChoiceSubmit = Callable[[Deliver, int], Job]
#: A streamed answer's events from its reader, first step, shape and call reader.
Events = Callable[[Reader, Response, ResponseShape, CallStream | None], AsyncIterator[str]]


def seeded(sampling: SamplingConfig, choice: int) -> SamplingConfig:
    """Choice ``choice``'s sampling: the request's, its seed moved by ``choice`` (none: none)."""
    if choice == 0 or sampling.seed is None:
        return sampling
    return sampling.with_(seed=sampling.seed + choice)


async def answer(
    service: Service,
    request: Request,
    n: int,
    stream: bool,
    shape: ResponseShape,
    submit: ChoiceSubmit,
    calls: Callable[[], CallStream | None],
    events: Events,
) -> HTTPResponse:
    """``n`` choices of one request, whole or streamed (``shape``: the first choice's)."""
    shapes = [shape] + [_shape_of(shape, i) for i in range(1, n)]
    admitted = await _admit_all(service, request, n, submit)
    if admitted is None:
        return HTTPResponse(status_code=499)
    readers = [calls() for _ in range(n)]
    if stream:
        gens = [events(r, f, s, c) for (r, f), s, c in zip(admitted, shapes, readers, strict=True)]
        return event_stream(_merged(gens))
    try:
        collected = await asyncio.gather(*(service.collect(request, r, f) for r, f in admitted))
    except ClientGone:
        return HTTPResponse(status_code=499)
    bodies = []
    for steps, s, c in zip(collected, shapes, readers, strict=True):
        text = "".join(step.text for step in steps)
        logprobs = [lp for step in steps for lp in step.logprobs]
        last = steps[-1]
        message = c.parse(text) if c is not None else None
        bodies.append(s.full(text, last.finish_reason, last.stats, logprobs, message))
    return JSONResponse(_joined(bodies))


def _shape_of(shape: ResponseShape, index: int) -> ResponseShape:
    """Choice ``index``'s shape: the first's id and time, its own text offsets."""
    out = replace(shape, index=index, sent=0)
    out.id, out.created = shape.id, shape.created
    return out


async def _admit_all(
    service: Service, request: Request, n: int, submit: ChoiceSubmit
) -> list[tuple[Reader, Response]] | None:
    """Admit every choice (their first steps awaited together); if one is refused (a full
    queue) the others are closed and its error raised; None when the client left."""

    def one(i: int) -> Callable[[Deliver], Job]:
        return lambda deliver: submit(deliver, i)

    results = await asyncio.gather(
        *(service.admit(request, one(i)) for i in range(n)), return_exceptions=True
    )
    admitted = [r for r in results if isinstance(r, tuple)]
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed or len(admitted) < n:
        for reader, _ in admitted:
            reader.close()
        if failed:
            raise failed[0]
        return None
    return admitted


def _joined(bodies: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One body of several choices: the first's envelope, every choice, summed usage."""
    out = dict(bodies[0])
    out["choices"] = [b["choices"][0] for b in bodies]
    out["usage"] = _usage([b["usage"] for b in bodies])
    return out


def _usage(each: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The prompt counted once, the completions summed."""
    completion = sum(u["completion_tokens"] for u in each)
    return each[0] | {
        "completion_tokens": completion,
        "total_tokens": each[0]["prompt_tokens"] + completion,
    }


async def _merged(gens: Sequence[AsyncIterator[str]]) -> AsyncIterator[str]:
    """The choices' events as they come, less each one's ``[DONE]`` and usage chunk; then
    one usage chunk (when asked for) and one ``[DONE]``. Leaving early closes every choice."""
    queue: asyncio.Queue[tuple[int, str | None]] = asyncio.Queue()

    async def pump(i: int, gen: AsyncIterator[str]) -> None:
        try:
            async for event in gen:
                await queue.put((i, event))
        finally:
            await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
    usages: list[dict[str, Any]] = []
    last_usage: dict[str, Any] | None = None
    done = 0
    try:
        while done < len(gens):
            _, event = await queue.get()
            if event is None:
                done += 1
                continue
            if event == sse("[DONE]"):
                continue
            body = _data(event)
            if body is not None and "usage" in body and not body.get("choices"):
                usages.append(body["usage"])
                last_usage = body
                continue
            yield event
        if last_usage is not None:
            yield sse(last_usage | {"usage": _usage(usages)})
        yield sse("[DONE]")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _data(event: str) -> dict[str, Any] | None:
    """The JSON object of a ``data:`` event, or None."""
    head = "data: "
    if not event.startswith(head):
        return None
    try:
        body = json.loads(event[len(head) :])
    except json.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None
