"""Targets bigger than the card (issue 43): ladders with big targets shipped as presets with
their shapes, system RAM as a budget beside VRAM, and llama.cpp's own draft-model speculation
(``llama-server -md``) priced in every placement beside ``auto``. No model file, no network."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from planning_support import plan_json
from traces_fixtures import synthetic_set

from pyramid_gguf.cli.main import main
from pyramid_gguf.core.errors import UserError, VocabularyMismatch
from pyramid_gguf.core.ladder import LadderPaths
from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.core.spec import SpecConfig
from pyramid_gguf.decoding.offline.replay import replay_trace
from pyramid_gguf.decoding.offline.traces import TierTrace, Trace, TraceSet
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.models.registry import get_preset, parse_registry
from pyramid_gguf.models.vocab_check import MAX_SIZE_DIFFERENCE, check_same_vocabulary
from pyramid_gguf.planning import ram as ram_mod
from pyramid_gguf.planning.devices import catalogue
from pyramid_gguf.planning.memory import GiB
from pyramid_gguf.planning.peer import PeerWalks, walk
from pyramid_gguf.planning.plan import PlanInputs, plan_ladder, plan_preset
from pyramid_gguf.planning.ram import RamBudget, detect_ram, reserve, resolve_ram, ssd_tps
from pyramid_gguf.planning.rank import (
    ALL,
    DRAFT_ON_CPU,
    NO_QUALIFIER,
    QUALIFIER_DRAFTS,
    TARGET_ONLY,
    placement_costs,
    placements,
    rank,
)
from pyramid_gguf.planning.sources import cpu_profile, gpu_profile, traces_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from preset_shapes import recipe_shape

#: The ladders issue 43 asks for, and the recipe each tier's shape was priced from.
BIG = {
    "qwen2.5-0.5b-7b-32b": ("qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-32b"),
    "qwen2.5-0.5b-3b-14b": ("qwen2.5-0.5b", "qwen2.5-3b", "qwen2.5-14b"),
    "qwen3-0.6b-4b-32b": ("qwen3-0.6b", "qwen3-4b", "qwen3-32b"),
    "llama3-1b-8b-70b": ("llama-3.2-1b", "llama-3.1-8b", "llama-3.3-70b"),
}
QWEN32 = "qwen2.5-0.5b-7b-32b"
CARD = ["--gpu", "rtx-4060-8gb", "--vram", "8GiB"]


pytestmark = pytest.mark.usefixtures("offline")


def invoke(*args: str) -> Any:
    return CliRunner().invoke(main, ["plan", *args])


# --- presets and shapes -------------------------------------------------------------------------


@pytest.mark.parametrize("preset", list(BIG))
def test_every_big_preset_plans_offline_with_its_target_split(preset: str) -> None:
    """On an 8 GB card the target never fits whole: it is split (or, beside a qualifier, on the
    CPU), the smaller tiers go whole on the GPU first, and each placement names its RAM need
    and the three speeds."""
    doc = plan_json("--preset", preset, *CARD, "--ram", "64GiB", "--prompts", "code")
    shapes = {t: s.shape for t, s in get_preset(preset).tiers.items()}
    assert sum("shape shipped in models.toml" in s for s in doc["sources"]) == 3
    assert doc["ram"]["how"] == "--ram 64GiB" and not doc["not_fitting_ram"]
    names = {p["placement"] for p in doc["placements"]}
    assert names == {ALL, DRAFT_ON_CPU, NO_QUALIFIER, QUALIFIER_DRAFTS, TARGET_ONLY}
    for p in doc["placements"]:
        target = shapes["target"]
        assert target is not None
        ngl = p["tiers"]["target"]["n_gpu_layers"]
        assert ngl < target.n_layer + 1, p["placement"]
        if p["placement"] in ("target only", "no qualifier"):
            assert ngl > 1, p["placement"]  # the output layer and some blocks on the GPU
        on_cpu = target.n_layer - max(ngl - 1, 0)  # the first blocks stay on the CPU
        assert p["host_bytes"] > sum(target.layer_bytes[:on_cpu]) + target.embd_bytes
        assert p["plain_tps"] > 0 and p["auto_tps"] > 0
        assert (p["peer_spec_tps"] is None) == (p["placement"] == "target only")
        for tier in ("draft", "qualifier"):
            shape = shapes[tier]
            if tier in p["tiers"] and p["placement"] != "draft on CPU" and shape is not None:
                assert p["tiers"][tier]["n_gpu_layers"] == shape.n_layer + 1
    assert doc["best_peer_spec"]["tps"] > 0


#: config.json values (hidden, layers, heads, KV heads, FFN, vocabulary, tied embeddings).
CONFIGS = {
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151936, True),
    "qwen2.5-3b": (2048, 36, 16, 2, 11008, 151936, True),
    "qwen2.5-7b": (3584, 28, 28, 4, 18944, 152064, False),
    "qwen2.5-14b": (5120, 48, 40, 8, 13824, 152064, False),
    "qwen2.5-32b": (5120, 64, 40, 8, 27648, 152064, False),
    "qwen3-0.6b": (1024, 28, 16, 8, 3072, 151936, True),
    "qwen3-4b": (2560, 36, 32, 8, 9728, 151936, True),
    "qwen3-32b": (5120, 64, 64, 8, 25600, 151936, False),
    "llama-3.2-1b": (2048, 16, 32, 8, 8192, 128256, True),
    "llama-3.1-8b": (4096, 32, 32, 8, 14336, 128256, False),
    "llama-3.3-70b": (8192, 80, 64, 8, 28672, 128256, False),
}


def test_big_shapes_are_the_published_configs_priced_by_the_recipe() -> None:
    for preset, recipes in BIG.items():
        for tier, name in zip(("draft", "qualifier", "target"), recipes, strict=True):
            shape = get_preset(preset).tiers[tier].shape
            assert shape is not None, (preset, tier)
            got = (shape.n_embd, shape.n_layer, shape.n_head, shape.n_head_kv[0], shape.n_ff,
                   shape.n_vocab, shape.tied)  # fmt: skip
            assert got == CONFIGS[name], (preset, tier)
            want, _ = recipe_shape(name)
            assert replace(shape, source="") == replace(want, source=""), (preset, tier)
            assert get_preset(preset).tiers[tier].source == "hf"


def test_the_big_targets_cost_what_their_files_weigh() -> None:
    """The recipe's Qwen2.5 32B is the 19.85 GB file bartowski lists, a Llama 3.3 70B 42.5 GB."""
    sizes = {"qwen2.5-32b": 19.85e9, "qwen2.5-14b": 8.99e9, "llama-3.3-70b": 42.52e9}
    for name, listed in sizes.items():
        _, total = recipe_shape(name)
        assert 0.99 < total / listed < 1.0, name


