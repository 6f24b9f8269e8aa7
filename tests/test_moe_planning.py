"""Mixtures of experts in the planner: routing read from the header, a token priced by its active
experts only, a block by the union its tokens read (recorded or, as a fallback, random routing),
and the experts of the first blocks in system RAM ranked beside ``-ngl`` layer splits."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from traces_fixtures import synthetic_set

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from pyramid_gguf.cli.main import main
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.core.gguf_header import read_header
from pyramid_gguf.core.ladder import LadderPaths
from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.models.registry import get_preset
from pyramid_gguf.models.shapes import parse_shape
from pyramid_gguf.planning import sources
from pyramid_gguf.planning.compose import composed_curve
from pyramid_gguf.planning.memory import GiB, ModelMemory, model_memory, shape_memory, shape_of
from pyramid_gguf.planning.moe import (
    ExpertUnion,
    block_bytes,
    expert_plan,
    moe_curve,
    random_touched,
)
from pyramid_gguf.planning.plan import load_plan
from pyramid_gguf.planning.rank import EXPERTS_ON_CPU, Ranking, placements, rank
from pyramid_gguf.planning.tiers import preset_memory
from pyramid_gguf.planning.vram import tier_plan

MOE_PRESET = "qwen3-0.6b-30b-a3b"
#: Experts, experts used, expert FFN width, shared-expert FFN width of the tiny header below.
E, K, FF, SHARED = 8, 2, 32, 16


def write_moe_header(path: Path, n_layer: int = 2, n_embd: int = 64) -> Path:
    """A tiny qwen3moe-shaped GGUF (f32 weights, zeros): every routing key llama.cpp writes."""
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_block_count(n_layer)
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(4 * n_embd)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_expert_count(E)
    w.add_expert_used_count(K)
    w.add_expert_feed_forward_length(FF)
    w.add_expert_shared_feed_forward_length(SHARED)
    z = np.zeros
    w.add_tensor("token_embd.weight", z((100, n_embd), np.float32))
    w.add_tensor("output.weight", z((100, n_embd), np.float32))
    w.add_tensor("output_norm.weight", z(n_embd, np.float32))
    for i in range(n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_q.weight", z((n_embd, n_embd), np.float32))
        w.add_tensor(b + "ffn_gate_inp.weight", z((E, n_embd), np.float32))
        w.add_tensor(b + "ffn_gate_exps.weight", z((E, FF, n_embd), np.float32))
        w.add_tensor(b + "ffn_up_exps.weight", z((E, FF, n_embd), np.float32))
        w.add_tensor(b + "ffn_down_exps.weight", z((E, n_embd, FF), np.float32))
        w.add_tensor(b + "ffn_gate_shexp.weight", z((SHARED, n_embd), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def preset_models() -> dict[str, ModelMemory]:
    return dict(preset_memory(get_preset(MOE_PRESET)).models)


def test_routing_is_read_from_the_header_and_shipped_in_shapes(tmp_path: Path) -> None:
    mm = model_memory(write_moe_header(tmp_path / "moe.gguf"))
    x = mm.experts
    assert x is not None
    assert (x.n_expert, x.n_used, x.expert_ff, x.shared_ff) == (E, K, FF, SHARED)
    per_block = 3 * E * FF * 64 * 4  # gate, up, down experts in f32; router and shared excluded
    assert x.layer_bytes == (per_block, per_block)
    assert all(e < b for e, b in zip(x.layer_bytes, mm.layer_bytes, strict=True))
    # the shape models.toml ships round-trips the routing
    shape = shape_of(read_header(tmp_path / "moe.gguf"), "test")
    table = tomllib.loads(shape.to_toml())
    assert parse_shape(table, "t").experts == x
    assert shape_memory(parse_shape(table, "t"), "t").experts == x
    del table["expert_bytes"]
    with pytest.raises(UserError, match="expert_bytes"):
        parse_shape(table, "t")


def test_a_tiny_moe_from_synth_has_its_experts(tmp_path: Path) -> None:
    synth = pytest.importorskip("synth")
    if not hasattr(synth, "write_tiny_moe"):
        pytest.skip("tests/synth.py has no write_tiny_moe")
    mm = model_memory(synth.write_tiny_moe(tmp_path / "m.gguf", experts=4, used=2))
    assert mm.experts is not None and (mm.experts.n_expert, mm.experts.n_used) == (4, 2)
    assert all(0 < e < b for e, b in zip(mm.experts.layer_bytes, mm.layer_bytes, strict=True))
    assert model_memory(synth.write_tiny_llama(tmp_path / "d.gguf")).experts is None


def test_presets_ship_expert_shapes() -> None:
    """Every MoE preset: routing as the published configs give it, experts most of the bytes."""
    want = {
        "qwen3-0.6b-30b-a3b": (128, 8, 768, 48),
        "qwen3-coder-0.6b-30b-a3b": (128, 8, 768, 48),
        "gpt-oss-20b": (32, 4, 2880, 24),
        "gpt-oss-20b-120b": (128, 4, 2880, 36),
    }
    for name, (n_expert, n_used, ff, n_layer) in want.items():
        models = preset_memory(get_preset(name)).models
        t = models["target"]
        assert t.experts is not None and t.n_layer == n_layer
        assert (t.experts.n_expert, t.experts.n_used, t.experts.expert_ff) == (n_expert, n_used, ff)
        assert sum(t.experts.layer_bytes) > 0.8 * t.weight_bytes
        if "draft" in models and name.startswith("qwen3"):
            assert models["draft"].experts is None and models["draft"].n_vocab == t.n_vocab


def test_a_token_reads_its_active_experts_only() -> None:
    t = preset_models()["target"]
    x = t.experts
    assert x is not None
    every = sum(t.layer_bytes) + t.head_bytes
    experts = sum(x.layer_bytes)
    one = block_bytes(t, 1)
    assert one == pytest.approx(every - experts + experts * x.n_used / x.n_expert)
    assert every / one > 9  # the old price: every expert, every evaluation
    cpu = sources.cpu_profile("ddr5-8core").profile
    gpu = sources.gpu_profile("rtx-4060-8gb", detect=False).profile
    whole = moe_curve(t, t.n_layer + 1, 0, cpu, gpu)  # every part on the GPU
    dense_parts = every - experts
    want = (
        gpu.per_byte[0] * (dense_parts + experts * x.n_used / x.n_expert)
        + gpu.per_layer[0] * t.n_layer
        + gpu.fixed[0]
    )
    assert whole(1) == pytest.approx(want)
    assert composed_curve(t, t.n_layer + 1, cpu, gpu)(1) > 5 * whole(1)
    # a block of 8 reads the union: dearer than one token, far cheaper than 8
    assert whole(1) < whole(8) < 8 * whole(1)
    assert block_bytes(t, 8) == pytest.approx(
        dense_parts + experts * random_touched(x.n_expert, x.n_used, 8) / x.n_expert
    )


def test_random_routing_union_matches_the_issue() -> None:
    """Issue 49's figures: Qwen3-30B-A3B (8 of 128) reads 3.6x one token's expert bytes at 4
    tokens and 6.5x at 8; gpt-oss-120b (4 of 128) 3.8x and 7.2x."""
    qwen, oss = ExpertUnion.random(128, 8), ExpertUnion.random(128, 4)
    assert qwen.ratio(4) == pytest.approx(3.6, abs=0.05)
    assert qwen.ratio(8) == pytest.approx(6.5, abs=0.06)
    assert oss.ratio(4) == pytest.approx(3.8, abs=0.05)
    assert oss.ratio(8) == pytest.approx(7.2, abs=0.05)
    for u in (qwen, oss):
        assert u.ratio(1) == pytest.approx(1.0)
        for k in (1, 5, 16, 20):  # 20: beyond the table, random routing still
            loads = u.load(k)
            assert sum(m * c for m, c in enumerate(loads, 1)) == pytest.approx(k * u.n_used)
            assert u.touched(k) == pytest.approx(random_touched(128, u.n_used, k))


def test_the_union_is_measured_on_recorded_routes() -> None:
    n_tokens, n_layer = 40, 3
    same = np.tile(np.array([0, 1]), (n_tokens, n_layer, 1))  # [n_tokens, n_layer, K]
    u = ExpertUnion.from_routes(same, n_expert=8)
    assert [u.touched(k) for k in (1, 2, 8)] == [2.0, 2.0, 2.0]
    assert u.load(4) == (0.0, 0.0, 0.0, 2.0)  # both experts used by all 4 tokens
    alternate = np.array([[[0, 1]] * n_layer, [[2, 3]] * n_layer] * (n_tokens // 2))
    a = ExpertUnion.from_routes(alternate, n_expert=8)
    assert [a.touched(k) for k in (1, 2, 3)] == [2.0, 4.0, 4.0]
    rng = np.random.default_rng(0)
    noise = np.stack(
        [
            np.stack([rng.choice(64, size=4, replace=False) for _ in range(n_layer)])
            for _ in range(3000)
        ]
    )
    r = ExpertUnion.from_routes(noise, n_expert=64)
    for k in (2, 4, 8, 16):
        assert r.touched(k) == pytest.approx(random_touched(64, 4, k), rel=0.03)
    assert "3000 tokens" in r.source
    dense_first = np.concatenate([np.full((n_tokens, 1, 2), -1), alternate], axis=1)
    assert ExpertUnion.from_routes(dense_first, n_expert=8).loads == a.loads  # no router: left out
    with pytest.raises(UserError, match="n_tokens, n_layer, K"):
        ExpertUnion.from_routes(np.zeros((4, 2)), n_expert=8)
    with pytest.raises(UserError, match="expert ids"):
        ExpertUnion.from_routes(same + 7, n_expert=8)


def test_recorded_locality_prices_a_block_lower_than_random_routing() -> None:
    t = preset_models()["target"]
    cpu = sources.cpu_profile("ddr5-8core").profile
    gpu = sources.gpu_profile("rtx-4060-8gb", detect=False).profile
    sticky = np.tile(np.arange(8), (64, t.n_layer, 1))  # every token the same 8 experts
    local = ExpertUnion.from_routes(sticky, n_expert=128)
    random = moe_curve(t, t.n_layer + 1, t.n_layer, cpu, gpu)
    recorded = moe_curve(t, t.n_layer + 1, t.n_layer, cpu, gpu, union=local)
    assert recorded(1) == pytest.approx(random(1))
    assert recorded(8) < 0.5 * random(8)


def test_the_plan_puts_experts_in_ram_on_an_8gib_card() -> None:
    """Qwen3-30B-A3B Q4_K_M (18.6 GB) on an 8 GiB card: every layer on the GPU but the experts
    of the first blocks beats the best -ngl layer split; everything fits the budget."""
    models = preset_models()
    load = LoadConfig(n_ctx=4096)
    options = placements(models, 8 * GiB, load)
    moe = [p for p in options if p.name.endswith(EXPERTS_ON_CPU)]
    assert moe
    for p in options:
        assert p.plan.gpu_bytes <= p.plan.usable_bytes
    target = models["target"]
    for p in moe:
        assert p.n_gpu_layers("target") == target.n_layer + 1
        n = p.n_cpu_moe("target")
        assert 0 < n < target.n_layer
        # the smallest N that fits: one block fewer would not
        fewer = tier_plan("target", target, -1, p.plan.load, n_cpu_moe=n - 1)
        left = p.plan.usable_bytes - sum(t.gpu_bytes for t in p.plan.tiers if t.tier != "target")
        assert fewer.gpu_bytes > left
    cpu = sources.cpu_profile("ddr5-8core").profile
    gpu = sources.gpu_profile("rtx-4060-8gb", detect=False).profile
    ranked = rank(options, models, synthetic_set(1, draft=0.7), cpu, gpu)
    best_split = max(
        (p for p in ranked if not p.placement.name.endswith(EXPERTS_ON_CPU)),
        key=lambda p: p.plain_tps,
    )
    best_moe = max((p for p in ranked if p.placement.name.endswith(EXPERTS_ON_CPU)),
                   key=lambda p: p.plain_tps)  # fmt: skip
    assert best_moe.plain_tps > best_split.plain_tps
    assert ranked[0].placement.name.endswith(EXPERTS_ON_CPU)
    assert ranked[0].to_dict()["tiers"]["target"]["n_cpu_moe"] > 0


def test_load_plan_gives_the_target_its_n_cpu_moe() -> None:
    models = preset_models()
    cpu = sources.cpu_profile("ddr5-8core").profile
    gpu = sources.gpu_profile("rtx-4060-8gb", detect=False).profile
    options = placements(models, 8 * GiB, LoadConfig(n_ctx=4096))
    ranked = rank(options, models, synthetic_set(1, draft=0.7), cpu, gpu)
    ranking = Ranking(tuple(ranked), synthetic_set(1), cpu, gpu)
    paths = LadderPaths.of("/models/target.gguf", None, "/models/draft.gguf")
    _, loads = load_plan(paths, ranking, LoadConfig(n_ctx=4096, n_cpu_moe=3))
    best = ranking.best.placement
    assert loads["target"].n_cpu_moe == best.n_cpu_moe("target") > 0
    assert loads["target"].n_gpu_layers == models["target"].n_layer + 1
    for tier, load in loads.items():
        if tier != "target":
            assert load.n_cpu_moe == 0


def test_n_cpu_moe_by_hand_is_planned_as_given() -> None:
    models = preset_models()
    load = LoadConfig(n_ctx=4096, n_cpu_moe=40)
    options = placements(models, 8 * GiB, load)
    moe = [p for p in options if p.name.endswith(EXPERTS_ON_CPU)]
    assert moe and all(p.n_cpu_moe("target") == 40 for p in moe)
    everything = LoadConfig(n_ctx=4096, cpu_moe=True)
    assert all(
        p.n_cpu_moe("target") == 48
        for p in placements(models, 8 * GiB, everything)
        if p.name.endswith(EXPERTS_ON_CPU)
    )
    # too few blocks' experts off the card for the budget: no such placement
    t = [("target", models["target"])]
    assert expert_plan(t, 8 * GiB, LoadConfig(n_ctx=4096), n_cpu_moe=2) is None


PLAN = ["plan", "--vram", "8GiB", "--ctx-size", "4096", "--gpu", "rtx-4060-8gb",
        "--cpu", "ddr5-8core", "--ram", "64GiB"]  # fmt: skip


def test_plan_command_shows_the_expert_placement() -> None:
    res = CliRunner().invoke(main, [*PLAN, "--preset", MOE_PRESET, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["best"].endswith(EXPERTS_ON_CPU)
    assert doc["plan"]["tiers"][-1]["n_cpu_moe"] > 0
    text = CliRunner().invoke(main, [*PLAN, "--preset", MOE_PRESET]).output
    assert "n_cpu_moe: target=" in text and EXPERTS_ON_CPU in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--preset", MOE_PRESET, "--n-cpu-moe", "-1"], "--n-cpu-moe must be >= 0"),
        (["--preset", "qwen3-0.6b-1.7b-4b", "--n-cpu-moe", "4"], "not a mixture of experts"),
    ],
)
def test_a_bad_n_cpu_moe_is_one_error_line(extra: list[str], message: str) -> None:
    res = CliRunner().invoke(main, [*PLAN, *extra])
    assert res.exit_code != 0
    assert res.output.startswith("Error: ") and message in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_plan_prices_the_union_on_recorded_routes(tmp_path: Path) -> None:
    """``plan --routes``: the ranking says the union came from the recorded routes; experts that
    stay the same token after token make verification cheaper than random routing does."""
    sticky = tmp_path / "routes.npy"
    np.save(sticky, np.tile(np.arange(8, dtype=np.int32), (64, 48, 1)))
    base = [*PLAN, "--preset", MOE_PRESET]
    res = CliRunner().invoke(main, [*base, "--routes", str(sticky)])
    assert res.exit_code == 0, res.output
    assert "experts: the target reads" in res.output and str(sticky) in res.output
    assert "1.0x one token's expert bytes at 4 tokens" in res.output
    plain = CliRunner().invoke(main, base).output
    assert "from random routing (8 of 128 experts): 3.6x" in plain
    bad = CliRunner().invoke(main, [*base, "--routes", str(tmp_path / "none.npy")])
    assert bad.exit_code != 0 and bad.output.startswith("Error: cannot read recorded routes")
    dense = ["--preset", "qwen3-0.6b-1.7b-4b", "--routes", str(sticky)]
    res = CliRunner().invoke(main, [*PLAN, *dense])
    assert res.exit_code != 0 and "not a mixture of experts" in res.output
