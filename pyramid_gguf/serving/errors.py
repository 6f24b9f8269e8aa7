"""Errors with no web framework: :class:`ApiError`, answered in each dialect's shape: OpenAI's
(``{"error": {"message", "type", "param", "code"}}``), llama-server's (``{"error": {"code":
<status>, "message", "type"}}``), Ollama's (``{"error": "..."}``) or Anthropic's (``{"type":
"error", "error": {"type", "message"}}``), and the first of a request body's validation errors
as one (the server's handlers, which pick the shape by route, are in :mod:`.http_errors`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.errors import UserError

#: llama-server's error ``type`` of a status, where ours is OpenAI's generic
#: ``invalid_request_error`` (``error_type`` in its ``server-common.h``).
LLAMA_TYPES: dict[int, str] = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}
#: Anthropic's error type of each status we answer (``api_error`` otherwise).
ANTHROPIC_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


class ApiError(Exception):
    """An error answered in OpenAI's shape (:meth:`body`) or llama-server's
    (:meth:`llama_body`: ``llama_type`` replaces ``type`` there, and ``extra`` fields join it,
    as its ``n_prompt_tokens`` and ``n_ctx`` of a prompt over the context)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        llama_type: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers
        self.llama_type = llama_type
        self.extra = extra or {}

    def llama_body(self) -> dict[str, Any]:
        """llama-server's shape: the status as ``code``, its ``type`` names."""
        kind = self.llama_type or self.type
        if kind == "invalid_request_error":
            kind = LLAMA_TYPES.get(self.status, kind)
        return {"error": {"code": self.status, "message": self.message, "type": kind, **self.extra}}

    def ollama_body(self) -> dict[str, Any]:
        """Ollama's shape: the message alone."""
        return {"error": self.message}

    def anthropic_body(self) -> dict[str, Any]:
        """Anthropic's shape: its error type of the status."""
        kind = ANTHROPIC_TYPES.get(self.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def body(self) -> dict[str, Any]:
        """OpenAI's shape."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def context_exceeded(n_prompt: int, n_ctx: int) -> ApiError:
    """A prompt of ``n_prompt`` tokens that does not fit a slot's ``n_ctx``: OpenAI's
    ``context_length_exceeded``, llama-server's ``exceed_context_size_error`` (with both
    counts)."""
    return ApiError(
        400,
        f"the request ({n_prompt} tokens) exceeds the available context size ({n_ctx} "
        "tokens): raise --ctx-size or shorten the prompt",
        code="context_length_exceeded",
        llama_type="exceed_context_size_error",
        extra={"n_prompt_tokens": n_prompt, "n_ctx": n_ctx},
    )


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
