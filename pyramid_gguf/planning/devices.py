"""The device profiles shipped with the package, and how a user (or llama.cpp) names one.

GPUs: the consumer and laptop cards fitted to published llama.cpp figures
(``data/devices/gpus/*.json``, :mod:`.hardware`) and the H100 this project measured, a
datacenter card (``data/devices/h100-80gb.json``). CPUs: desktop classes by memory and cores
(``data/devices/cpus/*.json``) and this project's 2-core build VM (``data/devices/cpu.json``).
Each is named by its slug (``rtx-4060-8gb``); a looser name works when it picks one card
(``"RTX 4060"``, ``rtx-4060-ti-16gb``, ``"NVIDIA GeForce RTX 3060 Ti"``), and a device name as
CUDA reports it maps to a slug by the same rule, its memory size settling the variant.
Pure Python.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import UserError

_DEVICES = Path(__file__).resolve().parent.parent / "data" / "devices"
#: Profiles outside ``gpus/`` and ``cpus/``: measured ones.
_MEASURED = {"gpu": (_DEVICES / "h100-80gb.json",), "cpu": (_DEVICES / "cpu.json",)}
KINDS = ("gpu", "cpu")
#: What ``plan`` prices with when no card is named, measured or detected: the most common
#: card of the consumer range (published figures behind it), and a desktop beside it.
DEFAULT = {"gpu": "rtx-3060-12gb", "cpu": "ddr4-8core"}
#: Words in a device's name that say nothing about which card it is.
_NOISE = {"nvidia", "geforce", "rtx", "gpu", "graphics", "max", "q"} | {
    "hbm3",
    "hbm3e",
    "pcie",
    "sxm",
    "sxm5",
}
_GIB = re.compile(r"^(\d+)(gb|g|gib)$")


@dataclass(frozen=True)
class DeviceEntry:
    """One shipped profile as ``plan --gpu list`` shows it: ``vram_bytes`` (0 for a CPU),
    ``bandwidth`` in bytes/s (0: not given), ``basis`` (``published``: fitted to or checked
    against figures of this device; ``spec-derived``: its spec sheet and the fitted model;
    ``measured``: fitted to this project's own curves), ``fit_error`` in words."""

    slug: str
    kind: str
    full_name: str
    cls: str
    vram_bytes: int
    bandwidth: float
    basis: str
    fit_error: str
    path: Path

    @classmethod
    def read(cls, path: Path) -> DeviceEntry:
        d = json.loads(path.read_text(encoding="utf-8"))
        return cls(
            slug=str(d["name"]),
            kind=str(d.get("kind", "gpu")),
            full_name=str(d.get("full_name", d["name"])),
            cls=str(d.get("class", "")),
            vram_bytes=int(d.get("vram_bytes", 0)),
            bandwidth=float(d.get("bandwidth", 0.0)),
            basis=str(d.get("basis", "")),
            fit_error=fit_summary(d),
            path=path,
        )


def fit_summary(d: dict[str, Any]) -> str:
    """How far a profile's predictions fell from its device's published token steps, in
    words: ``fit 1-6% (2), held out 13.5% (1)``; a measured profile's own note."""
    if "fit_note" in d:
        return str(d["fit_note"])
    parts = []
    for use in ("fit", "held_out"):
        errs = sorted(abs(r["error"]) for r in d.get("fit_error", {}).get(use, []))
        if not errs:
            continue
        lo, hi = f"{errs[0]:.1%}", f"{errs[-1]:.1%}"
        span = lo if lo == hi else f"{lo}-{hi}"
        parts.append(f"{use.replace('_', ' ')} {span} ({len(errs)})")
    return ", ".join(parts) or "no published figure of this device"


def catalogue(kind: str) -> dict[str, DeviceEntry]:
    """Every shipped profile of ``kind`` (``gpu`` or ``cpu``) by slug: the fitted ones by
    memory size, then the measured ones."""
    paths = [*sorted((_DEVICES / f"{kind}s").glob("*.json"), key=_natural), *_MEASURED[kind]]
    entries = [DeviceEntry.read(p) for p in paths]
    return {e.slug: e for e in entries}


def _natural(path: Path) -> list[Any]:
    """``rtx-4060-8gb`` before ``rtx-4060-ti-8gb``, ``ddr4-8core`` before ``ddr4-16core``."""
    return [(int(t), "") if t.isdigit() else (-1, t) for t in re.split(r"(\d+)", path.stem)]


def _words(name: str) -> tuple[tuple[str, ...], int | None]:
    """A name's words that tell cards apart, and the memory size it states (GiB), if any."""
    words, size = [], None
    for w in re.split(r"[^a-z0-9]+", name.lower()):
        m = _GIB.match(w)
        if m:
            size = int(m.group(1))
        elif w and w not in _NOISE:
            words.append(w)
    return tuple(words), size


def candidates(name: str, entries: dict[str, DeviceEntry]) -> list[DeviceEntry]:
    """The entries ``name`` may mean: the slug itself, else every entry whose words (its
    memory size aside) are the name's, of the stated size where it states one."""
    key = name.strip().lower()
    if key in entries:
        return [entries[key]]
    words, size = _words(key)
    found = []
    for e in entries.values():
        slug_words, slug_size = _words(e.slug)
        if slug_words == words and (size is None or size == slug_size):
            found.append(e)
    return found


def resolve(kind: str, name: str) -> DeviceEntry:
    """The shipped profile ``name`` means (a one-line :class:`UserError` listing the valid
    names when it means none, or more than one)."""
    entries = catalogue(kind)
    found = candidates(name, entries)
    if len(found) == 1:
        return found[0]
    if found:
        which = ", ".join(e.slug for e in found)
        raise UserError(f"--{kind} {name!r} could mean {which}; name one")
    raise UserError(
        f"unknown {kind.upper()} {name!r}; valid: {', '.join(entries)} "
        f"(pyramid-gguf plan --{kind} list), or a profile file"
    )


def match_device(description: str, total_bytes: int | None = None) -> DeviceEntry | None:
    """The shipped GPU profile of a device as llama.cpp names it (``NVIDIA GeForce RTX 4060
    Ti``), the variant whose memory is nearest ``total_bytes`` when the name fits several;
    None when no shipped card matches."""
    found = candidates(description, catalogue("gpu"))
    if not found:
        return None
    if total_bytes is None:
        return found[0] if len(found) == 1 else None
    return min(found, key=lambda e: abs(e.vram_bytes - total_bytes))


def format_list(kind: str) -> str:
    """The table ``plan --gpu list`` / ``--cpu list`` prints."""
    entries = list(catalogue(kind).values())
    head = f"{'slug':<22} {'name':<46} {'VRAM':>5} {'GB/s':>5} {'basis':<12} its figures' error"
    lines = [head, "-" * len(head)]
    for e in entries:
        vram = f"{e.vram_bytes / 2**30:.0f}G" if e.vram_bytes else "-"
        bw = f"{e.bandwidth / 1e9:.0f}" if e.bandwidth else "-"
        lines.append(
            f"{e.slug:<22} {e.full_name[:46]:<46} {vram:>5} {bw:>5} {e.basis:<12} {e.fit_error}"
        )
    lines.append(
        f"default: {DEFAULT[kind]}; name one with --{kind} SLUG (or a profile file); "
        "predicted profiles: docs/consumer-gpus.md"
    )
    return "\n".join(lines)
