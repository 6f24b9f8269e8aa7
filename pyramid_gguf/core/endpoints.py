"""RPC servers by address: :class:`Endpoint` (``HOST:PORT``), llama.cpp's ``--rpc`` list, and
:func:`probe`, ggml-rpc's handshake spoken from Python (no llama.cpp needed)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import UserError

DEFAULT_PORT = 50052
#: The protocol version of the vendored ggml-rpc (ggml-rpc.h, RPC_PROTO_*_VERSION): both ends
#: must share the major version, and the server's minor may not be newer.
PROTO_MAJOR, PROTO_MINOR = 7, 0
#: ggml-rpc's HELLO command id (fixed at 14 across versions) and its capability bytes.
_CMD_HELLO, _CAPS = 14, 24


@dataclass(frozen=True)
class Endpoint:
    """One RPC server's ``HOST:PORT``."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        host, sep, port = text.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UserError(
                f"--rpc wants HOST:PORT (e.g. 192.168.1.20:{DEFAULT_PORT}), got {text!r}"
            )
        return cls(host.strip("[]"), int(port))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoints(text: str | Sequence[str]) -> tuple[Endpoint, ...]:
    """``HOST:PORT[,HOST:PORT...]`` (llama.cpp's ``--rpc``) as endpoints, in order, no repeats."""
    items = text.split(",") if isinstance(text, str) else [p for t in text for p in t.split(",")]
    out: list[Endpoint] = []
    for item in items:
        if item.strip():
            endpoint = Endpoint.parse(item)
            if endpoint not in out:
                out.append(endpoint)
    if not out:
        raise UserError("--rpc names no server")
    return tuple(out)


def probe(endpoint: Endpoint, timeout: float = 5.0) -> tuple[int, int, int]:
    """The server's protocol version ``(major, minor, patch)`` from a HELLO of our own, so
    that llama.cpp never meets a server it would abort on. A :class:`UserError` when nothing
    answers, the server serves another client (ggml's server takes one at a time), or speaks
    another protocol version."""
    where = f"the RPC server at {endpoint}"
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout) as s:
            s.sendall(struct.pack("<BQ", _CMD_HELLO, _CAPS) + bytes(_CAPS))
            head = _recv(s, 8)
            (size,) = struct.unpack("<Q", head)
            if size < 4 or size > 4096:
                raise UserError(f"{where} answered the handshake with {size} bytes: not ggml-rpc")
            major, minor, patch = struct.unpack("<BBB", _recv(s, size)[:3])
    except TimeoutError:
        raise UserError(
            f"{where} does not answer within {timeout:g} s (it serves one client at a time: is "
            "another program connected to it?)"
        ) from None
    except ConnectionResetError:
        raise UserError(f"{where} closed the connection during the handshake: {_other()}") from None
    except EOFError:
        raise UserError(f"{where} closed the connection during the handshake: {_other()}") from None
    except OSError as e:
        raise UserError(f"cannot reach {where}: {e.strerror or e}") from None
    if major != PROTO_MAJOR or minor > PROTO_MINOR:
        raise UserError(
            f"{where} speaks RPC protocol {major}.{minor}.{patch}, this build "
            f"{PROTO_MAJOR}.{PROTO_MINOR}: run the same llama.cpp version on both machines"
        )
    return major, minor, patch


def _other() -> str:
    return f"probably another llama.cpp version (this build speaks RPC protocol {PROTO_MAJOR}.x)"


def _recv(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data
