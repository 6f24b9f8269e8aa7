"""Requests sent together start together: every POST is announced to the slots while it is read.

A client that sends four requests at once has them read one after another by the event loop;
the first is tokenized and submitted before the others' handlers run, and without notice its
batch would start alone, the other three waiting a whole batch for their first token
(llama-server does the same). :class:`ArrivalsMiddleware` announces each POST to the pool
while it is served (:meth:`~pyramid_gguf.decoding.runtime.slots.SlotPool.announced`): the batch
about to run gathers it until it is submitted, for at most the batcher's gather window.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from starlette.types import ASGIApp, Receive, Scope, Send


class ArrivalsMiddleware:
    """ASGI middleware serving each HTTP POST inside ``announced()``."""

    def __init__(
        self, app: ASGIApp, announced: Callable[[], AbstractContextManager[object]]
    ) -> None:
        self.app = app
        self.announced = announced

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        with self.announced():
            await self.app(scope, receive, send)
