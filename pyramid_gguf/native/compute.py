"""The one thread of this process that runs llama.cpp's graphs (``llama_decode``...).

llama-cpp-python builds ggml's CPU backend with OpenMP (``OPENMP = 1`` in the system info): a
graph runs in an OpenMP team of the thread that called ``llama_decode``, and ggml syncs the
team with an OpenMP barrier after every node (``ggml_barrier``; hundreds per token). GNU
OpenMP gives every thread that ever starts a team a pool of its own (``n_threads - 1`` workers
that live as long as that thread) and counts all of them; once the count exceeds the CPUs, a
thread waiting at any barrier spins only 100 times before it sleeps in the kernel
(``gomp_throttled_spin_count_var``, ``do_spin`` in libgomp's config/linux/wait.h), so every
barrier of every later graph costs a futex sleep and wake-up. A server whose slot threads take
turns calling ``llama_decode`` crosses that line as soon as a second thread decodes (2 threads
on 2 cores: 1 + 1 + 1 workers > 2 CPUs), and stays over it. llama-server and llama-bench never
do: one thread of theirs decodes.

So every graph of this process runs on one thread, started on first use: :func:`run` hands a
call to it (or makes it directly when called on that thread) and waits for it; an interrupt
that arrives while it waits is raised once the call has returned, as it would be after a native
call made on the caller's own thread.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: The compute thread's name (what ``threading.enumerate`` and py-spy show).
THREAD_NAME = "pyramid-gguf-compute"


class _Call:
    """One call handed to the compute thread; ``done`` is released when it has returned."""

    __slots__ = ("args", "done", "error", "finished", "fn", "result")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.result: Any = None
        self.error: BaseException | None = None
        #: Set (after ``result`` or ``error``) just before ``done`` is released.
        self.finished = False
        self.done = threading.Lock()
        self.done.acquire()


class _Runner:
    """The compute thread and the queue of calls it runs, in order."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            call = self.calls.get()
            try:
                call.result = call.fn(*call.args)
            except BaseException as e:  # the caller raises it
                call.error = e
            finally:
                call.finished = True
                call.done.release()
            del call


_lock = threading.Lock()
_runner: _Runner | None = None


def _reset_after_fork() -> None:
    """A forked child has no compute thread: it starts its own on first use."""
    global _runner, _lock
    _runner, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def _get_runner() -> _Runner:
    global _runner
    runner = _runner
    if runner is None:
        with _lock:
            if _runner is None:
                _runner = _Runner()
            runner = _runner
    return runner


def compute_thread() -> threading.Thread:
    """The compute thread (started now if it has not been)."""
    return _get_runner().thread


def run(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the compute thread, its value returned (its exception raised) here.

    ``fn`` is a native call that runs a graph (``llama_decode``...). Blocks until it has
    returned; a KeyboardInterrupt while it runs is raised after it returned, never while the
    compute thread may still use what the caller would then free.
    """
    runner = _get_runner()
    if threading.current_thread() is runner.thread:
        return fn(*args)
    call = _Call(fn, args)
    runner.calls.put(call)
    interrupted: BaseException | None = None
    while not call.finished:  # not "until acquired": an interrupt may land just after
        try:
            call.done.acquire()
        except BaseException as e:  # a Ctrl-C: wait for the call to return first
            interrupted = interrupted or e
    if interrupted is not None:
        raise interrupted
    if call.error is not None:
        raise call.error
    return call.result
