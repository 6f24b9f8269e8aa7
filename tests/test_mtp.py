"""The target's own MTP head as a tier (``--draft mtp``) on a tiny hybrid target with a NextN
layer: lossless in every lossless mode, MTP chains included (MTP -> target, and MTP under a
qualifier), greedy bit-identical under ``--strict-identity`` and sampled by a chi-square test."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_LOAD
from lossless import HOT, chi_square_pvalue, generate, joint, pairs, shaped_costs
from synth import write_tiny_llama
from synth_hybrid import HybridSpec, write_hybrid

from pyramid_gguf import Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.core.ladder import MTP, LadderPaths
from pyramid_gguf.decoding.runtime.tiers import ModelTier
from pyramid_gguf.native import MtpSequence
from pyramid_gguf.runtime.loading import AUTO_DEPTH, rollback_depth

GREEDY = SamplingConfig(temperature=0, max_tokens=40, ignore_eos=True)
PROMPTS = ("the model of the tree", "a", "def return if else")


@pytest.fixture(scope="session")
def hybrid_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mtp")


@pytest.fixture(scope="session")
def hybrid_target(hybrid_dir: Path) -> Path:
    return write_hybrid(hybrid_dir / "hybrid.gguf", seed=20)


@pytest.fixture(scope="session")
def hybrid_qualifier(hybrid_dir: Path) -> Path:
    """A tiny llama of the same vocabulary (tests/synth.py): a qualifier above the head."""
    return write_tiny_llama(hybrid_dir / "qualifier.gguf", seed=11)


@pytest.fixture(scope="module")
def mtp_pyramid(hybrid_target: Path, hybrid_qualifier: Path) -> Iterator[Pyramid]:
    with Pyramid.from_paths(
        hybrid_target, draft="mtp", qualifier=hybrid_qualifier, load=TINY_LOAD
    ) as p:
        yield p


def test_draft_mtp_is_the_targets_head(mtp_pyramid: Pyramid) -> None:
    assert LadderPaths.of("t.gguf", draft="mtp").draft is MTP
    assert LadderPaths.of("t.gguf", draft="mtp").shape.has_draft
    draft = mtp_pyramid.ladder.draft
    assert isinstance(draft, ModelTier) and isinstance(draft.loaded, MtpSequence)
    assert mtp_pyramid.ladder.target.loaded.cfg.load_mtp


def test_the_head_drafts_what_the_target_would_often(mtp_pyramid: Pyramid) -> None:
    """Not a random drafter: the synthetic head agrees with its target on some rounds (else
    the chains below would prove little about acceptance)."""
    r = mtp_pyramid.generate("the model of the tree", GREEDY, SpecConfig(mode="sd", l_d=3))
    (stage,) = [s for s in r.stats.stages if s.verifications]
    assert stage.verifications < 38  # some rounds committed two tokens or more


@pytest.mark.parametrize("mode", ["sd", "psd-exact", "auto"])
def test_strict_identity_with_the_mtp_head(
    hybrid_target: Path, hybrid_qualifier: Path, mode: str
) -> None:
    load = replace(TINY_LOAD, strict_identity=True)
    with Pyramid.from_paths(hybrid_target, draft="mtp", qualifier=hybrid_qualifier, load=load) as p:
        for text in PROMPTS:
            want = p.generate(text, GREEDY, SpecConfig(mode="target")).token_ids
            got = p.generate(text, GREEDY, SpecConfig(mode=mode, l_d=4, l_q=8))  # type: ignore[arg-type]
            assert got.token_ids == want


@pytest.mark.parametrize(
    "spec",
    [
        SpecConfig(mode="sd", l_d=3),
        SpecConfig(mode="psd-exact", l_d=2, l_q=3),
        SpecConfig(mode="sd", l_d=3, exact_rule="greedy-match"),
        SpecConfig(mode="auto"),
    ],
    ids=["sd", "psd-exact", "greedy-match", "auto"],
)
def test_mtp_chains_follow_the_target_distribution(mtp_pyramid: Pyramid, spec: SpecConfig) -> None:
    p = mtp_pyramid
    prompt = p.tokenize("the model of the tree")
    gpu = shaped_costs(p, per_token=0.02, draft=0.15)
    seen: set[str] = set()

    def run(seed: int) -> list[int]:
        tokens, stats = generate(p, prompt, spec, HOT.with_(seed=seed), gpu)
        seen.update(s.name for s in stats.stages if s.verifications)
        return tokens

    sampled = pairs(run, p.ladder.target.n_vocab)
    assert any(name.startswith("draft->") for name in seen), seen
    assert chi_square_pvalue(sampled, joint(p.ladder.target, prompt)) > 0.001


def test_mtp_needs_nextn_layers(hybrid_dir: Path) -> None:
    plain = write_hybrid(hybrid_dir / "no-nextn.gguf", seed=20, spec=HybridSpec(nextn=False))
    with pytest.raises(UserError, match="no MTP"):
        Pyramid.from_paths(plain, draft="mtp", load=TINY_LOAD)


def test_mtp_logits_follow_its_input_states(mtp_pyramid: Pyramid) -> None:
    """The head's row after the same tokens differs when the target's states differ: its
    input really is the target's hidden state (the pairing of native/mtp.py)."""
    head = mtp_pyramid.ladder.draft
    target = mtp_pyramid.ladder.target
    assert isinstance(head, ModelTier)
    ctx = mtp_pyramid.tokenize("the model of the tree")
    target.model.reset()
    head.model.reset()
    target.prefill(ctx)
    with_states = head.score([*ctx, 5], [])[0]
    head.model.reset()
    target.model.reset()  # the target holds nothing: the head pairs with no state
    without = head.score([*ctx, 5], [])[0]
    head.model.reset()
    assert not np.allclose(with_states, without)


