"""DRY ("don't repeat yourself"), llama.cpp's repetition sampler, as a warp of each position
after its own prefix.

- The formula: llama.cpp's own ``test-sampling.cpp`` cases, and hand-built histories whose
  repetitions, breakers and penalties can be read off.
- The breaker table: a hand-built vocabulary, then the tiny model's real one, where every
  penalty equals what llama.cpp's DRY sampler computes on the same history.
- Losslessness: greedy speculative decoding under DRY is target decoding under DRY (and DRY
  changes a looping answer); sampled, the first two tokens follow the target's distribution
  under DRY by a chi-square test.
- The surfaces: llama-server's and OpenAI's fields, ``run --dry-multiplier``.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import httpx
import llama_cpp
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import TINY_LOAD
from lossless import chain_joint, chi_square_pvalue
from serving_support import live_server

from pyramid_gguf import Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.cli.main import main
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.decoding.runtime import warps
from pyramid_gguf.decoding.runtime.engine import decode, make_scheduler
from pyramid_gguf.decoding.runtime.sampling import Sampler
from pyramid_gguf.decoding.runtime.stats import GenerationStats
from pyramid_gguf.decoding.runtime.tiers import ModelTier
from pyramid_gguf.serving.settings import ServerSettings

GREEDY = SamplingConfig(temperature=0, max_tokens=40, ignore_eos=True)
HOT = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=2, ignore_eos=True)


def table(*breakers: Sequence[int]) -> warps.Breakers:
    """A breaker table from token sequences (head, then tail), as llama.cpp's tests give it."""
    out: dict[int, set[tuple[int, ...]]] = {}
    for b in breakers:
        out.setdefault(b[0], set()).add(tuple(b[1:]))
    return {t: frozenset(v) for t, v in out.items()}


def penalties(
    history: Sequence[int],
    breakers: warps.Breakers = {},  # noqa: B006 (read only)
    *,
    multiplier: float = 1.0,
    base: float = 2.0,
    allowed_length: int = 1,
    last_n: int = -1,
) -> dict[int, float]:
    return warps.dry_penalties(
        history,
        breakers,
        multiplier=multiplier,
        base=base,
        allowed_length=allowed_length,
        last_n=last_n,
    )


# --- the formula ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("probs", "history", "want", "multiplier", "base", "allowed", "last_n", "breakers"),
    [
        ([0.25] * 4, [0, 1], [0.25] * 4, 1.0, 1.1, 2, 4, []),
        ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, 5, []),
        ([0.2] * 5, [0, 1, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 2, 6, [[3]]),
        ([0.2] * 5, [0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818],
         2.0, 1.1, 2, 5, []),
        ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 4, 7, []),
    ],
)  # fmt: skip
def test_llama_cpp_test_sampling_cases(
    probs: list[float],
    history: list[int],
    want: list[float],
    multiplier: float,
    base: float,
    allowed: int,
    last_n: int,
    breakers: list[list[int]],
) -> None:
    """llama.cpp's ``tests/test-sampling.cpp`` ``test_dry`` cases, through the whole chain
    (DRY alone, then the softmax), to its tolerance."""
    cfg = SamplingConfig(
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        min_p=0.0,
        dry_multiplier=multiplier,
        dry_base=base,
        dry_allowed_length=allowed,
        dry_penalty_last_n=last_n,
        samplers=("dry",),
    )
    z = np.log(np.array(probs))[None]
    adjusted = warps.adjust(z, cfg, [history], table(*breakers))
    np.testing.assert_allclose(warps.finish(adjusted, cfg)[0], want, atol=1e-5)


def test_repetitions_and_their_penalties() -> None:
    """History ``a b c c b c y a b c`` (llama.cpp's comment): the last three tokens ``a b c``
    appeared before ``c``, ``b c`` before ``y``, ``c`` before ``b``. With allowed length 1,
    multiplier 1 and base 2 the next token is lowered by ``2 ** (length - 1)``."""
    a, b, c, y = 1, 2, 3, 9
    history = [a, b, c, c, b, c, y, a, b, c]
    assert penalties(history) == {c: 4.0, y: 2.0, b: 1.0}
    assert penalties(history, allowed_length=2) == {c: 2.0, y: 1.0}
    assert penalties(history, multiplier=0.5, base=3.0) == {c: 4.5, y: 1.5, b: 0.5}
    assert penalties(history, last_n=4) == {}  # y a b c: nothing repeats
    assert penalties(history, last_n=0) == {}
    assert penalties(history, multiplier=0.0) == {}
    # b is a breaker: no repetition runs across it, and b itself is never lowered
    assert penalties(history, table([b])) == {c: 1.0, y: 1.0}


