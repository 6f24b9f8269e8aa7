"""Tier shapes for models.toml: what ``pyramid-gguf plan --preset`` needs of files not downloaded.

Two ways to a shape (``pyramid_gguf/models/shapes.py`` says what each value means):

- ``header PATH``: read from a real GGUF header (the presets whose files are here);
- ``recipe NAME``: from a published ``config.json`` (below, with its address) priced by
  llama.cpp's Q4_K_M recipe (``llama_tensor_get_type`` in ``src/llama-quant.cpp``): every
  matrix Q4_K; ``attn_v`` and ``ffn_down`` Q6_K on the blocks ``use_more_bits`` picks (counted
  in the order the tensors are stored, which convert_hf_to_gguf writes sorted by name:
  blk.0, blk.1, blk.10, ...); the output head Q6_K (the token embeddings when they are tied,
  else ``token_embd`` Q4_K); a matrix whose rows are not a multiple of 256 falls back to Q5_0
  (for Q4_K) or Q8_0 (for Q6_K); norms, biases and ``rope_freqs`` F32.

The recipe reproduces the real Qwen2.5-Coder 1.5B Q4_K_M header block by block (``check``),
and the file sizes the hub presets' model cards list within 0.1-2% (the rest is the header: the
tokenizer, 5-8 MB).

    python scripts/preset_shapes.py check                      # recipe vs the files here
    python scripts/preset_shapes.py recipe llama-3.1-8b        # a [shape] table to paste
    python scripts/preset_shapes.py header ~/.cache/pyramid-gguf/models/x.gguf --source "..."
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from pyramid_gguf.core.gguf_header import read_header
from pyramid_gguf.models.shapes import TierShape
from pyramid_gguf.planning.memory import shape_of


@dataclass(frozen=True)
class Config:
    """The values of a model's published ``config.json`` that decide its tensors."""

    arch: str  # llama, qwen2, qwen3
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    tied: bool
    url: str
    #: The Q4_K_M file's size as its model card lists it (bytes, decimal GB as published), or 0.
    published_size: float = 0.0
    file: str = ""


