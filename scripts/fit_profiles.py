"""Fit device profiles for consumer GPUs and desktop CPU classes to published llama.cpp figures,
write them, and print the fit report.

    python scripts/fit_profiles.py > docs/planner/consumer-fit.txt
    python scripts/fit_profiles.py --markdown        # the report's tables as Markdown

Reads ``pyramid_gguf/data/devices/published.json`` (the figures, each marked fit / held_out /
context) and ``specs.json`` (spec sheets); fits the physical model of
``pyramid_gguf/planning/hardware.py`` (GPU: to the CUDA figures marked ``fit``; CPU: compute per
core from this project's measured 2-core profile ``cpu.json``, bandwidth efficiency from the
published CPU figures marked ``fit``); writes ``gpus/<slug>.json`` and ``cpus/<slug>.json`` for
every device marked ``ship``; prints predicted against published for every figure it can price.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pyramid_gguf.planning.compose import MAX_N, DeviceProfile, Shape
from pyramid_gguf.planning.hardware import (
    DEVICES_DIR,
    CpuModel,
    Figure,
    GpuModel,
    ModelFacts,
    Spec,
    Work,
    cpu_compute,
    fit_cpu,
    fit_cpu_gemm,
    fit_figures,
    fit_gpu,
    load_published,
    load_specs,
    priced,
)

#: The default ladder's shapes as plan reads them (blocks + output head; tests/test_planning.py).
LADDER = {
    "llama-3.2-1b-q4_k_m": Shape(799_500_000, 16),
    "llama-3.2-3b-q4_k_m": Shape(2_012_000_000, 28),
    "llama-3.1-8b-q4_k_m": Shape(4_617_000_000, 32),
}
RATIO_N = (1, 2, 4, 8, 16)
#: Hosts whose figures stand for a shipped class with the same spec.
HOST_CLASS = {"ryzen-7-7840hs": "ddr5-8core"}
#: This project's measured H100 curves (Q4_K_M, llama-cpp-python): a check of the batch shape.
H100_CURVES = Path(__file__).resolve().parents[1] / "docs" / "gpu-h100" / "batch_cost.json"
H100 = Spec(
    "h100", "NVIDIA H100 80GB HBM3", "gpu", "datacenter", "hopper", 3.35e12, sms=132, boost_ghz=1.98
)


@dataclass(frozen=True)
class Row:
    """One figure, priced."""

    figure: Figure
    predicted_tps: float

    @property
    def error(self) -> float:
        return self.predicted_tps / self.figure.tokens_per_s - 1.0

    def to_dict(self, models: Mapping[str, ModelFacts]) -> dict[str, Any]:
        f = self.figure
        m = models[str(f.model)]
        return {
            "figure": f.id,
            "model": f"{m.name} {m.quant}",
            "test": f.test,
            "n": f.n,
            "backend": f.backend,
            "published_tok_s": f.tokens_per_s,
            "predicted_tok_s": round(self.predicted_tps, 2),
            "error": round(self.error, 4),
            "source": f.extra.get("url", ""),
        }


def price(
    figures: Iterable[Figure],
    specs: Mapping[str, Spec],
    models: Mapping[str, ModelFacts],
    gpu: GpuModel,
    cpu: CpuModel,
    gemm: Mapping[str, CpuModel] | None = None,
) -> list[Row]:
    """Every figure the models can price, predicted (a CPU's large batches by the
    ``gemm_rate`` of its ISA: ``gemm[spec.isa]``, else ``cpu``'s)."""
    rows = []
    for f in figures:
        for kind, model in (("gpu", gpu), ("cpu", cpu)):
            if priced(f, specs, kind):
                spec = specs[str(f.card)]
                if kind == "cpu" and gemm:
                    model = gemm.get(spec.isa, cpu)
                seconds = model.seconds(spec, f.work(models))
                rows.append(Row(f, f.n / seconds))
    return rows


def fit_gemm(
    figures: Sequence[Figure],
    specs: Mapping[str, Spec],
    models: Mapping[str, ModelFacts],
    cpu: CpuModel,
) -> dict[str, CpuModel]:
    """The CPU model per vector ISA, its large-batch rate fitted to that ISA's prompt figures
    marked ``fit`` (published pp512 of llama.cpp's CPU backend)."""
    prompt = [f for f in fit_figures(figures, specs, "cpu") if f.n > MAX_N]
    isas = sorted({specs[str(f.card)].isa for f in prompt})
    return {
        isa: fit_cpu_gemm([f for f in prompt if specs[str(f.card)].isa == isa], specs, models, cpu)
        for isa in isas
    }


def predicted(profile: DeviceProfile) -> dict[str, Any]:
    """Tok/s of the default ladder's tiers and the 8B's batch cost ratios (predicted)."""
    out: dict[str, Any] = {}
    for name, shape in LADDER.items():
        one = profile.cost(1, shape)
        out[name] = {
            "tok_s": round(1.0 / one, 1),
            "ms_per_token": round(one * 1e3, 3),
            "batch_ratio": {str(n): round(profile.cost(n, shape) / one, 3) for n in RATIO_N},
        }
    return out


def card_rows(rows: Sequence[Row], slug: str) -> list[Row]:
    return [r for r in rows if HOST_CLASS.get(str(r.figure.card), r.figure.card) == slug]


def basis_of(rows: Sequence[Row]) -> str:
    """``published`` when a CUDA (or CPU) figure of the device was fitted or held out, else
    ``spec-derived`` (a figure of another backend is only a check)."""
    own = [r for r in rows if r.figure.backend in ("CUDA", "CPU")]
    return "published" if any(r.figure.use in ("fit", "held_out") for r in own) else "spec-derived"


def write_profile(
    spec: Spec,
    profile: DeviceProfile,
    rows: Sequence[Row],
    models: Mapping[str, ModelFacts],
    fitted: dict[str, Any],
) -> Path:
    basis = basis_of(rows)
    figure_sources = sorted({str(r.figure.extra.get("url", "")) for r in rows} - {""})
    data = profile.to_dict()
    data.update(
        {
            "kind": spec.kind,
            "class": spec.cls,
            "arch": spec.arch,
            "full_name": spec.name,
            "vram_bytes": spec.vram_bytes,
            "bandwidth": spec.bandwidth,
            **(
                {"sms": spec.sms, "boost_mhz": round(spec.boost_ghz * 1000)}
                if spec.kind == "gpu"
                else {"cores": spec.cores, "memory": spec.memory, "isa": spec.isa}
            ),
            "basis": basis,
            "sources": [*spec.sources, *figure_sources],
            "fit_error": {
                use: [r.to_dict(models) for r in rows if r.figure.use == use]
                for use in ("fit", "held_out", "context")
            },
            "predicted": predicted(profile),
            "model": fitted,
        }
    )
    folder = DEVICES_DIR / ("gpus" if spec.kind == "gpu" else "cpus")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{spec.slug}.json"
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return path


def h100_check(gpu: GpuModel, markdown: bool) -> str:
    """Measured H100 batch ratios against the model's, its one unknown (Hopper's bandwidth
    efficiency) solved from the measured single token of the 8B: the batch shape is not fitted."""
    ms = json.loads(H100_CURVES.read_text(encoding="utf-8"))["ms_per_decode"]
    curves = {k: ms["synthetic-llama-" + k.split("-", 2)[2] + ".gguf"] for k in LADDER}
    target = curves["llama-3.1-8b-q4_k_m"][0] / 1e3
    lo, hi = 0.01, 1.0
    for _ in range(60):  # bisection: a larger efficiency, a faster token
        mid = (lo + hi) / 2
        m = replace(gpu, eta=dict(gpu.eta) | {"hopper": mid})
        t = m.seconds(H100, Work(LADDER["llama-3.1-8b-q4_k_m"].weight_bytes, 32))
        lo, hi = (mid, hi) if t > target else (lo, mid)
    m = replace(gpu, eta=dict(gpu.eta) | {"hopper": lo})
    body = []
    for name, shape in LADDER.items():
        one = m.seconds(H100, Work(shape.weight_bytes, shape.n_layer))
        row = [name, f"{curves[name][0]:.2f}", f"{one * 1e3:.2f}"]
        for n in RATIO_N[1:]:
            pred = m.seconds(H100, Work(shape.weight_bytes, shape.n_layer, n)) / one
            row.append(f"{curves[name][n - 1] / curves[name][0]:.2f} / {pred:.2f}")
        body.append(row)
    head = ["model", "measured ms", "predicted ms"]
    head += [f"n={n} measured / predicted" for n in RATIO_N[1:]]
    return (
        f"Batch shape against this project's measured H100 curves (docs/gpu-h100/batch_cost.json, "
        f"not fitted; Hopper's bandwidth efficiency {lo:.3f} solved from the 8B's single token)\n"
        + table(head, body, markdown)
    )


def stats(rows: Sequence[Row]) -> str:
    if not rows:
        return "none"
    errs = [abs(r.error) for r in rows]
    median, worst = statistics.median(errs), max(errs)
    return f"{len(rows)} figures, median |error| {median:.1%}, worst {worst:.1%}"


def table(header: Sequence[str], body: Iterable[Sequence[str]], markdown: bool) -> str:
    lines = [list(header), *[list(r) for r in body]]
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        return "\n".join(out + ["| " + " | ".join(r) + " |" for r in lines[1:]])
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    out = []
    for k, r in enumerate(lines):
        cells = zip(r, widths, strict=True)
        out.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(cells)))
        if k == 0:
            out.append("-" * len(out[0]))
    return "\n".join(out)


