"""Where the planner's inputs come from: device profiles and acceptance traces.

A device profile is, first to last: the one named (a shipped slug, :mod:`.devices`, or a
profile file); the user's own measured one (``$PYRAMID_GGUF_HOME/devices/gpu.json`` /
``cpu.json``, written by ``pyramid-gguf calibrate --device-profile``); for the GPU, the shipped
profile of the card llama.cpp reports (a CUDA build); else a shipped default, a consumer card
and a desktop CPU (never the datacenter H100). Traces: the user's recorded ones for the ladder
(``$PYRAMID_GGUF_HOME/traces/<ladder>.json``), else the default ladder's shipped ones. Every
prediction names its sources and how each was chosen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import UserError
from ..core.home import cache_home
from ..decoding.offline.traces import TraceSet
from ..decoding.pricing.costs import CostCurve
from . import devices
from .compose import DeviceProfile, Shape

_DATA = Path(__file__).resolve().parent.parent / "data"
SHIPPED_TRACES = _DATA / "traces" / "qwen2.5-coder-demo.json"


@dataclass(frozen=True)
class Chosen:
    """A device profile and how it was chosen, in words (``named``, ``yours (PATH)``,
    ``detected: NAME``, ``default: ...``)."""

    profile: DeviceProfile
    how: str


def user_profile(kind: str) -> Path:
    """Where a profile the user measured lives (``kind``: ``cpu`` or ``gpu``)."""
    return cache_home() / "devices" / f"{kind}.json"


def named_profile(kind: str, name: str | Path) -> DeviceProfile:
    """A profile by shipped name or by file (a path, or any name ending in ``.json``)."""
    text = str(name)
    if isinstance(name, Path) or text.endswith(".json") or "/" in text:
        path = Path(text).expanduser()
        if not path.is_file():
            raise UserError(f"no {kind.upper()} device profile file {path}")
        return DeviceProfile.load(path)
    return DeviceProfile.load(devices.resolve(kind, text).path)


def _hint(kind: str) -> str:
    return (
        f"name yours with --{kind} NAME (pyramid-gguf plan --{kind} list) or measure it "
        "(pyramid-gguf calibrate --device-profile)"
    )


def cpu_profile(name: str | Path | None = None) -> Chosen:
    """``name``, else the user's CPU profile, else the default desktop class."""
    if name is not None:
        return Chosen(named_profile("cpu", name), "named")
    own = user_profile("cpu")
    if own.is_file():
        return Chosen(DeviceProfile.load(own), f"yours ({own})")
    default = devices.DEFAULT["cpu"]
    return Chosen(named_profile("cpu", default), f"default: no CPU named; {_hint('cpu')}")


def gpu_profile(name: str | Path | None = None, *, detect: bool = True) -> Chosen:
    """``name``, else the user's GPU profile, else the shipped profile of the card llama.cpp
    reports (``detect``), else the default consumer card."""
    if name is not None:
        return Chosen(named_profile("gpu", name), "named")
    own = user_profile("gpu")
    if own.is_file():
        return Chosen(DeviceProfile.load(own), f"yours ({own})")
    seen = None
    if detect:
        from ..native import gpu_device  # lazy: native imports llama_cpp

        seen = gpu_device()
    if seen is not None:
        entry = devices.match_device(*seen)
        if entry is not None:
            return Chosen(DeviceProfile.load(entry.path), f"detected: {seen[0]}")
    default = devices.DEFAULT["gpu"]
    why = "no card named or detected"
    if seen is not None:
        why = f"detected {seen[0]!r}, which no shipped profile matches"
    return Chosen(named_profile("gpu", default), f"default: {why}; {_hint('gpu')}")


def save_measured(
    kind: str, name: str, source: str, samples: Sequence[tuple[Shape, CostCurve]]
) -> tuple[DeviceProfile, Path, list[float]]:
    """Fit a profile of this machine's ``kind`` device to measured curves of whole models
    (at least two sizes; a CPU without a per-block term) and save it where :func:`gpu_profile`
    / :func:`cpu_profile` look first: ``(profile, path, largest relative error per sample)``."""
    profile = DeviceProfile.fit(name, source, samples, per_layer=kind == "gpu")
    path = user_profile(kind)
    profile.save(path)
    return profile, path, profile.errors(samples)


def traces_for(ladder: str, path: Path | None = None) -> TraceSet:
    """``path``, else the traces the user recorded for ``ladder``, else the shipped ones."""
    own = cache_home() / "traces" / f"{ladder}.json"
    return TraceSet.load(path or (own if own.is_file() else SHIPPED_TRACES))
