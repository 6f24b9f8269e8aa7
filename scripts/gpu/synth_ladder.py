"""Random-weight GGUF ladders with the shapes and file sizes of real Q4_K_M ladders.

Their timings and memory are real; their acceptance rates are meaningless (the tiers share a
vocabulary, not knowledge). Tensors are written directly as K-quant blocks of random bytes with
sane scales, the types chosen as llama.cpp's Q4_K_M recipe chooses them (``attn_v`` and
``ffn_down`` in Q6_K on the layers ``use_more_bits`` picks, the output head in Q6_K, rows not
a multiple of 256 in Q8_0), so an 8B file takes seconds instead of an f16 write and a quantize.

    python scripts/gpu/synth_ladder.py --out /tmp/ladders llama-1b llama-3b llama-8b
    python scripts/gpu/synth_ladder.py --out /tmp/ladders --ladder qwen [--layers-scale 0.25]
    python scripts/gpu/synth_ladder.py --out /tmp/shapes --ladder llama --header-only

``--header-only`` writes the header and leaves the tensor data a hole (a sparse file of the
full size, no disk used): enough for ``pyramid-gguf plan``, which reads headers only.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from synth import tiny_vocab

Q = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class Shape:
    """The hyper-parameters that decide a model's cost and memory."""

    arch: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    tied: bool
    rope_base: float
    qkv_bias: bool = False


SHAPES = {  # from the real models' config.json
    "llama-1b": Shape("llama", 2048, 16, 32, 8, 8192, 128256, True, 500000.0),
    "llama-3b": Shape("llama", 3072, 28, 24, 8, 8192, 128256, True, 500000.0),
    "llama-8b": Shape("llama", 4096, 32, 32, 8, 14336, 128256, False, 500000.0),
    "qwen-0.5b": Shape("qwen2", 896, 24, 14, 2, 4864, 151936, True, 1e6, True),
    "qwen-1.5b": Shape("qwen2", 1536, 28, 12, 2, 8960, 151936, True, 1e6, True),
    "qwen-3b": Shape("qwen2", 2048, 36, 16, 2, 11008, 151936, True, 1e6, True),
    "qwen-7b": Shape("qwen2", 3584, 28, 28, 4, 18944, 152064, False, 1e6, True),
    "qwen-14b": Shape("qwen2", 5120, 48, 40, 8, 13824, 152064, False, 1e6, True),
    "qwen-32b": Shape("qwen2", 5120, 64, 40, 8, 27648, 152064, False, 1e6, True),
    # The GPU kit's CPU rehearsal (kit.sh --cpu): Qwen2-style, a few MiB each.
    "tiny-s": Shape("qwen2", 256, 2, 4, 2, 512, 4096, True, 1e6, True),
    "tiny-m": Shape("qwen2", 256, 4, 4, 2, 768, 4096, True, 1e6, True),
    "tiny-l": Shape("qwen2", 512, 8, 8, 2, 1536, 4096, False, 1e6, True),
}
LADDERS = {
    "llama": ("llama-1b", "llama-3b", "llama-8b"),
    "qwen": ("qwen-0.5b", "qwen-1.5b", "qwen-7b"),
    # Targets bigger than a consumer card (the big-target issue): the 0.5B draft and a
    # qualifier whole on the GPU, the target split with most of its blocks in system RAM.
    "qwen-32b": ("qwen-0.5b", "qwen-7b", "qwen-32b"),
    "qwen-14b": ("qwen-0.5b", "qwen-3b", "qwen-14b"),
    "tiny": ("tiny-s", "tiny-m", "tiny-l"),
}

#: Per block type: bytes per block of 256 (or 32) weights, where the f16 scale(s) sit, and the
#: scale that gives weights a standard deviation of about 1 (random bytes elsewhere).
_BLOCK = {
    Q.Q4_K: ((0, 2), 1 / 300),  # w = d*sc*q - dmin*m; dmin = 7.5 d centres it
    Q.Q6_K: ((208,), 1 / 1350),  # w = d*scale*(q - 32)
    Q.Q8_0: ((0,), 1 / 73),  # w = d*q
}


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the layers whose ``attn_v``/``ffn_down`` get more bits."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def block_type(name: str, n_in: int, shape: Shape, layer: int) -> gguf.GGMLQuantizationType:
    """The Q4_K_M recipe, with rows that K-quants cannot split in Q8_0."""
    if n_in % 256:
        return Q.Q8_0
    head = name == "output.weight" or (shape.tied and name == "token_embd.weight")
    more = name.endswith(("attn_v.weight", "ffn_down.weight")) and use_more_bits(
        layer, shape.n_layer
    )
    return Q.Q6_K if head or more else Q.Q4_K


