"""Choosing the card: the shipped profiles, listing them, names a user types or llama.cpp
reports, the user's own measured profile first, and a consumer default (never the H100) that
says how to name one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from synth import TinySpec, write_tiny_llama

import pyramid_gguf.native
from pyramid_gguf.cli.main import main
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.planning import devices, sources
from pyramid_gguf.planning.compose import DeviceProfile, Shape

REQUIRED = (
    "rtx-2060-6gb", "rtx-3050-8gb", "rtx-3060-12gb", "rtx-3060-ti-8gb", "rtx-3070-8gb",
    "rtx-3080-10gb", "rtx-4060-8gb", "rtx-4060-ti-8gb", "rtx-4060-ti-16gb", "rtx-4070-12gb",
    "rtx-4090-24gb", "rtx-4050-laptop-6gb", "rtx-4060-laptop-8gb",
)  # fmt: skip


@pytest.fixture(autouse=True)
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No profile of the machine running the tests leaks in."""
    monkeypatch.setenv("PYRAMID_GGUF_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.output


# --- the catalogue ------------------------------------------------------------------------------


def test_every_shipped_profile_loads_under_its_slug() -> None:
    for kind in devices.KINDS:
        entries = devices.catalogue(kind)
        assert devices.DEFAULT[kind] in entries
        for slug, e in entries.items():
            assert DeviceProfile.load(e.path).name == slug == e.slug
            assert e.kind == kind and e.basis in ("published", "spec-derived", "measured")
            assert e.fit_error
    gpus = devices.catalogue("gpu")
    assert set(REQUIRED) <= set(gpus)
    for slug in REQUIRED:
        assert gpus[slug].vram_bytes >= 6 * 2**30 and gpus[slug].bandwidth > 1e11
    assert gpus["h100-80gb"].cls == "datacenter" and gpus["h100-80gb"].basis == "measured"
    assert gpus[devices.DEFAULT["gpu"]].cls == "consumer"


def test_fit_error_summarises_the_devices_own_figures() -> None:
    rows = {"fit": [{"error": 0.02}, {"error": -0.05}], "held_out": [{"error": 0.135}]}
    assert devices.fit_summary({"fit_error": rows}) == "fit 2.0%-5.0% (2), held out 13.5% (1)"
    assert "no published figure" in devices.fit_summary({"fit_error": {}})
    assert devices.fit_summary({"fit_note": "measured: x"}) == "measured: x"


@pytest.mark.parametrize("kind", devices.KINDS)
def test_list_prints_every_profile(kind: str) -> None:
    code, out = run("plan", f"--{kind}", "list")
    assert code == 0, out
    for e in devices.catalogue(kind).values():
        line = next(ln for ln in out.splitlines() if ln.startswith(e.slug + " "))
        assert e.full_name[:30] in line and e.basis in line
    code, out = run("plan", f"--{kind}", "list", "--json")
    rows = json.loads(out)
    assert [r["slug"] for r in rows] == list(devices.catalogue(kind))
    keys = {"name", "vram_bytes", "bandwidth_gbs", "basis", "fit_error"}
    assert all(keys <= set(r) for r in rows)


# --- names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("rtx-4060-8gb", "rtx-4060-8gb"),
        ("RTX 4060", "rtx-4060-8gb"),
        ("rtx 3060 ti", "rtx-3060-ti-8gb"),
        ("4060 Ti 16GB", "rtx-4060-ti-16gb"),
        ("h100", "h100-80gb"),
    ],
)
def test_a_name_resolves_to_one_profile(name: str, slug: str) -> None:
    assert devices.resolve("gpu", name).slug == slug


def test_an_ambiguous_or_unknown_name_is_one_line_listing_the_valid_ones() -> None:
    with pytest.raises(UserError, match="rtx-4060-ti-8gb, rtx-4060-ti-16gb"):
        devices.resolve("gpu", "rtx 4060 ti")
    with pytest.raises(UserError) as e:
        devices.resolve("gpu", "rtx-9090")
    assert "\n" not in str(e.value) and "rtx-3070-8gb" in str(e.value)
    code, out = run("plan", "--preset", "llama3-1b-3b-8b", "--gpu", "rtx-9090", "--vram", "8GiB")
    assert code == 1 and out.startswith("Error: ") and out.count("\n") == 1
    assert "rtx-4060-8gb" in out and "plan --gpu list" in out
    code, out = run("plan", "--preset", "llama3-1b-3b-8b", "--cpu", "ddr9", "--vram", "8GiB")
    assert code == 1 and out.startswith("Error: ") and "ddr4-8core" in out


