"""A tiny BERT GGUF: the local stand-in of llama-server's embedding test model, bge-small.

bge-small (``ggml-org/models``, ``bert-bge-small``) is a BERT: an encoder (attention sees the
whole input), learned positions up to 512, CLS pooling named in its header, and an uncased
WordPiece vocabulary that puts ``[CLS]`` before an input and ``[SEP]`` after it. This writes a
model of the same architecture and tokenizer kind with random weights (its vectors mean
nothing; the suite checks their shapes, norms and equalities), small enough to load in
milliseconds. Its vocabulary is BERT's layout (``[PAD]`` 0, ``[unused*]``, ``[UNK]`` 100,
``[CLS]`` 101, ``[SEP]`` 102, ``[MASK]`` 103), then every printable ASCII character as a word
start and as a continuation (so any ASCII word tokenizes), then the given words and pieces;
the suite's shim gives the whole words and pieces of SmolLM2's vocabulary
(:func:`vocabulary_of`), so common English words are one token each, as in BERT's.

    python3 scripts/llama_server_suite/tiny_bert.py OUT.gguf SOURCE.gguf
"""

from __future__ import annotations

import string
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

#: llama.cpp's WordPiece marks a word's first piece with this (BERT's pieces carry ``##``).
WORD_START = "\u2581"
PAD, UNK, CLS, SEP, MASK = 0, 100, 101, 102, 103
SPECIALS = {PAD: "[PAD]", UNK: "[UNK]", CLS: "[CLS]", SEP: "[SEP]", MASK: "[MASK]"}


@dataclass(frozen=True)
class BertShape:
    """The tiny model's shape: ``n_ctx_train`` positions (bge's 512), ``n_embd``-long vectors."""

    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_ff: int = 128
    n_ctx_train: int = 512


def vocabulary(words: Iterable[str], pieces: Iterable[str] = ()) -> list[str]:
    """BERT's token list, in llama.cpp's spelling: specials at BERT's ids, then characters,
    ``words`` (each a word start) and ``pieces`` (continuations), lowercased, without
    repeats."""
    tokens = [SPECIALS.get(i, f"[unused{i}]") for i in range(MASK + 1)]
    chars = [c for c in string.printable if not (c.isspace() or c.isupper())]  # uncased
    seen = set(tokens)
    for token in [
        *(WORD_START + c for c in chars),
        *chars,
        *(WORD_START + w.lower() for w in words),
        *(p.lower() for p in pieces),
    ]:
        if token not in seen and token.strip(WORD_START):
            seen.add(token)
            tokens.append(token)
    return tokens


def token_type(token: int) -> gguf.TokenType:
    """BERT's specials are control tokens, its ``[unused*]`` unused, the rest normal."""
    if token in SPECIALS:
        return gguf.TokenType.CONTROL
    return gguf.TokenType.UNUSED if token < MASK else gguf.TokenType.NORMAL


def vocabulary_of(source: Path) -> tuple[list[str], list[str]]:
    """The whole words and the continuation pieces (ASCII letters only) of a byte-level BPE
    GGUF's vocabulary (GPT-2's ``Ġ`` marks a word start), in its order."""
    reader = gguf.GGUFReader(source)
    field = reader.fields["tokenizer.ggml.tokens"]
    words: list[str] = []
    pieces: list[str] = []
    for i in field.data:
        token = bytes(field.parts[i]).decode("utf-8", errors="replace")
        body = token.removeprefix("\u0120")
        if body.isascii() and body.isalpha():
            (words if token != body else pieces).append(body)
    return words, pieces


def write_tiny_bert(
    path: Path,
    words: Iterable[str],
    pieces: Iterable[str] = (),
    *,
    shape: BertShape | None = None,
    seed: int = 0,
) -> Path:
    """Write the tiny BERT to ``path`` (through a temporary file, so a reader never sees half
    of it) and return ``path``."""
    shape = shape or BertShape()
    tokens = vocabulary(words, pieces)
    rng = np.random.default_rng(seed)
    d, ff = shape.n_embd, shape.n_ff

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def vec(n: int, value: float = 0.0) -> np.ndarray:
        return np.full(n, value, dtype=np.float32)

    tensors = {
        "token_embd.weight": mat(len(tokens), d),
        "token_types.weight": mat(2, d),
        "position_embd.weight": mat(shape.n_ctx_train, d),
        "token_embd_norm.weight": vec(d, 1.0),
        "token_embd_norm.bias": vec(d),
    }
    for i in range(shape.n_layer):
        b = f"blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensors[f"{b}{name}.weight"] = mat(d, d)
            tensors[f"{b}{name}.bias"] = vec(d)
        tensors |= {
            f"{b}attn_output_norm.weight": vec(d, 1.0),
            f"{b}attn_output_norm.bias": vec(d),
            f"{b}ffn_up.weight": mat(ff, d),
            f"{b}ffn_up.bias": vec(ff),
            f"{b}ffn_down.weight": mat(d, ff),
            f"{b}ffn_down.bias": vec(d),
            f"{b}layer_output_norm.weight": vec(d, 1.0),
            f"{b}layer_output_norm.bias": vec(d),
        }
    part = path.with_name(path.name + ".part")
    w = gguf.GGUFWriter(part, "bert")
    w.add_name("tiny-bert")
    w.add_context_length(shape.n_ctx_train)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_block_count(shape.n_layer)
    w.add_head_count(shape.n_head)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.CLS)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types([token_type(i) for i in range(len(tokens))])
    w.add_token_type_count(2)
    w.add_bos_token_id(CLS)
    w.add_sep_token_id(SEP)
    w.add_unk_token_id(UNK)
    w.add_pad_token_id(PAD)
    w.add_mask_token_id(MASK)
    for name, array in tensors.items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    part.replace(path)
    return path


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit(__doc__.rstrip().rsplit("\n", 1)[-1].strip())
    out, source = map(Path, argv)
    print(write_tiny_bert(out, *vocabulary_of(source)))


if __name__ == "__main__":
    main(sys.argv[1:])
