"""The grammar state of one generated sequence: allowed tokens, draft checks, rollback.

:class:`Constraint` wraps an ``llguidance.LLMatcher``. It moves with the sequence's KV cache:
:meth:`~Constraint.consume` the tokens a round commits, :meth:`~Constraint.rollback` those it
takes back. Reading it (:meth:`~Constraint.allowed`, :meth:`~Constraint.masks`,
:meth:`~Constraint.validate`, :meth:`~Constraint.forced`) never changes it.

End of generation: the tokenizer's EOS ids (every end-of-generation id of the model, as
:func:`pyramid_gguf.native.grammar.grammar_tokenizer` builds it) are allowed exactly where the
grammar may end. An EOS is kept here and never given to the matcher (llguidance counts an EOS
for rollback in some states and not in others); after it nothing is allowed, and
``rollback(1)`` takes it back.

Masks are boolean ``[V]`` rows over the model's logits (``V = n_vocab``); ids beyond the
tokenizer's vocabulary are never allowed. Pure: llguidance and numpy, no ``llama_cpp``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NoReturn

import llguidance
import llguidance.numpy
import numpy as np

from ..core.errors import UserError
from ..core.grammar import Grammar
from .compile import compile_grammar, one_line


@functools.cache
def _executor() -> llguidance.LLExecutor:
    """One worker thread: a single sequence's draft masks are computed in order anyway."""
    return llguidance.LLExecutor(1)


