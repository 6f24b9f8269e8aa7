"""Incremental detokenization and stop strings."""

from __future__ import annotations

from pyramid_gguf.serving.textstream import TextStream


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
