"""Embeddings in Python: :class:`Embedder`, one GGUF model loaded for embeddings, beside any ladder.

```python
from pyramid_gguf.embeddings import Embedder, EmbeddingConfig

with Embedder.load("bge-small.gguf", EmbeddingConfig(pooling="mean")) as e:
    vectors = e.embed(["a cat", "a dog"])  # float32 [2, n_embd], unit length
```

Inputs are texts (tokenized as llama-server tokenizes them: the model's BOS/EOS added, special
tokens parsed) or token-id lists, or a mix of both in one list (llama-server's mixed prompt). An
input longer than the context is an error unless ``truncate`` is set (Ollama's default), when
its first :attr:`Embedder.n_ctx` tokens are embedded. No web framework is imported here; the
server's routes are :mod:`pyramid_gguf.serving.embeddings`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

# llama.cpp's libraries load before numpy's (docs/ARCHITECTURE.md, "Loading order").
from .native.embedding import POOLING, EmbeddingConfig, EmbeddingModel, Pooling  # isort: skip

# isort: split
import numpy as np

from .core.errors import UserError

__all__ = ["POOLING", "Embedded", "Embedder", "EmbeddingConfig", "EmbeddingCounts", "Pooling"]

#: One input: a text, token ids, or a mixed list of texts and token ids.
Input = str | Sequence[int | str]


@dataclass(frozen=True)
class Embedded:
    """Vectors of a call and what they cost: ``vectors`` float32 ``[n_inputs, n_embd]``
    (pooled) or one ``[n_tokens_i, n_embd]`` per input (pooling ``none``); ``n_tokens``: the
    tokens embedded per input (after any truncation)."""

    vectors: np.ndarray | list[np.ndarray]
    n_tokens: tuple[int, ...]

    @property
    def total_tokens(self) -> int:
        return sum(self.n_tokens)


@dataclass(frozen=True)
class EmbeddingCounts:
    """What an :class:`Embedder` did since it was loaded (the server's ``/metrics``): the
    ``inputs`` embedded, their ``tokens``, the ``decodes`` (``llama_decode`` calls) and the
    ``seconds`` spent embedding."""

    inputs: int = 0
    tokens: int = 0
    decodes: int = 0
    seconds: float = 0.0


class Embedder:
    """One embedding model: tokenize, embed; thread-safe (calls take turns)."""

    def __init__(self, model: EmbeddingModel) -> None:
        self._model = model
        self._counts = EmbeddingCounts()
        self._counts_lock = threading.Lock()

    @classmethod
    def load(cls, path: str | os.PathLike[str], cfg: EmbeddingConfig | None = None) -> Embedder:
        """Load ``path`` for embeddings (a one-line :class:`UserError` for a bad file)."""
        return cls(EmbeddingModel(path, cfg))

    # --- what it is ------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._model.path

    @property
    def name(self) -> str:
        """The model's name: the file's, without ``.gguf``."""
        return self._model.path.stem

    @property
    def n_embd(self) -> int:
        """Length of every vector."""
        return self._model.n_embd

    @property
    def n_ctx(self) -> int:
        """Most tokens of one input."""
        return self._model.n_ctx

    @property
    def pooling(self) -> Pooling:
        """The pooling llama.cpp runs (``none``: one vector per token)."""
        return self._model.pooling

    @property
    def n_vocab(self) -> int:
        return self._model.vocab.n_vocab

    def metadata(self) -> dict[str, str]:
        return self._model.metadata()

    def counts(self) -> EmbeddingCounts:
        """What it has embedded so far."""
        with self._counts_lock:
            return self._counts

    # --- tokens ----------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Token ids of ``text`` (BOS/EOS where the model adds them; special tokens parsed)."""
        return self._model.vocab.tokenize(text, add_special=add_special, parse_special=True)

    def tokens_of(self, item: Input) -> list[int]:
        """The token ids of one input: a text, ids, or a mixed list (special tokens around its
        text only when the list starts with it, as llama-server adds them)."""
        if isinstance(item, str):
            return self.tokenize(item)
        tokens: list[int] = []
        first = True
        for piece in item:
            if isinstance(piece, str):
                tokens += self.tokenize(piece, add_special=first)
                first = False
            elif isinstance(piece, int) and not isinstance(piece, bool):
                tokens.append(piece)
                first = False
            else:
                raise UserError(f"an input holds {piece!r}: give texts or token ids")
        return tokens

    # --- embeddings ------------------------------------------------------------------------

    def run(
        self, inputs: Sequence[Input], *, truncate: bool = False, normalize: int | None = None
    ) -> Embedded:
        """Embed every input (pooled: ``[n, n_embd]``; ``none``: one ``[n_tokens, n_embd]`` per
        input); ``truncate`` keeps each input's first :attr:`n_ctx` tokens rather than refusing
        it; ``normalize``: llama-server's ``embd_normalize`` (None: the config's, 2)."""
        tokens = [self.tokens_of(item) for item in inputs]
        if truncate:
            tokens = [t[: self.n_ctx] for t in tokens]
        counts = tuple(len(t) for t in tokens)
        started = time.perf_counter()
        if self.pooling == "none":
            vectors: np.ndarray | list[np.ndarray] = self._model.embed_tokens(tokens)
        else:
            vectors = self._model.embed(tokens, normalize)
        self._count(len(tokens), sum(counts), time.perf_counter() - started)
        return Embedded(vectors, counts)

    def _count(self, inputs: int, tokens: int, seconds: float) -> None:
        with self._counts_lock:
            c = self._counts
            self._counts = replace(
                c,
                inputs=c.inputs + inputs,
                tokens=c.tokens + tokens,
                decodes=self._model.decodes,
                seconds=c.seconds + seconds,
            )

    def embed(self, texts: Sequence[Input], *, truncate: bool = False) -> np.ndarray:
        """One unit-length vector per input: float32 ``[len(texts), n_embd]`` (a pooled model;
        pooling ``none`` is a :class:`UserError`: :meth:`run` gives its vectors)."""
        if self.pooling == "none":
            raise UserError("pooling 'none' gives one vector per token: run() returns them")
        vectors = self.run(texts, truncate=truncate).vectors
        assert isinstance(vectors, np.ndarray)
        return vectors

    # --- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        self._model.close()

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
