"""The n-gram drafter's index: the longest earlier match of the current suffix, and what followed.

Prompt lookup made selective. :class:`NGramIndex` indexes every position of a token sequence by
the :data:`KEY` tokens ending there and grows as tokens are committed; :meth:`NGramIndex.match`
finds the longest earlier occurrence of the sequence's suffix (ties: the most recent) and
returns what followed it. A :class:`NGramPool` keeps finished sequences (earlier requests of a
server) and is searched too; :class:`NGramLookup` searches both. Longer matches are kept far
more often by the verifier, so the match length travels with the proposal: ``auto`` sizes its
block by it, fixed modes only require a minimum (``ngram_min``). The drafter itself, a
:class:`~.proposers.Proposer` like the draft models, is :class:`~.proposers.NGramProposer`.

Pure Python: no model evaluation, no ``llama_cpp``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

#: Tokens of the index key (also the shortest match ever found).
KEY = 2
#: Matches are measured up to this many tokens (longer ones are as good as certain).
MAX_MATCH = 64
#: Earlier occurrences of the key examined per lookup, newest first.
MAX_CANDIDATES = 64
#: Quoted match length that shows the answer copying its prompt (:attr:`Match.copying`), the
#: key length of llama.cpp's ``ngram-simple``. Over the six shipped sets (greedy, 256 tokens)
#: the target kept the next token after 95% of such matches.
COPY_EVIDENCE = 12


@dataclass(frozen=True)
class Match:
    """A suffix match: ``length`` tokens matched, then the ``continuation`` that followed.

    ``quoted``: the match lies in text the answer was given (its prompt, or the shared pool),
    not in the answer itself. Answers that quote their prompt (an edit) copy on; an answer
    that echoes its own short phrase usually does not.
    """

    length: int
    continuation: list[int]
    quoted: bool = False

    @property
    def copying(self) -> bool:
        """The answer is visibly copying its prompt: the match quotes it (or the pool) for at
        least :data:`COPY_EVIDENCE` tokens, what llama.cpp's ``ngram-simple`` drafts on."""
        return self.quoted and self.length >= COPY_EVIDENCE


class NGramIndex:
    """Every position of a token sequence, keyed by the :data:`KEY` tokens ending there."""

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` and index the new positions."""
        seq = self.tokens
        for t in tokens:
            seq.append(int(t))
            if len(seq) >= KEY:
                self._ends.setdefault(tuple(seq[-KEY:]), []).append(len(seq) - 1)

    def sync(self, context: Sequence[int]) -> None:
        """Make the index hold exactly ``context`` (extending it when it continues the
        indexed tokens, rebuilding it otherwise)."""
        n = len(self.tokens)
        if len(context) >= n and list(context[:n]) == self.tokens:
            self.extend(context[n:])
        else:
            self.tokens, self._ends = [], {}
            self.extend(context)

    def match(
        self, suffix: Sequence[int], max_tokens: int, *, skip_last: bool, quoted_before: int = 0
    ) -> Match | None:
        """The longest earlier occurrence of ``suffix``'s tail in this sequence.

        ``skip_last``: ``suffix`` is this sequence itself, so its own end is not a match.
        ``quoted_before``: matches ending before this position are :attr:`Match.quoted`.
        Returns None when no occurrence of at least :data:`KEY` tokens has a continuation.
        """
        if len(suffix) < KEY or max_tokens < 1:
            return None
        ends = self._ends.get(tuple(suffix[-KEY:]))
        if not ends:
            return None
        seq = self.tokens
        best_len, best_end = 0, -1
        examined = 0
        for end in reversed(ends):
            if skip_last and end >= len(seq) - 1:
                continue
            examined += 1
            if examined > MAX_CANDIDATES:
                break
            n = KEY
            limit = min(MAX_MATCH, end + 1, len(suffix))
            while n < limit and seq[end - n] == suffix[-1 - n]:
                n += 1
            if n > best_len:
                best_len, best_end = n, end
                if n >= limit:
                    break
        if best_end < 0 or best_end + 1 >= len(seq):
            return None
        continuation = seq[best_end + 1 : best_end + 1 + max_tokens]
        return Match(best_len, continuation, quoted=best_end < quoted_before)


class NGramPool:
    """Finished sequences (earlier requests) searched by later ones; at most ``max_tokens``
    tokens in all, oldest dropped first. Thread-safe."""

    def __init__(self, max_tokens: int = 1 << 18) -> None:
        self.max_tokens = max_tokens
        self._docs: deque[NGramIndex] = deque()
        self._size = 0
        self._lock = threading.Lock()

    def add(self, tokens: Sequence[int]) -> None:
        if len(tokens) <= KEY:
            return
        doc = NGramIndex(tokens[-self.max_tokens :])
        with self._lock:
            self._docs.append(doc)
            self._size += len(doc)
            while self._size > self.max_tokens:
                self._size -= len(self._docs.popleft())

    def match(self, suffix: Sequence[int], max_tokens: int) -> Match | None:
        if len(suffix) < KEY or max_tokens < 1:
            return None
        key = tuple(suffix[-KEY:])
        with self._lock:  # a dict look-up per document: a full pool holds hundreds of them
            docs = [d for d in self._docs if key in d._ends]
        best: Match | None = None
        for doc in reversed(docs):  # newest first: it wins ties
            m = doc.match(suffix, max_tokens, skip_last=False, quoted_before=len(doc))
            if m is not None and (best is None or m.length > best.length):
                best = m
        return best


class NGramLookup:
    """The longest earlier match of a context's suffix, in the context itself (indexed as it
    grows) and in an optional shared pool: what the n-gram drafter proposes from."""

    def __init__(self, pool: NGramPool | None = None) -> None:
        self.index = NGramIndex()
        self.pool = pool

    def lookup(
        self, context: Sequence[int], max_tokens: int, answer_start: int = 0
    ) -> Match | None:
        """The longest match of ``context``'s suffix: in ``context`` itself, else in the pool
        when the pool's is longer. Matches before ``answer_start`` (the prompt) and in the
        pool are quoted."""
        self.index.sync(context)
        own = self.index.match(context, max_tokens, skip_last=True, quoted_before=answer_start)
        if self.pool is None:
            return own
        pooled = self.pool.match(context, max_tokens)
        if pooled is not None and (own is None or pooled.length > own.length):
            return pooled
        return own
