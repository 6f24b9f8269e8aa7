"""Errors in OpenAI's shape: ``ApiError``, request validation, API-key check, handlers."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response as HTTPResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..core.errors import UserError


class ApiError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def validation_error(exc: RequestValidationError) -> ApiError:
    """The first pydantic error as a 400 naming the offending field."""
    errors = exc.errors()
    if not errors:
        return ApiError(400, "invalid request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return ApiError(400, "We could not parse the JSON body of your request.")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = loc[0] if loc else None  # the top-level field
    if first.get("type") == "missing" and param is None:
        return ApiError(400, "the request body must be a JSON object")
    message = str(first.get("msg", "invalid value"))
    return ApiError(400, f"{'.'.join(loc)}: {message}" if loc else message, param=param)


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
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def error_of(e: Exception) -> ApiError:
    """Any exception as an :class:`ApiError`: user errors are 400, the rest 500."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, UserError):
        return ApiError(400, str(e))
    return ApiError(500, f"internal error: {type(e).__name__}: {e}", type="server_error")


def install_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape; validation errors are 400, not FastAPI's 422."""

    async def api_error(request: Request, exc: Exception) -> HTTPResponse:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def validation(request: Request, exc: Exception) -> HTTPResponse:
        assert isinstance(exc, RequestValidationError)
        return validation_error(exc).response()

    async def user_error(request: Request, exc: Exception) -> HTTPResponse:
        return ApiError(400, str(exc)).response()

    async def http_error(request: Request, exc: Exception) -> HTTPResponse:
        assert isinstance(exc, StarletteHTTPException)
        kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
        return ApiError(exc.status_code, str(exc.detail), type=kind).response()

    async def internal(request: Request, exc: Exception) -> HTTPResponse:
        return error_of(exc).response()

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(UserError, user_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal)
