"""System memory as a budget: the host RAM a placement needs against what the machine has.

What a placement keeps in host memory (:attr:`~.vram.Plan.host_bytes`): the weights of every
layer left on the CPU, the KV cache of those layers and the CPU compute buffers. llama.cpp maps
the GGUF file (``mmap``), so a CPU-resident weight is a page of the file in the page cache: it
counts against RAM like any allocation, and the kernel may drop it under pressure, after which the
next token reads it from disk again. The layers offloaded to the GPU are read once through the
same mapping while loading and then unmapped (``llama_model_loader::load_all_data``), so they
cost nothing after loading. Where llama.cpp repacks CPU weights for its faster kernels
(``CPU_REPACK``: Q4_0 and Q4_K on x86 CPUs with AVX2, ARM with dot-product instructions) it
copies them into anonymous memory instead: the same bytes, but an overflow then swaps (or meets
the OOM killer) rather than re-reading the file.

The budget is the machine's RAM (``--ram SIZE``, else ``MemTotal`` of ``/proc/meminfo``, else
``os.sysconf``; a cgroup's ``memory.max`` when lower) less a reserve for the operating system,
the desktop and this process (:func:`reserve`: ``max(2 GiB, 10 %)``). A placement whose host
bytes exceed it does not fit: each token would read the overflow from disk again (a cyclic scan
larger than the page cache evicts what the next token needs first, so at least the overflow and
up to every CPU-resident byte), which :func:`ssd_tps` prices at an assumed
:data:`SSD_BYTES_PER_S` (a PCIe 3.0 NVMe drive's sequential read; page faults through a mapping
usually reach less), as an upper bound. Pure Python.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .memory import GiB, parse_size

#: The reserve kept for the OS, the desktop and this process: at least this much ...
RESERVE_MIN = 2 * GiB
#: ... or this share of the RAM, whichever is larger.
RESERVE_FRACTION = 0.10
#: Assumed read bandwidth of the disk an overflowing placement re-reads weights from (bytes/s).
SSD_BYTES_PER_S = 3e9

MEMINFO = Path("/proc/meminfo")
CGROUP_MAX = Path("/sys/fs/cgroup/memory.max")


def reserve(total_bytes: int) -> int:
    """Bytes of RAM kept for everything but the ladder: ``max(2 GiB, 10 %)``."""
    return max(RESERVE_MIN, int(total_bytes * RESERVE_FRACTION))


@dataclass(frozen=True)
class RamBudget:
    """The machine's RAM (``total_bytes``), the reserve kept and how the size was found."""

    total_bytes: int
    reserve_bytes: int
    how: str

    @property
    def usable_bytes(self) -> int:
        return max(self.total_bytes - self.reserve_bytes, 0)

    def describe(self) -> str:
        total, kept = self.total_bytes / GiB, self.reserve_bytes / GiB
        return (
            f"{self.usable_bytes / GiB:.1f} GiB usable ({total:.1f} GiB {self.how}, "
            f"less a {kept:.1f} GiB reserve for the OS)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "total_bytes": self.total_bytes,
            "reserve_bytes": self.reserve_bytes,
            "usable_bytes": self.usable_bytes,
            "how": self.how,
        }


def _meminfo_total(path: Path) -> int | None:
    try:
        for line in path.read_text(encoding="ascii").splitlines():
            if line.startswith("MemTotal:"):
                parts = line.split()
                return int(parts[1]) * (1024 if parts[2:] == ["kB"] else 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_limit(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def detect_ram(meminfo: Path | None = None, cgroup: Path | None = None) -> tuple[int, str] | None:
    """``(bytes, how)`` of this machine's RAM (``meminfo`` / ``cgroup``: the files to read,
    default :data:`MEMINFO` / :data:`CGROUP_MAX`), or None when it cannot be read."""
    meminfo = meminfo or MEMINFO
    cgroup = cgroup or CGROUP_MAX
    total, how = _meminfo_total(meminfo), f"MemTotal of {meminfo}"
    if total is None:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            how = "os.sysconf"
        except (AttributeError, ValueError, OSError):
            return None
        if total <= 0:
            return None
    limit = _cgroup_limit(cgroup)
    if limit is not None and limit < total:
        total, how = limit, f"the cgroup limit {cgroup}"
    return total, how


def resolve_ram(ram: str | int | None) -> RamBudget | None:
    """The RAM budget of a ``--ram`` value (``None`` or ``auto``: this machine's, detected;
    bytes or a size such as ``32GiB``: that machine's), or None when it cannot be detected."""
    if isinstance(ram, int):
        return RamBudget(ram, reserve(ram), "given")
    if ram is None or ram.strip().lower() == "auto":
        found = detect_ram()
        if found is None:
            return None
        total, how = found
        return RamBudget(total, reserve(total), f"detected: {how}")
    total = parse_size(ram)
    return RamBudget(total, reserve(total), f"--ram {ram.strip()}")


def overflow_bytes(host_bytes: int, budget: RamBudget) -> int:
    """Bytes of a placement's host memory beyond the budget (0: it fits)."""
    return max(host_bytes - budget.usable_bytes, 0)


def ssd_tps(seconds_per_token: float, overflow: int, bandwidth: float = SSD_BYTES_PER_S) -> float:
    """Tokens per second at best when every token also reads ``overflow`` bytes from disk."""
    return 1.0 / (seconds_per_token + overflow / bandwidth)
