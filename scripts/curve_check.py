"""``calibrate``'s batch curve beside llama.cpp's ``llama-bench`` on the same file and threads.

For each batch size ``n`` it prints llama-bench's prompt-processing time of ``n`` tokens
(``-p n -n 0``: one ``llama_decode`` from an empty context, logits of the last token only), our
calibration's time of the same ``n`` (``measure_curve``: after a 48-token prefix, every row's
logits read, as a verification reads them) and ours with the last row only (like with like),
each the median of ``--repeats``, the two tools run in turn ``--rounds`` times.

    python scripts/curve_check.py MODEL.gguf --bench PATH/llama-bench [--threads 2]
"""

from __future__ import annotations

# llama.cpp's libraries load before numpy's (docs/ARCHITECTURE.md, "Loading order").
from pyramid_gguf import native  # noqa: F401

# isort: split
import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.decoding.runtime.calibrate import PREFIX, measure_curve
from pyramid_gguf.native import NativeModel, build_id

SIZES = (1, 2, 4, 8, 16, 32, 64)


def bench(tool: Path, model: Path, threads: int, repeats: int) -> dict[int, float]:
    """llama-bench's seconds per prompt of ``n`` tokens, by ``n``."""
    sizes = ",".join(map(str, SIZES))
    cmd = [str(tool), "-m", str(model), "-t", str(threads), "-p", sizes, "-n", "0"]
    out = subprocess.run([*cmd, "-r", str(repeats), "-o", "json"], capture_output=True, text=True)
    rows = json.loads(out.stdout)
    return {int(r["n_prompt"]): r["n_prompt"] / r["avg_ts"] for r in rows if r["n_prompt"]}


def last_row(model: NativeModel, repeats: int) -> dict[int, float]:
    """Ours, only the last row's logits asked for."""
    prefix = list(range(1000, 1000 + PREFIX))
    batch = list(range(2000, 2000 + max(SIZES)))
    model.reset()
    model.eval(prefix)
    out = {}
    for n in SIZES:
        times = []
        for _ in range(repeats):
            model.rollback(PREFIX)
            t0 = time.perf_counter()
            model.eval(batch[:n], [n - 1])
            times.append(time.perf_counter() - t0)
        out[n] = statistics.median(times)
    model.reset()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--bench", type=Path, required=True, help="llama-bench of the same llama.cpp")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    load = LoadConfig(n_ctx=512, n_threads=args.threads, n_threads_batch=args.threads)
    peer: dict[int, list[float]] = {n: [] for n in SIZES}
    ours: dict[int, list[float]] = {n: [] for n in SIZES}
    last: dict[int, list[float]] = {n: [] for n in SIZES}
    with NativeModel(args.model, load) as m:
        for _ in range(args.rounds):
            for n, s in bench(args.bench, args.model, args.threads, args.repeats).items():
                peer[n].append(s)
            curve = measure_curve(m, repeats=args.repeats).curve
            for n in SIZES:
                ours[n].append(curve(n))
            for n, s in last_row(m, args.repeats).items():
                last[n].append(s)
    print(f"{args.model.name}, {args.threads} threads, {build_id()}")
    print(
        f"{'n':>4} {'llama-bench':>12} {'calibrate':>10} {'ratio':>6} {'last row':>9} {'ratio':>6}"
    )
    for n in SIZES:
        p, o, lr = (statistics.median(x[n]) * 1e3 for x in (peer, ours, last))
        print(f"{n:>4} {p:>10.1f}ms {o:>8.1f}ms {o / p:>6.2f} {lr:>7.1f}ms {lr / p:>6.2f}")


if __name__ == "__main__":
    main()
