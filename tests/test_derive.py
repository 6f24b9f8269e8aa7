"""Deriving tiers: layer skipping (byte-for-byte tensor copy) and requantizing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from synth import TinySpec, write_tiny_llama

from pyramid_gguf.cli.models import derive as derive_cmd
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.models.derive import (
    KEY_DERIVED_FROM,
    KEY_KEEP_LAYERS,
    KEY_QUANTIZE,
    format_layers,
    keep_layers,
    parse_layer_list,
    requantize,
    skip_every,
)
from pyramid_gguf.native import NativeModel

CFG = LoadConfig(n_ctx=256, n_batch=128, n_threads=2, n_threads_batch=2)


def logits(path: Path, text: str = "the model of the tree") -> tuple[np.ndarray, NativeModel]:
    """Last-position logits, feeding one token per decode."""
    m = NativeModel(path, CFG)
    rows = [m.eval([t], [-1])[0] for t in m.vocab.tokenize(text)]
    return rows[-1], m


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf", spec=TinySpec(n_layer=4))


def test_layer_lists() -> None:
    assert parse_layer_list("0-2, 5,7-8") == [0, 1, 2, 5, 7, 8]
    assert format_layers([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert skip_every(4, 12) == [0, 1, 2, 4, 5, 6, 8, 9, 10, 11]
    for bad in ("a", "3-1", "1,,2"):
        with pytest.raises(UserError):
            parse_layer_list(bad)
    with pytest.raises(UserError, match="layer out of range: the model has 4 layers"):
        parse_layer_list("0-4", 4)


def test_keep_layers_tiny(tiny: Path, tmp_path: Path) -> None:
    out = keep_layers(tiny, tmp_path / "d.gguf", layer_spec="0,1,3")
    full, src = logits(tiny)
    cut, dst = logits(out)
    assert dst.n_layer == 3 and dst.n_vocab == src.n_vocab
    vocab = [src.vocab.token_text(i) for i in range(src.n_vocab)]
    assert [dst.vocab.token_text(i) for i in range(dst.n_vocab)] == vocab
    assert dst.metadata()[KEY_KEEP_LAYERS] == "0-1,3"
    assert dst.metadata()[KEY_DERIVED_FROM].startswith("tiny.gguf sha256:")
    assert not np.allclose(full, cut)
    same, _ = logits(keep_layers(tiny, tmp_path / "all.gguf", layer_spec="0-3"))
    np.testing.assert_array_equal(full, same)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_requantize_tiny(tiny: Path, tmp_path: Path) -> None:
    out = requantize(tiny, tmp_path / "q.gguf", "q8_0", threads=2)
    assert out.stat().st_size < tiny.stat().st_size
    q, m = logits(out)
    assert m.metadata()[KEY_QUANTIZE] == "Q8_0"
    assert np.isfinite(q).all()


def test_derive_cli(tiny: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(derive_cmd, [str(tiny), "-o", str(tmp_path / "e.gguf"), "--skip-every", "2"])
    assert r.exit_code == 0, r.output
    assert NativeModel(tmp_path / "e.gguf", CFG).n_layer == 3  # layers 0, 2, 3
    r = runner.invoke(derive_cmd, [str(tiny), "-o", str(tmp_path / "x.gguf"), "--quantize", "Q9"])
    assert r.exit_code == 1 and "Error: unknown quantization type" in r.output
    assert "valid:" in r.output and "Traceback" not in r.output
    r = runner.invoke(derive_cmd, [str(tiny), "-o", str(tmp_path / "x.gguf")])
    assert r.exit_code == 1 and "give exactly one of" in r.output
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.real
def test_keep_layers_smollm2(smollm2_path: Path, tmp_path: Path) -> None:
    smollm2 = smollm2_path
    full, src = logits(smollm2)
    cut, dst = logits(keep_layers(smollm2, tmp_path / "s20.gguf", layer_spec="0-19"))
    assert dst.n_layer == 20 and dst.n_vocab == src.n_vocab == 49152
    assert not np.allclose(full, cut)
    same, _ = logits(keep_layers(smollm2, tmp_path / "s30.gguf", layer_spec="0-29"))
    np.testing.assert_array_equal(full, same)
