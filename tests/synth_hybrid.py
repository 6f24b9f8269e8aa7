"""Synthetic hybrid GGUFs with a NextN (MTP) layer: llama.cpp's ``qwen35`` architecture.

:func:`write_hybrid` writes a random-weight Qwen3.5-style model: ``n_layer`` trunk blocks, every
``attn_interval``-th a gated full-attention block and the others Gated DeltaNet (linear
attention, a recurrent state per sequence), plus one NextN block after them
(``qwen35.nextn_predict_layers = 1``: llama.cpp's ``draft-mtp`` head, loaded with
``llama_model_params.load_mtp``). Tensor names and shapes follow
``src/models/qwen35.cpp`` (``load_block_trunk`` / ``load_block_mtp``); a shape there written
``{ne0, ne1}`` is a numpy array of shape ``(ne1, ne0)`` here.

The vocabulary is :func:`synth.tiny_vocab`'s, so a tiny llama draft written by
:func:`synth.write_tiny_llama` with the same ``n_extra_tokens`` sits under a hybrid target.
Random weights give a head that never agrees with its target, so the weights are shaped:
``trunk_scale`` shrinks what every trunk block adds to the residual stream (attention, Gated
DeltaNet and FFN output projections), so the target's next token depends mostly on its current
token (with context still moving it), and the NextN block's ``eh_proj`` passes the token
embedding half of its input through (llama.cpp concatenates ``[enorm(embedding);
hnorm(hidden)]``), so the head's guess for the token after next is the target's distribution
after the token it is given; ``mtp_noise`` adds random weights on top (more noise, fewer
agreements).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from synth import tiny_vocab


@dataclass(frozen=True)
class HybridSpec:
    """Shape of a synthetic qwen35 model (all sizes in elements)."""

    n_embd: int = 64
    #: Trunk blocks (the NextN block comes on top: block_count = n_layer + 1).
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    #: Every attn_interval-th trunk block is full attention, the rest Gated DeltaNet.
    attn_interval: int = 2
    #: Gated DeltaNet: key heads (ssm group count), value heads (ssm time-step rank), head size.
    ssm_k_heads: int = 2
    ssm_v_heads: int = 4
    ssm_head_dim: int = 16
    ssm_conv: int = 4
    n_ctx_train: int = 4096
    n_extra_tokens: int = 0
    logit_scale: float = 3.0
    #: "f32", "f16" or "q8_0" for the weight matrices (norms and small vectors stay f32).
    dtype: str = "f32"
    #: Scale of what each trunk block adds to the residual stream (1: plain random weights).
    trunk_scale: float = 0.3
    #: Random part of the NextN block's weights (0: the head passes the embedding through).
    mtp_noise: float = 0.3
    #: Write the NextN block (False: the same trunk without an MTP head).
    nextn: bool = True


def _store(a: np.ndarray, dtype: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType | None]:
    if a.ndim < 2 or dtype == "f32" or a.shape[-1] % 32:  # ssm_conv1d rows: 4 wide
        return a.astype(np.float32), None
    if dtype == "f16":
        return a.astype(np.float16), None
    if dtype == "q8_0":
        q = gguf.quants.quantize(a.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
        return q, gguf.GGMLQuantizationType.Q8_0
    raise ValueError(f"HybridSpec.dtype must be f32, f16 or q8_0, got {dtype!r}")


def hybrid_tensors(spec: HybridSpec, seed: int) -> dict[str, np.ndarray]:
    """Every tensor of the model, f32, keyed by its GGUF name."""
    n_vocab = len(tiny_vocab(spec.n_extra_tokens)[0])
    rng = np.random.default_rng(seed)
    e, hd = spec.n_embd, spec.head_dim
    key_dim = spec.ssm_head_dim * spec.ssm_k_heads
    value_dim = spec.ssm_head_dim * spec.ssm_v_heads
    conv_dim = 2 * key_dim + value_dim

    def mat(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    w = {
        "token_embd.weight": mat(n_vocab, e, np.sqrt(e) * 0.5),
        "output_norm.weight": ones(e),
        "output.weight": mat(n_vocab, e, spec.logit_scale),
    }

    def attention(i: int) -> dict[str, np.ndarray]:
        return {
            f"blk.{i}.attn_q.weight": mat(2 * spec.n_head * hd, e),
            f"blk.{i}.attn_k.weight": mat(spec.n_head_kv * hd, e),
            f"blk.{i}.attn_v.weight": mat(spec.n_head_kv * hd, e),
            f"blk.{i}.attn_output.weight": mat(e, spec.n_head * hd),
            f"blk.{i}.attn_q_norm.weight": ones(hd),
            f"blk.{i}.attn_k_norm.weight": ones(hd),
        }

    def ffn(i: int) -> dict[str, np.ndarray]:
        return {
            f"blk.{i}.attn_norm.weight": ones(e),
            f"blk.{i}.post_attention_norm.weight": ones(e),
            f"blk.{i}.ffn_gate.weight": mat(spec.n_ff, e),
            f"blk.{i}.ffn_up.weight": mat(spec.n_ff, e),
            f"blk.{i}.ffn_down.weight": mat(e, spec.n_ff),
        }

    for i in range(spec.n_layer):
        w |= ffn(i)
        if (i + 1) % spec.attn_interval == 0:
            w |= attention(i)
            continue
        w |= {
            f"blk.{i}.attn_qkv.weight": mat(conv_dim, e),
            f"blk.{i}.attn_gate.weight": mat(value_dim, e),
            f"blk.{i}.ssm_conv1d.weight": mat(conv_dim, spec.ssm_conv),
            f"blk.{i}.ssm_dt.bias": rng.uniform(-1.0, 1.0, spec.ssm_v_heads).astype(np.float32),
            f"blk.{i}.ssm_a": -rng.uniform(0.5, 1.5, spec.ssm_v_heads).astype(np.float32),
            f"blk.{i}.ssm_beta.weight": mat(spec.ssm_v_heads, e),
            f"blk.{i}.ssm_alpha.weight": mat(spec.ssm_v_heads, e),
            f"blk.{i}.ssm_norm.weight": ones(spec.ssm_head_dim),
            f"blk.{i}.ssm_out.weight": mat(e, value_dim),
        }
    if spec.nextn:
        i = spec.n_layer
        w |= ffn(i) | attention(i)
        # eh_proj maps [embedding; hidden] (2 e) to e: the identity on the embedding half,
        # plus mtp_noise of random weights.
        proj = np.concatenate([np.eye(e), np.zeros((e, e))], axis=1).astype(np.float32)
        w |= {
            f"blk.{i}.nextn.eh_proj.weight": proj + mat(e, 2 * e, spec.mtp_noise),
            f"blk.{i}.nextn.enorm.weight": ones(e),
            f"blk.{i}.nextn.hnorm.weight": ones(e),
            f"blk.{i}.nextn.shared_head_norm.weight": ones(e),
        }
        for name in (f"blk.{i}.attn_output.weight", f"blk.{i}.ffn_down.weight"):
            w[name] = w[name] * np.float32(spec.mtp_noise)
    for i in range(spec.n_layer):
        for role in ("attn_output", "ssm_out", "ffn_down"):
            name = f"blk.{i}.{role}.weight"
            if name in w:
                w[name] = w[name] * np.float32(spec.trunk_scale)
    return w


def write_hybrid(
    path: str | Path, *, seed: int = 0, spec: HybridSpec | None = None, name: str = "tiny-qwen35"
) -> Path:
    """Write a random-weight qwen35 GGUF (trunk plus one NextN block) to ``path``; return it."""
    spec = spec or HybridSpec()
    path = Path(path)
    if spec.n_layer % spec.attn_interval != 0:
        raise ValueError("HybridSpec.n_layer must be a multiple of attn_interval")
    tokens, scores, types = tiny_vocab(spec.n_extra_tokens)
    arch = "qwen35"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_context_length(spec.n_ctx_train)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer + (1 if spec.nextn else 0))
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_key_length(spec.head_dim)
    writer.add_value_length(spec.head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_dimension_count(spec.head_dim)
    quarter = spec.head_dim // 2
    writer.add_rope_dimension_sections(
        [quarter - 2 * (quarter // 3), quarter // 3, quarter // 3, 0]
    )
    writer.add_rope_freq_base(10000000.0)
    writer.add_ssm_conv_kernel(spec.ssm_conv)
    writer.add_ssm_state_size(spec.ssm_head_dim)
    writer.add_ssm_group_count(spec.ssm_k_heads)
    writer.add_ssm_time_step_rank(spec.ssm_v_heads)
    writer.add_ssm_inner_size(spec.ssm_head_dim * spec.ssm_v_heads)
    writer.add_uint32(f"{arch}.full_attention_interval", spec.attn_interval)
    if spec.nextn:
        writer.add_uint32(f"{arch}.nextn_predict_layers", 1)
    file_type = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }.get(spec.dtype)
    if file_type is None:
        raise ValueError(f"HybridSpec.dtype must be f32, f16 or q8_0, got {spec.dtype!r}")
    writer.add_file_type(file_type)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    for key, value in hybrid_tensors(spec, seed).items():
        data, raw = _store(value, spec.dtype)
        if raw is None:
            writer.add_tensor(key, data)
        else:
            writer.add_tensor(key, data, raw_shape=data.shape, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
