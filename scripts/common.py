"""What several scripts set up alike: llama.cpp's own tools (the peer build of
``../shared/tools/llama_peer.sh build``), a free local port, and the geometric mean their
summaries report. Scripts run as ``python scripts/NAME.py`` import it as ``common``."""

from __future__ import annotations

import math
import socket
import statistics
from collections.abc import Sequence
from pathlib import Path

#: Where ``llama_peer.sh build`` puts llama.cpp's tools (its ``PEER_HOME``).
PEER_HOME = Path.home() / ".cache" / "llama-peer"


def peer_bin(home: Path, name: str) -> Path:
    """llama.cpp's tool ``name`` (``llama-bench``, ``llama-speculative-simple``...) built under
    ``home``; exits with a one-line message when it is not built."""
    found = sorted(home.glob(f"*/vendor/llama.cpp/build/bin/{name}"))
    if not found:
        raise SystemExit(f"no {name} under {home}: run ../shared/tools/llama_peer.sh build")
    return found[-1]


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def geomean(values: Sequence[float]) -> float:
    """The geometric mean of positive ``values``."""
    return math.exp(statistics.mean(math.log(v) for v in values))
