"""Derive a smaller tier from one GGUF: layer skipping and requantizing.

:func:`keep_layers` copies a GGUF keeping a subset of its ``blk.N.*`` tensors (quantized bytes
copied as they are, blocks renumbered, ``<arch>.block_count`` and per-layer metadata arrays
cut to match). :func:`requantize` runs llama.cpp's quantizer. Both write a temporary file and
rename it, so the output path never holds a half-written model, and both record provenance in
the output's metadata (``pyramid_gguf.*`` keys).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gguf

from ..core.errors import UserError
from ..core.files import check_gguf_path
from .fetch import file_sha256

_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")
KEY_DERIVED_FROM = "pyramid_gguf.derived_from"
KEY_KEEP_LAYERS = "pyramid_gguf.keep_layers"
KEY_QUANTIZE = "pyramid_gguf.quantize"


def _out_of_range(n_layer: int) -> UserError:
    return UserError(f"layer out of range: the model has {n_layer} layers (0-{n_layer - 1})")


def parse_layer_list(spec: str, n_layer: int | None = None) -> list[int]:
    """``"0-9,12,14-27"`` -> sorted unique layer indices; checked against ``n_layer`` if given."""
    layers: set[int] = set()
    for part in (p.strip() for p in spec.split(",")):
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not m:
            raise UserError(f"bad layer list {spec!r}: use indices and ranges like 0-9,12,14-27")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        if hi < lo:
            raise UserError(f"bad layer range {part!r} in {spec!r}: end before start")
        layers.update(range(lo, hi + 1))
    out = sorted(layers)
    if n_layer is not None and out and out[-1] >= n_layer:
        raise _out_of_range(n_layer)
    return out


def skip_every(n: int, n_layer: int) -> list[int]:
    """Drop every ``n``-th layer (1-based: n=4 drops layers 3, 7, ...); first and last stay."""
    if n < 2:
        raise UserError(f"--skip-every must be at least 2, got {n}")
    return [i for i in range(n_layer) if (i + 1) % n or i in (0, n_layer - 1)]


def format_layers(layers: Sequence[int]) -> str:
    """Inverse of :func:`parse_layer_list`: ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    xs = sorted(layers)
    parts: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts)


def _provenance(src: Path) -> str:
    return f"{src.name} sha256:{file_sha256(src)[:16]}"


def _field_value(field: Any) -> tuple[Any, gguf.GGUFValueType, gguf.GGUFValueType | None]:
    vtype = field.types[0]
    sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
    return field.contents(), vtype, sub


def _n_layer(reader: gguf.GGUFReader, arch: str) -> int:
    field = reader.fields.get(f"{arch}.block_count")
    if field is None:
        raise UserError(f"GGUF has no {arch}.block_count: not a layered model")
    return int(field.contents())


