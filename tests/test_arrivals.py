"""The server announces each POST to the slots while it is served (``serving.arrivals``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from pyramid_gguf.serving.arrivals import ArrivalsMiddleware


class FakePool:
    """Counts the requests announced now, as ``SlotPool.announced`` does."""

    def __init__(self) -> None:
        self.open = 0
        self.made = 0

    @contextmanager
    def announced(self) -> Iterator[None]:
        self.open += 1
        self.made += 1
        try:
            yield
        finally:
            self.open -= 1


def _client(pool: FakePool) -> TestClient:
    async def generate(request: Request) -> JSONResponse:
        await request.body()
        return JSONResponse({"open": pool.open})

    async def refused(request: Request) -> JSONResponse:
        raise ValueError("a handler that fails")

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"open": pool.open})

    app = Starlette(
        routes=[
            Route("/generate", generate, methods=["POST"]),
            Route("/refused", refused, methods=["POST"]),
            Route("/health", health),
        ]
    )
    app.add_middleware(ArrivalsMiddleware, announced=pool.announced)
    return TestClient(app, raise_server_exceptions=False)


def test_a_post_is_announced_while_it_is_served() -> None:
    pool = FakePool()
    client = _client(pool)
    assert client.post("/generate", content=b"{}").json() == {"open": 1}
    assert pool.open == 0 and pool.made == 1


def test_a_post_that_fails_is_withdrawn() -> None:
    pool = FakePool()
    client = _client(pool)
    assert client.post("/refused", content=b"{").status_code == 500
    assert pool.open == 0 and pool.made == 1


def test_a_get_is_not_announced() -> None:
    pool = FakePool()
    client = _client(pool)
    assert client.get("/health").json() == {"open": 0}
    assert pool.made == 0
