"""llguidance's tokenizer for a loaded model: the only caller of ``llguidance.llamacpp``.

Building it reads every token's bytes through llama.cpp (about a second for a 152k vocabulary),
so it is built once per loaded model (whichever of its sequences asks) and kept as long as the
model. It borrows the model's
``llama_vocab`` (llguidance tokenizes through it when it compiles a grammar's literals), so,
like :class:`~.vocab.Vocab`, it must not be used after the model is closed.
"""

from __future__ import annotations

import warnings
import weakref

import llguidance
import llguidance.llamacpp

from .sequence import ModelSequence
from .vocab import Vocab

_TOKENIZERS: weakref.WeakKeyDictionary[Vocab, llguidance.LLTokenizer] = weakref.WeakKeyDictionary()


def grammar_tokenizer(model: ModelSequence) -> llguidance.LLTokenizer:
    """The llguidance tokenizer of ``model`` (cached per model).

    Its EOS ids are the model's EOS, then every other end-of-generation id (EOT,
    ``<|endoftext|>``, ``<|file_sep|>``...): any id that ends a generation is allowed where the
    grammar may end. Its ``vocab_size`` is the vocabulary's token count, ``model.n_vocab``.
    """
    vocab = model.vocab  # one per loaded model, shared by its sequences
    tokenizer = _TOKENIZERS.get(vocab)
    if tokenizer is None:
        eos = [vocab.eos] if vocab.eos >= 0 else []
        eos += [t for t in range(model.n_vocab) if t not in eos and vocab.is_eog(t)]
        with warnings.catch_warnings():
            # llguidance calls llama_token_get_attr once per token; its deprecation warning
            # would cost half a second and 152k lines on a Qwen vocabulary.
            warnings.filterwarnings("ignore", "llama_token_get_attr", DeprecationWarning)
            tokenizer = llguidance.llamacpp.lltokenizer_from_vocab(
                vocab.ptr,
                eos_token=eos or None,
            )
        _TOKENIZERS[vocab] = tokenizer
    return tokenizer
