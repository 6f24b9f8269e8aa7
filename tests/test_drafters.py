"""Drafter kinds are declared once (decoding/runtime/drafters/): a toy kind registered here, with
one module's worth of code and one registry line, is named by ``--draft``, gets its chains
(``auto``'s and the fixed modes') and decodes losslessly on the tiny models."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import TINY_LOAD
from lossless import GREEDY, generate, shaped_costs

from pyramid_gguf import Pyramid, SpecConfig
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.core.ladder import DRAFTERS, NGRAM, Drafter, LadderPaths, LadderShape
from pyramid_gguf.decoding.pricing.chains import Keep, ladder_chains, mode_chain
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.decoding.pricing.estimates import Rate
from pyramid_gguf.decoding.runtime import drafters
from pyramid_gguf.decoding.runtime.drafters import DrafterKind, DraftSetup, Offer
from pyramid_gguf.decoding.runtime.verification import Block

# --- the toy kind: the module a new kind would be --------------------------------------------


class Repeat:
    """A drafter with no model that proposes the context's last token again, ``length`` times,
    and learns one keep rate from what the target keeps. Its own proposer."""

    name = "repeat"

    def __init__(self, setup: DraftSetup) -> None:
        self.length = setup.length
        self.rate = Rate.prior(0.9)
        self.learned = 0

    @property
    def proposer(self) -> Repeat:
        return self

    def start(self, answer_start: int) -> None:
        return None

    def offer(self, context: Sequence[int], max_tokens: int) -> Offer | None:
        k = min(self.length, max_tokens)
        return Offer([context[-1]] * k) if k > 0 and context else None

    def propose(self, context: Sequence[int], max_tokens: int) -> Block:
        return Block([context[-1]] * min(self.length, max_tokens), None, None)

    def sync(self, committed: Sequence[int]) -> None:
        return None

    def keep(self, offer: Offer) -> Keep:
        return self.rate.mean, self.rate.mean

    def learn(self, offer: Offer, proposed: int, kept: int) -> None:
        self.rate.add(min(kept + 1, proposed), proposed)
        self.learned += proposed


#: The toy's declaration: its name on the command line, what it loads (nothing), its lookup.
REPEAT = DrafterKind(Drafter("repeat", "the last token again"), Repeat)


@pytest.fixture()
def registered() -> Iterator[DrafterKind]:
    drafters.register(REPEAT)  # the one registry line
    yield REPEAT
    drafters.forget(REPEAT.name)


# --- what the registry gives it ---------------------------------------------------------------


def test_a_registered_kind_is_named_and_gets_its_chains(registered: DrafterKind) -> None:
    paths = LadderPaths.of("t.gguf", "q.gguf", "repeat")
    assert paths.draft is registered.drafter and paths.model_files().keys() == {
        "qualifier",
        "target",
    }
    shape = paths.shape
    assert shape == LadderShape(("qualifier", "target"), "repeat") and shape.has_draft
    # auto: plain, the n-gram drafter (everywhere), the toy, the qualifier drafting
    chains = {c.name: c for c in ladder_chains(shape, SpecConfig())}
    assert list(chains) == ["target", "ngram", "repeat", "qualifier"]
    assert chains["repeat"].lookup and chains["repeat"].models == ("target",)
    assert chains["repeat"].rules[0].lossless
    sd = mode_chain(SpecConfig(mode="sd"), shape)
    assert (sd.name, sd.tiers, sd.lookup) == ("repeat", ("repeat", "target"), True)
    psd = mode_chain(SpecConfig(mode="psd-exact"), shape)
    assert psd.name == "repeat-pyramid" and psd.models == ("qualifier", "target")
    # priced as any drafter with no model: free drafting, the block it offers
    costs = {"target": CostCurve.shaped(1.0, 0.02)}
    pick = chains["repeat"].price(costs, ((0.9, 0.9),), 8, overhead=0.0, available=3)
    assert pick.best is not None and pick.best.chain == "repeat" and pick.best.k <= 3


def test_a_kind_is_known_only_while_registered() -> None:
    assert "repeat" not in DRAFTERS and LadderPaths.of("t.gguf", draft="repeat").draft == Path(
        "repeat"
    )
    drafters.register(REPEAT)
    try:
        assert DRAFTERS["repeat"] is REPEAT.drafter and drafters.KINDS["repeat"] is REPEAT
        with pytest.raises(ValueError, match="two drafters named"):
            drafters.register(DrafterKind(Drafter("repeat", "another"), Repeat))
    finally:
        drafters.forget("repeat")
    assert "repeat" not in drafters.KINDS and "repeat" not in DRAFTERS
    assert list(DRAFTERS)[:2] == ["ngram", "mtp"] and DRAFTERS["ngram"] is NGRAM
    with pytest.raises(ValueError, match="a lookup exactly when it loads nothing"):
        DrafterKind(Drafter("half", "loads nothing, looks up nothing"))


def test_a_mode_without_a_draft_names_every_drafter() -> None:
    with pytest.raises(UserError, match="--draft GGUF or --draft ngram"):
        LadderShape().check("sd")


# --- it decodes losslessly -------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [SpecConfig(mode="sd", l_d=3), SpecConfig(mode="psd-exact", l_d=2, l_q=3)],
    ids=["sd", "psd-exact"],
)
def test_a_toy_kind_is_lossless_in_the_fixed_modes(
    registered: DrafterKind, tiny_target: Path, tiny_qualifier: Path, spec: SpecConfig
) -> None:
    load = replace(TINY_LOAD, strict_identity=True)
    with Pyramid.from_paths(tiny_target, draft="repeat", qualifier=tiny_qualifier, load=load) as p:
        assert p.ladder.draft is registered.drafter
        stage = "repeat->target" if spec.mode == "sd" else "repeat->qualifier"
        ran = 0
        for text in ("the model of the tree", "a", "def return if else"):
            prompt = p.tokenize(text)
            want = p.generate(prompt, GREEDY, SpecConfig(mode="target")).token_ids
            got, stats = generate(p, prompt, spec, GREEDY)
            assert got == want
            ran += sum(s.verifications for s in stats.stages if s.name == stage)
        assert ran > 0, "the toy never proposed: the test would prove nothing"


def test_a_toy_kind_is_lossless_under_auto(registered: DrafterKind, tiny_target: Path) -> None:
    """Priced as a GPU (a longer block nearly free), auto bets on the toy's blocks; greedy
    output is the target's, token for token, and the toy learns from every round of it."""
    load = replace(TINY_LOAD, strict_identity=True)
    with Pyramid.from_paths(tiny_target, draft="repeat", load=load) as p:
        gpu = shaped_costs(p, per_token=0.02, draft=10.0)
        chosen = 0
        for text in ("a", "the model of the tree", "def return if else"):
            prompt = p.tokenize(text)
            want = p.generate(prompt, GREEDY, SpecConfig(mode="target")).token_ids
            got, stats = generate(p, prompt, SpecConfig(mode="auto"), GREEDY, gpu)
            assert got == want
            assert stats.auto is not None
            chosen += stats.auto.choices["repeat"].rounds if "repeat" in stats.auto.choices else 0
        assert chosen > 0, "auto never chose the toy: the test would prove nothing"
