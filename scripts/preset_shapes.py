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

Mixtures of experts (``MOE_CONFIGS``, issue 49) add their routing and experts: Qwen3's MoE by the
same Q4_K_M recipe (``ffn_gate_exps`` / ``ffn_up_exps`` Q4_K, ``ffn_down_exps`` by the
``ffn_down`` rule, the router ``ffn_gate_inp`` F32 as llama.cpp never quantizes it); gpt-oss as
ggml-org converted it (experts MXFP4 as OpenAI published them, every other matrix ``q8``,
norms, biases and attention sinks F32).

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
from pyramid_gguf.models.shapes import Experts, TierShape
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


@dataclass(frozen=True)
class MoeConfig:
    """A mixture of experts' published ``config.json`` values that decide its tensors
    (``n_ff``: ``intermediate_size``, unused by the experts but written to the header;
    ``expert_ff``: ``moe_intermediate_size`` or gpt-oss's ``intermediate_size``)."""

    arch: str  # qwen3moe, gpt-oss
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_expert: int
    n_used: int
    expert_ff: int
    n_vocab: int
    url: str
    published_size: float = 0.0
    file: str = ""
    #: The matrices' type besides the experts (gpt-oss: as converted; Qwen3: the recipe).
    note: str = ""


MOE_CONFIGS = {
    # Qwen/Qwen3-30B-A3B config.json: hidden_size 2048, num_hidden_layers 48,
    # num_attention_heads 32, num_key_value_heads 4, head_dim 128, intermediate_size 6144,
    # moe_intermediate_size 768, num_experts 128, num_experts_per_tok 8, vocab_size 151936,
    # tie_word_embeddings false, no shared expert.
    "qwen3-30b-a3b": MoeConfig(
        "qwen3moe", 2048, 48, 32, 4, 128, 6144, 128, 8, 768, 151936,
        "https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json",
        18.6e9, "Qwen/Qwen3-30B-A3B-GGUF Qwen3-30B-A3B-Q4_K_M.gguf",
    ),
    # Qwen/Qwen3-Coder-30B-A3B-Instruct: the same block shapes as Qwen3-30B-A3B (its
    # intermediate_size, unused by the experts, recalled as 5472: uncertain).
    "qwen3-coder-30b-a3b": MoeConfig(
        "qwen3moe", 2048, 48, 32, 4, 128, 5472, 128, 8, 768, 151936,
        "https://huggingface.co/Qwen/Qwen3-Coder-30B-A3B-Instruct/blob/main/config.json",
        0.0, "unsloth/Qwen3-Coder-30B-A3B-Instruct-GGUF Qwen3-Coder-30B-A3B-Instruct-Q4_K_M.gguf",
    ),
    # openai/gpt-oss-20b config.json: hidden_size 2880, num_hidden_layers 24,
    # num_attention_heads 64, num_key_value_heads 8, head_dim 64, intermediate_size 2880,
    # num_local_experts 32, experts_per_token 4, vocab_size 201088, untied.
    "gpt-oss-20b": MoeConfig(
        "gpt-oss", 2880, 24, 64, 8, 64, 2880, 32, 4, 2880, 201088,
        "https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json",
        12.1e9, "ggml-org/gpt-oss-20b-GGUF gpt-oss-20b-mxfp4.gguf", "q8",
    ),
    # openai/gpt-oss-120b config.json: as the 20b with 36 layers and 128 experts.
    "gpt-oss-120b": MoeConfig(
        "gpt-oss", 2880, 36, 64, 8, 64, 2880, 128, 4, 2880, 201088,
        "https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json",
        63.4e9, "ggml-org/gpt-oss-120b-GGUF gpt-oss-120b-mxfp4-00001-of-00003.gguf (3 parts)",
        "q8",
    ),
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


def moe_recipe_shape(name: str) -> tuple[TierShape, int]:
    """``(shape, file tensor bytes)`` of the file of ``MOE_CONFIGS[name]`` (see the module
    docstring for the types)."""
    c = MOE_CONFIGS[name]
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    order = sorted(range(c.n_layer), key=str)
    more = {layer for i, layer in enumerate(order) if use_more_bits(i, c.n_layer)}
    f32 = 4
    gpt = c.arch == "gpt-oss"
    layers, experts = [], []
    for i in range(c.n_layer):
        mat = Q.Q8_0 if gpt else Q.Q4_K
        q6 = Q.Q8_0 if gpt else (Q.Q6_K if i in more else Q.Q4_K)
        b = 2 * c.n_embd * f32  # attn_norm, ffn_norm (gpt-oss: post_attention_norm)
        b += nbytes(mat, q_dim, c.n_embd) + nbytes(mat, kv_dim, c.n_embd)
        b += nbytes(q6, kv_dim, c.n_embd) + nbytes(mat, c.n_embd, q_dim)
        b += c.n_expert * c.n_embd * f32  # the router, F32
        if gpt:  # q, k, v, o biases, attention sinks, router bias, experts' biases
            b += (q_dim + 2 * kv_dim + c.n_embd + c.n_head + c.n_expert) * f32
            x = 2 * nbytes(Q.MXFP4, c.expert_ff, c.n_embd) + nbytes(Q.MXFP4, c.n_embd, c.expert_ff)
            x = c.n_expert * (x + (2 * c.expert_ff + c.n_embd) * f32)
        else:  # per-head q and k norms; experts Q4_K, ffn_down_exps by the ffn_down rule
            b += 2 * c.head_dim * f32
            down = Q.Q6_K if i in more else Q.Q4_K
            x = 2 * nbytes(Q.Q4_K, c.expert_ff, c.n_embd) + nbytes(down, c.n_embd, c.expert_ff)
            x *= c.n_expert
        layers.append(b + x)
        experts.append(x)
    embd = nbytes(Q.Q8_0 if gpt else Q.Q4_K, c.n_vocab, c.n_embd)
    head = c.n_embd * f32 + nbytes(Q.Q8_0 if gpt else Q.Q6_K, c.n_vocab, c.n_embd)
    how = (
        "the experts MXFP4, other matrices Q8_0 (as ggml-org's conversion, inferred from the "
        "listed size)"
        if gpt
        else "llama.cpp's Q4_K_M recipe"
    )
    listed = f", listed at {c.published_size / 1e9:.1f} GB" if c.published_size else ""
    file = c.file or "the hub file"
    source = f"{c.url} priced by {how} (scripts/preset_shapes.py); {file}{listed}"
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
        tied=False,
        layer_bytes=tuple(layers),
        head_bytes=head,
        embd_bytes=embd,
        other_bytes=0,
        experts=Experts(c.n_expert, c.n_used, c.expert_ff, 0, tuple(experts)),
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
    for name, m in MOE_CONFIGS.items():
        _, total = moe_recipe_shape(name)
        listed = f"{m.published_size / 1e9:>10.2f}" if m.published_size else f"{'-':>10}"
        diff = f"{total / m.published_size - 1:+.1%}" if m.published_size else "-"
        print(f"{name:<19} {total / 1e9:>10.3f} {listed} {diff:>11}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check").add_argument(
        "--models", type=Path, default=Path("~/.cache/pyramid-gguf/models").expanduser()
    )
    sub.add_parser("recipe").add_argument("name", choices=sorted([*CONFIGS, *MOE_CONFIGS]))
    h = sub.add_parser("header")
    h.add_argument("path", type=Path)
    h.add_argument("--source", required=True, help="where the file came from")
    args = ap.parse_args()
    if args.cmd == "check":
        check(args.models)
    elif args.cmd == "recipe" and args.name in MOE_CONFIGS:
        print(moe_recipe_shape(args.name)[0].to_toml())
    elif args.cmd == "recipe":
        print(recipe_shape(args.name)[0].to_toml())
    else:
        print(shape_of(read_header(args.path), args.source).to_toml())


if __name__ == "__main__":
    main()
