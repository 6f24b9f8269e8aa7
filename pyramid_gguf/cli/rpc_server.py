"""``pyramid-gguf rpc-server``: llama.cpp's RPC server, for tiers another machine runs.

The server is ggml's own (``ggml_backend_rpc_start_server``, the C entry point of llama.cpp's
``rpc-server`` tool) from the same llama.cpp build, started in this process; any llama.cpp of
the same RPC protocol version can use it (``--rpc HOST:PORT``), and ours can use llama.cpp's.
It binds to loopback unless told otherwise: it has no authentication and no encryption.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import click

from ..core.endpoints import DEFAULT_PORT, PROTO_MAJOR, PROTO_MINOR, Endpoint
from ..core.errors import UserError
from ..core.load import check_threads, default_threads
from .options import command

WARNING = (
    "llama.cpp's RPC server has no authentication and no encryption: anyone who reaches "
    "this port can run code on this machine's devices and read what it computes. Use it on a "
    "trusted network only."
)


def _check_port(endpoint: Endpoint) -> None:
    """A :class:`UserError` unless ``endpoint`` can be listened on (ggml's server only prints
    a line and returns when it cannot)."""
    try:
        family = socket.AF_INET6 if ":" in endpoint.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((endpoint.host, endpoint.port))
    except OSError as e:
        raise UserError(f"cannot listen on {endpoint}: {e.strerror or e}") from None


@command()
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (another machine's clients need this machine's LAN address).",
)
@click.option("--port", "-p", type=int, default=DEFAULT_PORT, show_default=True)
@click.option(
    "--threads",
    "-t",
    "n_threads",
    type=int,
    default=None,
    help=f"CPU threads, when the CPU serves [default: {default_threads()}].",
)
@click.option(
    "--cache",
    "cache_dir",
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep received tensors here by hash (llama.cpp's rpc-server -c): a second load of "
    "the same model sends no weights.",
)
def rpc_server(host: str, port: int, n_threads: int | None, cache_dir: Path | None) -> None:
    """Serve this machine's GPUs (else its CPU) to pyramid-gguf's or llama.cpp's --rpc.

    Runs until Ctrl-C. On the other machine: pyramid-gguf run --rpc HOST:PORT ...
    """
    from ..native import rpc

    threads = default_threads() if n_threads is None else n_threads
    check_threads(threads)
    endpoint = Endpoint.parse(f"{host}:{port}")
    rpc.library()  # says how to rebuild where the backend is missing
    _check_port(endpoint)
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"Warning: {WARNING}", err=True)
    server = threading.Thread(
        target=rpc.serve,
        args=(endpoint,),
        kwargs={"threads": threads, "cache_dir": cache_dir},
        name="ggml-rpc-server",
        daemon=True,
    )
    server.start()
    cache = f"; tensors cached in {cache_dir}" if cache_dir else ""
    click.echo(
        f"llama.cpp RPC server (protocol {PROTO_MAJOR}.{PROTO_MINOR}) listening on "
        f"{endpoint}, {threads} threads{cache}. Ctrl-C stops it.",
        err=True,
    )
    while server.is_alive():
        server.join(0.5)
    raise UserError(f"the RPC server on {endpoint} stopped (see llama.cpp's line above)")
