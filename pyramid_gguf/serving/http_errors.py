"""The HTTP side of errors: the API-key check and the handlers that answer every error in
OpenAI's shape (:mod:`.errors` holds the errors themselves)."""

from __future__ import annotations

import hmac

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response as HTTPResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..core.errors import UserError
from .errors import ApiError, error_of, validation_error


class ApiKeyMiddleware:
    """401 for ``/v1`` requests without ``Authorization: Bearer <api_key>`` (pure ASGI)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = ApiError(
                    401,
                    "Incorrect or missing API key (send Authorization: Bearer KEY).",
                    code="invalid_api_key",
                )
                await response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def response(error: ApiError) -> JSONResponse:
    """``error`` as an HTTP response."""
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def install_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape; validation errors are 400, not FastAPI's 422."""

    async def api_error(request: Request, exc: Exception) -> HTTPResponse:
        assert isinstance(exc, ApiError)
        return response(exc)

    async def validation(request: Request, exc: Exception) -> HTTPResponse:
        assert isinstance(exc, RequestValidationError)
        return response(validation_error(exc.errors()))

    async def user_error(request: Request, exc: Exception) -> HTTPResponse:
        return response(ApiError(400, str(exc)))

    async def http_error(request: Request, exc: Exception) -> HTTPResponse:
        assert isinstance(exc, StarletteHTTPException)
        kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
        return response(ApiError(exc.status_code, str(exc.detail), type=kind))

    async def internal(request: Request, exc: Exception) -> HTTPResponse:
        return response(error_of(exc))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(UserError, user_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal)