def test_a_breaker_of_several_tokens_cuts_the_repetition() -> None:
    """``5 3 6 5 3 6 5``: ``5 3 6 5`` appeared before ``3`` (2 ** 3). With the breaker
    ``3 6`` the repetition after it is ``5`` alone (2 ** 0); 3 is only its head, so it is
    still lowered."""
    history = [5, 3, 6, 5, 3, 6, 5]
    assert penalties(history) == {3: 8.0}
    assert penalties(history, table([3, 6])) == {3: 1.0}
    assert penalties(history, table([3, 7])) == {3: 8.0}  # a tail that does not match


def test_the_exponent_is_clamped_as_in_float32() -> None:
    """A run of 12 identical tokens is 11 long; with base 1e10 float32 overflows past an
    exponent of 3 (88.72 / log 1e10), where llama.cpp clamps it."""
    got = penalties([5] * 12, base=1e10, allowed_length=2)
    assert got == {5: pytest.approx(1e30)}
    assert penalties([5] * 12, base=1.0, allowed_length=2) == {5: 1.0}


def test_dry_reads_each_rows_prefix() -> None:
    """Sampler.prepare lowers each verified row after its own prefix, as the penalties do."""
    cfg = SamplingConfig(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=1)
    sampler = Sampler(cfg, vocab=FakeVocab([b"x"] * 8))  # no breaker text in this vocabulary
    rows = sampler.prepare([1, 2, 3, 1, 2], np.zeros((3, 8)), drafted=[3, 1])
    # after 1 2 3 1 2: "1 2" came before 3; after ...3: "1 2 3" came before 1;
    # after ...3 1: "1 2 3 1" came before 2
    assert rows[0].tolist() == [0, 0, 0, -2, 0, 0, 0, 0]
    assert rows[1].tolist() == [0, -4, 0, 0, 0, 0, 0, 0]
    assert rows[2].tolist() == [0, 0, -8, 0, 0, 0, 0, 0]


def test_dry_with_breakers_needs_the_vocabulary() -> None:
    cfg = SamplingConfig(dry_multiplier=0.8)
    with pytest.raises(ValueError, match="vocabulary"):
        Sampler(cfg)
    Sampler(cfg.with_(dry_sequence_breakers=()))  # no breakers: nothing to look up
    with pytest.raises(UserError, match="--dry-base must be >= 1"):
        cfg.with_(dry_base=0.5)
    with pytest.raises(UserError, match="--dry-penalty-last-n"):
        cfg.with_(dry_penalty_last_n=-2)
    with pytest.raises(UserError, match="--dry-sequence-breaker"):
        cfg.with_(dry_sequence_breakers=("",))


# --- the breaker table ------------------------------------------------------------------------


class FakeVocab:
    """A vocabulary of given pieces; tokenizing maps bytes through ``words``."""

    def __init__(self, pieces: list[bytes], words: dict[bytes, list[int]] | None = None):
        self._pieces = pieces
        self.words = words or {}
        self.asked: list[bytes] = []

    def pieces(self) -> list[bytes]:
        return self._pieces

    def tokenize_bytes(self, data: bytes) -> list[int]:
        self.asked.append(data)
        return self.words[data]


def test_breaker_table_of_a_hand_built_vocabulary() -> None:
    """A token holding a breaker is a breaker alone; one whose end begins a breaker heads the
    tokens of the rest (each rest tokenized once); the others are not in the table."""
    pieces = [b"a", b"\n", b"x\n", b"b:", b"::", b"ab", b"c", b":c:"]
    vocab = FakeVocab(pieces, {b"c": [6]})
    got = warps.breaker_table(vocab.pieces(), vocab.tokenize_bytes, ["\n", ":c"])
    assert got == {
        1: frozenset({()}),
        2: frozenset({()}),
        3: frozenset({(6,)}),
        4: frozenset({(6,)}),
        7: frozenset({()}),
    }
    assert vocab.asked == [b"c"]


