"""One sequence's grammar, kept in step with whatever context a round is looking at.

A :class:`Guide` holds the sequence's :class:`~pyramid_gguf.grammar.Constraint` (or, for a lazy
grammar, waits for a :class:`~pyramid_gguf.core.grammar.Trigger` to start one) and answers for
any context that extends the committed tokens, as a tier's KV cache does: it rolls its matcher
back to the part of the context it shares and consumes the rest (:meth:`Guide._goto`). So a
draft model asks for the allowed tokens after its own drafted tokens, a verification for the
masks of every position of a block, and the next round starts from the committed text again.

Where the grammar is not active (no grammar, or before a lazy one's trigger) every read says
"anything goes" (``None`` masks). Losslessness (docs/ALGORITHMS.md, "Grammars"): every tier's
rows are masked by the same grammar at the same positions, so each stage's ``p`` and ``q`` are
the tiers' distributions restricted to the allowed tokens and renormalised, and the rules keep
the masked target's distribution exactly.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import llguidance
import numpy as np

from ...core.grammar import Grammar, Trigger
from ...grammar import Constraint
from ...grammar.masking import mask_logits
from .tiers import common_prefix

F = TypeVar("F", bound=Callable[..., Any])


def _timed(method: F) -> F:
    """Add the time a :class:`Guide` method takes to the guide's ``seconds``."""

    @functools.wraps(method)
    def timed(self: Guide, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return method(self, *args)
        finally:
            self.seconds += time.perf_counter() - t0

    return cast(F, timed)


class Guide:
    """The grammar of one generation whose answer starts at ``start`` in its committed tokens.

    ``grammar``: constrains the whole answer; ``triggers``: lazy grammars, each starting where
    its text appears in the answer (``grammar`` and ``triggers`` are exclusive). ``piece``
    gives a token's bytes (special tokens rendered), to find triggers in the text.
    """

    def __init__(
        self,
        tokenizer: llguidance.LLTokenizer,
        n_vocab: int,
        piece: Callable[[int], bytes],
        start: int,
        *,
        grammar: Grammar | None = None,
        triggers: Sequence[Trigger] = (),
    ) -> None:
        if grammar is not None and triggers:
            raise ValueError("a generation has one grammar: a whole-answer one or lazy triggers")
        self.tokenizer = tokenizer
        self.n_vocab = n_vocab
        self.piece = piece
        self.start = start
        self.triggers = tuple(triggers)
        self.constraint: Constraint | None = None
        #: Where the constraint's first token sits in the committed tokens.
        self.begin = start
        #: The tokens the matcher has consumed: ``context[begin : begin + len(fed)]``.
        self.fed: list[int] = []
        if grammar is not None:
            self.constraint = Constraint(grammar, tokenizer, n_vocab)
        #: Tokens of the answer scanned for triggers so far, and their bytes.
        self._scanned = 0
        self._text = b""
        #: A lazy grammar took over the answer (its trigger appeared).
        self.triggered: Trigger | None = None
        #: Seconds spent here (masks, checks, forced tokens, trigger scans).
        self.seconds = 0.0

    @property
    def active(self) -> bool:
        """The grammar constrains the tokens from :attr:`begin` on."""
        return self.constraint is not None

    # --- reading, at any context that extends the committed tokens ------------------------

    def mask(
        self, context: Sequence[int], logits: np.ndarray, tokens: Sequence[int] = ()
    ) -> np.ndarray:
        """``logits`` under the grammar: the row ``[V]`` after ``context``, or the rows
        ``[k + 1, V]`` after it and after each prefix of ``tokens`` (a valid block), with every
        token the grammar refuses at ``-inf``; unchanged where the grammar is not active."""
        masks = self.masks(context, tokens)
        if masks is None:
            return logits
        return mask_logits(logits, masks[0] if logits.ndim == 1 else masks)

    @_timed
    def masks(self, context: Sequence[int], tokens: Sequence[int]) -> np.ndarray | None:
        """Bool ``[k + 1, V]``: the allowed tokens after ``context`` and after each prefix of
        ``tokens`` (a valid block), or None where the grammar is not active."""
        if not self._goto(context):
            return None
        assert self.constraint is not None
        masks = self.constraint.masks(tokens)
        # A row after an end-of-generation token allows nothing; nothing after it is ever
        # committed, but its row must stay a distribution: let it end again.
        empty = ~masks.any(axis=-1)
        if empty.any():
            ends = np.array([e for e in self.constraint.eos if e < masks.shape[-1]], dtype=np.int64)
            masks[np.ix_(np.flatnonzero(empty), ends)] = True
        return masks

    @_timed
    def valid(self, context: Sequence[int], tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar accepts after ``context``."""
        if not self._goto(context):
            return len(tokens)
        assert self.constraint is not None
        return self.constraint.validate(tokens)

    @_timed
    def forced(self, context: Sequence[int]) -> list[int]:
        """The tokens the grammar forces after ``context`` (empty where inactive)."""
        if not self._goto(context):
            return []
        assert self.constraint is not None
        return self.constraint.forced()

    def _goto(self, context: Sequence[int]) -> bool:
        """Bring the matcher to ``context``; False where the grammar is not active there."""
        if self.constraint is None or len(context) < self.begin:
            return False
        want = context[self.begin :]
        keep = common_prefix(self.fed, want)
        if keep < len(self.fed):
            self.constraint.rollback(len(self.fed) - keep)
            del self.fed[keep:]
        rest = [int(t) for t in want[keep:]]
        if rest:
            self.constraint.consume(rest)
            self.fed += rest
        return True

    # --- committing ---------------------------------------------------------------------

    @_timed
    def observe(self, committed: Sequence[int]) -> bool:
        """Called after each committed token: True when a lazy grammar's trigger has just
        appeared, ending with that token. Its constraint then starts: what the token holds
        after the trigger's end must fit the grammar (else the answer has left it already and
        stays free), and the round must stop here: its later tokens were chosen without it."""
        if not self.triggers or self.triggered is not None:
            return False
        answer = committed[self.start :]
        if len(answer) == self._scanned:
            return False
        seen = len(self._text)
        self._text += b"".join(self.piece(t) for t in answer[self._scanned :])
        self._scanned = len(answer)
        for trigger in self.triggers:
            end = self._find(self._text, trigger, seen)
            if end is not None:
                self._begin(len(committed), trigger, self._text[end:])
                return True
        return False

    @staticmethod
    def _find(text: bytes, trigger: Trigger, seen: int) -> int | None:
        """Byte offset of the end of ``trigger`` in the answer's ``text``, or None; a literal
        trigger anywhere is only looked for where it could end after the first ``seen`` bytes
        (the text grows token by token)."""
        lead = len(text) - len(text.lstrip()) if trigger.at_start else 0
        if trigger.regex:
            pattern = re.compile(trigger.text.encode("utf-8"))
            found = pattern.match(text, lead) if trigger.at_start else pattern.search(text)
            return None if found is None else found.end()
        needle = trigger.text.encode("utf-8")
        if trigger.at_start:
            return lead + len(needle) if text[lead:].startswith(needle) else None
        at = text.find(needle, max(seen - len(needle) + 1, 0))
        return at + len(needle) if at >= 0 else None

    def _begin(self, begin: int, trigger: Trigger, leftover: bytes) -> None:
        """Start ``trigger``'s grammar after the committed token ``begin - 1``, whose text
        ends with ``leftover`` past the trigger (consumed into the matcher first)."""
        self.triggered = trigger
        constraint = Constraint(trigger.grammar, self.tokenizer, self.n_vocab)
        if leftover:
            tokens = self.tokenizer.tokenize_bytes(leftover)
            if constraint.validate(tokens) < len(tokens):
                return  # the answer has already left the grammar: it stays free
            constraint.consume(tokens)
            constraint.settle()  # not the context's tokens: never rolled back
        self.constraint = constraint
        self.begin = begin
        self.fed = []
