"""Tier shapes shipped in ``models.toml``: what the planner needs of a model file it does not have.

A tier may carry a ``shape`` table, so that ``pyramid-gguf plan --preset NAME`` prices a ladder
before anything is downloaded. Each value is what the file's GGUF header says (``source`` says
where it was read: the real header, or a published ``config.json`` priced by llama.cpp's
quantization recipe, ``scripts/preset_shapes.py``). Sizes in bytes:

- ``layer_bytes[i]``: the tensors ``blk.i.*``;
- ``head_bytes``: ``output.weight`` (absent when the embeddings are tied) and ``output_norm``,
  as stored in the file;
- ``embd_bytes``: ``token_embd``; ``other_bytes``: any other tensor (``rope_freqs``, ...).

``n_head_kv`` is one number, or one per block; ``key_length`` / ``value_length`` are the
per-head dimensions of K and V (default ``n_embd / n_head``).

A mixture of experts adds its routing (:class:`Experts`): ``n_expert`` routed experts per block,
``n_expert_used`` of them per token (``<arch>.expert_count``, ``<arch>.expert_used_count``),
``expert_ff`` / ``shared_expert_ff`` (``<arch>.expert_feed_forward_length``,
``<arch>.expert_shared_feed_forward_length``; 0: none) and ``expert_bytes[i]``: the routed
experts' tensors of block i (``blk.i.*_exps.*``, every expert), a part of ``layer_bytes[i]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core.errors import UserError

_INTS = ("n_layer", "n_embd", "n_head", "n_ff", "n_vocab", "head_bytes", "embd_bytes")
#: Every key of a shape table; all but ``key_length``, ``value_length``, ``other_bytes`` needed.
SHAPE_KEYS = (
    "source", "arch", *_INTS, "n_head_kv", "key_length", "value_length", "tied",
    "layer_bytes", "other_bytes",
    "n_expert", "n_expert_used", "expert_ff", "shared_expert_ff", "expert_bytes",
)  # fmt: skip
_OPTIONAL = ("key_length", "value_length", "other_bytes")
#: The keys of a mixture of experts' routing: all of them, or none (a dense model).
EXPERT_KEYS = ("n_expert", "n_expert_used", "expert_ff", "shared_expert_ff", "expert_bytes")


@dataclass(frozen=True)
class Experts:
    """The routed experts of a mixture of experts (see the module docstring): counts, FFN
    widths, and bytes of every routed expert per block (``layer_bytes``, ``n_layer`` entries)."""

    n_expert: int
    n_used: int
    expert_ff: int
    shared_ff: int
    layer_bytes: tuple[int, ...]

    def __post_init__(self) -> None:
        if not 0 < self.n_used <= self.n_expert:
            raise UserError(
                f"a mixture of experts needs 0 < experts used ({self.n_used}) <= experts "
                f"({self.n_expert})"
            )

    def bytes_per_expert(self, block: int) -> float:
        """Bytes of one routed expert of ``block`` (its share of the stacked tensors)."""
        return self.layer_bytes[block] / self.n_expert

    def keep(self, blocks: list[int]) -> Experts:
        """Only ``blocks`` kept (a tier derived by layer skipping), renumbered."""
        return Experts(self.n_expert, self.n_used, self.expert_ff, self.shared_ff,
                       tuple(self.layer_bytes[i] for i in blocks))  # fmt: skip


@dataclass(frozen=True)
class TierShape:
    """The memory facts of one GGUF file as ``models.toml`` ships them (see the module
    docstring; bytes, and per-block tuples of ``n_layer`` entries)."""

    source: str
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: tuple[int, ...]
    key_length: int
    value_length: int
    n_ff: int
    n_vocab: int
    tied: bool
    layer_bytes: tuple[int, ...]
    head_bytes: int
    embd_bytes: int
    other_bytes: int = 0
    experts: Experts | None = None

    @property
    def tensor_bytes(self) -> int:
        """Bytes of every tensor stored in the file."""
        return sum(self.layer_bytes) + self.head_bytes + self.embd_bytes + self.other_bytes

    def to_toml(self) -> str:
        """The shape as the body of a ``[presets.NAME.TIER.shape]`` table."""
        kv = self.n_head_kv[0] if len(set(self.n_head_kv)) == 1 else list(self.n_head_kv)
        rows: list[tuple[str, Any]] = [
            ("source", self.source),
            ("arch", self.arch),
            ("n_layer", self.n_layer),
            ("n_embd", self.n_embd),
            ("n_head", self.n_head),
            ("n_head_kv", kv),
            ("key_length", self.key_length),
            ("value_length", self.value_length),
            ("n_ff", self.n_ff),
            ("n_vocab", self.n_vocab),
            ("tied", self.tied),
            ("layer_bytes", list(self.layer_bytes)),
            ("head_bytes", self.head_bytes),
            ("embd_bytes", self.embd_bytes),
            ("other_bytes", self.other_bytes),
        ]
        if self.experts is not None:
            x = self.experts
            rows += [
                ("n_expert", x.n_expert),
                ("n_expert_used", x.n_used),
                ("expert_ff", x.expert_ff),
                ("shared_expert_ff", x.shared_ff),
                ("expert_bytes", list(x.layer_bytes)),
            ]
        return "\n".join(f"{k} = {_toml_value(v)}" for k, v in rows)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(str(x) for x in v) + "]"
    return str(v)


def _int(table: Mapping[str, Any], key: str, where: str) -> int:
    value = table[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise UserError(f"{where}.{key}: expected a non-negative integer, got {value!r}")
    return value


def _ints(value: Any, n: int, key: str, where: str) -> tuple[int, ...]:
    """One integer for every block, or a list of ``n``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * n
    if (
        isinstance(value, list)
        and len(value) == n
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        return tuple(value)
    raise UserError(f"{where}.{key}: expected an integer or a list of {n} integers")


def parse_shape(table: Any, where: str) -> TierShape:
    """A validated :class:`TierShape` from a ``shape`` table (one-line :class:`UserError`s)."""
    if not isinstance(table, dict):
        raise UserError(f"{where}: a shape must be a table")
    for key in table:
        if key not in SHAPE_KEYS:
            raise UserError(f"{where}: unknown key {key!r}; valid: {', '.join(SHAPE_KEYS)}")
    for key in SHAPE_KEYS:
        if key not in table and key not in _OPTIONAL and key not in EXPERT_KEYS:
            raise UserError(f"{where}: missing key {key!r}")
    for key in ("source", "arch"):
        if not isinstance(table[key], str) or not table[key]:
            raise UserError(f"{where}.{key}: expected a string")
    if not isinstance(table["tied"], bool):
        raise UserError(f"{where}.tied: expected true or false")
    ints = {k: _int(table, k, where) for k in _INTS}
    n_layer, n_head = ints["n_layer"], ints["n_head"]
    if n_layer == 0 or n_head == 0:
        raise UserError(f"{where}: n_layer and n_head must be positive")
    head_dim = ints["n_embd"] // n_head
    key_length = _int(table, "key_length", where) if "key_length" in table else head_dim
    value_length = _int(table, "value_length", where) if "value_length" in table else head_dim
    return TierShape(
        source=table["source"],
        arch=table["arch"],
        n_layer=n_layer,
        n_embd=ints["n_embd"],
        n_head=n_head,
        n_head_kv=_ints(table["n_head_kv"], n_layer, "n_head_kv", where),
        key_length=key_length,
        value_length=value_length,
        n_ff=ints["n_ff"],
        n_vocab=ints["n_vocab"],
        tied=table["tied"],
        layer_bytes=_ints(table["layer_bytes"], n_layer, "layer_bytes", where),
        head_bytes=ints["head_bytes"],
        embd_bytes=ints["embd_bytes"],
        other_bytes=_int(table, "other_bytes", where) if "other_bytes" in table else 0,
        experts=_experts(table, n_layer, where),
    )


def _experts(table: Mapping[str, Any], n_layer: int, where: str) -> Experts | None:
    """A shape table's routing (:data:`EXPERT_KEYS`: all or none), validated."""
    given = [k for k in EXPERT_KEYS if k in table]
    if not given:
        return None
    if len(given) != len(EXPERT_KEYS):
        missing = ", ".join(k for k in EXPERT_KEYS if k not in table)
        raise UserError(f"{where}: a mixture of experts' shape also needs {missing}")
    ints = {k: _int(table, k, where) for k in EXPERT_KEYS[:4]}
    experts = Experts(
        n_expert=ints["n_expert"],
        n_used=ints["n_expert_used"],
        expert_ff=ints["expert_ff"],
        shared_ff=ints["shared_expert_ff"],
        layer_bytes=_ints(table["expert_bytes"], n_layer, "expert_bytes", where),
    )
    layers = _ints(table["layer_bytes"], n_layer, "layer_bytes", where)
    if any(e > b for e, b in zip(experts.layer_bytes, layers, strict=True)):
        raise UserError(f"{where}.expert_bytes: more than a block's layer_bytes")
    return experts
