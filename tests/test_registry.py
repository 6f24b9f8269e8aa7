"""models.toml parsing: shipped presets are valid; typos are rejected with the valid names."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyramid_gguf.core.errors import UserError
from pyramid_gguf.models.presets import DEFAULT_PRESET, describe, preset_names, resolve_preset
from pyramid_gguf.models.registry import (
    TIERS,
    get_preset,
    load_registry,
    parse_registry,
    registry_text,
)

GOOD = """
[presets.p]
mode = "sd"
l_d = 3
[presets.p.draft]
source = "derived"
from = "target"
keep_layers = "0-3"
file = "d.gguf"
[presets.p.target]
source = "hf"
repo = "a/b"
file = "t.gguf"
revision = "main"
"""


def test_every_shipped_preset_is_valid() -> None:
    presets = load_registry()
    assert DEFAULT_PRESET in presets
    assert {"llama3-1b-3b-8b", "qwen2.5-0.5b-1.5b-3b", "qwen2.5-1.5b-3b-7b"} <= set(presets)
    for preset in presets.values():
        assert "target" in preset.tiers
        assert preset.spec.info.n_tiers <= len(preset.tiers)
        for tier in preset.tiers.values():
            assert tier.file.endswith(".gguf")
            if tier.source == "pypi":
                assert tier.sha256 and tier.size and tier.packages
    assert preset_names() == sorted(presets)


def test_package_data_is_the_repository_file() -> None:
    repo_copy = Path(__file__).resolve().parent.parent / "models.toml"
    assert registry_text() == repo_copy.read_text()


def test_default_preset_is_a_three_tier_pypi_ladder() -> None:
    preset = get_preset(DEFAULT_PRESET)
    assert set(preset.tiers) == set(TIERS)
    assert preset.tiers["draft"].source == "derived"
    assert preset.tiers["draft"].derived_from == "qualifier"
    assert {preset.tiers[t].source for t in ("qualifier", "target")} == {"pypi"}
    assert preset.spec.mode == "auto"  # every preset: the cost model decides


def test_parse_minimal_document() -> None:
    preset = parse_registry(GOOD)["p"]
    assert preset.spec.mode == "sd" and preset.spec.l_d == 3
    assert preset.tiers["draft"].keep_layers == "0-3"


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("l_d = 3", "l_dd = 3", "unknown key 'l_dd'; valid: description, mode"),
        ("[presets.p.draft]", "[presets.p.drafter]", "unknown key 'drafter'; valid: description"),
        ('source = "hf"', 'source = "s3"', "unknown source 's3'; valid: hf, pypi, derived"),
        ('revision = "main"', 'revision = "main"\nb = 1', "unknown key 'b'; valid: source, repo"),
        ('mode = "sd"', 'mode = "psd-exact"', "needs 3 tiers"),
        ('keep_layers = "0-3"', 'quantize = "Q4_0"\nkeep_layers = "0-3"', "exactly one of"),
        ('revision = "main"', "", "missing key 'revision'"),
        ("l_d = 3", 'l_d = "3"', "expected"),
    ],
)
def test_strict_parsing(old: str, new: str, message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        parse_registry(GOOD.replace(old, new, 1))


def test_unknown_preset_lists_valid_names() -> None:
    with pytest.raises(UserError, match=f"unknown preset 'nope'; valid: .*{DEFAULT_PRESET}"):
        resolve_preset("nope")


def test_user_registry_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    extra = tmp_path / "mine.toml"
    extra.write_text(GOOD)
    monkeypatch.setenv("PYRAMID_GGUF_MODELS", str(extra))
    monkeypatch.setenv("PYRAMID_GGUF_HOME", str(tmp_path / "home"))
    assert "p" in preset_names() and DEFAULT_PRESET in preset_names()
    with pytest.raises(UserError, match="missing; run `pyramid-gguf pull p`"):
        resolve_preset("p", fetch=False)


def test_resolve_uses_local_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYRAMID_GGUF_HOME", str(tmp_path))
    preset = get_preset("smollm2-selfspec")
    for tier in preset.tiers.values():
        (tmp_path / "models").mkdir(exist_ok=True)
        (tmp_path / "models" / tier.file).write_bytes(b"GGUF")
    ladder = resolve_preset("smollm2-selfspec", fetch=False)
    assert ladder.paths.qualifier is None and ladder.paths.draft is not None
    assert ladder.paths.target.name == preset.tiers["target"].file and ladder.spec.mode == "auto"
    info = describe(preset)
    assert all(t["present"] for t in info["tiers"].values())
