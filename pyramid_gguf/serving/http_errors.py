"""The HTTP side of errors: each dialect's error shape, chosen in one place by the route a request
matched, the one API-key check, and the handlers that answer every error (:mod:`.errors` holds
the errors themselves).

A dialect's routes live on its own router (:func:`router`), which tags them with the
:class:`Dialect`; :func:`dialect_of` reads the tag of the route a request matched (OpenAI's shape
for a path no route matches), so a new route answers errors in its own dialect's shape whatever
its path, and the key check and the error handlers ask the same function.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response as HTTPResponse
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from ..core.errors import ContextOverflow, UserError
from .errors import ApiError, error_of, validation_error

#: Paths answered without the API key (llama-server's public ``/health``; ``/metrics``;
#: Ollama's ``/api/version``, the probe its clients send first).
PUBLIC = frozenset({"/health", "/v1/health", "/metrics", "/api/version"})


@dataclass(frozen=True)
class Dialect:
    """One API's way of answering an error: ``name`` (the tag of its routes) and ``body``, an
    :class:`ApiError` as that API's JSON body."""

    name: str
    body: Callable[[ApiError], Any]

    def response(self, error: ApiError) -> JSONResponse:
        """``error`` as this dialect's HTTP response (its status and headers)."""
        return JSONResponse(self.body(error), status_code=error.status, headers=error.headers)


OPENAI = Dialect("openai", ApiError.body)
LLAMA = Dialect("llama-server", ApiError.llama_body)
OLLAMA = Dialect("ollama", ApiError.ollama_body)
ANTHROPIC = Dialect("anthropic", ApiError.anthropic_body)
DIALECTS = {d.name: d for d in (OPENAI, LLAMA, OLLAMA, ANTHROPIC)}


def router(dialect: Dialect) -> APIRouter:
    """A router whose routes answer errors in ``dialect``'s shape."""
    return APIRouter(tags=[dialect.name])


def _of_route(route: BaseRoute | None) -> Dialect | None:
    tags = getattr(route, "tags", None) or ()
    return next((DIALECTS[t] for t in tags if t in DIALECTS), None)


def dialect_of(scope: Scope, routes: Sequence[BaseRoute] = ()) -> Dialect:
    """The dialect of the route ``scope`` matched (before routing has run: the first of
    ``routes``, the dialects' own, that matches it); OpenAI's when no route matches."""
    found = _of_route(scope.get("route"))
    if found is None:
        matched = (r for r in routes if r.matches(scope)[0] == Match.FULL)
        found = _of_route(next(matched, None))
    return found or OPENAI


def respond(request: Request, error: ApiError) -> JSONResponse:
    """``error`` answered in the shape of the route ``request`` matched."""
    return dialect_of(request.scope).response(error)


class ApiKeyMiddleware:
    """401 for requests without the API key, as ``Authorization: Bearer <api_key>`` or
    llama-server's (and Anthropic's) ``X-Api-Key: <api_key>`` (pure ASGI), answered in the
    dialect of the route asked for. Every route needs it but :data:`PUBLIC`."""

    def __init__(self, app: ASGIApp, api_key: str, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.bearer = f"Bearer {api_key}".encode()
        self.key = api_key.encode()
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if path and path not in PUBLIC:
            headers = dict(scope["headers"])
            bearer = headers.get(b"authorization", b"")
            key = headers.get(b"x-api-key", b"")
            if not (hmac.compare_digest(bearer, self.bearer) or hmac.compare_digest(key, self.key)):
                error = ApiError(
                    401,
                    "Incorrect or missing API key (send Authorization: Bearer KEY or X-Api-Key).",
                    code="invalid_api_key",
                )
                await dialect_of(scope, self.routes).response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def json_body(request: Request, empty: bytes = b"{}") -> dict[str, Any]:
    """The request's JSON object body (``empty`` when there is none): a 400 for bad JSON or a
    body that is no object."""
    try:
        body = json.loads(await request.body() or empty)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"invalid JSON body: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def shaped(e: Exception) -> ApiError:
    """Any exception as the :class:`ApiError` answered for it: a prompt longer than the context
    with OpenAI's code (which clients look for) and llama-server's type."""
    if isinstance(e, ContextOverflow):
        return ApiError(
            400, str(e), code="context_length_exceeded", llama_type="exceed_context_size_error"
        )
    return error_of(e)


def install_error_handlers(app: FastAPI) -> None:
    """Every error in its route's shape; validation errors are 400, not FastAPI's 422."""

    async def known(request: Request, exc: Exception) -> HTTPResponse:
        return respond(request, shaped(exc))

    async def validation(request: Request, exc: Exception) -> HTTPResponse:
        assert isinstance(exc, RequestValidationError)
        return respond(request, validation_error(exc.errors()))

    async def http_error(request: Request, exc: Exception) -> HTTPResponse:
        assert isinstance(exc, StarletteHTTPException)
        kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
        return respond(request, ApiError(exc.status_code, str(exc.detail), type=kind))

    app.add_exception_handler(ApiError, known)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(UserError, known)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, known)
