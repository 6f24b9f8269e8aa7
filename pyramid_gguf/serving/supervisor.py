"""``serve --rpc``: the server in a worker process, behind a front that outlives a lost link.

llama.cpp's RPC client has no way to fail softly: when an RPC server stops or the network
drops mid-graph it aborts the process (ggml-rpc.cpp, ``RPC_STATUS_ASSERT``). So with tiers on
RPC servers, ``serve`` keeps the listening socket in a small front process (:class:`Front`)
that relays every request to a worker process running the real server on loopback. When the
worker dies, the front answers the requests it was relaying with a 503 naming the cause (an
error event where a stream had begun), ``/health`` says why, and the front probes the RPC
servers (ggml-rpc's handshake, :func:`~pyramid_gguf.core.endpoints.probe`) every second and
starts a new worker once they answer: the next request succeeds, with no restart by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..core.endpoints import Endpoint, probe
from ..core.errors import UserError

#: The environment variable that carries a worker's serve parameters (JSON).
WORKER_ENV = "PYRAMID_GGUF_SERVE_WORKER"
#: Hop-by-hop headers a relay must not forward (RFC 9110, 7.6.1), plus the length it recomputes.
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "content-length", "host"}


@dataclass
class State:
    """What the front knows: the worker's address when it serves, else why it does not."""

    port: int | None = None
    reason: str = "loading the models"
    ready_once: bool = False


def _error(status: int, message: str) -> JSONResponse:
    """OpenAI's error shape (llama-server's ``unavailable_error`` type for a 503)."""
    kind = "unavailable_error" if status == 503 else "server_error"
    body = {"error": {"code": status, "message": message, "type": kind}}
    return JSONResponse(body, status, headers={"Retry-After": "1"} if status == 503 else None)


class Front:
    """The front process: relays to a worker, restarts it when the RPC servers are back."""

    def __init__(self, params: dict[str, Any], endpoints: Sequence[str], public_url: str) -> None:
        self.params = params
        #: Where clients reach us: the worker's lines name it instead of the worker's port.
        self.public_url = public_url
        self.ports: dict[int, int] = {}
        self.endpoints = [Endpoint.parse(e) for e in endpoints]
        self.state = State()
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0))
        self.app = Starlette(
            routes=[Route("/{path:path}", self.relay, methods=_METHODS)],
            lifespan=self._lifespan,
        )
        self.fatal: str | None = None

    # --- the worker -------------------------------------------------------------------------

    def _worker_url(self, proc: subprocess.Popen[bytes]) -> bytes:
        return f"http://127.0.0.1:{self.ports.get(proc.pid, 0)}".encode()

    def _spawn(self) -> tuple[subprocess.Popen[bytes], int]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        env = {**os.environ, WORKER_ENV: json.dumps({**self.params, "port": port}, default=str)}
        code = "from pyramid_gguf.cli.serve import worker; worker()"
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
        self.ports[proc.pid] = port
        return proc, port

    async def _supervise(self) -> None:
        """Run workers for good: start one, wait for it to serve, relay while it lives, then
        wait for the RPC servers and start the next."""
        while True:
            self.proc, port = self._spawn()
            last = asyncio.create_task(self._read_stderr(self.proc))
            if await self._wait_ready(self.proc, port):
                self.state = State(port, "", True)
            code = await asyncio.to_thread(self.proc.wait)
            line = await last
            reason = line or f"the server process exited with status {code}"
            if not self.state.ready_once:  # it never served: a bad flag or file, not a link
                self.fatal = reason
                raise UserError(reason)
            self.state = State(None, reason, True)
            await self._wait_for_servers()

    async def _read_stderr(self, proc: subprocess.Popen[bytes]) -> str:
        """Copy the worker's stderr to ours; its last ``Error:`` line (without the prefix)."""
        assert proc.stderr is not None
        last = ""
        while line := await asyncio.to_thread(proc.stderr.readline):
            sys.stderr.buffer.write(line.replace(self._worker_url(proc), self.public_url.encode()))
            sys.stderr.flush()
            text = line.decode("utf-8", "replace").strip()
            if text.startswith("Error: "):
                last = text[len("Error: ") :]
        return last

    async def _wait_ready(self, proc: subprocess.Popen[bytes], port: int) -> bool:
        while proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                r = await self.client.get(f"http://127.0.0.1:{port}/health", timeout=2.0)
                if r.status_code == 200:
                    return True
            await asyncio.sleep(0.2)
        return False

    async def _wait_for_servers(self) -> None:
        lost = self.state.reason
        while True:
            try:
                for e in self.endpoints:
                    await asyncio.to_thread(probe, e, 2.0)
                return
            except UserError as e:
                self.state = State(None, f"{lost}; waiting for it: {e}", True)
            await asyncio.sleep(1.0)

    # --- the relay --------------------------------------------------------------------------

    async def relay(self, request: Request) -> Response:
        port = self.state.port
        if request.url.path == "/health" and port is None:
            body = {"status": "error", "error": {"code": 503, "message": self.state.reason}}
            return JSONResponse(body, 503, headers={"Retry-After": "1"})
        if port is None:
            return _error(503, f"not serving: {self.state.reason}")
        url = f"http://127.0.0.1:{port}{request.url.path}"
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        try:
            upstream = self.client.build_request(
                request.method,
                url,
                params=request.query_params,
                headers=headers,
                content=await request.body(),
            )
            reply = await self.client.send(upstream, stream=True)
        except httpx.HTTPError:
            return _error(503, f"this request failed: {await self._cause()}")
        out = [(k, v) for k, v in reply.headers.items() if k.lower() not in _HOP]
        event_stream = reply.headers.get("content-type", "").startswith("text/event-stream")
        return StreamingResponse(
            self._body(reply, event_stream), reply.status_code, headers=dict(out)
        )

    async def _body(self, reply: httpx.Response, event_stream: bool) -> AsyncIterator[bytes]:
        try:
            async for chunk in reply.aiter_raw():
                yield chunk
        except httpx.HTTPError:
            cause = f"this request failed: {await self._cause()}"
            error = {"error": {"code": 503, "message": cause, "type": "unavailable_error"}}
            yield (f"data: {json.dumps(error)}\n\n" if event_stream else "").encode()
        finally:
            await reply.aclose()

    async def _cause(self) -> str:
        """Why the worker stopped answering, once it has said (up to 3 s)."""
        until = time.monotonic() + 3.0
        while self.state.port is not None and time.monotonic() < until:
            await asyncio.sleep(0.05)
        return self.state.reason or "the server process stopped answering"

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(self._supervise())
        task.add_done_callback(self._done)
        yield
        task.cancel()
        self._stop_worker()
        await self.client.aclose()

    def _done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            os.kill(os.getpid(), signal.SIGINT)  # stop serving: uvicorn exits its loop

    def _stop_worker(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]


def supervise(
    params: dict[str, Any], sockets: list[socket.socket], endpoints: Sequence[str]
) -> None:
    """Serve on ``sockets`` through a :class:`Front` until Ctrl-C; a worker that fails before
    it ever served (a bad model file, an unreachable RPC server at start) is a
    :class:`UserError` with its own line."""
    host, port = params["host"], sockets[0].getsockname()[1]
    front = Front(params, endpoints, f"http://{f'[{host}]' if ':' in host else host}:{port}")
    config = uvicorn.Config(front.app, log_level=params.get("log_level", "info"))
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=sockets)
    front._stop_worker()
    if front.fatal is not None:
        raise UserError(front.fatal)
