"""The vocabulary check every ladder passes before any decoding (llama.cpp's speculative rule).

Two tiers share a vocabulary when they use the same tokenizer model, their sizes differ by at
most 128 (padding rows), they agree on BOS and EOS, and every token text from id 5 up, within
the smaller size, is identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from ..core.errors import VocabularyMismatch

MAX_SIZE_DIFFERENCE = 128
FIRST_CHECKED_ID = 5


class TokenTable(Protocol):
    """What the check reads of a vocabulary (:class:`~pyramid_gguf.native.Vocab` is one)."""

    @property
    def n_vocab(self) -> int: ...

    @property
    def bos(self) -> int: ...

    @property
    def eos(self) -> int: ...

    def token_text(self, token: int) -> str: ...


class Vocabulary(Protocol):
    """A loaded model as the check sees it: its file, metadata and token table."""

    @property
    def path(self) -> Path: ...

    @property
    def vocab(self) -> TokenTable: ...

    def metadata(self) -> dict[str, str]: ...


def check_same_vocabulary(models: Sequence[Vocabulary]) -> None:
    """Raise :class:`VocabularyMismatch` (one line) unless all share the first's vocabulary."""
    for other in models[1:]:
        _check_pair(models[0], other)


def _check_pair(a: Vocabulary, b: Vocabulary) -> None:
    names = f"{Path(a.path).name} and {Path(b.path).name}"
    ta = a.metadata().get("tokenizer.ggml.model", "?")
    tb = b.metadata().get("tokenizer.ggml.model", "?")
    if ta != tb:
        raise VocabularyMismatch(f"vocabularies differ: {names} use tokenizers {ta!r} and {tb!r}")
    va, vb = a.vocab, b.vocab
    if abs(va.n_vocab - vb.n_vocab) > MAX_SIZE_DIFFERENCE:
        raise VocabularyMismatch(
            f"vocabularies differ: {names} have {va.n_vocab} and {vb.n_vocab} tokens "
            f"(more than {MAX_SIZE_DIFFERENCE} apart)"
        )
    if (va.bos, va.eos) != (vb.bos, vb.eos):
        raise VocabularyMismatch(
            f"vocabularies differ: {names} have BOS/EOS {va.bos}/{va.eos} and {vb.bos}/{vb.eos}"
        )
    for token in range(FIRST_CHECKED_ID, min(va.n_vocab, vb.n_vocab)):
        x, y = va.token_text(token), vb.token_text(token)
        if x != y:
            raise VocabularyMismatch(
                f"vocabularies differ: {names} first disagree at token {token}: {x!r} vs {y!r}"
            )
