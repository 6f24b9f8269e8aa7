"""A request's logit biases checked against the target's vocabulary, its text biases turned
into token biases as llama-server does (each token of the text, repeats adding up)."""

from __future__ import annotations

from ..core.errors import UserError
from ..core.sampling import SamplingConfig
from ..native import Vocab


def token_biases(sampling: SamplingConfig, vocab: Vocab) -> SamplingConfig:
    """``sampling`` with its text biases as token biases (each text tokenized without BOS,
    special tokens as text); a one-line :class:`UserError` for an id outside the vocabulary."""
    extra = [
        (token, bias)
        for text, bias in sampling.logit_bias_text
        for token in vocab.tokenize(text, add_special=False, parse_special=False)
    ]
    n_vocab = vocab.n_vocab
    bad = next((t for t, _ in (*sampling.logit_bias, *extra) if t >= n_vocab), None)
    if bad is not None:
        raise UserError(f"logit_bias: token id {bad} is not in the vocabulary (0 to {n_vocab - 1})")
    if not sampling.logit_bias_text:
        return sampling
    return sampling.with_(logit_bias=(*sampling.logit_bias, *extra), logit_bias_text=())