@pytest.mark.parametrize(
    ("reported", "total_gib", "slug"),
    [
        ("NVIDIA GeForce RTX 4060", 7.6, "rtx-4060-8gb"),
        ("NVIDIA GeForce RTX 4060 Ti", 7.6, "rtx-4060-ti-8gb"),
        ("NVIDIA GeForce RTX 4060 Ti", 15.6, "rtx-4060-ti-16gb"),
        ("NVIDIA GeForce RTX 4060 Laptop GPU", 7.6, "rtx-4060-laptop-8gb"),
        ("NVIDIA GeForce RTX 4050 Laptop GPU", 5.7, "rtx-4050-laptop-6gb"),
        ("NVIDIA GeForce RTX 3060", 11.7, "rtx-3060-12gb"),
        ("NVIDIA GeForce RTX 2060", 5.8, "rtx-2060-6gb"),
        ("NVIDIA H100 80GB HBM3", 79.1, "h100-80gb"),
    ],
)
def test_a_reported_device_maps_to_its_profile(reported: str, total_gib: float, slug: str) -> None:
    entry = devices.match_device(reported, int(total_gib * 2**30))
    assert entry is not None and entry.slug == slug


@pytest.mark.parametrize("reported", ["NVIDIA GeForce RTX 4090 D", "Tesla T4", "AMD Radeon RX"])
def test_an_unknown_device_maps_to_nothing(reported: str) -> None:
    assert devices.match_device(reported, 16 * 2**30) is None


# --- which profile a plan uses -------------------------------------------------------------


def test_no_card_named_or_detected_is_a_consumer_default_that_says_so() -> None:
    chosen = sources.gpu_profile(None, detect=False)
    assert chosen.profile.name == devices.DEFAULT["gpu"] != "h100-80gb"
    assert chosen.how.startswith("default") and "--gpu NAME" in chosen.how
    assert "calibrate --device-profile" in chosen.how
    cpu = sources.cpu_profile(None)
    assert cpu.profile.name == devices.DEFAULT["cpu"] and "--cpu NAME" in cpu.how


def test_the_detected_card_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        pyramid_gguf.native, "gpu_device", lambda: ("NVIDIA GeForce RTX 3070", 8 * 2**30)
    )
    chosen = sources.gpu_profile(None)
    assert chosen.profile.name == "rtx-3070-8gb" and "detected" in chosen.how
    monkeypatch.setattr(pyramid_gguf.native, "gpu_device", lambda: ("Tesla T4", 15 * 2**30))
    unknown = sources.gpu_profile(None)
    assert unknown.profile.name == devices.DEFAULT["gpu"] and "Tesla T4" in unknown.how


def test_a_measured_profile_of_ones_own_is_preferred(
    own_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        pyramid_gguf.native, "gpu_device", lambda: ("NVIDIA GeForce RTX 3070", 8 * 2**30)
    )
    curves = [
        (Shape(10**9, 10), CostCurve(tuple(0.004 + 0.0001 * n for n in range(16)))),
        (Shape(4 * 10**9, 30), CostCurve(tuple(0.012 + 0.0003 * n for n in range(16)))),
    ]
    _, path, errors = sources.save_measured("gpu", "yours-gpu", "test", curves)
    assert path == own_home / "devices" / "gpu.json" and max(errors) < 1e-6
    mine = sources.gpu_profile(None)
    assert mine.profile.name == "yours-gpu" and mine.how.startswith("yours")
    assert sources.gpu_profile("rtx-4090-24gb").profile.name == "rtx-4090-24gb"  # named wins
    assert sources.gpu_profile(str(path)).how == "named"  # a file works as a name


def test_calibrate_measures_ones_own_profile_in_one_command(tmp_path: Path, own_home: Path) -> None:
    small = write_tiny_llama(tmp_path / "small.gguf", seed=3, spec=TinySpec(n_layer=1))
    big = write_tiny_llama(tmp_path / "big.gguf", seed=4, spec=TinySpec(n_layer=6))
    code, out = run(
        "calibrate", "--target", str(big), "--draft", str(small), "--device-profile",
        "-t", "1", "-c", "256",
    )  # fmt: skip
    assert code == 0, out
    saved = own_home / "devices" / "cpu.json"  # a CPU build: the CPU's profile
    assert saved.is_file() and f"wrote your CPU profile to {saved}" in out
    assert sources.cpu_profile(None).how.startswith("yours")
    code, out = run("calibrate", "--target", str(big), "--device-profile", "-t", "1", "-c", "256")
    assert code == 1 and "two or more model sizes" in out
