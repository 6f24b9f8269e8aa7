"""Worker threads behind a bounded queue: how the server runs generations.

Every request is admitted into the queue (``queue_size`` at once, the running ones included; a
full queue answers 503 with ``Retry-After``) and runs on one of ``workers`` threads (one per
parallel slot: their generations are batched together by the engine), so the event loop stays
free. A client that disconnects cancels its generation at once (its worker stops at its next
token and its slot is free for the next request); the others are unaffected. When the server
shuts down, every admitted request is cancelled the same way and answered with a 503 in
OpenAI's shape. The queue also counts what ``/metrics`` reports.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

from fastapi import Request

from ..api import Response
from .http_errors import ApiError

#: ``Retry-After`` (seconds) of a 503 answered when the queue is full.
RETRY_AFTER_SECONDS = 1
#: Seconds of recent generation over which ``/metrics`` reports tokens per second.
RATE_WINDOW = 10.0

_END = object()

Work = Callable[[threading.Event], Iterator[Response]]


def shutting_down() -> ApiError:
    """The answer to a request that the server's shutdown cancelled or turned away."""
    return ApiError(
        503,
        "the server is shutting down; the request was cancelled",
        type="server_error",
        code="server_shutting_down",
    )


class Job:
    """One admitted generation: runs on the worker thread, read from the event loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        work: Work,
        on_tokens: Callable[[int], None] | None = None,
    ) -> None:
        self.cancel = threading.Event()
        self._loop = loop
        self._work = work
        self._on_tokens = on_tokens
        self._items: asyncio.Queue[object] = asyncio.Queue()
        #: Whether the generation was cancelled (or never started because it was).
        self.cancelled = False
        #: The generation's last step (its statistics), once it has one.
        self.last: Response | None = None

    def run(self) -> None:
        """Worker thread: stream the generation into the queue (errors too), then the end."""
        try:
            if self.cancel.is_set():
                self.cancelled = True
                return
            for step in self._work(self.cancel):
                self.cancelled = step.finish_reason == "cancelled"
                self.last = step
                if self._on_tokens is not None and step.token_ids:
                    self._on_tokens(len(step.token_ids))
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

    def abort(self, error: Exception) -> None:
        """Event loop: cancel the generation and make the reader's next :meth:`next` raise
        ``error``, whatever the worker still posts."""
        self.cancel.set()
        self._items.put_nowait(error)

    async def next(self) -> Response | None:
        """The next step, None at the end; re-raises an error of the generation (or the one
        given to :meth:`abort`)."""
        item = await self._items.get()
        if item is _END:
            return None
        if isinstance(item, Exception):
            raise item
        assert isinstance(item, Response)
        return item

    @asynccontextmanager
    async def watching(self, request: Request) -> AsyncIterator[None]:
        """While the block runs, a client that disconnects aborts the job with
        :class:`ClientGone` at once (the worker stops at its next token)."""

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


class ClientGone(Exception):
    """The client disconnected before its answer was sent."""


@dataclass
class Totals:
    """What the finished generations did, for ``/metrics``."""

    prompt_tokens: int = 0
    prompt_evaluated: int = 0
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generation_seconds: float = 0.0
    rejected: int = 0


class JobQueue:
    """Admits at most ``queue_size`` jobs at once and runs them on ``workers`` threads."""

    def __init__(self, queue_size: int, workers: int = 1) -> None:
        self.queue_size = queue_size
        self.workers = workers
        self.in_flight = 0
        self.completed = 0
        self.cancelled = 0
        self.totals = Totals()
        self._recent: deque[tuple[float, int]] = deque()
        #: Set by :meth:`shutdown`: new requests are refused.
        self.closing = False
        self._lock = threading.Lock()
        self._jobs: set[Job] = set()
        self._executor: ThreadPoolExecutor | None = None

    def submit(self, work: Work) -> Job:
        """Queue ``work``; 503 :class:`ApiError` when the queue is full or shutting down."""
        with self._lock:
            if self.closing:
                raise shutting_down()
            if self.in_flight >= self.queue_size:
                self.totals.rejected += 1
                raise ApiError(
                    503,
                    f"the server is busy ({self.queue_size} requests queued); retry later",
                    type="server_error",
                    code="queue_full",
                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
                )
            self.in_flight += 1
            job = Job(asyncio.get_running_loop(), work, self._count)
            self._jobs.add(job)
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    self.workers, thread_name_prefix="pyramid-engine"
                )
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
                if job.last is not None:
                    self._add(job.last)

    def _add(self, last: Response) -> None:
        """Count a finished generation's statistics (lock held)."""
        stats, t = last.stats, self.totals
        t.prompt_tokens += stats.prompt_tokens
        t.prompt_evaluated += stats.prompt_evaluated
        t.prompt_seconds += stats.prompt_seconds
        t.generated_tokens += stats.generated_tokens
        t.generation_seconds += stats.generation_seconds

    def _count(self, tokens: int) -> None:
        """A worker emitted ``tokens`` tokens now."""
        now = time.monotonic()
        with self._lock:
            self._recent.append((now, tokens))
            while self._recent and self._recent[0][0] < now - RATE_WINDOW:
                self._recent.popleft()

    def tokens_per_second(self) -> float:
        """Tokens emitted per second by all generations over the last :data:`RATE_WINDOW`."""
        now = time.monotonic()
        with self._lock:
            return sum(n for t, n in self._recent if t >= now - RATE_WINDOW) / RATE_WINDOW

    def shutdown(self) -> None:
        """Event loop, when the server starts to stop: refuse new jobs, and abort every admitted
        one with a 503 (the running generation stops at its next token)."""
        with self._lock:
            self.closing = True
            jobs = list(self._jobs)
        for job in jobs:
            job.abort(shutting_down())

    def close(self) -> None:
        """Cancel every job and wait for the worker (before the models are freed)."""
        with self._lock:
            for job in self._jobs:
                job.cancel.set()
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