class RandomBlocks:
    """Quantized tensors of random bytes drawn from one pool, scales set per block type."""

    def __init__(self, seed: int, pool_bytes: int = 1 << 26) -> None:
        self.rng = np.random.default_rng(seed)
        self.pool = self.rng.integers(0, 256, size=pool_bytes, dtype=np.uint8)

    def tensor(self, qtype: gguf.GGMLQuantizationType, rows: int, n_in: int) -> np.ndarray:
        """``[rows, bytes per row]`` uint8 blocks of a ``[rows, n_in]`` weight matrix."""
        per_block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n_blocks = rows * n_in // per_block
        start = int(self.rng.integers(0, self.pool.size))
        flat = np.resize(np.roll(self.pool, -start), n_blocks * type_size)
        blocks = flat.reshape(n_blocks, type_size)
        offsets, unit = _BLOCK[qtype]
        d = np.float16(unit / np.sqrt(n_in))
        blocks[:, offsets[0] : offsets[0] + 2] = np.frombuffer(d.tobytes(), np.uint8)
        if qtype == Q.Q4_K:
            dmin = np.float16(7.5 * float(d))
            blocks[:, 2:4] = np.frombuffer(dmin.tobytes(), np.uint8)
        return blocks.reshape(rows, n_in // per_block * type_size)


def write(
    name: str, path: Path, *, layers_scale: float = 1.0, seed: int = 0, header_only: bool = False
) -> Path:
    """Write the synthetic model ``name`` (a key of :data:`SHAPES`) to ``path`` (with
    ``header_only``, the tensor data is a hole of the right size)."""
    shape = SHAPES[name]
    n_layer = max(1, round(shape.n_layer * layers_scale))
    head_dim = shape.n_embd // shape.n_head
    n_kv = shape.n_head_kv * head_dim
    tokens, scores, types = tiny_vocab(shape.n_vocab - len(tiny_vocab(0)[0]))
    # a 64 MiB pool of random bytes for real shapes; 1 MiB for the kit's tiny ones
    blocks = RandomBlocks(seed, 1 << 26 if shape.n_embd * shape.n_ff >= 1 << 22 else 1 << 20)

    w = gguf.GGUFWriter(str(path), shape.arch)
    w.add_name(f"synthetic-{name}")
    w.add_context_length(131072 if shape.arch == "llama" else 32768)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_layer_norm_rms_eps(1e-5 if shape.arch == "llama" else 1e-6)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(shape.rope_base)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    def matrix(key: str, rows: int, n_in: int, layer: int = 0) -> None:
        qtype = block_type(key, n_in, shape, layer)
        if header_only:
            per_block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            row_bytes = n_in // per_block * type_size
            w.add_tensor_info(key, (rows, row_bytes), np.dtype(np.uint8), rows * row_bytes, qtype)
        else:
            w.add_tensor(key, blocks.tensor(qtype, rows, n_in), raw_dtype=qtype)

    def ones(key: str, n: int) -> None:
        if header_only:
            w.add_tensor_info(key, (n,), np.dtype(np.float32), 4 * n)
        else:
            w.add_tensor(key, np.ones(n, dtype=np.float32))

    matrix("token_embd.weight", shape.n_vocab, shape.n_embd)
    ones("output_norm.weight", shape.n_embd)
    if not shape.tied:
        matrix("output.weight", shape.n_vocab, shape.n_embd)
    for i in range(n_layer):
        b = f"blk.{i}."
        ones(b + "attn_norm.weight", shape.n_embd)
        matrix(b + "attn_q.weight", shape.n_embd, shape.n_embd, i)
        matrix(b + "attn_k.weight", n_kv, shape.n_embd, i)
        matrix(b + "attn_v.weight", n_kv, shape.n_embd, i)
        if shape.qkv_bias:
            for part, n in (("q", shape.n_embd), ("k", n_kv), ("v", n_kv)):
                ones(f"{b}attn_{part}.bias", n)
        matrix(b + "attn_output.weight", shape.n_embd, shape.n_embd, i)
        ones(b + "ffn_norm.weight", shape.n_embd)
        matrix(b + "ffn_gate.weight", shape.n_ff, shape.n_embd, i)
        matrix(b + "ffn_up.weight", shape.n_ff, shape.n_embd, i)
        matrix(b + "ffn_down.weight", shape.n_embd, shape.n_ff, i)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    if header_only:
        w.write_ti_data_to_file()
        out = w.fout[0]
        start = gguf.GGUFWriter.ggml_pad(out.tell(), w.data_alignment)
        size = sum(
            gguf.GGUFWriter.ggml_pad(ti.nbytes, w.data_alignment) for ti in w.tensors[0].values()
        )
        out.truncate(start + size)
    else:
        w.write_tensors_to_file()
    w.close()
    return path


def ladder_paths(
    out: Path, names: Sequence[str], layers_scale: float = 1.0, header_only: bool = False
) -> list[Path]:
    """Write (or reuse) each model of ``names`` under ``out``; smallest first."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, name in enumerate(names):
        path = out / f"synthetic-{name}-q4_k_m.gguf"
        if not path.exists():
            t0 = time.perf_counter()
            tmp = path.with_suffix(".part")
            write(name, tmp, layers_scale=layers_scale, seed=i, header_only=header_only)
            tmp.rename(path)
            size = path.stat().st_size / 2**30
            print(f"wrote {path} ({size:.2f} GiB, {time.perf_counter() - t0:.0f} s)", flush=True)
        paths.append(path)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"models: {', '.join(SHAPES)}")
    ap.add_argument("--ladder", choices=sorted(LADDERS), help="all three tiers of a ladder")
    ap.add_argument("--out", type=Path, default=Path("/tmp/synthetic-ladders"))
    ap.add_argument("--layers-scale", type=float, default=1.0, help="keep this share of blocks")
    ap.add_argument("--header-only", action="store_true", help="tensor data left a hole")
    args = ap.parse_args()
    names = list(LADDERS[args.ladder]) if args.ladder else args.names
    unknown = [n for n in names if n not in SHAPES]
    if not names or unknown:
        ap.error(f"name models from {', '.join(SHAPES)} or pass --ladder")
    for path in ladder_paths(args.out, names, args.layers_scale, args.header_only):
        print(path)


if __name__ == "__main__":
    main()
