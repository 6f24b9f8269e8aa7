"""The cache home: where pyramid-gguf keeps models, cost curves, traces and tuned configs, and
whether a directory can be written before anything slow is done for nothing."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import UserError


def cache_home() -> Path:
    """Where pyramid-gguf keeps models, tuned configs and cost curves: ``$PYRAMID_GGUF_HOME``,
    default ``~/.cache/pyramid-gguf``."""
    return Path(os.environ.get("PYRAMID_GGUF_HOME") or "~/.cache/pyramid-gguf").expanduser()


def unwritable(directory: Path) -> str | None:
    """Why no file can be written in ``directory`` (created if missing), or None when one can.

    Tried, not inferred from permission bits: a read-only file system, a file in the way or a
    directory of another user all fail here, before anything slow is done for nothing.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return None


def require_writable(directory: Path, what: str) -> None:
    """A :class:`UserError` unless files can be written in ``directory`` (``what`` is for)."""
    problem = unwritable(directory)
    if problem is not None:
        raise UserError(
            f"cannot write {what} to {directory}: {problem} "
            "(set PYRAMID_GGUF_HOME to a writable directory)"
        )
