"""Memory planner, fast GGUF header reader and ``pyramid-gguf plan``.

Real-model tests use the session fixtures ``qwen_draft_path`` / ``qwen_target_path``
(Qwen2.5-Coder 0.5B / 1.5B GGUF files) from ``tests/conftest.py``.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import gguf
import pytest
from click.testing import CliRunner
from synth import TinySpec, write_tiny_llama

from pyramid_gguf.core.errors import ModelFileError, UserError
from pyramid_gguf.core.gguf_header import read_header
from pyramid_gguf.core.ladder import LadderPaths
from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.planning import vram as planner
from pyramid_gguf.planning.memory import GiB, MiB, ModelMemory, model_memory, parse_size
from pyramid_gguf.planning.vram import (
    Plan,
    apply_plan,
    fit_ladder,
    make_plan,
    placement,
    tier_load_config,
    tier_plan,
)


def _cli() -> tuple[click.Command, list[str]]:
    """The full CLI when it imports (``plan`` subcommand), else the command object alone."""
    try:
        from pyramid_gguf.cli.main import main

        return main, ["plan"]
    except ImportError:
        from pyramid_gguf.cli.plan import plan

        return plan, []


def invoke(*args: str) -> Any:
    cmd, prefix = _cli()
    return CliRunner().invoke(cmd, [*prefix, *args])


# --- synthetic models -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_ladder(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("planner")
    return {
        "draft": write_tiny_llama(d / "draft.gguf", seed=1, spec=TinySpec(n_layer=2)),
        "qualifier": write_tiny_llama(d / "qual.gguf", seed=2, spec=TinySpec(n_embd=96, n_layer=3)),
        "target": write_tiny_llama(
            d / "target.gguf", seed=3, spec=TinySpec(n_embd=128, n_layer=4, n_ff=256)
        ),
    }


def test_header_matches_gguf_reader(tiny_ladder: dict[str, Path]) -> None:
    path = tiny_ladder["target"]
    h = read_header(path)
    r = gguf.GGUFReader(str(path))
    assert h.data_offset == r.data_offset
    assert h.alignment == r.alignment
    ours = {t.name: (t.nbytes, t.ggml_type) for t in h.tensors}
    theirs = {t.name: (int(t.n_bytes), int(t.tensor_type)) for t in r.tensors}
    assert ours == theirs
    assert h.metadata["llama.block_count"] == 4
    assert h.metadata["tokenizer.ggml.tokens"].length == len(r.fields["tokenizer.ggml.tokens"].data)


def test_tiny_model_memory(tiny_ladder: dict[str, Path]) -> None:
    spec = TinySpec(n_embd=128, n_layer=4, n_ff=256)
    mm = model_memory(tiny_ladder["target"])
    head_dim = spec.n_embd // spec.n_head
    kv_dim = spec.n_head_kv * head_dim
    per_layer = 4 * (
        2 * spec.n_embd  # norms
        + 2 * spec.n_embd * spec.n_embd  # q, o
        + 2 * kv_dim * spec.n_embd  # k, v
        + 3 * spec.n_ff * spec.n_embd  # gate, up, down
    )
    assert mm.layer_bytes == (per_layer,) * spec.n_layer
    assert mm.embd_bytes == 4 * mm.n_vocab * spec.n_embd
    assert mm.head_bytes == 4 * (mm.n_vocab * spec.n_embd + spec.n_embd)
    assert not mm.tied_output
    assert mm.kv_bytes_per_token() == (2 * kv_dim * 2,) * spec.n_layer
    assert sum(mm.layer_bytes) + mm.file_head_bytes + mm.embd_bytes + mm.other_bytes == (
        mm.tensor_bytes
    )


def test_tied_embeddings_duplicate_the_table(tiny_ladder: dict[str, Path]) -> None:
    h = read_header(tiny_ladder["draft"])
    tied = replace(h, tensors=tuple(t for t in h.tensors if t.name != "output.weight"))
    mm = model_memory(tied)
    assert mm.tied_output
    norm = 4 * mm.n_embd
    assert mm.file_head_bytes == norm
    assert mm.head_bytes == norm + mm.embd_bytes


@pytest.mark.parametrize(
    ("ngl", "output_first", "expected"),
    [
        (0, True, (0, False)),
        (1, True, (0, True)),
        (3, True, (2, True)),
        (4, True, (3, True)),
        (5, True, (4, True)),
        (99, True, (4, True)),
        (-1, True, (4, True)),
        (1, False, (1, False)),
        (4, False, (4, False)),
        (5, False, (4, True)),
    ],
)
def test_placement_mirrors_llama_cpp(
    ngl: int, output_first: bool, expected: tuple[int, bool]
) -> None:
    assert placement(4, ngl, output_first=output_first) == expected


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8GiB", 8 * GiB),
        ("6GB", 6 * 10**9),
        ("512MiB", 512 * MiB),
        ("512 mib", 512 * MiB),
        ("1.5G", int(1.5 * GiB)),
        ("0", 0),
        ("100B", 100),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "8", "GiB", "8 bananas", "-1GiB", "1e3MiB", "8GiBs"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(UserError):
        parse_size(text)


def test_tiny_plan_extremes_and_order(tiny_ladder: dict[str, Path]) -> None:
    models = [(t, model_memory(p)) for t, p in tiny_ladder.items()]
    none = make_plan(models, 0, LoadConfig(n_ctx=256, n_batch=32))
    assert all(t.n_gpu_layers == 0 and t.gpu_bytes == 0 for t in none.tiers)
    full = make_plan(models, 64 * GiB, LoadConfig(n_ctx=256, n_batch=32))
    assert all(t.full and t.cpu_kv_bytes == 0 for t in full.tiers)
    for t, (_, mm) in zip(full.tiers, models, strict=True):
        assert t.cpu_weight_bytes == mm.embd_bytes + mm.other_bytes
    _check_plans(models, n_ctx=256, n_ubatch=32, margin=0, step=4096)


def _check_plans(
    models: list[tuple[str, ModelMemory]],
    *,
    n_ctx: int,
    n_ubatch: int,
    margin: int,
    step: int,
    kv: str = "f16",
) -> None:
    """Monotone in the budget, never over it, earlier tiers full before later ones get layers."""
    load = LoadConfig(n_ctx=n_ctx, n_batch=n_ubatch, type_k=kv, type_v=kv)  # type: ignore[arg-type]
    top = make_plan(
        models, 1 << 40, replace(load, type_k="f16", type_v="f16"), margin_bytes=0
    ).gpu_bytes
    prev: Plan | None = None
    for budget in range(0, top + 2 * step, step):
        p = make_plan(models, budget, load, margin_bytes=margin)
        assert p.gpu_bytes <= max(budget - margin, 0)
        for earlier, later in itertools.pairwise(p.tiers):
            if later.n_gpu_layers > 0:
                assert earlier.full
        if prev is not None:
            for a, b in zip(prev.tiers, p.tiers, strict=True):
                assert b.n_gpu_layers >= a.n_gpu_layers
        prev = p
    assert prev is not None and all(t.full for t in prev.tiers)


def test_kv_quant_auto_fits_more(tiny_ladder: dict[str, Path]) -> None:
    models = [(t, model_memory(p)) for t, p in tiny_ladder.items()]
    load = LoadConfig(n_ctx=8192, n_batch=32)
    full_f16 = make_plan(models, 1 << 40, load, margin_bytes=0).gpu_bytes
    budget = full_f16 - 1
    plain = make_plan(models, budget, load, margin_bytes=0)
    auto = make_plan(models, budget, load, margin_bytes=0, kv_quant="auto")
    assert not all(t.full for t in plain.tiers)
    assert all(t.full for t in auto.tiers)
    assert auto.load.type_k == auto.load.type_v == "q8_0"
    assert auto.gpu_bytes <= budget
    roomy = make_plan(models, 1 << 40, LoadConfig(n_ctx=8192), kv_quant="auto")
    assert roomy.load.type_k == "f16"


def test_tier_load_config_and_apply_plan(tiny_ladder: dict[str, Path]) -> None:
    paths = LadderPaths(tiny_ladder["target"], draft=tiny_ladder["draft"])
    p = fit_ladder(64 * GiB, paths, LoadConfig(n_ctx=256))
    assert p.tier_names == ("draft", "target")
    assert apply_plan(p, "draft") == 3
    assert apply_plan(p, "target") == 5
    with pytest.raises(UserError, match="no qualifier tier"):
        apply_plan(p, "qualifier")
    base = LoadConfig(n_ctx=256, n_gpu_layers=-1)
    cfg = tier_load_config(p, "target", base)
    assert cfg.n_gpu_layers == 5 and cfg.n_ctx == 256
    q = replace(p, load=replace(p.load, type_k="q8_0", type_v="q8_0"))
    assert tier_load_config(q, "draft", base).flash_attn is True


def test_zero_layer_tier_counts_its_op_offload_buffer(tiny_ladder: dict[str, Path]) -> None:
    """A tier with no GPU layers still reserves a GPU buffer for llama.cpp's op offload (the
    output head and one micro-batch of logits, measured on an H100); the plan gives it op
    offload only where that fits, else turns it off, and never exceeds the budget."""
    models = [(t, model_memory(p)) for t, p in tiny_ladder.items()]
    load = LoadConfig(n_ctx=512, n_batch=64)
    target = models[-1][1]
    on = tier_plan("target", target, 0, load)
    off = tier_plan("target", target, 0, load, op_offload=False)
    assert on.gpu_bytes == target.head_bytes + target.compute_bytes(512, 64, logits=True)
    assert off.gpu_bytes == 0 and not off.op_offload and on.op_offload
    # Output layer alone on the GPU costs exactly what op offload reserves.
    assert tier_plan("target", target, 1, load).gpu_bytes == on.gpu_bytes
    lower = make_plan(models[:-1], 1 << 40, load, margin_bytes=0).gpu_bytes
    for budget in (lower, lower + on.gpu_bytes - 1):
        plan = make_plan(models, budget, load, margin_bytes=0)
        top = plan.tiers[-1]
        assert top.n_gpu_layers == 0 and not top.op_offload and top.gpu_bytes == 0
        assert plan.gpu_bytes <= budget
        assert tier_load_config(plan, "target", load).op_offload is False
    # A partly offloaded tier blocks later tiers' layers, not their op offload when it fits.
    mid = make_plan(models, lower - 1, load, margin_bytes=0)
    assert not mid.tiers[-2].full and mid.tiers[-1].n_gpu_layers == 0
    assert mid.gpu_bytes <= lower - 1
    assert tier_load_config(mid, "draft", load).op_offload is True


def test_margin_default(tiny_ladder: dict[str, Path]) -> None:
    assert planner.default_margin(GiB) == 256 * MiB
    assert planner.default_margin(100 * GiB) == 5 * GiB
    mm = model_memory(tiny_ladder["draft"])
    assert make_plan([("draft", mm)], 256 * MiB, LoadConfig(n_ctx=256)).tiers[0].n_gpu_layers == 0


def test_resolve_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    assert planner.resolve_budget("2GiB") == 2 * GiB
    monkeypatch.setattr("pyramid_gguf.native.supports_gpu_offload", lambda: False)
    with pytest.raises(UserError, match="--vram"):
        planner.resolve_budget(None)
    monkeypatch.setattr("pyramid_gguf.native.supports_gpu_offload", lambda: True)
    monkeypatch.setattr(planner.shutil, "which", lambda name: "/usr/bin/nvidia-smi")

    def fake_run(*args: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 0, stdout="7000\n3000\n", stderr="")

    monkeypatch.setattr(planner.subprocess, "run", fake_run)
    assert planner.resolve_budget("auto") == 7000 * MiB
    monkeypatch.setattr(planner.shutil, "which", lambda name: None)
    with pytest.raises(UserError, match="nvidia-smi"):
        planner.resolve_budget(None)


def test_truncated_header(tmp_path: Path, tiny_ladder: dict[str, Path]) -> None:
    raw = tiny_ladder["draft"].read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(raw[:200])
    with pytest.raises(ModelFileError, match="truncated"):
        read_header(bad)
    bad.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ModelFileError, match="truncated"):
        read_header(bad)


def test_cli_on_tiny_models(tiny_ladder: dict[str, Path]) -> None:
    res = invoke(
        "--draft", str(tiny_ladder["draft"]), "--qualifier", str(tiny_ladder["qualifier"]),
        "--target", str(tiny_ladder["target"]), "--vram", "4GiB", "--ctx-size", "256", "--fit",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "draft=3 qualifier=4 target=5" in res.output


# --- real models ------------------------------------------------------------------------------


@pytest.mark.real
def test_real_tensor_bytes_cover_the_file(qwen_draft_path: Path, qwen_target_path: Path) -> None:
    for path in (qwen_draft_path, qwen_target_path):
        h = read_header(path)
        mm = model_memory(h)
        assert len(mm.layer_bytes) == mm.n_layer and all(b > 0 for b in mm.layer_bytes)
        parts = sum(mm.layer_bytes) + mm.file_head_bytes + mm.embd_bytes + mm.other_bytes
        assert parts == h.tensor_bytes
        # Tensor sizes tile the data section exactly (up to alignment padding) to the file end.
        ordered = sorted(h.tensors, key=lambda t: t.offset)
        assert ordered[0].offset == 0
        for a, b in itertools.pairwise(ordered):
            end = a.offset + a.nbytes
            assert b.offset == -(-end // h.alignment) * h.alignment
        assert h.data_offset + ordered[-1].offset + ordered[-1].nbytes == path.stat().st_size
        assert h.file_size - h.data_offset - h.tensor_bytes < h.alignment * len(h.tensors)


@pytest.mark.real
def test_real_kv_bytes(qwen_draft_path: Path, qwen_target_path: Path) -> None:
    d = model_memory(qwen_draft_path)
    t = model_memory(qwen_target_path)
    assert (d.n_layer, d.n_embd, d.n_head) == (24, 896, 14)
    assert (t.n_layer, t.n_embd, t.n_head) == (28, 1536, 12)
    for mm in (d, t):
        head_dim = mm.n_embd // mm.n_head
        kv_dim = 2 * head_dim  # head_count_kv = 2 in both
        assert mm.kv_bytes(4096) == 4096 * mm.n_layer * 2 * kv_dim * 2
        q8 = kv_dim // 32 * 34
        assert mm.kv_bytes(4096, "q8_0", "q8_0") == 4096 * mm.n_layer * 2 * q8
        q4 = kv_dim // 32 * 18
        assert mm.kv_bytes(4096, "q4_0", "f16") == 4096 * mm.n_layer * (q4 + kv_dim * 2)
    # llama.cpp pads the cache to 256 cells: it reports 12.00 MiB for the 0.5B at n_ctx=1000.
    assert d.kv_bytes(1000) == 12 * MiB


@pytest.mark.real
def test_real_plans(qwen_draft_path: Path, qwen_target_path: Path) -> None:
    models = [("draft", model_memory(qwen_draft_path)), ("target", model_memory(qwen_target_path))]
    _check_plans(models, n_ctx=4096, n_ubatch=512, margin=0, step=32 * MiB)
    _check_plans(models, n_ctx=2048, n_ubatch=512, margin=64 * MiB, step=48 * MiB, kv="q8_0")
    zero = make_plan(models, 0)
    assert [t.n_gpu_layers for t in zero.tiers] == [0, 0]
    huge = make_plan(models, 1 << 40)
    assert [t.n_gpu_layers for t in huge.tiers] == [25, 29]
    one = make_plan(models, GiB)
    assert one.tiers[0].full and one.tiers[1].n_gpu_layers == 0
    assert one.gpu_bytes <= GiB - 256 * MiB


@pytest.mark.real
def test_real_cli_table_and_json(qwen_draft_path: Path, qwen_target_path: Path) -> None:
    args = ["--draft", str(qwen_draft_path), "--target", str(qwen_target_path), "--vram", "1GiB"]
    args.append("--fit")
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    assert "draft" in res.output and "target" in res.output
    assert "25/25" in res.output and "0/29" in res.output
    assert "host RAM needed" in res.output
    res = invoke(*args, "--json", "--ctx-size", "2048")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["budget_bytes"] == GiB and data["n_ctx"] == 2048
    assert [t["tier"] for t in data["tiers"]] == ["draft", "target"]
    assert data["gpu_bytes"] <= data["usable_bytes"]
    assert data["tiers"][0]["n_gpu_layers"] == 25
    assert data["gpu_bytes"] == sum(t["gpu_bytes"] for t in data["tiers"])


@pytest.mark.real
def test_real_tier_plan_adds_up(qwen_target_path: Path) -> None:
    mm = model_memory(qwen_target_path)
    for k in range(mm.n_layer + 2):
        tp = tier_plan("target", mm, k, LoadConfig(n_ctx=4096))
        assert tp.gpu_weight_bytes + tp.cpu_weight_bytes == mm.weight_bytes
        assert tp.gpu_kv_bytes + tp.cpu_kv_bytes == mm.kv_bytes(4096)


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["missing", "not_gguf", "bad_vram", "unitless_vram", "directory"])
def test_cli_bad_input(case: str, tmp_path: Path, tiny_ladder: dict[str, Path]) -> None:
    good = str(tiny_ladder["target"])
    junk = tmp_path / "junk.gguf"
    junk.write_text("this is not a model\n")
    args = {
        "missing": ["--target", str(tmp_path / "nope.gguf"), "--vram", "1GiB"],
        "not_gguf": ["--target", str(junk), "--vram", "1GiB"],
        "bad_vram": ["--target", good, "--vram", "lots"],
        "unitless_vram": ["--target", good, "--vram", "8"],
        "directory": ["--target", str(tmp_path), "--vram", "1GiB"],
    }[case]
    res = invoke(*args)
    assert res.exit_code != 0
    assert "Traceback" not in res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    assert isinstance(res.exception, SystemExit)  # an Error: line, not a crash


def test_synth_f16_tied_model_plans_and_loads(tmp_path: Path) -> None:
    from pyramid_gguf.native import NativeModel

    spec = TinySpec(dtype="f16", tied_output=True)
    path = write_tiny_llama(tmp_path / "tied.gguf", spec=spec)
    mm = model_memory(path)
    assert mm.tied_output and mm.head_bytes == mm.embd_bytes + 4 * spec.n_embd
    assert mm.layer_bytes[0] == 4 * 2 * spec.n_embd + 2 * (
        2 * spec.n_embd * spec.n_embd + 2 * 32 * spec.n_embd + 3 * spec.n_ff * spec.n_embd
    )
    p = fit_ladder(GiB, LadderPaths(path), LoadConfig(n_ctx=256))
    with NativeModel(path, tier_load_config(p, "target", LoadConfig(n_ctx=256))) as m:
        assert m.n_layer == spec.n_layer
        assert m.eval(m.vocab.tokenize("the cat"), logits_at=[-1]).shape == (1, mm.n_vocab)
