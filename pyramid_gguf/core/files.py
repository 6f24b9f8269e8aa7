"""Files as the user names them: is this path a GGUF file we can read? Is that one a JSON file
of the kind we expect? Can a result be written there?

The checks every loader and reader runs before anything else (the native adapter, the header
reader, the planner, trace and profile files), so a bad path is one line naming what is wrong;
and for the files a long run writes at its end (a benchmark's report, a trace file), the same
line before the run starts rather than after it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .errors import ModelFileError, UserError
from .home import unwritable

T = TypeVar("T")

#: The first four bytes of every GGUF file.
GGUF_MAGIC = b"GGUF"


def check_gguf_path(path: str | os.PathLike[str]) -> Path:
    """A readable GGUF file, or a one-line :class:`ModelFileError` saying what is wrong."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelFileError(f"model file not found: {p}")
    if p.is_dir():
        raise ModelFileError(f"model path is a directory, not a GGUF file: {p}")
    try:
        with p.open("rb") as f:
            head = f.read(8)
    except OSError as e:
        raise ModelFileError(f"cannot read model file {p}: {e.strerror}") from None
    if head[:4] != GGUF_MAGIC:
        raise ModelFileError(f"not a GGUF file (bad magic {head[:4]!r}): {p}")
    if len(head) < 8:
        raise ModelFileError(f"truncated GGUF file: {p}")
    return p


def load_json(path: Path, what: str, parse: Callable[[Any], T]) -> T:
    """``parse`` of the JSON in ``path``, or a one-line :class:`UserError` naming ``what`` the
    file should have been (missing, unreadable, not JSON, or not of that kind)."""
    try:
        return parse(json.loads(path.read_text(encoding="utf-8")))
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {e.strerror}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a {what} ({e})") from None


def check_output(path: str | os.PathLike[str], what: str) -> Path:
    """``path``, once a ``what`` file can be written there (its folder is created), else a
    one-line :class:`UserError`: for a long run to check before it starts."""
    p = Path(path).expanduser()
    problem = "is a directory" if p.is_dir() else unwritable(p.parent)
    if problem is not None:
        raise UserError(f"cannot write {what} {p}: {problem}")
    return p


def write_text(path: str | os.PathLike[str], text: str, what: str) -> None:
    """Write ``text`` (UTF-8) to ``path``, its folder created, or a one-line
    :class:`UserError` naming the ``what`` file that could not be written."""
    p = Path(path).expanduser()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot write {what} {p}: {e.strerror or e}") from None
