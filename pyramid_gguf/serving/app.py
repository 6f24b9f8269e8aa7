"""The HTTP app over one loaded :class:`~pyramid_gguf.api.Pyramid`.

``create_app(pyramid, settings)`` returns a FastAPI app with ``GET /health``, ``GET /metrics``
(Prometheus) and each dialect's routes, every one a door onto the same
:class:`~.service.Service` (admission by :meth:`Pyramid.submit`, the pyramid's bounded queue;
each generation read back by a :class:`~.jobs.Reader`): OpenAI's (:mod:`.openai_routes`),
llama-server's own (:mod:`.llama_server`), OpenAI's Responses API (:mod:`.responses`),
Ollama's (:mod:`.ollama`) and Anthropic's (:mod:`.anthropic`). Each route answers errors in its
dialect's shape, chosen by the route (:mod:`.http_errors`). :class:`Server` runs it on uvicorn.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI
from starlette.responses import Response as HTTPResponse

from ..api import Pyramid
from ..embeddings import Embedder
from . import anthropic, embeddings, llama_server, ollama, openai_routes, responses
from .arrivals import ArrivalsMiddleware
from .cors import CorsMiddleware
from .errors import ApiError
from .http_errors import ApiKeyMiddleware, install_error_handlers
from .metrics import CONTENT_TYPE as METRICS_TYPE
from .metrics import render as render_metrics
from .service import EmbeddingCard, Service
from .settings import ServerSettings


def create_app(
    pyramid: Pyramid, settings: ServerSettings | None = None, embedder: Embedder | None = None
) -> FastAPI:
    """The FastAPI app serving ``pyramid`` (which the caller keeps and closes); it bounds the
    pyramid's queue to ``settings.queue_size``. ``embedder`` (kept and closed by the caller too)
    answers the embedding routes (:mod:`.embeddings`); without it they say how to load one."""
    settings = settings or ServerSettings()
    pyramid.queue_size = settings.queue_size
    pyramid.template_kwargs = dict(settings.chat_template_kwargs)
    listed = None
    if embedder is not None:
        listed = EmbeddingCard(embedder.name, embedder.path, embedder.n_embd)
    service = Service(pyramid, settings, listed)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(service.wait)

    app = FastAPI(title="pyramid-gguf", lifespan=lifespan)
    app.state.service = service
    app.state.pyramid = pyramid
    app.state.embedder = embedder
    install_error_handlers(app)
    routers = [
        openai_routes.routes(),
        *embeddings.routes(),
        ollama.routes(),
        anthropic.routes(),
        responses.routes(),
        llama_server.routes(),
    ]
    # innermost: a request refused (a key, a preflight) is never announced to the slots
    app.add_middleware(ArrivalsMiddleware, announced=pyramid.slots.announced)
    if settings.api_key:  # the dialects' routes: a 401 in the shape of the route asked for
        routes = [route for r in routers for route in r.routes]
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key, routes=routes)
    if settings.cors_origins:  # added last: outermost, so a preflight needs no key
        app.add_middleware(CorsMiddleware, origins=settings.cors_origins)
    started = str(int(time.time()))  # llama-server's Process-Start-Time-Unix

    @app.get("/health")
    async def health() -> dict[str, Any]:
        now = pyramid.snapshot()
        return {
            "status": "ok",
            "model": service.model_name,
            "mode": service.spec.mode,
            "in_flight": now.admitted,
            "slots_idle": now.slots - now.busy,
            "slots_processing": now.busy,
            "queue_size": now.queue_size,
            "completed": now.completed,
            "cancelled": now.cancelled,
        }

    @app.get("/metrics")
    async def metrics() -> HTTPResponse:
        if not settings.metrics:
            raise ApiError(501, "/metrics is off (serve --metrics)", type="not_supported_error")
        embedded = embedder.counts() if embedder is not None else None
        body = render_metrics(pyramid.snapshot(), service.totals, embedded)
        response = HTTPResponse(body, media_type=METRICS_TYPE)
        # llama-server's capitals: its tests look the name up in a plain dict
        response.raw_headers.append((b"Process-Start-Time-Unix", started.encode()))
        return response

    if not settings.slots:  # registered first: it shadows llama_server's /slots

        @app.get("/slots")
        async def no_slots() -> None:
            raise ApiError(501, "/slots is off (serve --slots)", type="not_supported_error")

    for dialect in routers:
        app.include_router(dialect)
    return app


class Server(uvicorn.Server):
    """uvicorn's server for an app of :func:`create_app`.

    When it stops (Ctrl-C, SIGTERM) it first cancels every admitted generation, which is
    answered with a 503 in OpenAI's shape (an error event on a stream), then waits for the
    connections as uvicorn does: nobody waits for generations that nobody will read.
    """

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        service = getattr(getattr(self.config.app, "state", None), "service", None)
        if isinstance(service, Service):
            service.stop()
        await super().shutdown(sockets)