@dataclass
class Table:
    n_vocab: int
    bos: int = 1
    eos: int = 2

    def token_text(self, token: int) -> str:
        return f"t{token}"


@dataclass
class Model:
    path: Path
    vocab: Table

    def metadata(self) -> dict[str, str]:
        return {"tokenizer.ggml.model": "gpt2"}


def test_big_ladders_pass_llamas_vocabulary_rule() -> None:
    """Qwen2.5 0.5B and 3B have 151936 tokens, 7B and up 152064: exactly the 128 padding rows
    llama.cpp's rule allows. One more and the check refuses."""
    for preset in BIG:
        sizes = [t.shape.n_vocab for t in get_preset(preset).tiers.values() if t.shape]
        assert max(sizes) - min(sizes) <= MAX_SIZE_DIFFERENCE, preset
    qwen = [t.shape.n_vocab for t in get_preset(QWEN32).tiers.values() if t.shape]
    assert max(qwen) - min(qwen) == MAX_SIZE_DIFFERENCE
    small, big = (Model(Path(f"{n}.gguf"), Table(n)) for n in (min(qwen), max(qwen)))
    check_same_vocabulary([big, small])
    with pytest.raises(VocabularyMismatch, match="more than 128 apart"):
        check_same_vocabulary([Model(Path("x.gguf"), Table(max(qwen) + 1)), small])


