"""OpenAI's ``n``: several independent answers to one request, as ``choices`` with an index.

Each choice is its own generation (its own job in the slots' queue, so they share the slots
like any other requests), seeded ``seed + index`` when the request has a seed so that the
answers differ and still repeat, and admitted with the others by
:meth:`.service.Service.answer_all`. Whole answers are read together and :func:`joined` into
one body (``usage.completion_tokens`` sums the choices'); streamed ones are :func:`merged`:
their chunks interleave, each carrying its choice's ``index``, with one ``usage`` chunk and one
``[DONE]`` at the end.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

from ..core.sampling import SamplingConfig
from .openai import ResponseShape
from .service import sse


def seeded(sampling: SamplingConfig, choice: int) -> SamplingConfig:
    """Choice ``choice``'s sampling: the request's, its seed moved by ``choice`` (none: none)."""
    if choice == 0 or sampling.seed is None:
        return sampling
    return sampling.with_(seed=sampling.seed + choice)


def shapes(shape: ResponseShape, n: int) -> list[ResponseShape]:
    """The shapes of ``n`` choices: ``shape`` first, then each with the first's id and time,
    its own index and text offsets."""
    return [shape] + [_shape_of(shape, i) for i in range(1, n)]


def _shape_of(shape: ResponseShape, index: int) -> ResponseShape:
    """Choice ``index``'s shape: the first's id and time, its own text offsets."""
    out = replace(shape, index=index, sent=0)
    out.id, out.created = shape.id, shape.created
    return out


def joined(bodies: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The choices' whole bodies as one (:meth:`.service.Service.answer_all`'s ``join``)."""
    return bodies[0] if len(bodies) == 1 else _joined(bodies)


def merged(gens: Sequence[AsyncIterator[str]]) -> AsyncIterator[str]:
    """The choices' streams as one (:meth:`.service.Service.answer_all`'s ``merge``)."""
    return gens[0] if len(gens) == 1 else _merged(gens)


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
