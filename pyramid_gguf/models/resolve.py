"""The ladder a user names, with the knobs it runs with: the one resolution the CLI, the server
and the Python API share.

A ladder is named by a ``models.toml`` preset (fetched, assembled or derived when missing) or
by model paths. Its base :class:`~pyramid_gguf.core.spec.SpecConfig` is what ``tune`` saved for
exactly these files, else the preset's recommendation, else ``auto``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.ladder import LadderPaths
from ..core.spec import SpecConfig
from .presets import DEFAULT_PRESET, resolve_preset
from .tuned import load_tuned


@dataclass(frozen=True)
class Resolved:
    """A ladder's files, its base spec and its display name; ``tuned``: the spec is what
    ``tune`` saved for these files."""

    name: str
    paths: LadderPaths
    spec: SpecConfig
    tuned: bool = False


def resolve_ladder(
    preset: str | None = None, paths: LadderPaths | None = None, *, fetch: bool = True
) -> Resolved:
    """The files and base spec of ``paths``, else of ``preset``, else of the default preset
    (fetching what is missing unless ``fetch`` is False)."""
    if paths is None:
        r = resolve_preset(preset or DEFAULT_PRESET, fetch=fetch)
        resolved = Resolved(r.name, r.paths, r.spec)
    else:
        resolved = Resolved(paths.target.stem, paths, SpecConfig())
    tuned = load_tuned(resolved.paths)
    if tuned is None:
        return resolved
    return Resolved(resolved.name, resolved.paths, tuned, tuned=True)
