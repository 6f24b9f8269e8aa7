"""What the throughput model predicts on a GPU: measured batch costs, measured acceptance.

Synthetic models give real GPU timings but meaningless acceptance, real models on a CPU give
real acceptance but CPU timings. This combines the two through ``auto``'s own arithmetic
(:mod:`pyramid_gguf.decoding.pricing.policy`)::

    pyramid-gguf bench --modes sd,psd-exact,psd-a,psd-f --csv acceptance.csv   # any machine
    python scripts/gpu/predict.py docs/gpu-h100/batch_cost.json acceptance.csv \\
        --draft synthetic-llama-1b-q4_k_m.gguf --qualifier synthetic-llama-3b-q4_k_m.gguf \\
        --target synthetic-llama-8b-q4_k_m.gguf

Per mode it prints the predicted tok/s and speedup over ``target`` at the bench's ``l_d`` and
``l_q`` and at the best block sizes, and what ``auto`` would choose, next to PyramidSD's figures
(PSD_F 1.91x over SD, 124 tok/s on an RTX 4090 with Llama 3.2 1B / 3.2 3B / 3.1 8B).
"""

from __future__ import annotations

import argparse
import csv
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pyramid_gguf.core.ladder import LadderShape
from pyramid_gguf.core.spec import SpecConfig
from pyramid_gguf.decoding.pricing.chains import MAX_L_D, Chain, ladder_chains, price_plain
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.decoding.pricing.policy import choose, expected_tokens

#: auto's chains over a draft / qualifier / target ladder, by name.
CHAINS: dict[str, Chain] = {
    c.name: c for c in ladder_chains(LadderShape(("draft", "qualifier", "target")), SpecConfig())
}

FIXED_MODES = ("sd", "fsd", "psd-exact", "psd-a", "psd-f")
#: Stage names in bench output, per role.
DRAFT_TARGET = "draft->target"
DRAFT_QUALIFIER = "draft->qualifier"
QUALIFIER_TARGET = "qualifier->target"


def keep_rate(rate: float, k: int) -> float:
    """Per-position keep probability ``a`` of a stage whose verifications of ``k`` proposals
    kept a share ``rate`` of them: under the geometric model ``rate = a (1 - a^k) / ((1 - a) k)``,
    solved by bisection (the share grows with ``a``)."""

    def share(a: float) -> float:
        return sum(a**j for j in range(1, k + 1)) / k

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if share(mid) < rate else (lo, mid)
    return lo