CONFIGS = {
    "llama-3.2-1b": Config(
        "llama", 2048, 16, 32, 8, 64, 8192, 128256, True,
        "https://huggingface.co/meta-llama/Llama-3.2-1B-Instruct/blob/main/config.json",
        0.81e9, "bartowski/Llama-3.2-1B-Instruct-GGUF Llama-3.2-1B-Instruct-Q4_K_M.gguf",
    ),
    "llama-3.2-3b": Config(
        "llama", 3072, 28, 24, 8, 128, 8192, 128256, True,
        "https://huggingface.co/meta-llama/Llama-3.2-3B-Instruct/blob/main/config.json",
        2.02e9, "bartowski/Llama-3.2-3B-Instruct-GGUF Llama-3.2-3B-Instruct-Q4_K_M.gguf",
    ),
    "llama-3.1-8b": Config(
        "llama", 4096, 32, 32, 8, 128, 14336, 128256, False,
        "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/config.json",
        4.92e9, "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
    ),
    "qwen2.5-0.5b": Config(
        "qwen2", 896, 24, 14, 2, 64, 4864, 151936, True,
        "https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct/blob/main/config.json",
        0.40e9, "bartowski/Qwen2.5-0.5B-Instruct-GGUF Qwen2.5-0.5B-Instruct-Q4_K_M.gguf",
    ),
    "qwen2.5-1.5b": Config(
        "qwen2", 1536, 28, 12, 2, 128, 8960, 151936, True,
        "https://huggingface.co/Qwen/Qwen2.5-1.5B-Instruct/blob/main/config.json",
        0.99e9, "bartowski/Qwen2.5-1.5B-Instruct-GGUF Qwen2.5-1.5B-Instruct-Q4_K_M.gguf",
    ),
    "qwen2.5-3b": Config(
        "qwen2", 2048, 36, 16, 2, 128, 11008, 151936, True,
        "https://huggingface.co/Qwen/Qwen2.5-3B-Instruct/blob/main/config.json",
        1.93e9, "bartowski/Qwen2.5-3B-Instruct-GGUF Qwen2.5-3B-Instruct-Q4_K_M.gguf",
    ),
    "qwen2.5-7b": Config(
        "qwen2", 3584, 28, 28, 4, 128, 18944, 152064, False,
        "https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json",
        4.68e9, "bartowski/Qwen2.5-7B-Instruct-GGUF Qwen2.5-7B-Instruct-Q4_K_M.gguf",
    ),
    "qwen3-0.6b": Config(
        "qwen3", 1024, 28, 16, 8, 128, 3072, 151936, True,
        "https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json",
    ),
    "qwen3-1.7b": Config(
        "qwen3", 2048, 28, 16, 8, 128, 6144, 151936, True,
        "https://huggingface.co/Qwen/Qwen3-1.7B/blob/main/config.json",
    ),
    "qwen3-4b": Config(
        "qwen3", 2560, 36, 32, 8, 128, 9728, 151936, True,
        "https://huggingface.co/Qwen/Qwen3-4B/blob/main/config.json",
    ),
    # Big targets (issue 43): sizes as bartowski's model cards list them, where recalled; the
    # repository and file names are the hub's as best known, not checked from this machine.
    "qwen2.5-14b": Config(
        "qwen2", 5120, 48, 40, 8, 128, 13824, 152064, False,
        "https://huggingface.co/Qwen/Qwen2.5-14B-Instruct/blob/main/config.json",
        8.99e9, "bartowski/Qwen2.5-14B-Instruct-GGUF Qwen2.5-14B-Instruct-Q4_K_M.gguf",
    ),
    "qwen2.5-32b": Config(
        "qwen2", 5120, 64, 40, 8, 128, 27648, 152064, False,
        "https://huggingface.co/Qwen/Qwen2.5-32B-Instruct/blob/main/config.json",
        19.85e9, "bartowski/Qwen2.5-32B-Instruct-GGUF Qwen2.5-32B-Instruct-Q4_K_M.gguf",
    ),
    "qwen3-8b": Config(
        "qwen3", 4096, 36, 32, 8, 128, 12288, 151936, False,
        "https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json",
        0.0, "Qwen/Qwen3-8B-GGUF Qwen3-8B-Q4_K_M.gguf",
    ),
    "qwen3-32b": Config(
        "qwen3", 5120, 64, 64, 8, 128, 25600, 151936, False,
        "https://huggingface.co/Qwen/Qwen3-32B/blob/main/config.json",
        0.0, "Qwen/Qwen3-32B-GGUF Qwen3-32B-Q4_K_M.gguf",
    ),
    "llama-3.3-70b": Config(
        "llama", 8192, 80, 64, 8, 128, 28672, 128256, False,
        "https://huggingface.co/meta-llama/Llama-3.3-70B-Instruct/blob/main/config.json",
        42.52e9, "bartowski/Llama-3.3-70B-Instruct-GGUF Llama-3.3-70B-Instruct-Q4_K_M.gguf",
    ),
    # The default ladder's 1.5B and 0.5B as converted by Qwen (untied: the head is stored)
    "qwen2.5-coder-1.5b": Config("qwen2", 1536, 28, 12, 2, 128, 8960, 151936, False, ""),
}  # fmt: skip

