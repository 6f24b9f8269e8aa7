"""CORS as llama-server answers it (``tools/server/server-http.cpp``).

A request with an ``Origin`` gets ``Access-Control-Allow-Origin`` set to that origin when it is
allowed: any origin under ``"*"`` (llama-server's default, with credentials), a local one
(``localhost``, ``127.0.0.1``, ``::1``, any port) under ``"localhost"``, else one listed
exactly. A preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) is
answered 200 at once, before any key is asked, with credentials allowed and llama-server's
methods (``GET, POST, DELETE, OPTIONS``) and headers (``*``); an origin not allowed gets no
``Access-Control-Allow-Origin``, so the browser refuses the call.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

METHODS = "GET, POST, DELETE, OPTIONS"
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def allowed(origin: str, origins: tuple[str, ...]) -> bool:
    """Whether a page of ``origin`` may call a server allowing ``origins``."""
    if "localhost" in origins and _is_local(origin):
        return True
    return "*" in origins or (origin in origins and origin != "localhost")  # a keyword, not a page


def _is_local(origin: str) -> bool:
    try:
        return urlsplit(origin).hostname in LOCAL_HOSTS
    except ValueError:
        return False


class CorsMiddleware:
    """ASGI middleware adding llama-server's CORS headers for ``origins`` (a non-empty tuple).
    The names keep llama-server's capitals (``Access-Control-Allow-Origin``): its own tests
    look them up in a plain dict."""

    def __init__(self, app: ASGIApp, origins: tuple[str, ...]) -> None:
        self.app = app
        self.origins = origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None:
            await self.app(scope, receive, send)
            return
        echo = [(b"Access-Control-Allow-Origin", origin.encode("latin-1"))]
        if not allowed(origin, self.origins):
            echo = []
        credentials = [(b"Access-Control-Allow-Credentials", b"true"), (b"Vary", b"Origin")]
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            preflight = [
                *echo,
                *credentials,
                (b"Access-Control-Allow-Methods", METHODS.encode()),
                (b"Access-Control-Allow-Headers", b"*"),
                (b"Content-Type", b"text/html"),
                (b"Content-Length", b"0"),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": preflight})
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_with_origin(message: Message) -> None:
            if message["type"] == "http.response.start" and echo:
                message = {**message, "headers": [*message.get("headers", []), *echo, *credentials]}
            await send(message)

        await self.app(scope, receive, send_with_origin)
