"""Incremental detokenization and stop strings."""

from __future__ import annotations

from pyramid_gguf.core.textstream import TextStream


def test_multibyte_character_split_across_tokens_is_held_back() -> None:
    data = "héllo €".encode()
    s = TextStream()
    out = [s.feed(data[i : i + 1]) for i in range(len(data))]
    assert "".join(out) + s.flush() == "héllo €"
    assert all("\ufffd" not in piece for piece in out)
    euro = "€".encode()
    s2 = TextStream()
    assert s2.feed(euro[:1]) == ""
    assert s2.feed(euro[1:2]) == ""
    assert s2.feed(euro[2:]) == "€"


def test_stop_string_across_tokens_is_never_emitted() -> None:
    s = TextStream(stop=("</end>",))
    emitted = [s.feed(b) for b in (b"abc </", b"en", b"d> more")]
    assert "".join(emitted) == "abc "
    assert s.stopped
    assert s.feed(b"x") == ""


def test_partial_stop_prefix_is_released_when_it_does_not_complete() -> None:
    s = TextStream(stop=("STOP",))
    assert s.feed(b"ST") == ""
    assert s.feed(b"ART") == "START"
    assert s.flush() == ""
    assert s.text == "START"


def test_flush_releases_held_prefix_at_end() -> None:
    s = TextStream(stop=("STOP",))
    assert s.feed(b"abc ST") == "abc "
    assert s.flush() == "ST"
    assert s.text == "abc ST"


def test_character_cut_by_the_last_token_is_dropped_not_replaced() -> None:
    """max_tokens can stop inside a multi-byte character: its bytes are dropped at the end,
    and a character broken in the middle of the text still shows as U+FFFD."""
    cat = "🐱".encode()
    s = TextStream()
    assert s.feed(b"ok " + cat[:2]) == "ok "
    assert s.flush() == ""
    assert s.text == "ok "
    s = TextStream()
    assert s.feed(cat[:2] + b"!") == "\ufffd!"  # invalid in the middle: shown as such