def _copy(
    reader: gguf.GGUFReader,
    out: Path,
    layers: Sequence[int] | None,
    extra: dict[str, str],
) -> None:
    """Write ``reader``'s model to ``out`` keeping ``layers`` (all if None), plus ``extra`` KVs."""
    arch = str(reader.fields["general.architecture"].contents())
    n_layer = _n_layer(reader, arch)
    keep = list(range(n_layer)) if layers is None else list(layers)
    renumber = {old: new for new, old in enumerate(keep)}
    writer = gguf.GGUFWriter(str(out), arch=arch, endianess=reader.endianess)
    alignment = reader.fields.get("general.alignment")
    if alignment is not None:
        writer.data_alignment = int(alignment.contents())
    for field in reader.fields.values():
        name = field.name
        if name == "general.architecture" or name.startswith("GGUF.") or name in extra:
            continue
        value, vtype, sub = _field_value(field)
        if field.name == f"{arch}.block_count":
            value = len(keep)
        elif name.startswith(f"{arch}.") and isinstance(value, list) and len(value) == n_layer:
            value = [value[i] for i in keep]  # per-layer arrays (head counts, window flags...)
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    for key, text in extra.items():
        writer.add_key_value(key, text, gguf.GGUFValueType.STRING)
    tensors = []
    for t in reader.tensors:
        name = t.name
        m = _BLOCK.match(name)
        if m:
            if int(m.group(1)) not in renumber:
                continue
            name = f"blk.{renumber[int(m.group(1))]}.{m.group(2)}"
        tensors.append(t)
        writer.add_tensor_info(name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()


def _output_for(src: Path, out: str | os.PathLike[str]) -> Path:
    """``out`` as a path, refused when it names the input (the rename would replace it)."""
    out_p = Path(out)
    if out_p.resolve() == src.resolve() or (out_p.exists() and os.path.samefile(out_p, src)):
        raise UserError(f"the output {out_p} is the input model; give -o another path")
    return out_p


def _tmp_for(out: Path) -> Path:
    return out.with_name(f".{out.name}.{os.getpid()}.tmp")


def keep_layers(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    layers: Sequence[int] | None = None,
    layer_spec: str | None = None,
    every: int | None = None,
) -> Path:
    """Copy ``src`` to ``out`` keeping only some transformer blocks; returns ``out``.

    Give exactly one of ``layers`` (indices), ``layer_spec`` (``"0-9,12"``) or ``every``
    (drop every n-th layer). Tensor types and bytes are unchanged; the vocabulary is too.
    """
    src_p = check_gguf_path(src)
    out_p = _output_for(src_p, out)
    if sum(x is not None for x in (layers, layer_spec, every)) != 1:
        raise UserError("give exactly one of --keep-layers or --skip-every")
    print(f"reading {src_p.name} ...", file=sys.stderr)
    reader = gguf.GGUFReader(str(src_p))
    n_layer = _n_layer(reader, str(reader.fields["general.architecture"].contents()))
    if layer_spec is not None:
        keep = parse_layer_list(layer_spec, n_layer)
    elif every is not None:
        keep = skip_every(every, n_layer)
    else:
        keep = sorted(set(layers or ()))
        if keep and (keep[0] < 0 or keep[-1] >= n_layer):
            raise _out_of_range(n_layer)
    if not keep:
        raise UserError("no layers kept")
    extra = {KEY_DERIVED_FROM: _provenance(src_p), KEY_KEEP_LAYERS: format_layers(keep)}
    print(f"writing {out_p.name}: {len(keep)} of {n_layer} layers", file=sys.stderr)
    _atomic(out_p, lambda tmp: _copy(reader, tmp, keep, extra))
    return out_p


def requantize(
    src: str | os.PathLike[str], out: str | os.PathLike[str], qtype: str, *, threads: int
) -> Path:
    """Requantize ``src`` to ``qtype`` (a :func:`~pyramid_gguf.native.ftype_names` name)."""
    from ..native import ftype_names, quantize  # lazy: only requantizing needs llama.cpp

    src_p = check_gguf_path(src)
    out_p = _output_for(src_p, out)
    names = ftype_names()
    key = qtype.upper()
    if key not in names:
        raise UserError(f"unknown quantization type {qtype!r}; valid: {', '.join(sorted(names))}")
    extra = {KEY_DERIVED_FROM: _provenance(src_p), KEY_QUANTIZE: key}

    def build(tmp: Path) -> None:
        stage = tmp.with_name(tmp.name + ".q")
        try:
            print(f"quantizing {src_p.name} to {key} ...", file=sys.stderr)
            quantize(src_p, stage, names[key], threads=threads)
            _copy(gguf.GGUFReader(str(stage)), tmp, None, extra)  # adds the provenance keys
        finally:
            stage.unlink(missing_ok=True)

    _atomic(out_p, build)
    return out_p


def _atomic(out: Path, build: Any) -> None:
    """Run ``build(tmp)`` then rename ``tmp`` to ``out``; remove ``tmp`` on any failure."""
    tmp = _tmp_for(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        build(tmp)
        os.replace(tmp, out)
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)
