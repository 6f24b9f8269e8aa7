"""A TCP relay that adds a network's delay (and, optionally, its bandwidth) to a loopback link.

    python scripts/rpc_relay.py --listen 127.0.0.1:50100 --to 127.0.0.1:50052 --delay-ms 1.5

Every byte that crosses it, either way, arrives ``--delay-ms`` later than it left (a one-way
delay: a round trip pays it twice), after waiting its turn on a link of ``--mbps`` megabits per
second when given. Byte order is kept. The benchmark (``scripts/rpc_bench.py``) puts it between
pyramid-gguf (or llama.cpp) and an RPC server on the same machine, so LAN, Wi-Fi and WAN links
are priced without two machines. Its own cost is Python's: about 0.05-0.1 ms a hop here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """One direction's delay (seconds) and bandwidth (bits per second, 0: unlimited)."""

    delay: float
    bits_per_second: float = 0.0


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: Link) -> None:
    """Copy ``reader`` to ``writer``, each chunk delivered ``link.delay`` after it was read
    (and after the chunks before it have been serialized at ``link.bits_per_second``)."""
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
    free_at = 0.0

    async def deliver() -> None:
        while (item := await queue.get()) is not None:
            due, data = item
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(deliver())
    try:
        while data := await reader.read(1 << 20):
            now = time.perf_counter()
            if link.bits_per_second:
                free_at = max(free_at, now) + len(data) * 8 / link.bits_per_second
                now = free_at
            queue.put_nowait((now + link.delay, data))
    except (ConnectionError, OSError):
        pass
    finally:
        queue.put_nowait(None)
        with contextlib.suppress(ConnectionError, OSError):
            await sender


async def _serve(listen: tuple[str, int], to: tuple[str, int], link: Link) -> asyncio.Server:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*to)
        except OSError:
            client_w.close()
            return
        for sock in (client_w, server_w):
            raw = sock.get_extra_info("socket")
            if raw is not None:
                import socket

                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pump(client_r, server_w, link), _pump(server_r, client_w, link))

    return await asyncio.start_server(handle, *listen)


class Relay:
    """A relay on a thread of its own: ``with Relay(listen, to, Link(0.0015)):``."""

    def __init__(self, listen: tuple[str, int], to: tuple[str, int], link: Link) -> None:
        self.listen, self.to, self.link = listen, to, link
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="relay")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(_serve(self.listen, self.to, self.link))
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> Relay:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", required=True, metavar="HOST:PORT")
    ap.add_argument("--to", required=True, metavar="HOST:PORT")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay")
    ap.add_argument("--mbps", type=float, default=0.0, help="link bandwidth (0: unlimited)")
    a = ap.parse_args()
    link = Link(a.delay_ms / 1000, a.mbps * 1e6)

    async def forever() -> None:
        server = await _serve(_address(a.listen), _address(a.to), link)
        async with server:
            await server.serve_forever()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(forever())


if __name__ == "__main__":
    main()