def test_mtp_bench_counts_llama_cpp_rounds_by_committed_tokens(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """scripts/mtp_bench.py: each round of llama.cpp's draft-mtp commits its kept drafts plus
    one token, so rounds are n_predict - n_accept, even when the last round drafts fewer than
    k; a run that fell back to checkpoint replay (no n_rs_seq) is refused, not timed."""
    import argparse
    import subprocess
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import mtp_bench

    # 3 rounds keeping 3 of k = 3 (12 tokens), then one keeping 1 of the 2 it could draft.
    log = "decoded   14 tokens in    0.700 seconds, speed:   20.000 t/s\n"
    log += "n_draft   = 3\nn_predict = 14\nn_drafted = 11\nn_accept  = 10\n"
    out = {"text": log}

    def run(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        assert "draft-mtp" in cmd and "--ignore-eos" in cmd
        return subprocess.CompletedProcess(cmd, 0, "", out["text"])

    monkeypatch.setattr(mtp_bench, "peer_bin", lambda home, name: tmp_path / name)
    monkeypatch.setattr(mtp_bench.subprocess, "run", run)
    args = argparse.Namespace(peer_home=tmp_path, model=tmp_path / "m.gguf", k=3, n=13, threads=2)
    r = mtp_bench.peer(args)
    assert r["rounds"] == 4 and r["kept_per_round"] == pytest.approx(10 / 4)
    assert r["round_s"] == pytest.approx(0.7 / 4)
    out["text"] = "speculative decoding will use checkpoints\n" + log
    with pytest.raises(RuntimeError, match="checkpoints"):
        mtp_bench.peer(args)


def test_snapshots_follow_what_the_loaded_mode_can_drop(hybrid_target: Path) -> None:
    """Plain decoding never rolls back, so a target loaded for it keeps no recurrent-state
    snapshots (each costs a state copy per block at every token); ``sd`` keeps its block,
    ``auto`` :data:`AUTO_DEPTH` (its blocks on such a target no longer), at most the cap.
    Another mode on that context still decodes exactly: its rollbacks take the saved-state
    path."""
    assert rollback_depth(SpecConfig(mode="psd-exact", l_d=2, l_q=5)) == 5
    depth = {}
    for draft, spec, cap in (
        ("mtp", SpecConfig(mode="target"), 16),
        ("mtp", SpecConfig(mode="sd", l_d=3), 16),
        ("mtp", SpecConfig(mode="auto"), 16),
        ("mtp", SpecConfig(mode="auto"), 2),
    ):
        load = replace(TINY_LOAD, n_rs_seq=cap)
        with Pyramid.from_paths(hybrid_target, draft=draft, load=load, spec=spec) as p:
            depth[spec.mode, cap] = p.ladder.target.loaded.n_rs_seq
            if spec.mode == "target":
                want = p.generate(PROMPTS[0], GREEDY, spec).token_ids
                got = p.generate(PROMPTS[0], GREEDY, SpecConfig(mode="sd", l_d=3))
                assert got.token_ids == want
                assert p.ladder.target.loaded.rollback_counts()[1] > 0  # through saved states
    assert depth == {("target", 16): 0, ("sd", 16): 3, ("auto", 16): AUTO_DEPTH, ("auto", 2): 2}
