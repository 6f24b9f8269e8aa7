"""What a generation yields: :class:`Response` steps, a joined :class:`Completion`, and the
target's log-probabilities of a token (:class:`TokenLogprob`). Plain data, no native code."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..decoding.runtime.stats import GenerationStats

#: A prompt: text (tokenized with BOS, special tokens parsed) or token ids.
Prompt = str | Sequence[int]
#: What a job's reader receives: each :class:`Response`, an exception that ended the
#: generation, then this (the end).
END = None


@dataclass(frozen=True)
class TokenLogprob:
    """The target's log-probability (natural log, temperature 1, before any sampling warp) of
    one emitted token, its bytes (``piece``), and the ``top`` alternatives as
    ``(id, bytes, logprob)``, most likely first."""

    token: int
    piece: bytes
    logprob: float
    top: tuple[tuple[int, bytes, float], ...] = ()


@dataclass(frozen=True)
class Response:
    """One step of a stream: the new text and tokens, the running stats, and (when asked for)
    the target's log-probabilities of the tokens."""

    text: str
    token_ids: list[int]
    finish_reason: str | None
    stats: GenerationStats
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Completion:
    """A finished generation."""

    text: str
    token_ids: list[int]
    finish_reason: str
    stats: GenerationStats
    prompt_tokens: int = 0
