"""Errors in OpenAI's shape, with no web framework: :class:`ApiError`, and the first of a request
body's validation errors as one (the server's handlers are in :mod:`.http_errors`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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


def validation_error(errors: Sequence[Any]) -> ApiError:
    """The first of pydantic's ``errors`` (dicts) as a 400 naming the offending field."""
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


def error_of(e: Exception) -> ApiError:
    """Any exception as an :class:`ApiError`: user errors are 400, the rest 500."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, UserError):
        return ApiError(400, str(e))
    return ApiError(500, f"internal error: {type(e).__name__}: {e}", type="server_error")
