"""The GPU kit (scripts/gpu/kit.sh, kit.py; issue 48 part 5): its prediction from measured
curves, its errors, and the CPU rehearsal of the whole pipeline writing the same kit.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "scripts" / "gpu"
sys.path.insert(0, str(KIT))

import kit  # noqa: E402

from pyramid_gguf.core.errors import UserError  # noqa: E402
from pyramid_gguf.core.spec import SpecConfig  # noqa: E402
from pyramid_gguf.planning.peer import PeerWalks  # noqa: E402


def _ms(one: float, shape: Any) -> dict[str, float]:
    return {str(k): round(one * shape(k), 3) for k in kit.SIZES}


def _doc(target_shape: Any) -> dict[str, Any]:
    """A kit.json as a GPU run would leave it: the small tiers whole on the card (nearly flat),
    the split target at two -ngl values, mapped and pinned."""
    plans = {"alone": {"target": 37}, "two": {"qualifier": 29, "target": 21},
             "pyramid": {"draft": 25, "qualifier": 29, "target": 18}}  # fmt: skip
    curves = [
        {"tier": "draft", "ngl": -1, "weights": "mapped", "ms": _ms(3.0, lambda k: 1 + k / 64)},
        {"tier": "qualifier", "ngl": -1, "weights": "mapped",
         "ms": _ms(12.0, lambda k: 1 + k / 32)},
    ]  # fmt: skip
    for ngl, one in ((21, 300.0), (18, 320.0)):
        for weights, slow in (("mapped", 1.3), ("pinned", 1.0)):
            curves.append({"tier": "target", "ngl": ngl, "weights": weights,
                           "ms": _ms(one, lambda k, s=slow: target_shape(k, s))})  # fmt: skip
    return {"plans": plans, "curves": curves,
            "bench": {"tg": [{"n_gpu_layers": 37, "avg_ts": 4.0}]}}  # fmt: skip


def _flat_past_offload(k: int, slow: float) -> float:
    """CPU-bound and steep to 31 tokens, then op offload: one copy of the weights."""
    return 1 + 0.4 * (k - 1) if k < 32 else 1.6 * slow


def _steep(k: int, slow: float) -> float:
    return 1 + 0.9 * (k - 1)


@pytest.fixture(scope="module")
def code_traces() -> Any:
    return kit.stand_in(("code",))


def test_the_prediction_reads_the_measured_curves(code_traces: Any) -> None:
    doc = _doc(_flat_past_offload)
    out = kit.predict(doc, code_traces, SpecConfig(mode="auto"))
    figs, ratios = out["figures"], out["ratios"]
    assert set(out["placements"]) == {"two, mapped", "two, pinned", "pyramid, mapped",
                                      "pyramid, pinned"}  # fmt: skip
    # pinned weights copy faster for op offload (a curve nowhere dearer than mapped): the
    # peer, searched over every knob, is never slower there
    for name in ("two", "pyramid"):
        pinned, mapped = (out["placements"][f"{name}, {w}"]["peer"]["tps"]
                          for w in ("pinned", "mapped"))  # fmt: skip
        assert pinned >= mapped
    assert figs["auto"]["tps"] == max(v["tps"] for v in out["placements"].values())
    assert figs["ngl_tps"] == 4.0 and "llama-bench" in figs["ngl_how"]
    assert ratios["auto_vs_ngl"] == pytest.approx(figs["auto"]["tps"] / 4.0, rel=1e-3)
    assert ratios["pyramid_vs_two"] == pytest.approx(
        figs["pyramid"]["tps"] / figs["two_model"]["tps"], rel=1e-3
    )
    assert out["goals_met"]["auto_vs_ngl"] == (ratios["auto_vs_ngl"] >= 3.0)
    # the peer is llama.cpp -md at its best knobs on the same curves
    best = out["placements"][figs["md"]["at"]]["peer"]
    assert figs["md"]["tps"] == best["tps"] and 1 <= best["draft_max"] <= 64


def test_the_peer_drafts_longer_where_op_offload_flattens_the_curve(code_traces: Any) -> None:
    flat = kit.predict(_doc(_flat_past_offload), code_traces, SpecConfig(mode="auto"))
    steep = kit.predict(_doc(_steep), code_traces, SpecConfig(mode="auto"))
    at = "two, pinned"
    assert flat["placements"][at]["peer"]["draft_max"] > steep["placements"][at]["peer"][
        "draft_max"]  # fmt: skip
    assert flat["placements"][at]["peer"]["draft_max"] >= 31
    # and the walks agree with the module's own search on those curves
    costs = {"qualifier": kit.to_curve(_doc(_steep)["curves"][1]["ms"]),
             "target": kit.to_curve(_doc(_steep)["curves"][3]["ms"])}  # fmt: skip
    direct = PeerWalks(code_traces).best(costs)
    assert direct is not None
    assert direct.tps == pytest.approx(steep["placements"][at]["peer"]["tps"], rel=1e-2)


def test_a_kit_json_without_curves_is_refused(code_traces: Any) -> None:
    doc = _doc(_steep)
    doc["curves"] = [c for c in doc["curves"] if c["tier"] != "target"]
    with pytest.raises(UserError):
        kit.predict(doc, code_traces, SpecConfig(mode="auto"))


def test_predict_from_a_bad_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "kit.json"
    bad.write_text("{}", encoding="utf-8")
    res = subprocess.run([sys.executable, str(KIT / "kit.py"), "predict", "--from", str(bad)],
                         capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert res.returncode == 2 and res.stderr.strip().startswith("error: ")
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_the_cpu_rehearsal_writes_the_kit_json(tmp_path: Path) -> None:
    """kit.sh --cpu: the tiny ladder, the same stages as on a GPU, one kit.json back."""
    env = os.environ | {"KIT_WORK": str(tmp_path / "w"), "OUT": str(tmp_path / "out"),
                        "KIT_SETS": "code", "KIT_BUDGET": "240", "PY": sys.executable}  # fmt: skip
    res = subprocess.run(["bash", str(KIT / "kit.sh"), "--cpu"], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "kit.json").read_text(encoding="utf-8"))
    assert doc["meta"]["cpu_rehearsal"] is True
    assert set(doc["plans"]) >= {"alone", "two", "pyramid"}
    measured = {(r["tier"], r["weights"]) for r in doc["curves"] if "ms" in r}
    assert {("draft", "mapped"), ("qualifier", "mapped"), ("target", "mapped"),
            ("target", "pinned")} <= measured  # fmt: skip
    for r in doc["curves"]:
        assert list(r["ms"]) == [str(k) for k in kit.CPU_SIZES]
        assert all(v > 0 for v in r["ms"].values())
    assert "bench" in doc and "predict" in doc
    assert set(doc["predict"]["ratios"]) == set(kit.GOALS)
    assert (tmp_path / "out" / "log.txt").is_file()
