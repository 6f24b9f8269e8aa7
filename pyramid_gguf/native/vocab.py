"""A model's vocabulary: tokenizing, token bytes and texts, special tokens.

:class:`Vocab` borrows the ``llama_vocab`` pointer of a :class:`~.handles.ModelHandle` (the
model owns and frees it), so it lives no longer than its model.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import llama_cpp

from ..core.textstream import encode_utf8


class Vocab:
    """Tokenizer and token facts of one loaded model."""

    def __init__(self, vocab_ptr: Any) -> None:
        self._ptr = vocab_ptr
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab_ptr))
        self._pieces: tuple[bytes, ...] | None = None
        #: ``token_bytes`` of the tokens asked for so far, per ``special``.
        self._bytes: tuple[dict[int, bytes], dict[int, bytes]] = ({}, {})

    @property
    def ptr(self) -> Any:
        """The borrowed ``llama_vocab`` pointer (for llguidance's tokenizer, :mod:`.grammar`)."""
        return self._ptr

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        """Token ids of ``text``; ``add_special`` adds BOS where the model asks for it.

        Text that cannot be UTF-8 (lone surrogates: undecodable bytes of a command line, or
        ``"\\ud800"`` in JSON) is a :class:`UserError`."""
        return self.tokenize_bytes(
            encode_utf8(text, "the prompt"), add_special=add_special, parse_special=parse_special
        )

    def tokenize_bytes(
        self, data: bytes, *, add_special: bool = False, parse_special: bool = False
    ) -> list[int]:
        """Token ids of raw bytes (by default without BOS, special tokens not parsed, as
        llama.cpp tokenizes DRY's sequence breakers)."""
        cap = len(data) + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(
            self._ptr, data, len(data), buf, cap, add_special, parse_special
        )
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(
                self._ptr, data, len(data), buf, cap, add_special, parse_special
            )
        return list(buf[:n])

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The raw bytes one token renders to (control tokens render empty unless ``special``)."""
        known = self._bytes[1 if special else 0]
        got = known.get(token)
        if got is None:
            got = known[int(token)] = self._piece(int(token), special)
        return got

    def _piece(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._ptr, int(token), buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._ptr, int(token), buf, -n, 0, special)
        return buf.raw[:n]

    def pieces(self) -> tuple[bytes, ...]:
        """Every token alone as llama.cpp's ``llama_vocab::detokenize({t}, true)`` renders it
        (special text included; what DRY searches for its breakers). ``[V]``, read once."""
        if self._pieces is None:
            one = (llama_cpp.llama_token * 1)()
            buf = ctypes.create_string_buffer(256)
            out = []
            for t in range(self.n_vocab):
                one[0] = t
                n = llama_cpp.llama_detokenize(self._ptr, one, 1, buf, 256, False, True)
                if n < 0:
                    big = ctypes.create_string_buffer(-n)
                    n = llama_cpp.llama_detokenize(self._ptr, one, 1, big, -n, False, True)
                    out.append(big.raw[:n])
                else:
                    out.append(buf.raw[:n])
            self._pieces = tuple(out)
        return self._pieces

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        """Text of ``tokens`` (invalid UTF-8 replaced; ``special``: control tokens rendered)."""
        data = b"".join(self.token_bytes(t, special=special) for t in tokens)
        return data.decode("utf-8", errors="replace")

    def token_text(self, token: int) -> str:
        """The vocabulary's stored text of a token (what the vocabulary check compares)."""
        raw = llama_cpp.llama_vocab_get_text(self._ptr, int(token))
        return raw.decode("utf-8", errors="replace") if raw else ""

    def is_eog(self, token: int) -> bool:
        """End of generation (EOS, EOT, ...)."""
        return bool(llama_cpp.llama_vocab_is_eog(self._ptr, int(token)))

    @property
    def bos(self) -> int:
        return int(llama_cpp.llama_vocab_bos(self._ptr))

    @property
    def eos(self) -> int:
        return int(llama_cpp.llama_vocab_eos(self._ptr))
