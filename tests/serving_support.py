"""What the serving tests share (a support module, not a test module): the tiny three-tier
ladder's files, a live server on uvicorn in a thread, its URL and pyramid, a free port, waiting
until the engine is idle, a request body posted as it is, and generations slowed so that a test
can cut one short."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from synth import CHATML_TEMPLATE, write_tiny_llama

from pyramid_gguf.api import Pyramid
from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.embeddings import Embedder
from pyramid_gguf.serving.app import create_app
from pyramid_gguf.serving.settings import ServerSettings


@dataclass
class Models:
    """The server tests' tiny three-tier ladder: its files."""

    target: Path
    qualifier: Path
    draft: Path


def write_models(folder: Path) -> Models:
    """Write the three tiny models (a qualifier and a draft noisier than conftest's)."""
    return Models(
        target=write_tiny_llama(folder / "target.gguf", seed=10, chat_template=CHATML_TEMPLATE),
        qualifier=write_tiny_llama(folder / "qualifier.gguf", seed=11, base_seed=10, noise=0.2),
        draft=write_tiny_llama(folder / "draft.gguf", seed=12, base_seed=10, noise=0.3),
    )


#: How the server tests load their tiny models.
LOAD = LoadConfig(n_ctx=1024, n_batch=256, n_threads=1, n_threads_batch=1)


@dataclass
class Live:
    """A running server: its base URL, the pyramid it serves and its app."""

    url: str
    pyramid: Pyramid
    app: Any = None

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def live_server(
    pyramid: Pyramid, settings: ServerSettings, embedder: Embedder | None = None
) -> Iterator[Live]:
    """Run ``create_app`` (what ``serve`` runs) on uvicorn in a background thread until the
    block ends."""
    port = free_port()
    app = create_app(pyramid, settings, embedder)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield Live(f"http://127.0.0.1:{port}", pyramid, app)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def post(
    url: str, body: Any, headers: dict[str, str] | None = None, timeout: float = 60
) -> httpx.Response:
    """POST ``body`` to ``url`` as JSON (bytes and strings sent as they are)."""
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    sent = {"Content-Type": "application/json", **(headers or {})}
    return httpx.post(url, content=data, headers=sent, timeout=timeout)


def health(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/health").json())


def wait_until(url: str, ready: Any, timeout: float = 10.0) -> dict[str, Any]:
    """``/health`` once ``ready(health)`` holds (a failure after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not ready(now := health(url)):
        assert time.monotonic() < deadline, f"not ready: {now}"
        time.sleep(0.02)
    return now


def wait_idle(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """``/health`` once nothing is queued or running."""
    return wait_until(url, lambda h: h["in_flight"] == 0, timeout)


def slow_generation(pyramid: Pyramid, monkeypatch: pytest.MonkeyPatch, pause: float = 0.5) -> None:
    """Make each step of ``pyramid``'s generations keep its slot ``pause`` seconds longer, on
    the slot's thread, whatever door admitted them."""
    generate = pyramid._generate

    def slow(*args: Any, **kwargs: Any) -> Iterator[Any]:
        for step in generate(*args, **kwargs):
            yield step
            time.sleep(pause)

    monkeypatch.setattr(pyramid, "_generate", slow)
