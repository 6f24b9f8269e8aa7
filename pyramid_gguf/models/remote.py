"""A hub tier's GGUF header, read by HTTP range requests: a few MB, never the weights.

``plan --preset NAME`` prices a ladder before download. For a tier with no shape in
``models.toml`` it reads the file's header from the Hugging Face hub: ``get_hf_file_metadata``
resolves the file (size, and the address the hub redirects to), then ranged GETs fetch the
first ``FIRST_BYTES`` and, while the header goes on, twice as much each time, up to
``MAX_BYTES`` (a 150k-token vocabulary's header is 5-8 MB). The hub's auth headers
(``HF_TOKEN``) go with requests to the hub's own host only, not to a storage host it redirects
to. ``HF_ENDPOINT`` points it at another hub (the tests' local server).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from ..core.errors import UserError
from ..core.gguf_header import GGUFHeader, TruncatedHeader, parse_header
from .fetch import hub_error
from .registry import Tier

FIRST_BYTES = 4 << 20
MAX_BYTES = 64 << 20
TIMEOUT_S = 30


@dataclass(frozen=True)
class RemoteHeader:
    """A parsed header and how many bytes were read to get it."""

    header: GGUFHeader
    bytes_read: int


def _get(url: str, headers: dict[str, str], start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of ``url`` (at most that many, even from a server that ignores
    the range)."""
    req = urllib.request.Request(url, headers={**headers, "Range": f"bytes={start}-{stop - 1}"})
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
        if resp.status == 200 and start > 0:  # range ignored: skip to start
            resp.read(start)
        return bytes(resp.read(stop - start))


def hub_header(tier: Tier) -> RemoteHeader:
    """The GGUF header of an ``hf`` tier, read from the hub (one-line :class:`UserError`s)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    assert tier.source == "hf" and tier.repo and tier.revision
    where = f"{tier.repo}/{tier.file}@{tier.revision}"
    url = hf_hub_url(tier.repo, tier.file, revision=tier.revision)
    try:
        meta = get_hf_file_metadata(url)
    except Exception as e:  # the hub raises many types; all become one line
        raise hub_error(tier, e) from None
    size = meta.size
    if not size:
        raise UserError(f"the hub gave no size for {where}; cannot read its header")
    location = meta.location or url
    same_host = urlsplit(location).netloc == urlsplit(url).netloc
    headers = dict(build_hf_headers()) if same_host else {}
    headers["Accept-Encoding"] = "identity"
    label = PurePosixPath("hf://") / tier.repo / tier.file
    buf = b""
    want = min(FIRST_BYTES, size)
    while True:
        try:
            buf += _get(location, headers, len(buf), want)
        except (urllib.error.URLError, OSError) as e:
            raise UserError(f"reading the header of {where} failed: {e}") from None
        try:
            return RemoteHeader(parse_header(buf, label, size), len(buf))
        except TruncatedHeader:
            if want >= min(MAX_BYTES, size):
                raise UserError(
                    f"the header of {where} is longer than {min(MAX_BYTES, size) >> 20} MiB"
                ) from None
            want = min(2 * want, MAX_BYTES, size)
