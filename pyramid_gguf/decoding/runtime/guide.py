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

import json
from collections.abc import Callable, Sequence

import llguidance
import numpy as np

from ...core.grammar import Grammar, Trigger
from ...grammar import Constraint
from .tiers import common_prefix


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
        #: Tokens of the answer scanned for triggers so far.
        self._scanned = 0
        #: A lazy grammar took over the answer (its trigger appeared).
        self.triggered: Trigger | None = None

    @property
    def active(self) -> bool:
        """The grammar constrains the tokens from :attr:`begin` on."""
        return self.constraint is not None

    # --- reading, at any context that extends the committed tokens ------------------------

    def allowed(self, context: Sequence[int]) -> np.ndarray | None:
        """Bool ``[V]``: the tokens allowed after ``context``, or None (anything)."""
        masks = self.masks(context, ())
        return None if masks is None else masks[0]

    def masks(self, context: Sequence[int], tokens: Sequence[int]) -> np.ndarray | None:
        """Bool ``[k + 1, V]``: the allowed tokens after ``context`` and after each prefix of
        ``tokens`` (a valid block), or None where the grammar is not active."""
        if not self._goto(context):
            return None
        assert self.constraint is not None
        return self.constraint.masks(tokens)

    def valid(self, context: Sequence[int], tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar accepts after ``context``."""
        if not self._goto(context):
            return len(tokens)
        assert self.constraint is not None
        return self.constraint.validate(tokens)

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

    def observe(self, committed: Sequence[int]) -> int | None:
        """Called after each committed token: where a lazy grammar's trigger has just appeared,
        start its constraint and return how many committed tokens to keep (the tokens after the
        trigger were chosen without it, so the round ends at the last one the grammar accepts);
        else None."""
        if not self.triggers or self.triggered is not None:
            return None
        answer = committed[self.start :]
        n_tok = len(answer)
        if n_tok == self._scanned:
            return None
        self._scanned = n_tok
        text = b"".join(self.piece(t) for t in answer)
        for trigger in self.triggers:
            at = self._find(text, trigger)
            if at is not None:
                return self._begin(committed, trigger, text, at)
        return None

    def _find(self, text: bytes, trigger: Trigger) -> int | None:
        """Byte offset of ``trigger`` in the answer's ``text``, or None."""
        needle = trigger.text.encode("utf-8")
        if trigger.at_start:
            lead = len(text) - len(text.lstrip())
            return lead if text[lead:].startswith(needle) else None
        at = text.find(needle)
        return at if at >= 0 else None

    def _begin(self, committed: Sequence[int], trigger: Trigger, text: bytes, at: int) -> int:
        """Start ``trigger``'s grammar at the token where its text begins (``at`` bytes into
        the answer); keep the committed tokens it accepts and return how many that is."""
        self.triggered = trigger
        answer = committed[self.start :]
        first, offset = 0, 0
        while first < len(answer) and offset + len(self.piece(answer[first])) <= at:
            offset += len(self.piece(answer[first]))
            first += 1
        lead = text[offset:at].decode("utf-8", errors="replace")
        grammar = _prefixed(trigger.grammar, lead) if lead else trigger.grammar
        self.constraint = Constraint(grammar, self.tokenizer, self.n_vocab)
        self.begin = self.start + first
        tail = [int(t) for t in answer[first:]]
        n = self.constraint.validate(tail)
        self.constraint.consume(tail[:n])
        self.fed = tail[:n]
        return self.begin + n


def _prefixed(grammar: Grammar, lead: str) -> Grammar:
    """A Lark ``grammar`` that first matches the literal text ``lead`` (what the token holding a
    trigger's start has before it)."""
    if grammar.kind != "lark" or not grammar.text.startswith("start:"):
        raise ValueError("a trigger's grammar is a Lark grammar starting with its start rule")
    body = grammar.text.replace("start:", "trigger_start:", 1)
    return Grammar.lark(f"start: {json.dumps(lead)} trigger_start\n{body}")