def rates(csv_path: Path, defaults: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{mode: {stage: keep probability}}`` from a ``bench --csv`` file: each stage's
    acceptance rate over blocks of ``l_d`` (into the qualifier, or the target in ``sd``) or
    ``l_q`` (into the target in a pyramid) proposals, the knobs of the row or ``defaults``."""
    out: dict[str, dict[str, float]] = {}
    with csv_path.open() as f:
        for row in csv.DictReader(f):
            if row["mode"] not in FIXED_MODES:
                continue
            knobs = {**defaults, **json.loads(row["knobs"])}
            keep = {}
            for part in row["stages"].split(";"):
                name, values = part.split("=")
                k = knobs["l_q"] if name == QUALIFIER_TARGET else knobs["l_d"]
                keep[name] = keep_rate(float(values.split("/")[0]), int(k))
            out[row["label"]] = keep
    return out


def fixed(
    mode: str, keep: dict[str, float], c: dict[str, CostCurve], l_d: int, l_q: int
) -> tuple[float, float]:
    """(tokens, seconds) of one round of a fixed mode at ``l_d`` / ``l_q``."""
    t, q, d = c["target"], c["qualifier"], c["draft"]
    if mode in ("sd", "fsd"):
        a = keep[DRAFT_TARGET]
        return expected_tokens(a, a, l_d), l_d * d(1) + t(l_d + 1)
    a_dq, a_qt = keep[DRAFT_QUALIFIER], keep[QUALIFIER_TARGET]
    per_token = (l_d * d(1) + q(l_d + 1)) / expected_tokens(a_dq, a_dq, l_d)
    return expected_tokens(a_qt, a_qt, l_q), l_q * per_token + t(l_q + 1)


def best_fixed(
    mode: str, keep: dict[str, float], c: dict[str, CostCurve]
) -> tuple[float, int, int]:
    """(tok/s, l_d, l_q) of a fixed mode at its best block sizes: ``auto``'s own search
    (:meth:`Chain.price`), no catch-up or round overhead."""
    if mode in ("sd", "fsd"):
        a = keep[DRAFT_TARGET]
        o = CHAINS["draft"].price(c, [(a, a)], MAX_L_D, overhead=0.0).best
        return (o.rate, o.k, 0) if o else (0.0, 0, 0)
    dq, qt = keep[DRAFT_QUALIFIER], keep[QUALIFIER_TARGET]
    o = CHAINS["pyramid"].price(c, [(dq, dq), (qt, qt)], 16, overhead=0.0).best
    return (o.rate, o.l_d, o.k) if o else (0.0, 0, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("costs", type=Path, help="scripts/batch_cost.py --json output")
    ap.add_argument("acceptance", type=Path, help="pyramid-gguf bench --csv output")
    ap.add_argument("--draft", required=True)
    ap.add_argument("--qualifier", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--l-d", type=int, default=4)
    ap.add_argument("--l-q", type=int, default=8)
    ap.add_argument("--measured-l-d", type=int, help="l_d the bench ran (a preset's, say)")
    ap.add_argument("--measured-l-q", type=int, help="l_q the bench ran")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="MODE:STAGE=P",
        help="set a keep probability (what-if: another draft), e.g. sd:draft->target=0.83",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ms = json.loads(args.costs.read_text())["ms_per_decode"]
    c = {
        tier: CostCurve(tuple(v / 1000 for v in ms[name]))
        for tier, name in (
            ("draft", args.draft),
            ("qualifier", args.qualifier),
            ("target", args.target),
        )
    }
    measured = asdict(SpecConfig()) | {
        k: v for k, v in (("l_d", args.measured_l_d), ("l_q", args.measured_l_q)) if v
    }
    keep = rates(args.acceptance, measured)
    for item in args.set:  # MODE:STAGE=P, e.g. sd:draft->target=0.83
        where, value = item.rsplit("=", 1)
        mode, stage = where.split(":", 1)
        keep.setdefault(mode, {})[stage] = float(value)
    base = 1.0 / c["target"](1)
    rows: list[dict[str, Any]] = []
    for mode, k in keep.items():
        tokens, seconds = fixed(mode, k, c, args.l_d, args.l_q)
        best, l_d, l_q = best_fixed(mode, k, c)
        rows.append({
            "mode": mode, "keep": {s: round(v, 3) for s, v in k.items()},
            "tps": round(tokens / seconds, 1), "speedup": round(tokens / seconds / base, 2),
            "best_tps": round(best, 1), "best_speedup": round(best / base, 2),
            "best_l_d": l_d, "best_l_q": l_q,
        })  # fmt: skip
    exact = keep.get("psd-exact", {})
    sd_keep = keep.get("sd", {}).get(DRAFT_TARGET, 0.0)
    dq, qt = exact.get(DRAFT_QUALIFIER, 0.0), exact.get(QUALIFIER_TARGET, 0.0)
    auto = choose(
        price_plain(c["target"], 0.0),
        [
            CHAINS["draft"].price(c, [(sd_keep, sd_keep)], 16, overhead=0.0).best,
            CHAINS["pyramid"].price(c, [(dq, dq), (qt, qt)], 16, overhead=0.0).best,
        ],
    )
    result: dict[str, Any] = {
        "target_tps": round(base, 1),
        "modes": rows,
        "auto": {"chain": auto.chain, "k": auto.k, "l_d": auto.l_d,
                 "speedup": round(auto.rate / base, 2)},
    }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"target {base:.1f} tok/s (predicted from the batch cost curve)")
    print(f"{'mode':<10} {'keep per position':<44} {'l_d/l_q':>7} {'tok/s':>7} {'speedup':>8} "
          f"{'best l_d/l_q':>12} {'tok/s':>7} {'speedup':>8}")  # fmt: skip
    for r in rows:
        keeps = " ".join(f"{s} {v:.2f}" for s, v in r["keep"].items())
        print(f"{r['mode']:<10} {keeps:<44} {args.l_d}/{args.l_q:<5} {r['tps']:>7.1f} "
              f"{r['speedup']:>7.2f}x {r['best_l_d']:>6}/{r['best_l_q']:<5} {r['best_tps']:>7.1f} "
              f"{r['best_speedup']:>7.2f}x")  # fmt: skip
    a = result["auto"]
    auto_l_d = f" l_d={a['l_d']}" if a["l_d"] else ""
    print(f"auto (lossless chains) would choose: {a['chain']} k={a['k']}{auto_l_d}, "
          f"{a['speedup']:.2f}x target")  # fmt: skip
    by = {r["mode"]: r for r in rows}
    if "sd" in by and "psd-f" in by:
        print(f"psd-f over sd: {by['psd-f']['tps'] / by['sd']['tps']:.2f}x at l_d/l_q "
              f"{args.l_d}/{args.l_q} (PyramidSD: 1.91x, RTX 4090)")  # fmt: skip


if __name__ == "__main__":
    main()