def report(
    rows: Sequence[Row],
    profiles: Mapping[str, tuple[Spec, DeviceProfile, str]],
    models: Mapping[str, ModelFacts],
    gpu: GpuModel,
    cpu: CpuModel,
    n_gpu_fit: int,
    markdown: bool,
) -> str:
    out = [
        "Consumer device profiles: fit report (scripts/fit_profiles.py; every tok/s in the "
        "'predicted' columns is predicted, every 'published' one is as its source states it)",
        "",
        f"GPU model, fitted to {n_gpu_fit} published CUDA figures: {json.dumps(gpu.to_dict())}",
        f"CPU model (compute per core and batch slope from this project's measured 2-core EPYC "
        f"profile; eta and fixed fitted to published CPU figures): {json.dumps(cpu.to_dict())}",
        "",
    ]
    for use in ("fit", "held_out", "context"):
        sel = [r for r in rows if r.figure.use == use]
        out.append(f"{use}: {stats(sel)}")
        body: list[Sequence[str]] = [
            (
                r.figure.card or "",
                f"{models[str(r.figure.model)].name} {models[str(r.figure.model)].quant}",
                r.figure.test,
                str(r.figure.n),
                r.figure.backend,
                f"{r.figure.tokens_per_s:.2f}",
                f"{r.predicted_tps:.2f}",
                f"{r.error:+.1%}",
            )
            for r in sel
        ]
        head: tuple[str, ...] = ("card", "model", "test", "n", "backend", "published tok/s")
        head = (*head, "predicted tok/s", "error")
        out += [table(head, body, markdown), ""]
    out.append(
        "Per device, predicted (Llama 3.2 1B / 3.2 3B / 3.1 8B Q4_K_M, all layers on it; "
        "ratio = cost of an 8B evaluation of n tokens over one token's)"
    )
    rows_out: list[Sequence[str]] = []
    for slug, (spec, profile, basis) in profiles.items():
        p = predicted(profile)
        tps = [p[k]["tok_s"] for k in LADDER]
        ms = [p[k]["ms_per_token"] for k in LADDER]
        ratios = p["llama-3.1-8b-q4_k_m"]["batch_ratio"]
        rows_out.append(
            (
                slug,
                basis,
                f"{spec.vram_bytes / 2**30:.0f}" if spec.kind == "gpu" else "-",
                f"{tps[2]:.1f}",
                f"{tps[1]:.1f}",
                f"{tps[0]:.1f}",
                f"{ms[1] / ms[2]:.2f}",
                f"{ms[0] / ms[2]:.2f}",
                *(f"{ratios[str(n)]:.2f}" for n in RATIO_N[1:]),
            )
        )
    columns: tuple[str, ...] = ("device", "basis", "GiB", "8B tok/s", "3B tok/s", "1B tok/s")
    columns = (*columns, "3B/8B", "1B/8B")
    columns = (*columns, *(f"n={n}" for n in RATIO_N[1:]))
    out += [table(columns, rows_out, markdown), ""]
    out.append("Batch cost ratios of the 1B and 3B, predicted (cost of n tokens over one token's)")
    ratio_rows: list[Sequence[str]] = []
    for slug, (_, profile, _) in profiles.items():
        p = predicted(profile)
        cells = [
            f"{p[k]['batch_ratio'][str(n)]:.2f}" for k in list(LADDER)[:2] for n in RATIO_N[1:]
        ]
        ratio_rows.append((slug, *cells))
    ratio_head = ["device", *(f"{k[:3]} n={n}" for k in ("1B", "3B") for n in RATIO_N[1:])]
    out += [table(ratio_head, ratio_rows, markdown), "", h100_check(gpu, markdown), ""]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    ap.add_argument("--no-write", action="store_true", help="fit and report only")
    args = ap.parse_args()
    specs = load_specs()
    models, figures = load_published()
    gpu_fit = fit_figures(figures, specs, "gpu")
    gpu = fit_gpu(gpu_fit, specs, models)
    core_rate, slope = cpu_compute(DeviceProfile.load(DEVICES_DIR / "cpu.json"), cores=2)
    steps = [f for f in fit_figures(figures, specs, "cpu") if f.n <= MAX_N]
    cpu = fit_cpu(steps, specs, models, core_rate, slope)
    gemm = fit_gemm(figures, specs, models, cpu)
    rows = price(figures, specs, models, gpu, cpu, gemm)
    profiles: dict[str, tuple[Spec, DeviceProfile, str]] = {}
    for spec in specs.values():
        if not spec.ship:
            continue
        model: GpuModel | CpuModel = gpu if spec.kind == "gpu" else gemm.get(spec.isa, cpu)
        mine = card_rows(rows, spec.slug)
        basis = basis_of(mine)
        source = (
            f"predicted: scripts/fit_profiles.py, the physical model of "
            f"pyramid_gguf/planning/hardware.py fitted to published llama.cpp figures "
            f"(pyramid_gguf/data/devices/published.json) and this device's spec sheet; "
            f"{basis} ({len(mine)} figures of this device or one with its spec)"
        )
        profile = model.profile(spec, source)
        profiles[spec.slug] = (spec, profile, basis)
        if not args.no_write:
            write_profile(spec, profile, mine, models, model.to_dict())
    print(report(rows, profiles, models, gpu, cpu, len(gpu_fit), args.markdown))
    print(
        "CPU large-batch (prompt) rate per ISA, fitted to published pp512: "
        + json.dumps({isa: m.to_dict().get("gemm_rate_gb") for isa, m in gemm.items()})
        + " GB x tokens / s per core"
    )


if __name__ == "__main__":
    main()