def test_breaker_tails_are_cut_to_llama_cpps_limits() -> None:
    long = "y" + "z" * 60  # 40 bytes kept: a tail of 39
    vocab = FakeVocab([b"y"], {b"z" * 39: list(range(39))})
    got = warps.breaker_table(vocab.pieces(), vocab.tokenize_bytes, [long])
    assert got == {0: frozenset({tuple(range(warps.MAX_BREAKER_TAIL))})}


def llama_cpp_dry(
    tier: ModelTier, cfg: SamplingConfig, history: list[int], row: np.ndarray
) -> np.ndarray:
    """llama.cpp's own DRY sampler on ``row`` ``[V]`` after ``history``."""
    texts = [t.encode() for t in cfg.dry_sequence_breakers]
    breakers = (ctypes.c_char_p * len(texts))(*texts)
    smpl = llama_cpp.llama_sampler_init_dry(
        tier.vocab.ptr,
        cfg.dry_multiplier,
        cfg.dry_base,
        cfg.dry_allowed_length,
        cfg.dry_penalty_last_n,
        breakers,
        len(texts),
    )
    try:
        for t in history:
            llama_cpp.llama_sampler_accept(smpl, t)
        data = (llama_cpp.llama_token_data * len(row))(
            *(llama_cpp.llama_token_data(i, float(v), 0.0) for i, v in enumerate(row))
        )
        arr = llama_cpp.llama_token_data_array(data, len(row), -1, False)
        llama_cpp.llama_sampler_apply(smpl, ctypes.byref(arr))
        out = np.empty(len(row))
        for d in data[: arr.size]:
            out[d.id] = d.logit
        return out
    finally:
        llama_cpp.llama_sampler_free(smpl)


@pytest.mark.parametrize("breakers", [("e", "th", "\n", ":"), ("he tr", "o"), ()])
def test_penalties_equal_llama_cpps_on_the_real_vocabulary(
    tiny_target: Path, breakers: tuple[str, ...]
) -> None:
    """Histories of real text (breaker bytes inside words and across tokens) and of looping
    token ids: every logit after our DRY equals llama.cpp's DRY sampler's."""
    cfg = SamplingConfig(
        dry_multiplier=0.8,
        dry_base=1.75,
        dry_allowed_length=2,
        dry_penalty_last_n=48,
        dry_sequence_breakers=breakers,
    )
    g = np.random.default_rng(0)
    with Pyramid.from_paths(tiny_target, load=TINY_LOAD) as p:
        tier = p.ladder.target
        sampler = Sampler(cfg, vocab=tier.vocab)
        text = "the model of the tree, the model: of the tree\nthe model of the tree"
        histories = [p.tokenize(text)]
        loop = list(g.integers(3, tier.n_vocab, size=5))
        histories.append([*loop, *loop, 7, *loop, *loop[:3]])
        histories.append(list(g.integers(3, 40, size=80)))
        lowered = 0
        for history in histories:
            row = g.normal(size=tier.n_vocab).astype(np.float32).astype(np.float64)
            want = llama_cpp_dry(tier, cfg, [int(t) for t in history], row)
            got = sampler.prepare([int(t) for t in history], row)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            lowered += int(np.sum(got < row))
        assert lowered > 0, "no history repeated: the comparison would prove nothing"


# --- losslessness -----------------------------------------------------------------------------


DRY = {"dry_multiplier": 0.8, "dry_allowed_length": 1, "dry_penalty_last_n": -1}


@pytest.mark.parametrize("mode", ["sd", "psd-exact"])
def test_greedy_under_dry_is_target_decoding(
    tiny_target: Path, tiny_qualifier: Path, tiny_draft: Path, mode: str
) -> None:
    load = replace(TINY_LOAD, strict_identity=True)
    with Pyramid.from_paths(
        tiny_target, draft=tiny_draft, qualifier=tiny_qualifier, load=load
    ) as p:
        prompt = p.tokenize("a")
        greedy = GREEDY.with_(max_tokens=80)
        plain = p.generate(prompt, greedy, SpecConfig(mode="target")).token_ids
        assert len(set(plain[-20:])) <= 4, "the tiny model no longer loops; pick another prompt"
        sampling = greedy.with_(**DRY)
        want = p.generate(prompt, sampling, SpecConfig(mode="target")).token_ids
        assert want != plain
        assert len(set(want[-20:])) > 2 * len(set(plain[-20:]))  # DRY broke the loop
        got = p.generate(prompt, sampling, SpecConfig(mode=mode, l_d=4, l_q=8))  # type: ignore[arg-type]
        assert got.token_ids == want


