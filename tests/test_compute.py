"""The compute thread: every graph of the process runs on one thread (native/compute.py)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.native import NativeModel, Part, compute, system_info


class _Slot:
    """A thread that lives until closed and runs what it is given (a serving slot's thread)."""

    def __init__(self) -> None:
        self._jobs: list[Callable[[], Any]] = []
        self._cv = threading.Condition()
        self._done = 0
        self._closed = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._closed:
                    self._cv.wait()
                if not self._jobs:
                    return
                job = self._jobs.pop(0)
            job()
            with self._cv:
                self._done += 1
                self._cv.notify_all()

    def do(self, job: Callable[[], Any]) -> None:
        with self._cv:
            want = self._done + 1
            self._jobs.append(job)
            self._cv.notify_all()
            while self._done < want:
                self._cv.wait()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self.thread.join()


def test_run_returns_raises_and_nests() -> None:
    assert compute.run(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ZeroDivisionError):
        compute.run(lambda: 1 // 0)
    # a call made on the compute thread runs there directly instead of waiting on itself
    where = compute.run(lambda: compute.run(threading.current_thread))
    assert where is compute.compute_thread()
    assert where is not threading.current_thread()


class _Signalled(Exception):
    pass


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs pthread_kill")
def test_an_interrupt_while_waiting_is_raised_after_the_call_returned() -> None:
    """A signal whose handler raises (Ctrl-C's KeyboardInterrupt) while the caller waits does
    not return control before the compute thread is done with the call."""
    assert threading.current_thread() is threading.main_thread()
    started, returned = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        time.sleep(0.3)
        returned.set()
        return "done"

    def handler(signum: int, frame: object) -> None:
        raise _Signalled

    def interrupt() -> None:
        started.wait()
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)

    old = signal.signal(signal.SIGUSR1, handler)
    try:
        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(_Signalled):
            compute.run(slow)
        assert returned.is_set()
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_every_decode_runs_on_the_compute_thread(
    tiny_target: Path, tiny_load: LoadConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decodes asked from several threads (the serving slots' threads) all run on one."""
    seen: list[threading.Thread] = []
    decode = llama_cpp.llama_decode

    def recording(ctx: Any, batch: Any) -> int:
        seen.append(threading.current_thread())
        return int(decode(ctx, batch))

    monkeypatch.setattr(llama_cpp, "llama_decode", recording)
    with NativeModel(tiny_target, replace(tiny_load, parallel=3)) as m:
        tokens = m.vocab.tokenize("the tree and the graph")
        slots = [_Slot() for _ in range(3)]
        try:
            for seq, slot in enumerate(slots):
                slot.do(partial(m.eval_parts, [Part(seq, tokens, [-1])]))
            m.eval([1], seq=0)
        finally:
            for slot in slots:
                slot.close()
    assert len(seen) == 4
    assert set(seen) == {compute.compute_thread()}


def _native_threads() -> int:
    """Threads of this process that Python did not start (OpenMP's workers among them)."""
    python = {t.native_id for t in threading.enumerate()}
    return sum(1 for tid in os.listdir("/proc/self/task") if int(tid) not in python)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
@pytest.mark.skipif("OPENMP = 1" not in system_info(), reason="an OpenMP build")
def test_threads_that_decode_start_no_openmp_pools_of_their_own(tiny_target: Path) -> None:
    """GNU OpenMP gives each thread that runs a graph its own pool of ``n_threads - 1``
    workers, and past one worker per CPU every barrier sleeps in the kernel: slots' threads
    that decode add no workers to the compute thread's."""
    load = LoadConfig(n_ctx=512, n_batch=64, n_threads=2, n_threads_batch=2, parallel=3)
    with NativeModel(tiny_target, load) as m:
        tokens = m.vocab.tokenize("the tree and the graph")
        m.eval(tokens, [-1], seq=0)  # the compute thread's pool, made once
        before = _native_threads()
        slots = [_Slot() for _ in range(2)]
        try:
            for seq, slot in enumerate(slots, start=1):
                slot.do(partial(m.eval, tokens, [-1], seq=seq))
            after = _native_threads()  # while those threads live (a pool dies with its thread)
        finally:
            for slot in slots:
                slot.close()
    assert after == before
