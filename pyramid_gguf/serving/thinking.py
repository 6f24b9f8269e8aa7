"""A thinking model's answer split into its thoughts and the rest, as the text arrives.

Templates of thinking models (Qwen3, DeepSeek-R1 and their kin) have the model think between
``<think>`` and ``</think>`` before it answers; the opening tag is the model's first text, or the
last of the prompt (the template opened it). :class:`Thoughts` reads pieces of the answer's text
and returns, for each, the part that is thinking and the part that is answer, holding back the
characters that may yet be the start of a tag (and the whitespace at the edges of the thinking,
which the tags' lines leave), so a streamed split and a whole one are the same text.
"""

from __future__ import annotations

OPEN = "<think>"
CLOSE = "</think>"


class Thoughts:
    """One answer's split: :meth:`feed` each piece of text, :meth:`finish` at the end; each
    returns ``(thinking, text)``. Text that does not open with ``<think>`` (after whitespace) is
    all answer; thinking that is never closed (an answer cut short) is all thinking.
    ``opened``: the prompt ended with ``<think>``, so the answer begins inside it."""

    def __init__(self, opened: bool = False) -> None:
        self._state = "thinking" if opened else "start"
        self._held = ""
        #: Drop the whitespace before the next text (after a tag).
        self._skip = opened

    def feed(self, piece: str) -> tuple[str, str]:
        self._held += piece
        thought = ""
        if self._state == "start":
            head = self._held.lstrip()
            if OPEN.startswith(head):  # nothing but whitespace yet, or the tag's start
                return "", ""
            if head.startswith(OPEN):
                self._state, self._held, self._skip = "thinking", head[len(OPEN) :], True
            else:
                self._state = "text"
        if self._state == "thinking":
            self._skip_space()
            end = self._held.find(CLOSE)
            if end < 0:
                cut = len(self._held) - _held_back(self._held)
                thought, self._held = self._held[:cut], self._held[cut:]
                return thought, ""
            thought = self._held[:end].rstrip()
            self._state, self._held, self._skip = "text", self._held[end + len(CLOSE) :], True
        self._skip_space()
        text, self._held = self._held, ""
        return thought, text

    def finish(self) -> tuple[str, str]:
        """What was held back: the end of unclosed thinking, or text that never opened any."""
        held, self._held = self._held, ""
        if self._state == "thinking":
            return held.rstrip(), ""
        return "", held

    def _skip_space(self) -> None:
        if self._skip:
            self._held = self._held.lstrip()
            self._skip = not self._held


def _held_back(text: str) -> int:
    """How many characters at the end of ``text`` may still be the closing tag's start or the
    whitespace before it."""
    longest = min(len(CLOSE) - 1, len(text))
    tag = next((k for k in range(longest, 0, -1) if CLOSE.startswith(text[-k:])), 0)
    body = text[: len(text) - tag]
    return tag + len(body) - len(body.rstrip())


def split(text: str, opened: bool = False) -> tuple[str, str]:
    """A whole answer's ``(thinking, text)``."""
    thoughts = Thoughts(opened)
    thought, said = thoughts.feed(text)
    rest_thought, rest = thoughts.finish()
    return thought + rest_thought, said + rest