#: K-quants need rows of 256 weights; llama.cpp falls back to these types otherwise.
FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q6_K: Q.Q8_0}


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the ``attn_v`` / ``ffn_down`` tensors that get Q6_K in Q4_K_M."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def nbytes(qtype: Q, rows: int, n_in: int) -> int:
    if qtype in FALLBACK and n_in % 256:
        qtype = FALLBACK[qtype]
    block, size = GGML_QUANT_SIZES[qtype]
    return rows * (n_in // block) * size


def recipe_shape(name: str) -> tuple[TierShape, int]:
    """``(shape, file tensor bytes)`` of the Q4_K_M file of ``CONFIGS[name]``."""
    c = CONFIGS[name]
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    order = sorted(range(c.n_layer), key=str)  # blk.0, blk.1, blk.10, ... as stored
    more = {layer for i, layer in enumerate(order) if use_more_bits(i, c.n_layer)}
    f32 = 4
    layers = []
    for i in range(c.n_layer):
        q6 = Q.Q6_K if i in more else Q.Q4_K
        b = 2 * c.n_embd * f32  # attn_norm, ffn_norm
        b += nbytes(Q.Q4_K, q_dim, c.n_embd) + nbytes(Q.Q4_K, kv_dim, c.n_embd)
        b += nbytes(q6, kv_dim, c.n_embd) + nbytes(Q.Q4_K, c.n_embd, q_dim)
        b += 2 * nbytes(Q.Q4_K, c.n_ff, c.n_embd) + nbytes(q6, c.n_embd, c.n_ff)
        if c.arch == "qwen2":  # q, k, v biases
            b += (q_dim + 2 * kv_dim) * f32
        if c.arch == "qwen3":  # per-head q and k norms
            b += 2 * c.head_dim * f32
        layers.append(b)
    embd = nbytes(Q.Q6_K if c.tied else Q.Q4_K, c.n_vocab, c.n_embd)
    head = c.n_embd * f32 + (0 if c.tied else nbytes(Q.Q6_K, c.n_vocab, c.n_embd))
    other = c.head_dim // 2 * f32 if c.arch == "llama" else 0  # rope_freqs (Llama 3.1 / 3.2)
    source = (
        f"{c.url} priced by llama.cpp's Q4_K_M recipe (scripts/preset_shapes.py); "
        f"{c.file or 'the hub file'}"
        + (f", listed at {c.published_size / 1e9:.2f} GB" if c.published_size else "")
    )
    shape = TierShape(
        source=source,
        arch=c.arch,
        n_layer=c.n_layer,
        n_embd=c.n_embd,
        n_head=c.n_head,
        n_head_kv=(c.n_head_kv,) * c.n_layer,
        key_length=c.head_dim,
        value_length=c.head_dim,
        n_ff=c.n_ff,
        n_vocab=c.n_vocab,
        tied=c.tied,
        layer_bytes=tuple(layers),
        head_bytes=head,
        embd_bytes=embd,
        other_bytes=other,
    )
    return shape, shape.tensor_bytes


def check(models: Path) -> None:
    """The recipe against the real Qwen2.5-Coder 1.5B header, block by block; the recipe's
    totals against the published sizes."""
    path = models / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    if path.is_file():
        real = shape_of(read_header(path), str(path))
        ours, _ = recipe_shape("qwen2.5-coder-1.5b")
        same = ours.layer_bytes == real.layer_bytes and ours.head_bytes == real.head_bytes
        print(f"{path.name}: recipe {'matches' if same else 'DIFFERS FROM'} the header")
    print(f"{'model':<19} {'tensors GB':>10} {'listed GB':>10} {'difference':>11}")
    for name, c in CONFIGS.items():
        _, total = recipe_shape(name)
        if c.published_size:
            diff = f"{total / c.published_size - 1:+.1%}"
            print(f"{name:<19} {total / 1e9:>10.3f} {c.published_size / 1e9:>10.2f} {diff:>11}")
        else:
            print(f"{name:<19} {total / 1e9:>10.3f} {'-':>10} {'-':>11}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check").add_argument(
        "--models", type=Path, default=Path("~/.cache/pyramid-gguf/models").expanduser()
    )
    sub.add_parser("recipe").add_argument("name", choices=sorted(CONFIGS))
    h = sub.add_parser("header")
    h.add_argument("path", type=Path)
    h.add_argument("--source", required=True, help="where the file came from")
    args = ap.parse_args()
    if args.cmd == "check":
        check(args.models)
    elif args.cmd == "recipe":
        print(recipe_shape(args.name)[0].to_toml())
    else:
        print(shape_of(read_header(args.path), args.source).to_toml())


if __name__ == "__main__":
    main()