def test_a_preset_whose_shapes_cannot_share_a_vocabulary_is_refused() -> None:
    shape, _ = recipe_shape("qwen2.5-0.5b")
    text = ""
    for tier, vocab in (("draft", 151936), ("target", 151936 + MAX_SIZE_DIFFERENCE + 1)):
        text += (
            f'[presets."p".{tier}]\nsource = "hf"\nrepo = "a/b"\nfile = "{tier}.gguf"\n'
            f'revision = "main"\n\n[presets."p".{tier}.shape]\n'
            f"{replace(shape, n_vocab=vocab).to_toml()}\n\n"
        )
    with pytest.raises(UserError, match="more than 128 tokens apart"):
        parse_registry(text)
    parse_registry(text.replace(str(151936 + MAX_SIZE_DIFFERENCE + 1), "152064"))


# --- system RAM --------------------------------------------------------------------------------


def test_ram_is_read_from_meminfo_or_a_lower_cgroup_limit(tmp_path: Path) -> None:
    meminfo, cgroup = tmp_path / "meminfo", tmp_path / "memory.max"
    meminfo.write_text("MemTotal:       16384000 kB\nMemFree:         1000 kB\n")
    cgroup.write_text("max\n")
    assert detect_ram(meminfo, cgroup) == (16384000 * 1024, f"MemTotal of {meminfo}")
    cgroup.write_text(f"{8 * GiB}\n")
    total, how = detect_ram(meminfo, cgroup) or (0, "")
    assert total == 8 * GiB and "cgroup" in how
    found = detect_ram(tmp_path / "none", tmp_path / "none")  # sysconf, where there is one
    assert found is None or (found[0] > 0 and found[1] == "os.sysconf")


def test_the_reserve_is_two_gib_or_a_tenth() -> None:
    assert reserve(8 * GiB) == 2 * GiB and reserve(64 * GiB) == int(6.4 * GiB)
    budget = resolve_ram("32GiB")
    assert budget is not None and budget.usable_bytes == 32 * GiB - int(3.2 * GiB)
    assert budget.how == "--ram 32GiB"
    with pytest.raises(UserError, match="bad size"):
        resolve_ram("lots")
    # an overflow re-read every token from an SSD: at best the bandwidth's worth
    assert ssd_tps(0.0, 3 * 10**9) == pytest.approx(1.0)
    assert ssd_tps(0.5, 0) == pytest.approx(2.0)


def test_plan_ranks_only_the_placements_that_fit_the_ram() -> None:
    """16 GiB: the 32B beside the 7B keeps 17.8 GiB in RAM and is not ranked; beside the 0.5B
    draft it fits and wins. Those left out say what an SSD would give them."""
    roomy = plan_json("--preset", QWEN32, *CARD, "--ram", "64GiB", "--prompts", "code")
    tight = plan_json("--preset", QWEN32, *CARD, "--ram", "16GiB", "--prompts", "code")
    usable = tight["ram"]["usable_bytes"]
    assert usable == 16 * GiB - 2 * GiB
    ranked = {p["placement"] for p in tight["placements"]}
    left = {u["placement"]: u for u in tight["not_fitting_ram"] if u["weights"] == "mapped"}
    assert ranked | set(left) == {p["placement"] for p in roomy["placements"]}
    assert ranked and left and not ranked & set(left)
    for p in tight["placements"]:
        assert p["host_bytes"] <= usable
    for u in left.values():
        assert u["host_bytes"] > usable and u["over_bytes"] == u["host_bytes"] - usable
        assert 0 < u["ssd_plain_tps"] < u["plain_tps"]
    for u in tight["not_fitting_ram"]:  # pinned or repacked weights cannot page: no SSD price
        assert u["weights"] == "mapped" or u["ssd_plain_tps"] == 0
    assert roomy["best"] in left  # what 64 GiB would run does not fit 16
    assert tight["best"] == "no qualifier"
    text = invoke("--preset", QWEN32, *CARD, "--ram", "16GiB", "--prompts", "code").output
    assert "does not fit the RAM" in text and "from an SSD" in text and "RAM: 14.0 GiB" in text


