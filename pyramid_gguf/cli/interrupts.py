"""Ctrl-C while llama.cpp runs: delivered once llama.cpp returns, never lost in its callback.

Python runs a signal's handler at the next line of Python it executes. While llama.cpp loads a
model, that line is in the log callback (``native/backend.py``), and ctypes cannot let an
exception out of a callback: it prints "Exception ignored on calling ctypes callback function"
and drops the KeyboardInterrupt, so the load, and the generation after it, went on.

:func:`interrupts_outside_callbacks` installs a SIGINT handler that raises KeyboardInterrupt
as usual, except inside the callback: there it only notes the interrupt and has it delivered
again shortly, until it lands in ordinary Python code (as soon as the native call returns).
The same holds in a finalizer (``__del__``, which the collector may run at any allocation, in
any test of a long run), where an exception is just as lost; and a KeyboardInterrupt lost
anywhere else Python cannot raise (another callback) is delivered again too, not dropped.
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from ..native.backend import in_log_callback

#: Seconds before an interrupt noted in the log callback is delivered again.
RETRY_SECONDS = 0.01


def cannot_raise_here(frame: FrameType | None) -> bool:
    """Whether an exception raised in ``frame`` would be lost: it runs inside llama.cpp's log
    callback or inside a finalizer (``__del__``)."""
    if in_log_callback(frame):
        return True
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


@contextmanager
def interrupts_outside_callbacks() -> Iterator[None]:
    """Within the block, Ctrl-C raises KeyboardInterrupt outside llama.cpp's log callback.

    Does nothing off the main thread or where SIGINT is not Python's default handler (ignored
    in a background job, or taken by the host program).
    """
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    lock = threading.Lock()
    state = {"active": True, "pending": False}

    def deliver_again() -> None:
        with lock:
            if state["active"]:
                _thread.interrupt_main(signal.SIGINT)

    def later() -> None:
        state["pending"] = True
        retry = threading.Timer(RETRY_SECONDS, deliver_again)
        retry.daemon = True
        retry.start()

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if cannot_raise_here(frame):
            later()
            return
        state["pending"] = False
        raise KeyboardInterrupt

    hook = sys.unraisablehook

    def on_unraisable(unraisable: sys.UnraisableHookArgs) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):  # raised where it was lost
            later()
            return
        hook(unraisable)

    signal.signal(signal.SIGINT, on_sigint)
    sys.unraisablehook = on_unraisable
    try:
        yield
    finally:
        with lock:
            state["active"] = False
        sys.unraisablehook = hook
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if state["pending"]:
            raise KeyboardInterrupt
