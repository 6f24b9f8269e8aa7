"""Plan before download: tier shapes shipped in models.toml, headers read from the hub by range
requests (a few MB, against the local hub server), and ``plan --preset`` for every shipped card
with no model file and no network."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hub_server import HubServer, hf_tier_toml, hub_env
from planning_support import plan_json
from synth import TinySpec, write_tiny_llama

from pyramid_gguf.cli.main import main
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.core.gguf_header import TruncatedHeader, parse_header, read_header
from pyramid_gguf.models.registry import get_preset, load_registry, parse_registry
from pyramid_gguf.planning.devices import catalogue
from pyramid_gguf.planning.hardware import load_published
from pyramid_gguf.planning.memory import (
    keep_blocks,
    model_memory,
    shape_memory,
    shape_of,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from preset_shapes import CONFIGS, recipe_shape

LLAMA = "llama3-1b-3b-8b"


pytestmark = pytest.mark.usefixtures("offline")


# --- shapes --------------------------------------------------------------------------------------


def test_every_hub_preset_ships_a_shape_per_tier() -> None:
    for preset in load_registry().values():
        for tier in preset.tiers.values():
            if tier.source == "hf":
                assert tier.shape is not None, (preset.name, tier.name)
                assert tier.shape.source and len(tier.shape.layer_bytes) == tier.shape.n_layer


def test_a_shape_gives_the_memory_facts_its_header_gives(tiny_target: Path) -> None:
    real = model_memory(tiny_target)
    shape = shape_of(read_header(tiny_target), "test")
    assert shape_memory(shape, real.path) == real
    kept = keep_blocks(real, [0], "cut")
    assert kept.n_layer == 1 and kept.layer_bytes == real.layer_bytes[:1]
    assert kept.tensor_bytes == real.tensor_bytes - sum(real.layer_bytes[1:])


def test_the_quantization_recipe_prices_hub_files_as_published() -> None:
    """Published sizes include the header (tokenizer, a few MB) the recipe does not count."""
    for name, c in CONFIGS.items():
        if c.published_size:
            _, total = recipe_shape(name)
            assert 0.97 < total / c.published_size < 1.0 + 1e-9, name


@pytest.mark.real
def test_shipped_shapes_are_the_real_headers(qwen_target_path: Path, qwen_draft_path: Path) -> None:
    """The default ladder's shapes, and its derived draft's, equal what its files say; the
    recipe reproduces the 1.5B block by block."""
    preset = get_preset("qwen2.5-coder-demo")
    for tier, path in (("target", qwen_target_path), ("qualifier", qwen_draft_path)):
        shape = preset.tiers[tier].shape
        assert shape is not None
        assert shape_memory(shape, "x") == replace(model_memory(path), path="x")
    recipe, _ = recipe_shape("qwen2.5-coder-1.5b")
    assert recipe.layer_bytes == shape_of(read_header(qwen_target_path), "x").layer_bytes


def test_a_bad_shape_is_one_line() -> None:
    toml = hf_tier_toml("p", "a/b", "c.gguf") + '[presets."p".target.shape]\narch = "llama"\n'
    with pytest.raises(UserError, match=r"shape: missing key 'source'"):
        parse_registry(toml)


# --- plan --preset, offline ---------------------------------------------------------------------


@pytest.mark.parametrize("card", list(catalogue("gpu")))
def test_offline_plan_for_every_shipped_card(card: str) -> None:
    vram = f"{catalogue('gpu')[card].vram_bytes >> 30}GiB"
    doc = plan_json("--preset", LLAMA, "--gpu", card, "--vram", vram, "--prompts", "code")
    names = [p["placement"] for p in doc["placements"]]
    assert doc["best"] == names[0] and "target only" in names
    speeds = [p["auto_tps"] for p in doc["placements"]]
    assert speeds == sorted(speeds, reverse=True)
    assert all(p["plain_tps"] > 0 for p in doc["placements"])
    assert doc["profiles"]["gpu"] == card
    assert any("shape shipped in models.toml" in s for s in doc["sources"])
    assert any("standing in for llama3-1b-3b-8b" in s for s in doc["sources"])


def test_predicted_8b_steps_fall_within_published_figures() -> None:
    """Where a card has a published Llama 3.1 8B Q4_K_M token step, the offline plan's
    target-only step is within 15% of it (the fit report's held-out errors)."""
    _, figures = load_published()
    checked = 0
    for f in figures:
        if f.model != "llama3.1-8b-q4_k_m" or f.n != 1 or f.card not in catalogue("gpu"):
            continue
        if f.use == "context" or f.backend != "CUDA":
            continue
        doc = plan_json("--preset", LLAMA, "--gpu", str(f.card), "--vram", "24GiB",
                        "--prompts", "code")  # fmt: skip
        only = next(p for p in doc["placements"] if p["placement"] == "target only")
        predicted = 1000 / only["tiers"]["target"]["ms_per_token"]
        assert predicted == pytest.approx(f.tokens_per_s, rel=0.15), f.id
        checked += 1
    assert checked >= 3


def test_no_card_named_says_which_profile_it_used() -> None:
    res = CliRunner().invoke(
        main, ["plan", "--preset", LLAMA, "--vram", "8GiB", "--prompts", "code"]
    )
    assert res.exit_code == 0, res.output
    gpu_line = next(ln for ln in res.output.splitlines() if ln.startswith("GPU costs"))
    assert "rtx-3060-12gb" in gpu_line and "default" in gpu_line and "--gpu NAME" in gpu_line


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--gpu", "gtx-9999"], "unknown GPU"),
        (["--vram", "8"], "needs a unit"),
        (["--vram", "lots"], "bad size"),
        (["--ram", "16"], "needs a unit"),
        (["--ram", "1GiB"], "GiB more RAM"),
        (["--preset", "nope"], "unknown preset"),
    ],
)
def test_bad_input_is_one_error_line(args: list[str], says: str) -> None:
    base = {"--preset": LLAMA, "--gpu": "rtx-4060-8gb", "--vram": "8GiB"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    res = CliRunner().invoke(main, ["plan", *(x for kv in base.items() for x in kv)])
    assert res.exit_code == 1 and res.output.startswith("Error: ") and says in res.output
    assert res.output.count("\n") == 1


def test_a_preset_without_shapes_offline_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = tmp_path / "models.toml"
    toml.write_text(hf_tier_toml("noshape", "someone/model-GGUF", "m.gguf"))
    monkeypatch.setenv("PYRAMID_GGUF_MODELS", str(toml))
    res = CliRunner().invoke(
        main, ["plan", "--preset", "noshape", "--gpu", "rtx-4060-8gb", "--vram", "8GiB"]
    )
    assert res.exit_code == 1 and res.output.startswith("Error: ")
    assert "HF_HUB_OFFLINE" in res.output and "pull noshape" in res.output
    assert res.output.count("\n") == 1


# --- headers by range requests ---------------------------------------------------------------


def test_a_header_parses_from_its_first_bytes_only(tiny_target: Path) -> None:
    data = tiny_target.read_bytes()
    whole = read_header(tiny_target)
    head = parse_header(data[: whole.data_offset], Path("x"), len(data))
    assert head.tensors == whole.tensors and head.metadata == whole.metadata
    with pytest.raises(TruncatedHeader):
        parse_header(data[: whole.data_offset // 2], Path("x"), len(data))


_READ = """
import json, sys
from pyramid_gguf.models import remote
from pyramid_gguf.models.registry import get_preset
from pyramid_gguf.planning.memory import model_memory
remote.FIRST_BYTES = 4096  # grow in steps, as a long vocabulary's header makes it
got = remote.hub_header(get_preset("hubbed").tiers["target"])
mm = model_memory(got.header)
print(json.dumps({"read": got.bytes_read, "layers": mm.layer_bytes, "head": mm.head_bytes,
                  "kv": mm.n_embd_k, "vocab": mm.n_vocab}))
"""


@pytest.fixture
def hub(tmp_path: Path) -> Any:
    """The local hub serving a tiny model padded to 40 MB (weights nobody should fetch)."""
    model = write_tiny_llama(tmp_path / "m.gguf", seed=5, spec=TinySpec(n_extra_tokens=3000))
    with HubServer() as server:
        server.state.files[("tester/big-GGUF", "big.gguf")] = model.read_bytes() + bytes(40 << 20)
        toml = tmp_path / "models.toml"
        toml.write_text(hf_tier_toml("hubbed", "tester/big-GGUF", "big.gguf"))
        env = hub_env(server.url, tmp_path, toml)
        yield server, env, model


def test_a_hub_header_is_read_with_a_few_ranged_requests(hub: Any) -> None:
    server, env, model = hub
    out = subprocess.run(
        [sys.executable, "-c", _READ], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    local = model_memory(model)
    assert tuple(got["layers"]) == local.layer_bytes and got["head"] == local.head_bytes
    assert tuple(got["kv"]) == local.n_embd_k and got["vocab"] == local.n_vocab
    size = len(server.state.files[("tester/big-GGUF", "big.gguf")])
    assert server.state.sent == got["read"] < 2 * read_header(model).data_offset + 8192
    assert server.state.sent < size / 100  # a few hundred KB of a 40 MB file
    gets = [r for r in server.state.requests if r.startswith("GET")]
    assert len(gets) >= 2 and all("bytes=" in r for r in gets)


def test_plan_reads_a_preset_without_shapes_from_the_hub(hub: Any) -> None:
    server, env, _ = hub
    out = subprocess.run(
        [sys.executable, "-m", "pyramid_gguf", "plan", "--preset", "hubbed", "--gpu",
         "rtx-4060-8gb", "--vram", "1GiB", "--prompts", "code", "--json"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["best"] == "target only"
    assert any("read from the hub" in s for s in doc["sources"])
    assert server.state.sent < 5 << 20
