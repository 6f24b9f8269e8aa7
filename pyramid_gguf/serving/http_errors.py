"""The HTTP side of errors: the API-key check and the handlers that answer every error in
OpenAI's shape, or in llama-server's on its own routes (every path but ``/v1/...`` and Ollama's
``/api/...``; :mod:`.errors` holds the errors themselves)."""

from __future__ import annotations

import hmac

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response as HTTPResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..core.errors import ContextOverflow, UserError
from .errors import ApiError, error_of, validation_error

#: Paths answered without the API key (llama-server's public ``/health``; ``/metrics``).
PUBLIC = frozenset({"/health", "/v1/health", "/metrics"})


class ApiKeyMiddleware:
    """401 for requests without the API key, as ``Authorization: Bearer <api_key>`` or
    llama-server's (and Anthropic's) ``X-Api-Key: <api_key>`` (pure ASGI). Every route needs it
    but :data:`PUBLIC` and Ollama's ``/api/`` routes, which check it themselves (answering in
    Ollama's error shape)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.bearer = f"Bearer {api_key}".encode()
        self.key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if path and path not in PUBLIC and not path.startswith("/api/"):
            headers = dict(scope["headers"])
            bearer = headers.get(b"authorization", b"")
            key = headers.get(b"x-api-key", b"")
            if not (hmac.compare_digest(bearer, self.bearer) or hmac.compare_digest(key, self.key)):
                error = ApiError(
                    401,
                    "Incorrect or missing API key (send Authorization: Bearer KEY or X-Api-Key).",
                    code="invalid_api_key",
                )
                await response(error, path)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def llama_path(path: str) -> bool:
    """Whether ``path`` is one of llama-server's own routes (no ``/v1/`` prefix, not Ollama's
    ``/api/``): its errors are answered in llama-server's shape."""
    return not path.startswith(("/v1/", "/api/"))


def response(error: ApiError, path: str | None = None) -> JSONResponse:
    """``error`` as the HTTP response of a request to ``path`` (None: in OpenAI's shape)."""
    body = error.llama_body() if path is not None and llama_path(path) else error.body()
    return JSONResponse(body, status_code=error.status, headers=error.headers)


def install_error_handlers(app: FastAPI) -> None:
    """Every error in its route's shape; validation errors are 400, not FastAPI's 422."""

    async def api_error(request: Request, exc: Exception) -> HTTPResponse:
        assert isinstance(exc, ApiError)
        return response(exc, request.url.path)

    async def validation(request: Request, exc: Exception) -> HTTPResponse:
        assert isinstance(exc, RequestValidationError)
        return response(validation_error(exc.errors()), request.url.path)

    async def user_error(request: Request, exc: Exception) -> HTTPResponse:
        # OpenAI's code for a prompt longer than the context, which clients look for
        if isinstance(exc, ContextOverflow):
            error = ApiError(
                400,
                str(exc),
                code="context_length_exceeded",
                llama_type="exceed_context_size_error",
            )
        else:
            error = ApiError(400, str(exc))
        return response(error, request.url.path)

    async def http_error(request: Request, exc: Exception) -> HTTPResponse:
        assert isinstance(exc, StarletteHTTPException)
        kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
        return response(ApiError(exc.status_code, str(exc.detail), type=kind), request.url.path)

    async def internal(request: Request, exc: Exception) -> HTTPResponse:
        return response(error_of(exc), request.url.path)

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(UserError, user_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal)
