"""Read-only facts of a loaded ladder for the callers above the runtime (serving, the CLI,
benchmarks), so that none reaches through its tiers: the context a request must fit, the
target's vocabulary (tokenize, detokenize), file, metadata and chat template, and each tier's
file and weights. :class:`LadderFacts` is
:class:`~pyramid_gguf.api.Pyramid`'s base."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..decoding.runtime.tiers import Ladder, ModelTier
from ..native import Vocab


@dataclass(frozen=True)
class TierFacts:
    """One loaded tier: its ``name`` (``draft``, ``qualifier``, ``target``), GGUF ``path`` and
    ``size`` in bytes, ``weights`` (where they went, in words) and ``weight_buffers`` (MiB per
    llama.cpp buffer type), the threads it decodes with and its ``--gpu-layers`` (-1: all)."""

    name: str
    path: Path
    size: int
    weights: str
    weight_buffers: dict[str, Any]
    n_threads: int
    n_gpu_layers: int


class LadderFacts:
    """What callers may read of ``ladder`` (set by the subclass) without touching its tiers."""

    ladder: Ladder

    @property
    def n_ctx(self) -> int:
        """A slot's context in tokens: the smallest over the ladder's models (what every
        request's prompt and answer must fit)."""
        return min(m.n_ctx for m in self.ladder.models)

    @property
    def vocab(self) -> Vocab:
        """The target's vocabulary (every tier shares it)."""
        return self.ladder.target.vocab

    @property
    def n_vocab(self) -> int:
        """Token ids run from 0 to ``n_vocab - 1``."""
        return self.ladder.target.n_vocab

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` (BOS added where the model asks for it, specials parsed)."""
        return self.vocab.tokenize(text)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.vocab.detokenize(tokens)

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends generation (EOS, EOT, ...)."""
        return self.vocab.is_eog(token)

    @property
    def model_path(self) -> Path:
        """The target's GGUF file."""
        return self.ladder.target.loaded.path

    def metadata(self) -> dict[str, str]:
        """The target GGUF's key/value metadata as strings."""
        return self.ladder.target.loaded.metadata()

    @property
    def chat_template(self) -> str | None:
        """The target GGUF's ``tokenizer.chat_template``, or None."""
        return self.ladder.target.loaded.chat_template()

    def tiers(self) -> list[TierFacts]:
        """Each loaded model, smallest first (the target last)."""
        return [
            TierFacts(
                t.name,
                t.loaded.path,
                t.loaded.path.stat().st_size,
                t.loaded.describe_weights(),
                dict(t.loaded.weight_buffers),
                t.loaded.cfg.n_threads,
                t.loaded.cfg.n_gpu_layers,
            )
            for t in self.ladder.models
        ]

    def tier(self, name: str) -> ModelTier:
        """The loaded tier ``name`` itself, for benchmarks that score with it (forced rows,
        quality); everything else goes through the generation API."""
        return self.ladder.tier(name)
