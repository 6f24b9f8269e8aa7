"""A fast GGUF header reader: key/value metadata and tensor infos, never the tensor data.

``gguf.GGUFReader`` builds numpy views of every array (about 11 s on a 150k-token
vocabulary); the planner only needs scalars, short numeric arrays and tensor shapes, so this
reader walks the header once with :mod:`struct` and skips string arrays by their lengths.

Sizes are in bytes. ``shape`` is ggml's ``ne`` order (innermost dimension first).
:func:`parse_header` reads the same from the first bytes of a file held in memory (a header
fetched by range requests); a prefix too short raises :class:`TruncatedHeader`.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .errors import ModelFileError
from .files import GGUF_MAGIC, check_gguf_path

_DEFAULT_ALIGNMENT = 32
#: Numeric arrays longer than this are summarised by their length only.
_MAX_ARRAY = 4096

# GGUF value types -> struct format (scalars); 8 = string, 9 = array.
_SCALAR = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}  # fmt: skip
_STRING, _ARRAY = 8, 9


class TruncatedHeader(ModelFileError):
    """The bytes given end inside the header (read more of the file and parse again)."""


@dataclass(frozen=True)
class ArrayInfo:
    """A metadata array too long (or of strings) to keep: its element type and length."""

    item_type: int
    length: int


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: name, ggml type id, ``ne`` shape and data size in bytes."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """Everything before the tensor data: metadata, tensor infos and where the data starts."""

    path: PurePath
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    alignment: int
    data_offset: int
    file_size: int

    @property
    def tensor_bytes(self) -> int:
        """Sum of the tensors' data sizes in bytes (alignment padding excluded)."""
        return sum(t.nbytes for t in self.tensors)


def tensor_nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of ``shape`` (ne order) stored as ``ggml_type``."""
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise ModelFileError(f"unknown ggml tensor type id {ggml_type}") from None
    n = 1
    for d in shape:
        n *= d
    return n // block * type_size


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, path: PurePath) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.buf):
            raise TruncatedHeader(f"truncated GGUF header: {self.path}")
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.unpack("Q")
        if self.pos + n > len(self.buf):
            raise TruncatedHeader(f"truncated GGUF header: {self.path}")
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        buf, pos, end = self.buf, self.pos, len(self.buf)
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > end:
                raise TruncatedHeader(f"truncated GGUF header: {self.path}")
            pos += 8 + unpack(buf, pos)[0]
        self.pos = pos

    def value(self, vtype: int) -> Any:
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type = self.unpack("I")
            length = self.unpack("Q")
            if item_type == _STRING or length > _MAX_ARRAY:
                if item_type == _STRING:
                    self.skip_strings(length)
                elif item_type in _SCALAR:
                    self.pos += length * struct.calcsize("<" + _SCALAR[item_type])
                else:
                    raise ModelFileError(f"nested GGUF arrays are not supported: {self.path}")
                return ArrayInfo(item_type, length)
            return [self.value(item_type) for _ in range(length)]
        raise ModelFileError(f"bad GGUF value type {vtype}: {self.path}")


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Parse the header of the GGUF file at ``path`` (raises :class:`ModelFileError`)."""
    p = check_gguf_path(path)
    file_size = p.stat().st_size
    with p.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return parse_header(buf, p, file_size)


def parse_header(buf: mmap.mmap | bytes, path: PurePath, file_size: int) -> GGUFHeader:
    """Parse a GGUF header from ``buf``, the first bytes (at least the header) of a file of
    ``file_size`` bytes named ``path``. Raises :class:`TruncatedHeader` when ``buf`` ends
    inside the header, :class:`ModelFileError` when it is not a GGUF header or the file is too
    short for its tensors."""
    if bytes(buf[:4]) != GGUF_MAGIC:
        if len(buf) < 4:
            raise TruncatedHeader(f"truncated GGUF header: {path}")
        raise ModelFileError(f"not a GGUF file (bad magic {bytes(buf[:4])!r}): {path}")
    cur = _Cursor(buf, path)
    cur.pos = 4
    version = cur.unpack("I")
    if version < 2:
        raise ModelFileError(f"unsupported GGUF version {version}: {path}")
    n_tensors = cur.unpack("Q")
    n_kv = cur.unpack("Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.unpack("I"))
    raw: list[tuple[str, int, tuple[int, ...], int]] = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.unpack("I")
        shape = tuple(cur.unpack("Q") for _ in range(n_dims))
        ggml_type = cur.unpack("I")
        offset = cur.unpack("Q")
        raw.append((name, ggml_type, shape, offset))
    alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
    data_offset = (cur.pos + alignment - 1) // alignment * alignment
    tensors = tuple(
        TensorInfo(name, t, shape, off, tensor_nbytes(t, shape)) for name, t, shape, off in raw
    )
    for t in tensors:
        if data_offset + t.offset + t.nbytes > file_size:
            raise ModelFileError(f"truncated GGUF file (tensor {t.name} past the end): {path}")
    return GGUFHeader(path, version, metadata, tensors, alignment, data_offset, file_size)
