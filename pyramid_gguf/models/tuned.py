"""Where ``tune`` keeps its result for a ladder, and reading it back.

A ladder's key hashes its resolved model paths and sizes, so a model file replaced by another
of a different size is a new ladder and its old result is not used. Files live in
``$PYRAMID_GGUF_HOME/tuned/<ladder-key>.json``; :func:`load_tuned` reads the spec back,
:func:`save_tuned` writes a result atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..core.errors import UserError
from ..core.home import cache_home
from ..core.ladder import TIERS, LadderPaths
from ..core.spec import SpecConfig

TUNED_VERSION = 1


def fingerprint(paths: LadderPaths) -> list[list[Any]]:
    """``[tier, resolved path or None / "ngram", size]`` for every tier name."""
    items: list[list[Any]] = []
    for tier in TIERS:
        value = paths.get(tier)
        if not isinstance(value, Path):
            items.append([tier, None if value is None else str(value), 0])
            continue
        p = value.expanduser()
        try:
            p = p.resolve()
            size = p.stat().st_size
        except OSError:
            size = -1
        items.append([tier, str(p), size])
    return items


def ladder_key(paths: LadderPaths) -> str:
    """Hash of the ladder's resolved model paths and sizes (``ngram`` / absent tiers included)."""
    blob = json.dumps(fingerprint(paths), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def tuned_dir() -> Path:
    return cache_home() / "tuned"


def tuned_path(paths: LadderPaths) -> Path:
    """``$PYRAMID_GGUF_HOME/tuned/<ladder-key>.json``."""
    return tuned_dir() / f"{ladder_key(paths)}.json"


def load_tuned(paths: LadderPaths) -> SpecConfig | None:
    """The tuned :class:`SpecConfig` of this ladder, or None (never tuned, stale or unreadable)."""
    try:
        data = json.loads(tuned_path(paths).read_text(encoding="utf-8"))
        if data.get("version") != TUNED_VERSION:
            return None
        known = {f.name for f in fields(SpecConfig)}
        return SpecConfig(**{k: v for k, v in data["spec"].items() if k in known})
    except (OSError, ValueError, KeyError, TypeError, AttributeError, UserError):
        return None


def save_tuned(paths: LadderPaths, result: Mapping[str, Any]) -> Path:
    """Write ``result`` (a tune result's dict, with its ``spec``) for ``paths`` atomically,
    with the ladder's files beside it; return the path."""
    path = tuned_path(paths)
    path.parent.mkdir(parents=True, exist_ok=True)
    ladder = {tier: {"path": p, "size": size} for tier, p, size in fingerprint(paths)}
    body = {"version": TUNED_VERSION, **result, "ladder": ladder}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
