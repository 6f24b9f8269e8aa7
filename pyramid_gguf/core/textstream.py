"""Incremental detokenization that never emits half a UTF-8 character, stop strings, and the
UTF-8 check of text a user sends (:func:`encode_utf8`).

:class:`TextStream` turns token bytes into text deltas: bytes of an unfinished multi-byte
character are held back until the character completes. With stop strings it also holds back
any tail that could still grow into a stop string, and reports where a stop string completes so
the text before it is all that is ever emitted.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from .errors import UserError


class TextStream:
    """Feed token bytes, get printable text deltas.

    >>> s = TextStream(stop=("END",))
    >>> s.feed(b"ab"), s.feed(b"cE"), s.feed(b"ND!"), s.stopped
    ('ab', 'c', '', True)
    """

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(stop)
        self._pending = ""  # decoded text held back because it may start a stop string
        self.text = ""  # everything emitted so far
        self.stopped = False

    def feed(self, data: bytes) -> str:
        """Add one token's bytes; return the text that is now safe to show."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(data)
        return self._release(final=False)

    def flush(self) -> str:
        """End of generation: release whatever is held back (no stop string completed).

        Bytes of a character that the last token left unfinished (generation stopped by
        ``max_tokens`` inside a multi-byte character) are dropped, not shown as U+FFFD; the
        tokens still count as generated.
        """
        if self.stopped:
            return ""
        self._decoder.reset()
        return self._release(final=True)

    def _release(self, *, final: bool) -> str:
        hit = min((i for i in (self._pending.find(s) for s in self._stop) if i >= 0), default=-1)
        if hit >= 0:
            out, self._pending, self.stopped = self._pending[:hit], "", True
        elif final:
            out, self._pending = self._pending, ""
        else:
            keep = max((_overlap(self._pending, s) for s in self._stop), default=0)
            cut = len(self._pending) - keep
            out, self._pending = self._pending[:cut], self._pending[cut:]
        self.text += out
        return out


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


def encode_utf8(text: str, what: str) -> bytes:
    """``text`` as UTF-8, or a :class:`UserError` naming ``what`` and the first bad character.

    Python keeps undecodable input bytes as lone surrogates (U+DC80-U+DCFF for byte 0x80-0xFF),
    which have no UTF-8 encoding.
    """
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = ord(text[e.start])
        shown = f"byte 0x{bad - 0xDC00:02x}" if 0xDC80 <= bad <= 0xDCFF else f"U+{bad:04X}"
        raise UserError(f"{what} is not valid UTF-8: {shown} at character {e.start}") from None