def test_no_placement_in_the_ram_is_one_line_saying_what_is_missing() -> None:
    res = invoke("--preset", QWEN32, *CARD, "--ram", "8GiB")
    assert res.exit_code == 1 and res.output.startswith("Error: ")
    assert res.output.count("\n") == 1
    m = re.search(r"needs is ([0-9.]+) GiB \(target only\): ([0-9.]+) GiB more RAM", res.output)
    assert m is not None, res.output
    assert float(m.group(2)) == pytest.approx(float(m.group(1)) - 6.0, abs=0.11)
    vram = re.search(r"or --vram ([0-9.]+GiB)", res.output)
    assert vram is not None, res.output
    # the --vram it names is enough: the target alone then fits the same RAM
    doc = plan_json("--preset", QWEN32, "--gpu", "rtx-4060-8gb", "--vram", vram.group(1),
                    "--ram", "8GiB", "--prompts", "code")  # fmt: skip
    assert any(p["placement"] == "target only" for p in doc["placements"])


def test_fit_says_whether_the_host_memory_fits() -> None:
    res = invoke("--preset", QWEN32, *CARD, "--ram", "8GiB", "--fit")
    assert res.exit_code == 0, res.output
    assert "does NOT fit" in res.output
    doc = json.loads(invoke("--preset", QWEN32, *CARD, "--ram", "64GiB", "--fit", "--json").output)
    assert doc["ram"]["total_bytes"] == 64 * GiB and doc["host_bytes"] < doc["ram"]["usable_bytes"]


