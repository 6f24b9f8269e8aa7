"""Tiny synthetic llama-architecture GGUF models, for tests and hardware probes.

:func:`write_tiny_llama` writes a valid GGUF with random weights and a small SentencePiece-style
vocabulary (byte fallback tokens plus a few hundred word pieces) that loads in milliseconds.
Models written with the same ``vocab_seed`` share one vocabulary; different ``seed`` values
give different next-token distributions over it, which is what the losslessness tests need.
``base_seed`` with ``noise`` makes a model that is a perturbation of another one, so a draft
agrees with its target often but not always.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "her",
    "are",
    "an",
    "be",
    "this",
    "which",
    "or",
    "have",
    "it",
    "not",
    "had",
    "but",
    "were",
    "one",
    "all",
    "their",
    "they",
    "has",
    "been",
    "there",
    "also",
    "more",
    "new",
    "other",
    "time",
    "can",
    "def",
    "return",
    "if",
    "else",
    "for",
    "while",
    "import",
    "class",
    "self",
    "print",
    "list",
    "int",
    "str",
    "none",
    "true",
    "false",
    "yield",
    "lambda",
    "try",
    "except",
    "raise",
    "with",
    "pass",
    "break",
    "continue",
    "range",
    "len",
    "open",
    "read",
    "write",
    "data",
    "value",
    "key",
    "item",
    "node",
    "tree",
    "graph",
    "path",
    "file",
    "line",
    "text",
    "word",
    "code",
    "test",
    "model",
    "token",
    "layer",
    "batch",
    "cache",
]


@dataclass(frozen=True)
class TinySpec:
    """Shape of a synthetic model."""

    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx_train: int = 2048
    n_extra_tokens: int = 0
    #: Appended to every word piece: a different salt is a different vocabulary.
    vocab_salt: str = ""
    logit_scale: float = 3.0
    #: Storage of the weight matrices: "f32" or "f16" (norms stay f32).
    dtype: str = "f32"
    #: Leave out ``output.weight`` so llama.cpp ties the head to ``token_embd``.
    tied_output: bool = False


def tiny_vocab(n_extra: int = 0, salt: str = "") -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of the synthetic SentencePiece vocabulary."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]  # unknown, control, control
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256  # byte
    pieces = [f"\u2581{w}{salt}" for w in dict.fromkeys(_WORDS)] + [
        chr(c) for c in range(ord("a"), ord("z") + 1)
    ]
    pieces += ["\u2581"] + [f"\u2581x{i}" for i in range(n_extra)]
    tokens += pieces
    types += [1] * len(pieces)
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    return tokens, scores, types


def write_tiny_llama(
    path: str | Path,
    *,
    seed: int = 0,
    spec: TinySpec | None = None,
    base_seed: int | None = None,
    noise: float = 1.0,
    chat_template: str | None = None,
    name: str = "tiny-llama",
) -> Path:
    """Write a random-weight llama GGUF to ``path`` and return it.

    Weights are ``W(base_seed) + noise * W(seed)`` when ``base_seed`` is given, else ``W(seed)``.
    """
    spec = spec or TinySpec()
    path = Path(path)
    tokens, scores, types = tiny_vocab(spec.n_extra_tokens, spec.vocab_salt)
    n_vocab = len(tokens)
    head_dim = spec.n_embd // spec.n_head
    if spec.dtype not in ("f32", "f16"):
        raise ValueError(f"TinySpec.dtype must be f32 or f16, got {spec.dtype!r}")
    mat_dtype = np.float16 if spec.dtype == "f16" else np.float32

    def weights(s: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(s)

        def mat(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
            return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(mat_dtype)

        w = {
            "token_embd.weight": mat(n_vocab, spec.n_embd, np.sqrt(spec.n_embd) * 0.5),
            "output_norm.weight": np.ones(spec.n_embd, dtype=np.float32),
        }
        if not spec.tied_output:
            w["output.weight"] = mat(n_vocab, spec.n_embd, spec.logit_scale)
        for i in range(spec.n_layer):
            w |= {
                f"blk.{i}.attn_norm.weight": np.ones(spec.n_embd, dtype=np.float32),
                f"blk.{i}.attn_q.weight": mat(spec.n_embd, spec.n_embd),
                f"blk.{i}.attn_k.weight": mat(spec.n_head_kv * head_dim, spec.n_embd),
                f"blk.{i}.attn_v.weight": mat(spec.n_head_kv * head_dim, spec.n_embd),
                f"blk.{i}.attn_output.weight": mat(spec.n_embd, spec.n_embd),
                f"blk.{i}.ffn_norm.weight": np.ones(spec.n_embd, dtype=np.float32),
                f"blk.{i}.ffn_gate.weight": mat(spec.n_ff, spec.n_embd),
                f"blk.{i}.ffn_up.weight": mat(spec.n_ff, spec.n_embd),
                f"blk.{i}.ffn_down.weight": mat(spec.n_embd, spec.n_ff),
            }
        return w

    tensors = weights(seed)
    if base_seed is not None:
        base = weights(base_seed)
        tensors = {
            k: v if k.endswith("norm.weight") else (base[k] + noise * v).astype(v.dtype)
            for k, v in tensors.items()
        }

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(spec.n_ctx_train)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(
        gguf.LlamaFileType.MOSTLY_F16 if spec.dtype == "f16" else gguf.LlamaFileType.ALL_F32
    )
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
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for key, value in tensors.items():
        writer.add_tensor(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


#: A minimal ChatML template, for tiny models that should support ``--chat``.
CHATML_TEMPLATE = (
    "{% for message in messages %}<s>{{ message['role'] }}\n{{ message['content'] }}</s>\n"
    "{% endfor %}{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def write_tiny_moe(
    path: str | Path,
    *,
    experts: int = 4,
    used: int = 2,
    expert_noise: float = 0.5,
    router_seed: int = 0,
    **dense: object,
) -> Path:
    """Write a tiny llama-architecture mixture of experts (Mixtral-style: llama.cpp's llama
    graph softmaxes the router, keeps the top ``used`` of ``experts`` and renormalises their
    weights) to ``path`` and return it.

    The dense model :func:`write_tiny_llama` writes with ``dense`` (``seed``, ``base_seed``,
    ``noise``, ``spec``...) gives everything but the FFN; expert ``e`` of layer ``i`` is that
    model's ``blk.i.ffn_*`` plus ``expert_noise`` times its own random weights, so the experts
    differ (routing changes the answers) while a draft near the dense model stays a good draft.
    The router ``ffn_gate_inp`` is random (``router_seed``).
    """
    path = Path(path)
    dense_path = write_tiny_llama(path.with_suffix(".dense.gguf"), **dense)  # type: ignore[arg-type]
    reader = gguf.GGUFReader(dense_path)
    rng = np.random.default_rng(router_seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, field.contents(), kind, sub_type=field.types[1])
        else:
            writer.add_key_value(key, field.contents(), kind)
    writer.add_expert_count(experts)
    writer.add_expert_used_count(used)
    for t in reader.tensors:
        data = np.array(t.data)
        role = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        if role in ("ffn_gate", "ffn_up", "ffn_down"):
            layer = t.name.split(".")[1]
            scale = expert_noise / np.sqrt(data.shape[1])
            stacked = np.stack(
                [data + scale * rng.standard_normal(data.shape) for _ in range(experts)]
            ).astype(data.dtype)
            if role == "ffn_gate":
                router = rng.standard_normal((experts, data.shape[1])) / np.sqrt(data.shape[1])
                writer.add_tensor(f"blk.{layer}.ffn_gate_inp.weight", router.astype(np.float32))
            writer.add_tensor(f"blk.{layer}.{role}_exps.weight", stacked)
        else:
            writer.add_tensor(t.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    dense_path.unlink()
    return path
