"""Where the planner's inputs come from: device profiles and acceptance traces.

Each is the user's own when they measured one (``$PYRAMID_GGUF_HOME/devices/cpu.json`` /
``gpu.json``, ``$PYRAMID_GGUF_HOME/traces/<ladder>.json``), else what ships with the package:
the CPU profile of the machine this release was measured on, the H100's GPU profile, and the
default ladder's traces. Every prediction names its sources.
"""

from __future__ import annotations

from pathlib import Path

from ..core.home import cache_home
from ..decoding.offline.traces import TraceSet
from .compose import DeviceProfile

_DATA = Path(__file__).resolve().parent.parent / "data"
#: The shipped profiles and traces.
SHIPPED_CPU = _DATA / "devices" / "cpu.json"
SHIPPED_GPU = _DATA / "devices" / "h100.json"
SHIPPED_TRACES = _DATA / "traces" / "qwen2.5-coder-demo.json"


def user_profile(kind: str) -> Path:
    """Where a profile the user measured lives (``kind``: ``cpu`` or ``gpu``)."""
    return cache_home() / "devices" / f"{kind}.json"


def cpu_profile(path: Path | None = None) -> DeviceProfile:
    """``path``, else the user's CPU profile, else the shipped one."""
    own = user_profile("cpu")
    return DeviceProfile.load(path or (own if own.is_file() else SHIPPED_CPU))


def gpu_profile(path: Path | None = None) -> DeviceProfile:
    """``path``, else the user's GPU profile, else the H100's."""
    own = user_profile("gpu")
    return DeviceProfile.load(path or (own if own.is_file() else SHIPPED_GPU))


def traces_for(ladder: str, path: Path | None = None) -> TraceSet:
    """``path``, else the traces the user recorded for ``ladder``, else the shipped ones."""
    own = cache_home() / "traces" / f"{ladder}.json"
    return TraceSet.load(path or (own if own.is_file() else SHIPPED_TRACES))
