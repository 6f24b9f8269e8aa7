"""Mixture-of-experts targets: placement (llama.cpp's --n-cpu-moe), router recording, and every
lossless mode on a tiny llama-architecture MoE (tests/synth.py ``write_tiny_moe``).

- Placement: the overrides are exactly llama.cpp's ``--n-cpu-moe N`` / ``--cpu-moe`` ones and
  select exactly the routed experts of the first N layers of a file; a load with them succeeds
  (on a CPU-only build the experts are in CPU memory anyway) and answers as without them.
- Routing: :func:`record_routes` gives K distinct in-range experts per token and layer, the
  same on a second recording and whatever the micro-batch size.
- Lossless: ``--strict-identity`` greedy output is bit-identical to ``target`` in ``sd``,
  ``psd-exact`` and ``auto``; sampled tokens at T=1 follow the MoE target's own joint
  distribution (chi-square) in the same modes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import TINY_LOAD
from lossless import HOT, PROMPT, SEEDS, chi_square_pvalue, generate, joint, pairs, shaped_costs
from synth import write_tiny_moe

from pyramid_gguf import Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.cli.main import main
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.core.gguf_header import read_header
from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.native import NativeModel
from pyramid_gguf.native.buffers import (
    FFN_EXPS_REGEX,
    experts_on_cpu,
    moe_patterns,
    plan_placement,
)
from pyramid_gguf.native.routing import record_routes

EXPERTS, USED, LAYERS = 4, 2, 2
GREEDY = SamplingConfig(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_moe(tiny_dir: Path) -> Path:
    """The tiny target (seed 10) with each FFN turned into 4 perturbed experts, 2 used."""
    return write_tiny_moe(tiny_dir / "moe.gguf", experts=EXPERTS, used=USED, seed=10)


@pytest.fixture(scope="module")
def moe_pyramid(tiny_moe: Path, tiny_qualifier: Path, tiny_draft: Path) -> Iterator[Pyramid]:
    with Pyramid.from_paths(
        tiny_moe, draft=tiny_draft, qualifier=tiny_qualifier, load=TINY_LOAD
    ) as p:
        yield p


# --- placement ------------------------------------------------------------------------------


def test_moe_overrides_are_llama_cpps(tiny_moe: Path) -> None:
    # common/arg.cpp: llm_add_n_cpu_ffn_overrides(N, LLM_FFN_EXPS_REGEX) and --cpu-moe
    assert moe_patterns(2) == [f"blk\\.0{FFN_EXPS_REGEX}", f"blk\\.1{FFN_EXPS_REGEX}"]
    assert moe_patterns(0, cpu_moe=True) == [FFN_EXPS_REGEX]
    assert moe_patterns(5, n_layer=LAYERS) == [FFN_EXPS_REGEX]  # N past the layers: all
    assert moe_patterns(0) == []
    names = [t.name for t in read_header(tiny_moe).tensors]
    want = [f"blk.0.ffn_{r}_exps.weight" for r in ("gate", "up", "down")]
    assert sorted(experts_on_cpu(names, moe_patterns(1))) == sorted(want)
    every = experts_on_cpu(names, moe_patterns(0, cpu_moe=True))
    assert len(every) == 3 * LAYERS and all("_exps." in n for n in every)
    # a shared expert and layer 10/11 are not layer 1's experts
    other = ["blk.1.ffn_up_shexp.weight", "blk.10.ffn_up_exps.weight", "blk.1.ffn_gate_inp.weight"]
    assert experts_on_cpu([*other, "blk.1.ffn_gate_up_exps.weight"], moe_patterns(2)) == [
        "blk.1.ffn_gate_up_exps.weight"
    ]


def test_n_cpu_moe_loads_and_answers_the_same(
    tiny_moe: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = replace(TINY_LOAD, n_cpu_moe=1)
    placement = plan_placement(tiny_moe, cfg)
    assert placement.cpu_experts == (f"blk\\.0{FFN_EXPS_REGEX}",)
    assert "experts of layers 0-0 in CPU memory" in placement.describe()
    monkeypatch.setenv("PYRAMID_GGUF_VERBOSE", "1")  # llama.cpp's load log, on stdout
    capsys.readouterr()
    with NativeModel(tiny_moe, TINY_LOAD) as plain, NativeModel(tiny_moe, cfg) as moe:
        monkeypatch.delenv("PYRAMID_GGUF_VERBOSE")
        # the tensors llama.cpp itself overrode: exactly layer 0's experts
        overridden = re.findall(
            r"tensor (\S+) \(.*\) buffer type overridden to CPU", capsys.readouterr().out
        )
        names = [t.name for t in read_header(tiny_moe).tensors]
        assert sorted(overridden) == sorted(experts_on_cpu(names, moe_patterns(1)))
        assert "experts of layers 0-0 in CPU memory" in moe.describe_weights()
        tokens = plain.vocab.tokenize(PROMPT)
        np.testing.assert_allclose(plain.eval(tokens, [-1]), moe.eval(tokens, [-1]), atol=1e-4)
    all_cpu = plan_placement(tiny_moe, replace(TINY_LOAD, cpu_moe=True))
    assert "experts of every layer in CPU memory" in all_cpu.describe()


def test_n_cpu_moe_flag(tiny_moe: Path) -> None:
    args = ["run", "--target", str(tiny_moe), "-p", "the model", "-t", "1", "-c", "512"]
    r = CliRunner().invoke(main, [*args, "--temp", "0", "-n", "4", "--n-cpu-moe", "1", "-v"])
    assert r.exit_code == 0, r.stderr
    assert "experts of layers 0-0 in CPU memory" in r.stderr
    r = CliRunner().invoke(main, [*args, "--n-cpu-moe", "-1"])
    assert r.exit_code != 0 and "Error: --n-cpu-moe must be >= 0" in r.stderr
    with pytest.raises(UserError, match="--rpc"):
        LoadConfig(n_cpu_moe=2, rpc=("127.0.0.1:50052",))


# --- the router's choices ---------------------------------------------------------------------


def test_routes_are_recorded(tiny_moe: Path, tiny_target: Path) -> None:
    with NativeModel(tiny_moe, TINY_LOAD) as m:
        tokens = m.vocab.tokenize("the model of the tree was in the house, and the tree")
        routes = record_routes(m, tokens, chunk=8)
        assert routes.shape == (len(tokens), LAYERS, USED)
        assert routes.min() >= 0 and routes.max() < EXPERTS
        assert all(len(set(r)) == USED for r in routes.reshape(-1, USED).tolist())
        assert len(np.unique(routes[:, 0])) > 1  # a random router spreads the tokens
        np.testing.assert_array_equal(record_routes(m, tokens, chunk=8), routes)
        np.testing.assert_array_equal(record_routes(m, tokens, chunk=3), routes)
        assert m.n_past == 0  # its own context: the model's cache is untouched
    with NativeModel(tiny_target, TINY_LOAD) as dense, pytest.raises(ValueError, match="not a"):
        record_routes(dense, [1, 2, 3])


# --- lossless on an MoE target -----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sd", "psd-exact", "auto"])
def test_strict_identity_on_an_moe_target(
    tiny_moe: Path, tiny_qualifier: Path, tiny_draft: Path, mode: str
) -> None:
    load = replace(TINY_LOAD, strict_identity=True)
    with Pyramid.from_paths(tiny_moe, draft=tiny_draft, qualifier=tiny_qualifier, load=load) as p:
        gpu = shaped_costs(p, per_token=0.02, draft=0.15)  # auto speculates
        spec = SpecConfig(mode=mode, l_d=4, l_q=8)  # type: ignore[arg-type]
        for text in ("the model of the tree", "a", "def return if else"):
            prompt = p.tokenize(text)
            want = p.generate(prompt, GREEDY, SpecConfig(mode="target")).token_ids
            got, stats = generate(p, prompt, spec, GREEDY, gpu)
            assert got == want
            assert any(s.verifications for s in stats.stages if s.name != "target")


@pytest.mark.parametrize(
    "spec",
    [SpecConfig(mode="sd", l_d=3), SpecConfig(mode="psd-exact", l_d=2, l_q=3), SpecConfig()],
    ids=["sd", "psd-exact", "auto"],
)
def test_sampled_tokens_follow_the_moe_distribution(moe_pyramid: Pyramid, spec: SpecConfig) -> None:
    p = moe_pyramid
    prompt = p.tokenize(PROMPT)
    gpu = shaped_costs(p, per_token=0.02, draft=0.15)
    seen: set[str] = set()

    def run(seed: int) -> list[int]:
        tokens, stats = generate(p, prompt, spec, HOT.with_(seed=seed), gpu)
        seen.update(s.name for s in stats.stages if s.verifications)
        return tokens

    sampled = pairs(run, p.ladder.target.n_vocab)
    assert seen, "no speculative round ran: the test would prove nothing"
    assert chi_square_pvalue(sampled, joint(p.ladder.target, prompt)) > 0.001
    draft = p.ladder.draft
    assert chi_square_pvalue(sampled, joint(draft, prompt)) < 1e-4  # type: ignore[arg-type]
    assert SEEDS >= 1000
