"""One worker thread behind a bounded queue: how the server runs generations.

Every request takes a slot (``queue_size`` admitted at once, the running one included; a full
queue answers 503 with ``Retry-After``) and runs on a single worker thread, so the event loop
stays free. A client that disconnects cancels its generation; the next request is unaffected.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from fastapi import Request

from ..api import Response
from .http_errors import ApiError

#: Seconds between disconnect checks while a request waits for the engine.
POLL_SECONDS = 0.1
#: ``Retry-After`` (seconds) of a 503 answered when the queue is full.
RETRY_AFTER_SECONDS = 1

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


class JobQueue:
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