def test_sampled_tokens_under_dry_follow_the_target(pyramid: Pyramid) -> None:
    """The first two tokens of ``sd`` under DRY follow the target's joint distribution under
    DRY. The prompt is the target's own greedy loop, whose continuation DRY lowers, so DRY's
    distribution is far from the plain one (the power check)."""
    start = pyramid.tokenize("a")
    loop = GREEDY.with_(max_tokens=30)
    prompt = start + pyramid.generate(start, loop, SpecConfig(mode="target")).token_ids
    sampling = HOT.with_(**{**DRY, "dry_multiplier": 3.0})
    target = pyramid.ladder.target
    vocab = target.vocab
    spec = SpecConfig(mode="sd", l_d=3)
    verified = 0
    firsts = []
    for seed in range(1500):
        stats = GenerationStats(mode=spec.mode)
        sampler = Sampler(sampling.with_(seed=seed), vocab=vocab)
        rounds, prefill = make_scheduler(pyramid.ladder, spec, sampler, stats)
        tokens = list(decode(pyramid.ladder, prompt, rounds, prefill, sampler, stats))
        verified += sum(s.verifications for s in stats.stages)
        firsts.append(tokens[0] * target.n_vocab + tokens[1])
    assert verified, "no speculative round ran: the test would prove nothing"
    sampled = np.array(firsts)
    assert chi_square_pvalue(sampled, chain_joint(target, prompt, sampling, vocab)) > 0.001
    # power: without DRY the same samples are rejected
    assert chi_square_pvalue(sampled, chain_joint(target, prompt, HOT)) < 1e-4


# --- the surfaces -----------------------------------------------------------------------------


def test_http_fields_take_dry(tiny_target: Path) -> None:
    """llama-server's ``/completion`` and OpenAI's route take DRY's fields: a looping greedy
    answer changes, ``/props``-style params echo them, and a bad value is a 400 naming it."""
    body = {"prompt": "a", "n_predict": 40, "temperature": 0}
    dry = {"dry_multiplier": 0.8, "dry_allowed_length": 1, "dry_sequence_breakers": ["\n"]}
    p = Pyramid.from_paths(tiny_target, load=TINY_LOAD, name="tiny")
    with p, live_server(p, ServerSettings()) as live:

        def post(path: str, b: dict[str, object]) -> httpx.Response:
            return httpx.post(f"{live.url}{path}", json=b, timeout=60)

        plain = post("/completion", body).json()
        got = post("/completion", {**body, **dry}).json()
        assert got["content"] != plain["content"]
        params = got["generation_settings"]
        assert params["dry_multiplier"] == 0.8 and params["dry_sequence_breakers"] == ["\n"]
        openai = post("/v1/completions", {**body, "max_tokens": 40, **dry})
        assert openai.status_code == 200, openai.text
        for bad in (
            {"dry_base": 0.5},
            {"dry_sequence_breakers": []},
            {"dry_allowed_length": -1},
        ):
            r = post("/completion", {**body, **dry, **bad})
            name = next(iter(bad))
            assert r.status_code == 400, r.text
            assert name in r.text or name.replace("_", "-") in r.text, r.text


def test_run_dry_flags(tiny_target: Path) -> None:
    fast = ["--target", str(tiny_target), "-t", "1", "-c", "512", "--temp", "0", "-n", "40"]
    runner = CliRunner()

    def run(*args: str) -> dict[str, object]:
        r = runner.invoke(main, ["run", *fast, "--raw", "-p", "a", "--json", *args])
        assert r.exit_code == 0, r.output
        return dict(json.loads(r.stdout))

    plain = run()
    dry = run("--dry-multiplier", "0.8", "--dry-allowed-length", "1")
    assert dry["tokens"] != plain["tokens"]
    assert (
        run("--dry-multiplier", "0.8", "--dry-allowed-length", "1", "--dry-penalty-last-n", "0")[
            "tokens"
        ]
        == plain["tokens"]
    )
    bad = runner.invoke(main, ["run", *fast, "-p", "a", "--dry-multiplier", "1", "--dry-base", "0"])
    assert bad.exit_code == 1 and "--dry-base must be >= 1" in bad.output
