"""Write a Mixtral-style mixture-of-experts GGUF whose answers are a real dense model's.

From a dense Qwen2-architecture GGUF (Qwen2.5-Coder-1.5B-Instruct Q4_K_M here) this writes a
llama.cpp ``llama``-architecture GGUF with ``llama.expert_count`` E and
``llama.expert_used_count`` K:

- every routed expert of layer ``i`` is a byte copy of the dense ``blk.i.ffn_gate/up/down``
  (quantized rows copied unchanged), stacked into ``ffn_gate_exps``/``ffn_up_exps``/
  ``ffn_down_exps`` (``[E, rows, row bytes]``);
- the router ``blk.i.ffn_gate_inp`` is random (f32 ``[E, n_embd]``, N(0, 1/n_embd), seeded);
- llama.cpp's llama graph (``src/models/llama.cpp``, ``build_moe_ffn(..., norm_w=true, ...,
  LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX)``) softmaxes the router logits, takes the top K and
  divides their weights by their sum: the layer's output is ``sum_k w_k FFN(x) = FFN(x)``
  (up to float rounding of ``sum_k w_k``), the dense model's, whatever the router picks;
- Q and K rows are permuted from Qwen2's NEOX RoPE layout (llama.cpp's qwen2 graph ropes
  halves) to llama's interleaved layout (llama's graph ropes pairs), as
  ``convert_hf_to_gguf.py``'s ``LlamaModel.permute`` does for HF Llama checkpoints: rows of a
  quantized weight are quantized independently, so moving whole rows is exact; the Q/K biases
  (the llama graph loads optional ``attn_q/k/v.bias``, ``create_tensor_qkv``) move with them;
- every other tensor, the tokenizer, chat template and hyperparameters are copied.

So the answers (and a draft's acceptance) are the dense model's, while the routing, the bytes a
token reads (attention, norms, embeddings plus K of E experts per layer) and their union over a
block of k tokens are an MoE's. Defaults E=8, K=2: Mixtral 8x7B's shape (a quarter of the
experts active per token; K >= 2 so the renormalisation really is exercised).

Usage::

    python scripts/moe_model.py SRC.gguf DST.gguf [--experts 8] [--used 2] [--seed 0]
    python scripts/moe_model.py SRC.gguf DST.gguf --check [-n 128] [--limit 1]  # greedy identity
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

ARCH = "llama"
_FFN = ("ffn_gate", "ffn_up", "ffn_down")
#: Hyperparameters copied from ``<src arch>.<key>`` to ``llama.<key>``.
_HPARAMS = (
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "rope.freq_base",
    "attention.layer_norm_rms_epsilon",
    "rope.dimension_count",
    "attention.key_length",
    "attention.value_length",
)


def permute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Rows ``[n_head * head_dim, ...]`` from NEOX to interleaved RoPE order: within each head
    the first and second halves become the even and odd rows (``LlamaModel.permute``)."""
    head_dim = rows.shape[0] // n_head
    return (
        rows.reshape(n_head, 2, head_dim // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)
    )


def _copy_field(w: gguf.GGUFWriter, key: str, field: Any) -> None:
    """Copy one key/value field with its exact type."""
    vtype = field.types[0]
    value = field.contents()
    if vtype == GGUFValueType.ARRAY:
        sub = field.types[1] if len(field.types) > 1 else GGUFValueType.INT32
        w.add_key_value(key, value, vtype, sub_type=sub)
    else:
        w.add_key_value(key, value, vtype)


def _tensor(reader: GGUFReader, name: str) -> Any:
    for t in reader.tensors:
        if t.name == name:
            return t
    raise KeyError(name)


def plan(
    reader: GGUFReader, experts: int, rng: np.random.Generator
) -> Iterator[tuple[str, np.ndarray, GGMLQuantizationType, bool]]:
    """The output tensors in order: ``(name, data, type, stacked)``; ``data`` is the reader's
    byte view (or f32 array), ``stacked``: write ``experts`` copies of it."""
    src = reader.fields["general.architecture"].contents()
    n_head = int(reader.fields[f"{src}.attention.head_count"].contents())
    n_head_kv = int(reader.fields[f"{src}.attention.head_count_kv"].contents())
    n_embd = int(reader.fields[f"{src}.embedding_length"].contents())
    for t in reader.tensors:
        parts = t.name.split(".")
        role = parts[2] if t.name.startswith("blk.") else ""
        data = np.asarray(t.data)
        if role in ("attn_q", "attn_k"):
            heads = n_head if role == "attn_q" else n_head_kv
            yield t.name, permute_rows(data, heads), t.tensor_type, False
        elif role == "ffn_gate":
            layer = parts[1]
            router = rng.normal(0.0, 1.0 / np.sqrt(n_embd), (experts, n_embd))
            yield (
                f"blk.{layer}.ffn_gate_inp.weight",
                router.astype(np.float32),
                (GGMLQuantizationType.F32),
                False,
            )
            for ffn in _FFN:
                s = _tensor(reader, f"blk.{layer}.{ffn}.weight")
                yield f"blk.{layer}.{ffn}_exps.weight", np.asarray(s.data), s.tensor_type, True
        elif role in ("ffn_up", "ffn_down"):
            continue  # written with ffn_gate
        else:
            yield t.name, data, t.tensor_type, False


def write_moe(src: Path, dst: Path, experts: int, used: int, seed: int) -> None:
    """Write ``dst``, the MoE form of the dense GGUF ``src`` (see the module docstring)."""
    if not 1 <= used <= experts:
        raise SystemExit(f"Error: need 1 <= --used <= --experts, got {used} of {experts}")
    reader = GGUFReader(src)
    src_arch = reader.fields["general.architecture"].contents()
    if src_arch not in ("qwen2", "llama"):
        raise SystemExit(f"Error: {src} is {src_arch!r}; this converts qwen2 (or llama) models")
    w = gguf.GGUFWriter(dst, ARCH)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key.startswith(f"{src_arch}."):
            rest = key[len(src_arch) + 1 :]
            if rest in _HPARAMS:
                _copy_field(w, f"{ARCH}.{rest}", field)
            continue
        if key == "general.name":
            w.add_name(f"{field.contents()} MoE {experts}x{used} (experts = dense FFN)")
            continue
        _copy_field(w, key, field)
    w.add_expert_count(experts)
    w.add_expert_used_count(used)
    tensors = list(plan(reader, experts, np.random.default_rng(seed)))
    for name, data, qtype, stacked in tensors:
        n_bytes = data.nbytes * (experts if stacked else 1)
        # byte rows of a quantized weight: gguf turns [.., rows, row bytes] into elements
        shape: tuple[int, ...] = (experts, *data.shape) if stacked else data.shape
        dtype = data.dtype
        w.add_tensor_info(name, shape, dtype, n_bytes, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _name, data, _, stacked in tensors:
        if stacked:  # E byte copies, one after the other: [E, rows, row bytes]
            w.write_tensor_data(np.broadcast_to(data, (experts, *data.shape)).copy())
        else:
            w.write_tensor_data(np.ascontiguousarray(data))
    w.close()


def _logits_after(p: Any, prompt: list[int], prefix: list[int]) -> np.ndarray:
    """The target's logits after ``prompt + prefix``, as plain decoding evaluates them (the
    prompt in one batch, then one token at a time), on a fresh cache. ``[V]``."""
    tier = p.ladder.target
    tier.model.reset()
    row = tier.prefill(prompt, logits=True)
    for token in prefix:
        row = tier.step(token)
    tier.model.reset()
    return np.asarray(row, dtype=np.float64)


def check(dense: Path, moe: Path, n: int, limit: int, threads: int) -> int:
    """Greedy ``target`` decoding (``--strict-identity``) of the dense and the MoE model on the
    first ``limit`` prompts of each shipped set: identical, or the first divergence with both
    models' logit margins there (top logit minus the other model's token's logit)."""
    from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
    from pyramid_gguf.bench.prompts import TEXT_SETS, load_prompt_sets

    load = LoadConfig(n_ctx=4096, n_threads=threads, n_threads_batch=threads, strict_identity=True)
    greedy = SamplingConfig(temperature=0, max_tokens=n)
    target = SpecConfig(mode="target")
    same = 0
    with Pyramid.from_paths(dense, load=load) as d, Pyramid.from_paths(moe, load=load) as m:
        prompts = [q for s in TEXT_SETS for q in load_prompt_sets([s])[:limit]]
        for q in prompts:
            tokens = d.tokenize(d.apply_chat_template([{"role": "user", "content": q.text}]))
            want = d.generate(tokens, greedy, target).token_ids
            got = m.generate(tokens, greedy, target).token_ids
            i = next((j for j, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), None)
            if i is None and len(want) == len(got):
                same += 1
                print(f"{q.key}: identical, {len(want)} tokens")
                continue
            if i is None:
                print(f"{q.key}: same {min(len(want), len(got))} tokens, lengths differ")
                continue
            zd, zm = _logits_after(d, tokens, want[:i]), _logits_after(m, tokens, want[:i])
            print(
                f"{q.key}: first divergence at token {i} of {len(want)}: dense {want[i]}, "
                f"MoE {got[i]}; dense margin {zd[want[i]] - zd[got[i]]:.4f}, "
                f"MoE margin {zm[got[i]] - zm[want[i]]:.4f} (logits)"
            )
    print(f"{same} of {len(prompts)} prompts identical")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="dense qwen2 GGUF")
    p.add_argument("dst", type=Path, help="MoE GGUF to write")
    p.add_argument("--experts", type=int, default=8, help="routed experts per layer (E)")
    p.add_argument("--used", type=int, default=2, help="experts used per token (K)")
    p.add_argument("--seed", type=int, default=0, help="router seed")
    p.add_argument(
        "--check",
        action="store_true",
        help="compare greedy answers of SRC (dense) and DST (written before) instead",
    )
    p.add_argument("-n", type=int, default=128, help="--check: tokens per answer")
    p.add_argument("--limit", type=int, default=1, help="--check: prompts per shipped set")
    p.add_argument("-t", "--threads", type=int, default=2)
    a = p.parse_args(argv)
    if not a.src.is_file():
        print(f"Error: no such file: {a.src}", file=sys.stderr)
        return 1
    if a.check:
        return check(a.src, a.dst, a.n, a.limit, a.threads)
    write_moe(a.src, a.dst, a.experts, a.used, a.seed)
    print(f"wrote {a.dst} ({a.dst.stat().st_size / 1e9:.2f} GB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