def test_the_set_up_run_and_serve_share_checks_the_detected_ram_first(
    tiny_draft: Path, tiny_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``plan_ladder`` (``run`` / ``serve`` / ``bench --vram``, ``Pyramid.load``) checks this
    machine's RAM unless told another: here a machine of 1 MiB, so nothing fits."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 1024 kB\n")
    monkeypatch.setattr(ram_mod, "MEMINFO", meminfo)
    monkeypatch.setattr(ram_mod, "CGROUP_MAX", tmp_path / "none")
    paths = LadderPaths.of(str(tiny_target), None, str(tiny_draft))
    inputs = PlanInputs(gpu="rtx-4060-8gb", gpu_offload=True, detect=False)
    load = LoadConfig(n_ctx=256)
    with pytest.raises(UserError, match=r"fits the RAM: 0\.0 GiB usable \(0\.0 GiB detected"):
        plan_ladder(paths, "1GiB", load, inputs=inputs)
    ok = plan_ladder(paths, "1GiB", load, inputs=replace(inputs, ram="8GiB"))
    assert ok.ram is not None and ok.ram.how == "--ram 8GiB"


# --- llama.cpp's draft-model speculation -------------------------------------------------------


def _trace(draft: list[bool], tops: list[float], n: int = 11) -> TraceSet:
    answer = tuple(range(100, 100 + n))
    argmax = tuple(answer[i] if draft[i] else 7 for i in range(n))
    tier = TierTrace(argmax, tuple(tops), tuple(tops))
    return TraceSet("t", {}, 0.0, (Trace("k", "s", (1, 2, 3), answer, {"draft": tier}),))


def test_the_peer_walk_follows_llamas_rules() -> None:
    """11 answer tokens, the first from the prompt; the draft wrong only at position 3;
    --spec-draft-n-max 4. Round 1 drafts 1-4 (4 evaluations: the last sampled token and three
    drafted ones), keeps 1-2 and the target's 3; round 2 drafts 4-7, keeps them and the
    target's 8; round 3 may draft only one (two tokens left, less one): 9, and the target's 10."""
    right = [True, True, True, False, *([True] * 7)]
    w = walk(_trace(right, [0.9] * 11), "draft", 4)
    assert w.tokens == 11 and w.committed == 10
    assert dict(w.target_batches) == {5: 2, 2: 1} and w.draft_steps == 4 + 4 + 1
    assert w.tokens_per_round == pytest.approx(10 / 3)
    target = CostCurve(tuple(0.1 * (1 + 0.2 * i) for i in range(16)))
    draft = CostCurve(tuple(0.01 * (1 + 0.5 * i) for i in range(16)))
    want = 2 * (target(5) + draft(5)) + target(2) + draft(2) + 9 * draft(1)
    assert w.seconds(target, draft) == pytest.approx(want)
    # --spec-draft-p-min: a draft never that sure drafts nothing (one evaluation a round, none
    # for the last token, when nothing is left to draft)
    shy = walk(_trace(right, [0.5] * 11), "draft", 4, p_min=0.75)
    assert dict(shy.target_batches) == {1: 10} and shy.draft_steps == 9
    # sure of position 1 only: one token drafted, two evaluations, then nothing (one each);
    # --spec-draft-n-min 2 drops that one draft
    tops = [0.9, 0.9, *([0.5] * 9)]
    one = walk(_trace([True] * 11, tops, 11), "draft", 4, p_min=0.75)
    assert dict(one.target_batches) == {2: 1, 1: 8} and one.draft_steps == 2 + 7
    dropped = walk(_trace([True] * 11, tops, 11), "draft", 4, p_min=0.75, n_min=2)
    assert dict(dropped.target_batches) == {1: 10}


@pytest.mark.parametrize("tier", ["draft", "qualifier"])
def test_the_peer_rounds_are_the_engines_greedy_match_rounds(tier: str) -> None:
    """The same trace, the engine's ``sd --exact-rule greedy-match`` with ``l_d = n``: as many
    target evaluations as llama.cpp's rounds."""
    traces = traces_for("none").select(["code"])
    curve = CostCurve((0.01,) * 16)
    for n in (1, 3, 6):
        evaluations = 0
        for t in traces.traces:
            only = Trace(t.key, t.set, t.prompt, t.answer, {"draft": t.tiers[tier]})
            spec = SpecConfig(mode="sd", exact_rule="greedy-match", l_d=n)
            evaluations += replay_trace(only, {"target": curve, "draft": curve}, spec).evaluations
        assert walk(traces, tier, n).rounds == evaluations


def test_the_peer_never_beats_plain_by_more_than_the_traces_allow() -> None:
    """At most plain decoding (no overhead) times the answer tokens per target evaluation the
    traces give its knobs, and below it: its draft costs something."""
    ranking = plan_preset(QWEN32, 8 * GiB, LoadConfig(),
                          inputs=PlanInputs(gpu="rtx-4060-8gb", gpu_offload=True, ram="64GiB",
                                            sets=("code",), detect=False))  # fmt: skip
    checked = set()
    for p in ranking.predictions:
        if p.peer is None:
            continue
        w = walk(ranking.traces, p.peer.draft, p.peer.draft_max, p.peer.p_min)
        bound = w.tokens / (w.rounds * p.costs["target"](1))
        assert p.peer.tps < bound
        assert p.peer.tokens_per_round == pytest.approx(w.tokens_per_round)
        assert p.peer.tokens_per_round <= 1 + p.peer.draft_max
        checked.add(p.placement.name)
    assert len(checked) == 4  # each split, whichever way its CPU weights sit


@pytest.mark.parametrize("card", ["rtx-2060-6gb", "rtx-4060-8gb", "rtx-3060-12gb"])
def test_the_peer_is_at_most_what_auto_reaches_with_the_same_chain(card: str) -> None:
    """Every placement that loads a smaller model lets ``auto`` run that model -> target too
    (and more chains, block sizes per round, the n-gram drafter): it is never slower than
    llama.cpp's draft-model speculation there, but for a margin. The chat traces: the fewest
    n-gram copies. Since the peer is searched at every ``--draft-max`` to 64 and its p-min, on
    the 70B with its draft on the CPU it is predicted 1.01-1.05x ``auto`` (a fixed block of 4
    against auto's per-round choice and round overhead): a known gap, not a guarantee."""
    inputs = PlanInputs(gpu=card, gpu_offload=True, ram="64GiB", sets=("chat",), detect=False)
    vram = catalogue("gpu")[card].vram_bytes
    for preset in (QWEN32, "llama3-1b-8b-70b"):
        ranking = plan_preset(preset, vram, LoadConfig(), inputs=inputs)
        for p in ranking.predictions:
            if p.peer is not None:  # within 6%: see below
                assert p.peer.tps <= 1.06 * p.tps, (preset, p.placement.name)


def test_the_best_smaller_tier_drafts_for_the_peer() -> None:
    """A qualifier that agrees far better than the draft is llama.cpp's better draft where the
    target's step is dear; the peer picks it, at a longer block than the weak draft."""
    from planning_support import CPU, GPU, LADDER, LOAD

    traces = synthetic_set(2, draft=0.3, qualifier=0.95)
    options = placements(LADDER, 6 * GiB, LOAD)
    walks = PeerWalks(traces)
    every = next(p for p in options if p.name == "all tiers")
    costs = placement_costs(every, LADDER, CPU, GPU)
    best = walks.best(costs)
    assert best is not None and best.draft == "qualifier" and best.draft_max >= 4
    only_draft = walks.best({k: v for k, v in costs.items() if k != "qualifier"})
    assert only_draft is not None and only_draft.draft == "draft"
    assert only_draft.draft_max < best.draft_max and only_draft.tps < best.tps
    assert walks.best({"target": costs["target"]}) is None
    ranked = rank(options, LADDER, traces, CPU, GPU)
    assert all((p.peer is None) == (p.placement.tiers == ("target",)) for p in ranked)


def test_the_plan_table_shows_the_peer() -> None:
    res = invoke("--preset", QWEN32, *CARD, "--ram", "64GiB", "--prompts", "code")
    assert res.exit_code == 0, res.output
    assert "llama.cpp -md" in res.output and "RAM GiB" in res.output
    row = next(ln for ln in res.output.splitlines() if ln.startswith("qualifier as draft"))
    assert re.search(r"\s[0-9.]+ q/\d+\s", row), row


def test_the_ram_budget_and_peer_modules_are_pure() -> None:
    """Both import without llama.cpp (the planner's arithmetic; docs/ARCHITECTURE.md)."""
    import subprocess

    for module in ("pyramid_gguf.planning.ram", "pyramid_gguf.planning.peer"):
        code = f"import sys, {module}; print('llama_cpp' in sys.modules)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True)  # fmt: skip
        assert out.stdout.strip() == "False"


def test_cpu_and_gpu_profiles_named_in_a_budget_are_the_ones_priced() -> None:
    """The RAM line and the profiles come back with the ranking (what it was predicted from)."""
    inputs = PlanInputs(gpu="rtx-4060-8gb", cpu="ddr4-8core", gpu_offload=True, ram=32 * GiB,
                        sets=("code",), detect=False)  # fmt: skip
    ranking = plan_preset(QWEN32, 8 * GiB, LoadConfig(), inputs=inputs)
    assert ranking.gpu is not None and ranking.gpu.name == gpu_profile("rtx-4060-8gb").profile.name
    assert ranking.cpu.name == cpu_profile("ddr4-8core").profile.name
    assert isinstance(ranking.ram, RamBudget) and ranking.ram.how == "given"
    assert any(line.startswith("RAM: 28.8 GiB usable") for line in ranking.sources())
