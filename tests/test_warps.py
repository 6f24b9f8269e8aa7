"""llama.cpp's samplers in numpy, each against its formula on hand-built logits.

Every expected value below is worked out from llama.cpp's definition (``llama-sampler.cpp``)
by hand or by a direct reimplementation of the formula in the test, never by the code under
test; the chain's order and the XTC mixture are checked the same way.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pyramid_gguf.cli.options import _logit_bias
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.core.sampling import (
    DEFAULT_SAMPLERS,
    SamplingConfig,
    parse_logit_bias,
    parse_samplers,
)
from pyramid_gguf.decoding.runtime.sampling import Sampler, warp

OFF = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


def cfg(**kw: object) -> SamplingConfig:
    return SamplingConfig(**{**OFF, **kw})  # type: ignore[arg-type]


def logs(*p: float) -> np.ndarray:
    return np.log(np.array(p))


def test_logit_bias_adds_and_bans() -> None:
    out = warp(np.array([1.0, 2.0, 3.0]), cfg(logit_bias=((0, 5.0), (2, -math.inf))))
    e6, e2 = math.exp(6), math.exp(2)
    assert out == pytest.approx([e6 / (e6 + e2), e2 / (e6 + e2), 0.0])


def test_logit_bias_forms_parse_like_openai_and_llama_server() -> None:
    assert parse_logit_bias({"7": 2, "3": -1.5}) == (((7, 2.0), (3, -1.5)), ())
    assert parse_logit_bias([[4, False], [5, 1]]) == (((4, -math.inf), (5, 1.0)), ())
    # a key that is not an integer is text, as llama-server reads it
    assert parse_logit_bias({"hello": 1, "9": -2}) == (((9, -2.0),), (("hello", 1.0),))
    assert parse_logit_bias([[" world", False]]) == ((), ((" world", -math.inf),))
    for bad in ({"": 1}, [[1, "x"]], [1, 2], "7:1", [[None, 1]]):
        with pytest.raises(UserError):
            parse_logit_bias(bad)


def test_cli_logit_bias_is_llamas_spelling() -> None:
    assert _logit_bias("15043+1") == (15043, 1.0)
    assert _logit_bias("15043-0.5") == (15043, -0.5)
    assert _logit_bias("2-inf") == (2, -math.inf)
    with pytest.raises(UserError, match="TOKEN_ID"):
        _logit_bias("hello")


def test_penalties_follow_llama_cpp() -> None:
    # window of the last 3 tokens: [1, 1, 3]; token 0 is older and not penalised.
    z = np.array([[2.0, -1.0, 0.5, 3.0]])
    c = cfg(repeat_penalty=2.0, repeat_last_n=3, frequency_penalty=0.5, presence_penalty=0.25)
    got = Sampler(c).prepare([0, 1, 1, 3], z)
    # token 1: -1 * 2 - (2 * 0.5 + 0.25); token 3: 3 / 2 - (1 * 0.5 + 0.25)
    assert got[0].tolist() == pytest.approx([2.0, -3.25, 0.5, 0.75])


def test_each_row_is_penalised_after_its_own_prefix() -> None:
    z = np.zeros((3, 4))
    got = Sampler(cfg(presence_penalty=1.0)).prepare([0], z, [1, 2])
    assert got.tolist() == [[-1, 0, 0, 0], [-1, -1, 0, 0], [-1, -1, -1, 0]]


def test_repeat_last_n_minus_one_reads_everything_and_zero_nothing() -> None:
    z = np.zeros((1, 3))
    history = [0, 1, 2, 2, 2, 2]
    everything = Sampler(cfg(presence_penalty=1.0, repeat_last_n=-1)).prepare(history, z)
    assert everything.tolist() == [[-1, -1, -1]]
    nothing = Sampler(cfg(presence_penalty=1.0, repeat_last_n=0)).prepare(history, z)
    assert nothing.tolist() == [[0, 0, 0]]


def test_typical_keeps_the_locally_typical_set() -> None:
    # p = [.5, .3, .2]: H = 1.0297; |surprise - H| = .337, .174, .580, so token 1 comes first,
    # then token 0, whose running mass .8 exceeds .5.
    assert warp(logs(0.5, 0.3, 0.2), cfg(typical_p=0.5)) == pytest.approx([0.625, 0.375, 0])


def test_typical_can_drop_the_top_token_so_greedy_is_not_the_argmax() -> None:
    # p = [.4, .3, .3]: H = 1.0889; |surprise - H| = .173, .115, .115: tokens 1 and 2 first.
    z = logs(0.4, 0.3, 0.3)
    assert warp(z, cfg(typical_p=0.5)) == pytest.approx([0, 0.5, 0.5])
    c = cfg(typical_p=0.5, temperature=0)
    assert not Sampler(c).greedy
    assert warp(z, c).tolist() == [0, 1, 0]


def test_top_n_sigma_keeps_logits_near_the_top() -> None:
    # mean 1.5, std sqrt(1.25) = 1.118: one sigma under 3 is 1.882.
    assert np.flatnonzero(warp(np.array([3.0, 2.0, 1.0, 0.0]), cfg(top_n_sigma=1.0))).tolist() == [
        0,
        1,
    ]
    two = warp(np.array([3.0, 2.0, 1.0, 0.0]), cfg(top_n_sigma=2.0))
    assert np.count_nonzero(two) == 3  # 3 - 2.236 = 0.764


def test_xtc_is_the_mixture_of_keeping_and_cutting() -> None:
    # Above threshold .1: .5, .3, .15; the cut keeps the least likely of them and the rest.
    z = logs(0.5, 0.3, 0.15, 0.05)
    got = warp(z, cfg(xtc_probability=0.4, xtc_threshold=0.1))
    cut = np.array([0, 0, 0.75, 0.25])
    assert got == pytest.approx(0.6 * np.array([0.5, 0.3, 0.15, 0.05]) + 0.4 * cut)
    # A threshold over .5 disables it; one token above the threshold leaves nothing to cut.
    assert warp(z, cfg(xtc_probability=1.0, xtc_threshold=0.6)) == pytest.approx(np.exp(z))
    assert warp(z, cfg(xtc_probability=1.0, xtc_threshold=0.4)) == pytest.approx(np.exp(z))


def test_xtc_at_temperature_zero_is_random_between_two_argmaxes() -> None:
    z = logs(0.5, 0.3, 0.15, 0.05)
    c = cfg(temperature=0, xtc_probability=0.25, xtc_threshold=0.1)
    assert not Sampler(c).greedy
    assert warp(z, c) == pytest.approx([0.75, 0, 0.25, 0])


def test_dynatemp_maps_entropy_to_temperature() -> None:
    p = np.array([0.8, 0.2])
    entropy = -(0.8 * math.log(0.8) + 0.2 * math.log(0.2))
    t = 0.5 + (1.5 - 0.5) * (entropy / math.log(2)) ** 2.0  # temp 1 +- .5, exponent 2
    want = p ** (1 / t) / np.sum(p ** (1 / t))
    assert warp(np.log(p), cfg(dynatemp_range=0.5, dynatemp_exponent=2.0)) == pytest.approx(want)


def test_default_order_filters_at_temperature_one_then_scales() -> None:
    # llama.cpp's default chain puts temperature last: top-p .9 reads p = [.5, .3, .15, .05]
    # (keeps 3), then temperature .5 squares them.
    z = logs(0.5, 0.3, 0.15, 0.05)
    sq = np.array([0.25, 0.09, 0.0225, 0])
    assert warp(z, cfg(top_p=0.9, temperature=0.5)) == pytest.approx(sq / sq.sum())
    # Temperature first: p^2 / sum = [.685, .247, .062, .007]; top-p .9 keeps two.
    first = cfg(top_p=0.9, temperature=0.5, samplers=("temperature", "top_p"))
    assert np.flatnonzero(warp(z, first)).tolist() == [0, 1]


def test_min_p_reads_temperature_one_probabilities() -> None:
    # p = [.6, .3, .08, .02] and min-p .1: keep >= .06, whatever the temperature after it.
    z = logs(0.6, 0.3, 0.08, 0.02)
    assert np.count_nonzero(warp(z, cfg(min_p=0.1, temperature=3.0))) == 3


def test_a_sampler_left_out_of_the_order_does_not_run() -> None:
    z = logs(0.5, 0.3, 0.15, 0.05)
    no_temp = cfg(temperature=0.5, samplers=("top_k",))
    assert warp(z, no_temp) == pytest.approx(np.exp(z))


def test_sampler_names_and_codes_parse_like_llama_cpp() -> None:
    assert parse_samplers("penalties;top_k;temperature") == ("penalties", "top_k", "temperature")
    assert parse_samplers("kypmxt") == ("top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
    assert parse_samplers(["nucleus", "temp", "typical"]) == ("top_p", "temperature", "typ_p")
    assert SamplingConfig().samplers == DEFAULT_SAMPLERS
    with pytest.raises(UserError, match="unknown sampler 'mirostat'"):
        parse_samplers("top_k;mirostat")


@pytest.mark.parametrize(
    "kw",
    [
        {"typical_p": 0},
        {"xtc_probability": 1.5},
        {"xtc_threshold": -0.1},
        {"dynatemp_range": -1},
        {"repeat_penalty": 0},
        {"repeat_last_n": -2},
        {"presence_penalty": math.nan},
        {"logit_bias": ((-1, 1.0),)},
        {"logit_bias": ((1, math.inf),)},
        {"samplers": ("top_k", "bogus")},
        {"xtc_probability": 0.5, "samplers": ("xtc", "penalties")},
    ],
)
def test_bad_chain_values_are_one_line_user_errors(kw: dict[str, object]) -> None:
    with pytest.raises(UserError) as e:
        SamplingConfig(**kw)  # type: ignore[arg-type]
    assert "\n" not in str(e.value)


def test_greedy_uses_the_prepared_row() -> None:
    c = SamplingConfig(temperature=0, logit_bias=((2, -math.inf),))
    s = Sampler(c)
    assert s.greedy
    row = s.prepare([], np.array([0.0, 1.0, 5.0]))
    assert s.pick(row) == 1


class FlatVerifier:
    """A verifier whose every row prefers token 1, then 2: ``[0, 1, .5, 0]``."""

    name = "target"

    def score(self, context: list[int], tokens: list[int]) -> np.ndarray:
        return np.tile([0.0, 1.0, 0.5, 0.0], (len(tokens) + 1, 1))


@pytest.mark.parametrize("temperature", [0.0, 1e-3])
def test_verify_warps_each_row_after_the_proposals_before_it(temperature: float) -> None:
    """Proposals [1, 1]: row 0 (after the context) keeps 1; row 1 follows the first proposal,
    whose presence penalty puts token 2 on top, so the second proposal is refused for 2."""
    from pyramid_gguf.decoding.pricing.chains import StageRule
    from pyramid_gguf.decoding.runtime.stats import StageStats
    from pyramid_gguf.decoding.runtime.verification import Block, verify

    c = SamplingConfig(temperature=temperature, top_k=0, top_p=1, min_p=0, presence_penalty=5)
    block = Block([1, 1], None, None)  # a deterministic proposer: one-hot q
    sampler = Sampler(c, np.random.default_rng(0))
    out = verify(FlatVerifier(), [3], block, StageRule(), sampler, StageStats("d->t"))  # type: ignore[arg-type]
    assert out.tokens == [1, 2] and out.n_accepted == 1


def test_run_flags_spell_llama_cpps_and_reach_the_config() -> None:
    import click
    from click.testing import CliRunner

    from pyramid_gguf.cli.options import sampling_config_from, sampling_options

    @click.command()
    @sampling_options
    def cmd(**params: object) -> None:
        c = sampling_config_from(params)
        click.echo(f"{c.repeat_penalty} {c.typical_p} {c.logit_bias} {';'.join(c.samplers)}")

    flags = ["--repeat-penalty", "1.2", "--typical", "0.9", "-l", "5+1.5", "--logit-bias", "7-inf"]
    out = CliRunner().invoke(cmd, [*flags, "--samplers", "top_k;temperature"])
    assert out.exit_code == 0, out.output
    assert out.output.strip() == "1.2 0.9 ((5, 1.5), (7, -inf)) top_k;temperature"
    from pyramid_gguf.cli.main import main

    for flags, says in (
        (["--typical", "0"], "--typical must be > 0"),
        (["--logit-bias", "hello"], "TOKEN_ID(+/-)BIAS"),
        (["--samplers", "top_k;bogus"], "unknown sampler 'bogus'"),
    ):
        bad = CliRunner().invoke(main, ["run", *flags, "-p", "hi"])
        assert bad.exit_code == 1 and says in bad.output, bad.output
        assert bad.output.startswith("Error: ") and len(bad.output.strip().splitlines()) == 1


def test_penalties_after_top_k_read_the_kept_tokens_only() -> None:
    """top-k 2 of [3, 2, 1, 0] keeps tokens 0 and 1; a presence penalty of 5 on token 0 then
    leaves [-2, 2] between them. Penalties first instead: [-2, 2, 1, 0], top-k keeps 1 and 2."""
    z = np.array([[3.0, 2.0, 1.0, 0.0]])
    after = Sampler(cfg(top_k=2, presence_penalty=5.0, samplers=("top_k", "penalties")))
    e2, e_2 = math.exp(2), math.exp(-2)
    assert after.warp(after.prepare([0], z))[0] == pytest.approx(
        [e_2 / (e_2 + e2), e2 / (e_2 + e2), 0, 0]
    )
    before = Sampler(cfg(top_k=2, presence_penalty=5.0))
    e1 = math.exp(1)
    assert before.warp(before.prepare([0], z))[0] == pytest.approx(
        [0, e2 / (e2 + e1), e1 / (e2 + e1), 0]
    )


def test_top_k_keeps_the_lowest_ids_among_ties_at_its_edge() -> None:
    z = np.array([0.0, 5.0, 1.0, 5.0, 5.0, 6.0, 5.0])
    kept = warp(z, cfg(top_k=3))
    assert np.flatnonzero(kept).tolist() == [1, 3, 5]
    assert warp(z[::-1].copy(), cfg(top_k=3)).nonzero()[0].tolist() == [0, 1, 2]  # ids 0, 1, 2
    assert warp(z, SamplingConfig(temperature=0, top_k=2)).tolist() == [0, 0, 0, 0, 0, 1, 0]
