"""The n-gram drafter: longest earlier suffix match, the newest on ties, a pool shared across
requests, and a minimum match length in the fixed modes."""

from __future__ import annotations

from pathlib import Path

from pyramid_gguf.decoding.runtime.ngram import (
    COPY_EVIDENCE,
    KEY,
    NGramIndex,
    NGramLookup,
    NGramPool,
)
from pyramid_gguf.decoding.runtime.proposers import NGramProposer


def test_longest_match_wins_over_the_newest_shorter_one() -> None:
    #        0  1  2  3  4  5  6  7  8  9 10 11 12 13
    seq = [9, 1, 2, 3, 50, 7, 2, 3, 60, 8, 9, 1, 2, 3]
    m = NGramIndex(seq).match(seq, 4, skip_last=True)
    assert m is not None
    assert m.length == 4  # [9, 1, 2, 3] at 0..3 beats [2, 3] at 6..7
    assert m.continuation == [50, 7, 2, 3]


def test_ties_go_to_the_newest_occurrence_and_the_suffix_itself_is_skipped() -> None:
    seq = [5, 6, 70, 5, 6, 80, 5, 6]
    m = NGramIndex(seq).match(seq, 3, skip_last=True)
    assert m is not None and m.length == 2 and m.continuation == [80, 5, 6]
    assert NGramIndex([1, 2, 3, 4]).match([1, 2, 3, 4], 3, skip_last=True) is None


def test_matches_in_the_prompt_or_the_pool_are_quoted() -> None:
    prompt = [1, 2, 3, 40, 41]
    answer = [9, 1, 2, 3]  # quotes the prompt
    m = NGramLookup().lookup(prompt + answer, 2, answer_start=len(prompt))
    assert m is not None and m.quoted and m.continuation == [40, 41]
    answer = [9, 7, 8, 50, 6, 7, 8]  # echoes itself
    m = NGramLookup().lookup(prompt + answer, 2, answer_start=len(prompt))
    assert m is not None and not m.quoted and m.continuation == [50, 6]
    pool = NGramPool()
    pool.add([5, 6, 7, 8, 60])
    m = NGramLookup(pool).lookup([*prompt, 6, 7, 8], 1, answer_start=len(prompt))
    assert m is not None and m.quoted and m.continuation == [60]


def test_a_long_quote_is_evidence_of_copying_an_echo_is_not() -> None:
    """``copying``: the answer has quoted its prompt for COPY_EVIDENCE tokens (llama.cpp's
    ngram-simple key); the same length echoing the answer itself does not count."""
    prompt = list(range(100, 140))
    answer = prompt[5 : 5 + COPY_EVIDENCE]
    m = NGramLookup().lookup(prompt + answer, 4, answer_start=len(prompt))
    assert m is not None and m.quoted and m.length == COPY_EVIDENCE and m.copying
    m = NGramLookup().lookup(prompt + answer[:-1], 4, answer_start=len(prompt))
    assert m is not None and m.quoted and not m.copying
    phrase = list(range(500, 500 + COPY_EVIDENCE + 1))
    m = NGramLookup().lookup([1, 2, *phrase, 7, *phrase], 4, answer_start=2)
    assert m is not None and not m.quoted and m.length > COPY_EVIDENCE and not m.copying


def test_index_follows_a_growing_context_and_rebuilds_on_a_new_one() -> None:
    drafter = NGramLookup()
    ctx = [1, 2, 3, 4, 1, 2]
    m = drafter.lookup(ctx, 2)
    assert m is not None and m.continuation == [3, 4]
    ctx += [3, 4, 1]  # committed tokens appended: the index extends
    m = drafter.lookup(ctx, 8)
    assert m is not None and m.length == 5 and m.continuation == [2, 3, 4, 1]
    assert drafter.lookup([7, 8, 9], 4) is None  # another prompt: rebuilt, nothing repeats


def test_pool_shares_earlier_requests_and_stays_bounded() -> None:
    pool = NGramPool(max_tokens=40)
    pool.add([10, 11, 12, 13, 14, 15, 16])
    drafter = NGramLookup(pool)
    m = drafter.lookup([1, 2, 10, 11, 12], 3)
    assert m is not None and m.length == 3 and m.continuation == [13, 14, 15]
    for i in range(10):  # 10 x 7 tokens > 40: the oldest documents are dropped
        pool.add([100 + i, 200, 201, 202, 203, 204, 205])
    assert drafter.lookup([1, 2, 10, 11, 12], 3) is None
    assert NGramLookup(None).lookup([1, 2, 10, 11, 12], 3) is None


def test_fixed_mode_proposer_needs_the_minimum_match() -> None:
    ctx = [1, 2, 3, 50, 51, 0, 2, 3]  # only a 2-token match ([2, 3])
    assert KEY == 2
    assert NGramProposer(4, min_match=2).propose(ctx, 4).tokens == [50, 51, 0, 2]
    assert NGramProposer(4, min_match=3).propose(ctx, 4).tokens == []
    assert NGramProposer(4, min_match=2).propose(ctx, 1).tokens == [50]


def test_a_server_ladder_remembers_earlier_answers(tiny_target: Path) -> None:
    """``share_ngrams`` (what ``serve`` turns on): a finished generation feeds the pool, so a
    later request that quotes it finds a long match there."""
    from conftest import TINY_LOAD

    from pyramid_gguf import LadderPaths, Pyramid, SamplingConfig, SpecConfig

    greedy = SamplingConfig(temperature=0, max_tokens=24, ignore_eos=True)
    with Pyramid.load(LadderPaths(tiny_target), load=TINY_LOAD, share_ngrams=True) as p:
        assert p.pool is not None
        first = p.generate("the model of the tree", greedy, SpecConfig(mode="target")).token_ids
        quote = [*p.tokenize("graph path"), *first[:10]]
        m = NGramLookup(p.pool).lookup(quote, 8)
        assert m is not None and m.length >= 10 and m.continuation == first[10:18]
    with Pyramid.load(LadderPaths(tiny_target), load=TINY_LOAD) as p:
        assert p.pool is None  # the Python API does not share by default
