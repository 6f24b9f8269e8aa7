"""A generation as the event loop reads it: :class:`Reader`, and the server's running totals.

The server admits a request through :meth:`Pyramid.submit <pyramid_gguf.api.Pyramid.submit>`,
the pyramid's one admission (a full queue answers 503 with ``Retry-After``): a slot's worker
thread decodes it and hands each step to :meth:`Reader.deliver`, which posts it to the event
loop (``call_soon_threadsafe``), so a request crosses one thread boundary between its handler
and the slot that decodes it, and no reader's pace holds a batch. A client that disconnects
cancels its job at once (its slot is free at its next token); when the server stops, every
request still open is cancelled and answered with a 503 in OpenAI's shape. :class:`Totals`
counts what ``/metrics`` reports beside the pool's own figures.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field

from fastapi import Request

from ..api import END, GenerationStats, Job, PoolClosed, QueueFull, Response
from .errors import ApiError

#: ``Retry-After`` (seconds) of a 503 answered when the queue is full.
RETRY_AFTER_SECONDS = 1
#: Seconds of recent generation over which ``/metrics`` reports tokens per second.
RATE_WINDOW = 10.0

#: A reader's ``deliver``: a step, a task's value, an error, or the end (None).
Deliver = Callable[[object], None]


def shutting_down() -> ApiError:
    """The answer to a request that the server's shutdown cancelled or turned away."""
    return ApiError(
        503,
        "the server is shutting down; the request was cancelled",
        type="server_error",
        code="server_shutting_down",
    )


def queue_full(message: str) -> ApiError:
    return ApiError(
        503,
        f"{message}; retry later",
        type="server_error",
        code="queue_full",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


class ClientGone(Exception):
    """The client disconnected before its answer was sent."""


@dataclass
class Totals:
    """What finished generations did, and tokens emitted recently (for ``/metrics``); written
    from the slots' threads, read from the event loop."""

    prompt_tokens: int = 0
    prompt_evaluated: int = 0
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generation_seconds: float = 0.0
    #: The longest sequence seen (prompt and generated tokens of one request).
    n_tokens_max: int = 0
    #: What the target verified (stages ``...->target``): tokens proposed, kept, and rounds.
    draft_tokens: int = 0
    draft_accepted: int = 0
    drafts: int = 0
    _recent: deque[tuple[float, int]] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def emitted(self, tokens: int) -> None:
        """A generation emitted ``tokens`` tokens now."""
        now = time.monotonic()
        with self._lock:
            self._recent.append((now, tokens))
            while self._recent and self._recent[0][0] < now - RATE_WINDOW:
                self._recent.popleft()

    def finished(self, stats: GenerationStats) -> None:
        """Count a finished generation's statistics."""
        with self._lock:
            self.prompt_tokens += stats.prompt_tokens
            self.prompt_evaluated += stats.prompt_evaluated
            self.prompt_seconds += stats.prompt_seconds
            self.generated_tokens += stats.generated_tokens
            self.generation_seconds += stats.generation_seconds
            self.n_tokens_max = max(self.n_tokens_max, stats.prompt_tokens + stats.generated_tokens)
            for stage in stats.stages:
                if stage.name.endswith("->target"):
                    self.draft_tokens += stage.draft_n
                    self.draft_accepted += stage.draft_n_accepted
                    self.drafts += stage.verifications

    def tokens_per_second(self) -> float:
        """Tokens emitted per second by all generations over the last :data:`RATE_WINDOW`."""
        now = time.monotonic()
        with self._lock:
            return sum(n for t, n in self._recent if t >= now - RATE_WINDOW) / RATE_WINDOW


class Reader:
    """One admitted generation, read from the event loop.

    :meth:`open` submits it (``submit`` is a :meth:`Pyramid.submit` call given the reader's
    ``deliver``); :meth:`next` awaits each step; :meth:`abort` cancels the job and makes the
    next read raise an error instead. ``readers`` is the server's set of open readers (its
    shutdown aborts them).
    """

    def __init__(self, totals: Totals, readers: set[Reader]) -> None:
        self._loop = asyncio.get_running_loop()
        self._items: deque[object] = deque()
        #: What :meth:`_get` awaits while nothing is posted (None when it is not waiting).
        self._waiter: asyncio.Future[None] | None = None
        self._totals = totals
        self._readers = readers
        self._last: Response | None = None
        self.job: Job | None = None

    def open(self, submit: Callable[[Deliver], Job]) -> Reader:
        """Admit the generation: a 503 when the queue is full."""
        try:
            self.job = submit(self.deliver)
        except QueueFull as e:
            raise queue_full(str(e)) from None
        except PoolClosed:
            raise shutting_down() from None
        self._readers.add(self)
        return self

    def deliver(self, item: object) -> None:
        """A slot's thread: count and post one item (a step, an error, or the end)."""
        if isinstance(item, Response):
            self._last = item
            if item.token_ids:
                self._totals.emitted(len(item.token_ids))
        elif item is END and self._last is not None:
            self._totals.finished(self._last.stats)
        try:
            self._loop.call_soon_threadsafe(self._put, item)
        except RuntimeError:  # the event loop is gone: nobody is listening
            self.cancel()

    def _put(self, item: object) -> None:
        """Event loop: queue ``item`` and wake the reader if it waits (one wake-up per item,
        no queue machinery: a step crosses to the loop once per token)."""
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _get(self) -> object:
        """Event loop: the next posted item, waiting for it when none is queued."""
        items = self._items
        while not items:
            waiter = self._waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return items.popleft()

    def cancel(self) -> None:
        """Stop the generation at its next token (a no-op once it has ended)."""
        if self.job is not None:
            self.job.cancel()

    def abort(self, error: Exception) -> None:
        """Event loop: cancel the generation and make the next :meth:`next` raise ``error``,
        whatever the slot still posts."""
        self.cancel()
        self._put(error)

    async def next(self) -> Response | None:
        """The next step, None at the end; re-raises an error of the generation (or the one
        given to :meth:`abort`)."""
        item = await self._get()
        if item is END:
            self._readers.discard(self)
            return None
        if isinstance(item, BaseException):
            self._readers.discard(self)
            raise item
        assert isinstance(item, Response)
        return item

    async def result(self) -> object:
        """A task's one item (what its work delivered first; None when it ended without one);
        re-raises its error or the one given to :meth:`abort`."""
        item = await self._get()
        self._readers.discard(self)
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        """The reader is done with it: cancel what is left (a no-op once finished)."""
        self.cancel()
        self._readers.discard(self)

    @asynccontextmanager
    async def watching(self, request: Request) -> AsyncIterator[None]:
        """While the block runs, a client that disconnects aborts the job with
        :class:`ClientGone` at once (the slot stops at its next token)."""

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            self.abort(ClientGone())

        watcher = asyncio.create_task(watch())
        try:
            yield
        finally:
            watcher.cancel()
            with suppress(asyncio.CancelledError):
                await watcher