class Constraint:
    """Matcher state of one sequence under ``grammar``.

    ``tokenizer``: the model's ``llguidance.LLTokenizer`` (built once per model);
    ``n_vocab``: the width ``V`` of the model's logits rows, at least the tokenizer's
    ``vocab_size``. An invalid grammar is a one-line :class:`UserError`.
    """

    def __init__(self, grammar: Grammar, tokenizer: llguidance.LLTokenizer, n_vocab: int) -> None:
        if n_vocab < tokenizer.vocab_size:
            raise ValueError(
                f"n_vocab {n_vocab} is narrower than the tokenizer's {tokenizer.vocab_size} ids"
            )
        matcher = llguidance.LLMatcher(tokenizer, compile_grammar(grammar), log_level=0)
        if matcher.is_error():
            raise UserError(f"invalid {grammar.what}: {one_line(matcher.get_error())}")
        self._matcher = matcher
        self._tokenizer = tokenizer
        self.n_vocab = n_vocab
        #: End-of-generation ids: allowed wherever the grammar may end.
        self.eos = frozenset(tokenizer.eos_tokens)
        #: Tokens consumed so far (an EOS included).
        self.n_consumed = 0
        self._ended = False

    def copy(self) -> Constraint:
        """An independent copy of this state (``LLMatcher.deep_copy``, microseconds)."""
        other = object.__new__(Constraint)
        other.__dict__.update(self.__dict__)
        other._matcher = self._matcher.deep_copy()
        return other

    # --- reading -------------------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        """The text so far is a complete answer: generation may stop here (EOS is allowed;
        still true after the EOS, which is only consumed where the grammar accepts)."""
        return self._matcher.is_accepting()

    @property
    def stopped(self) -> bool:
        """The grammar is complete and can take nothing but EOS (or EOS was consumed)."""
        return self._ended or self._matcher.is_stopped()

    def allowed(self) -> np.ndarray:
        """Bool ``[V]``: the tokens allowed next (nothing after an EOS)."""
        return self.masks(())[0]

    def masks(self, draft: Sequence[int]) -> np.ndarray:
        """Bool ``[k + 1, V]`` for a draft of ``k`` tokens: row ``i`` is :meth:`allowed` after
        ``draft[:i]`` were consumed, computed in one llguidance call without changing this
        state. Rows past the first token the grammar refuses, or past an EOS, allow nothing."""
        k = len(draft)
        n_tok = self._tokenizer.vocab_size
        bits = np.zeros((k + 1, (n_tok + 31) // 32), dtype=np.int32)
        if not self._ended:
            draft = [int(t) for t in draft]
            # llguidance leaves the rows after a refused token zero, but allows EOS again
            # after an EOS: cut the draft there.
            stop = next((i for i, t in enumerate(draft) if t in self.eos), k)
            if stop:
                llguidance.numpy.fill_next_token_bitmask_par_with_draft_tokens(
                    _executor(), [(self._matcher, 0, draft[:stop])], bits
                )
            else:
                llguidance.numpy.fill_next_token_bitmask(self._matcher, bits)
            if self._matcher.is_error():
                self._fail()
        # Bit j of 32-bit word w is token 32 w + j: little-endian bytes, little-endian bits;
        # unpacking past the last word pads with zeros up to ``n_vocab``.
        raw = bits.astype("<i4", copy=False).view(np.uint8)
        out = np.unpackbits(raw, axis=-1, count=self.n_vocab, bitorder="little")
        out[:, n_tok:] = 0
        return out.view(bool)

    def validate(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar accepts in turn from here: an EOS counts
        where the grammar may end (llguidance's ``validate_tokens`` refuses it once the grammar
        is complete, so EOS is judged here), nothing after it."""
        if self._ended:
            return 0
        tokens = [int(t) for t in tokens]
        stop = next((i for i, t in enumerate(tokens) if t in self.eos), len(tokens))
        n = self._matcher.validate_tokens(tokens[:stop]) if stop else 0
        if n < stop or stop == len(tokens):
            return n
        return stop + 1 if self._accepting_after(tokens[:stop]) else stop

    def _accepting_after(self, tokens: list[int]) -> bool:
        """Whether the grammar may end after the valid ``tokens`` (consumed, then rolled back)."""
        if not self._matcher.consume_tokens(tokens):
            self._fail()
        accepting = self._matcher.is_accepting()
        if tokens and not self._matcher.rollback(len(tokens)):
            self._fail()
        return accepting

    def forced(self) -> list[int]:
        """Tokens the grammar forces from here (llguidance's fast-forward tokens: the
        canonical tokenization of the forced bytes, stopping before any token a longer
        continuation could merge into). Empty when nothing is forced or after an EOS."""
        if self._ended:
            return []
        forced = self._matcher.compute_ff_tokens()
        if self._matcher.is_error():
            self._fail()
        return forced

    # --- moving with the KV cache ------------------------------------------------------

    def consume(self, tokens: Sequence[int]) -> None:
        """Commit ``tokens`` (sampled or accepted ones). A token the grammar refuses is a
        ``ValueError`` and nothing is consumed."""
        tokens = [int(t) for t in tokens]
        n = self.validate(tokens)
        if n < len(tokens):
            raise ValueError(
                f"the grammar refuses token {tokens[n]} at position {n} of {len(tokens)}"
            )
        if not tokens:
            return
        ends = tokens[-1] in self.eos
        if not self._matcher.consume_tokens(tokens[:-1] if ends else tokens):
            self._fail()
        self._ended = ends
        self.n_consumed += len(tokens)

    def settle(self) -> None:
        """Make every token consumed so far permanent: later rollbacks stop short of them (the
        text a lazy grammar starts after, say)."""
        self.n_consumed = 0

    def rollback(self, n: int) -> None:
        """Take back the last ``n`` consumed tokens (an EOS included); more than were
        consumed is a ``ValueError`` and changes nothing."""
        if not 0 <= n <= self.n_consumed:
            raise ValueError(f"cannot roll back {n} of {self.n_consumed} consumed tokens")
        if n == 0:
            return
        self.n_consumed -= n
        if self._ended:
            self._ended = False
            n -= 1
        if n and not self._matcher.rollback(n):
            self._fail()

    def _fail(self) -> NoReturn:
        """The matcher's error (a grammar too complex for llguidance's limits, say), on one
        line. The matcher stays broken: this sequence cannot go on under the grammar."""
        error = self._matcher.get_error() or "the grammar matcher failed"
        raise UserError(f"grammar error: {one_line(error)}")
