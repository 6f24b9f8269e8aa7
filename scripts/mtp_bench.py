"""One MTP round beside llama.cpp's ``draft-mtp``, and plain decoding beside llama-bench, on one
hybrid model with a NextN head (``scripts/hybrid_model.py`` writes one).

In one run, interleaved per repeat:

- **ours, fixed accepted lengths**: one round as ``sd`` with ``--draft mtp`` runs it (the head
  drafts ``k`` tokens greedily, the target verifies ``k + 1`` in one batch, both roll back to
  what is kept), with the number kept forced to ``a = 0..k``: seconds per round at each ``a``
  (rollback through llama.cpp's per-sequence snapshots, ``n_rs_seq = k`` as the loader sets
  it for ``sd``; ``--n-rs-seq 0`` times the saved-state path instead);
- **ours, end to end**: ``Pyramid.generate`` in ``target`` (loaded alone for it, as
  ``run --mode target`` is: no head, no snapshots) and in ``sd`` with ``--draft mtp``
  (``l_d = k``), greedy, ``-n`` tokens: tok/s, rounds, tokens kept per round;
- **llama.cpp**: ``llama-speculative-simple --spec-type draft-mtp --spec-draft-n-max k`` on the
  same prompt, greedy, same threads: tok/s, drafted and kept tokens, hence rounds and its
  seconds per round at its mean kept length (compared with ours interpolated there);
- ``llama-bench`` tg ``-n`` against our plain decoding.

    python scripts/mtp_bench.py MODEL.gguf [--peer-home ~/.cache/llama-peer] [-k 3] [-n 64]
        [--threads 2] [--repeats 2] [--n-rs-seq 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import PEER_HOME, peer_bin

from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.decoding.runtime.tiers import ModelTier

PROMPT = "the model of the tree is a graph of the data"
SPEED = re.compile(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds, speed:\s*([0-9.]+)\s*t/s")
COUNT = re.compile(r"\b(n_predict|n_drafted|n_accept)\s*=\s*(\d+)")
TG = re.compile(r"\|\s*tg(\d+)\s*\|\s*([0-9.]+)\s*±")


def fixed_rounds(p: Pyramid, k: int, rounds: int) -> list[float]:
    """Median seconds of one MTP round keeping ``a`` drafted tokens, for ``a = 0..k``."""
    target, draft = p.ladder.target, p.ladder.draft
    assert isinstance(draft, ModelTier)
    out = []
    for a in range(k + 1):
        ctx = p.tokenize(PROMPT)
        for t in (target, draft):
            t.model.reset()
        target.prefill(ctx)
        ctx.append(int(np.argmax(target.score(ctx[:-1], [])[-1])))
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            target.sync(ctx)
            draft.sync(ctx)
            z = draft.score(ctx, [])[0]
            drafts = [int(np.argmax(z))]
            while len(drafts) < k:
                drafts.append(int(np.argmax(draft.step(drafts[-1]))))
            rows = target.score(ctx, drafts)
            ctx += [*drafts[:a], int(np.argmax(rows[a]))]
            target.sync(ctx)
            draft.sync(ctx)
            times.append(time.perf_counter() - start)
        out.append(statistics.median(times[1:]))
    return out


def ours(args: argparse.Namespace) -> dict[str, Any]:
    load = LoadConfig(
        n_ctx=1024,
        n_batch=64,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_rs_seq=args.n_rs_seq,
    )
    greedy = SamplingConfig(temperature=0, max_tokens=args.n, ignore_eos=True)
    res: dict[str, Any] = {}
    sd = SpecConfig(mode="sd", l_d=args.k)
    plain = SpecConfig(mode="target")
    # plain decoding as ``run --mode target`` loads it (no head, no snapshots: like llama-bench);
    # the MTP rounds loaded for sd with l_d = k (n_rs_seq = k, as draft-mtp's need_n_rs_seq)
    for draft, spec in ((None, plain), ("mtp", sd)):
        with Pyramid.from_paths(args.model, draft=draft, load=load, spec=spec) as p:
            if draft is not None:
                res["fixed"] = fixed_rounds(p, args.k, args.rounds)
            p.generate(PROMPT, greedy.with_(max_tokens=4), spec)  # warm-up
            r = p.generate(PROMPT, greedy, spec)
            st = r.stats
            verif = sum(s.verifications for s in st.stages)
            res[spec.mode] = {
                "tok_s": st.generation_tps,
                "rounds": verif,
                "tokens": len(r.token_ids),
                "n_rs_seq": p.ladder.target.loaded.n_rs_seq,
            }
    return res


def peer(args: argparse.Namespace) -> dict[str, Any]:
    """One ``llama-speculative-simple --spec-type draft-mtp`` run: tok/s, rounds and tokens
    kept per round. With ``draft-mtp`` it keeps ``n_rs_seq = n_max`` recurrent snapshots
    (``need_n_rs_seq``), so every round commits ``ids`` (kept drafts plus one) with no
    checkpoint replay: rounds = ``n_predict - n_accept`` exactly (the last round may draft
    fewer than ``k`` tokens, so ``n_drafted // k`` undercounts)."""
    exe = peer_bin(args.peer_home, "llama-speculative-simple")
    cmd = [str(exe), "-m", str(args.model), "--spec-type", "draft-mtp"]
    cmd += ["--spec-draft-n-max", str(args.k), "-p", PROMPT, "-n", str(args.n), "--temp", "0"]
    cmd += ["-t", str(args.threads), "-tb", str(args.threads), "-c", "1024", "--ignore-eos"]
    done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", check=False)
    text = done.stdout + done.stderr
    m = SPEED.search(text)
    counts = {k: int(v) for k, v in COUNT.findall(text)}
    if m is None or "n_accept" not in counts or "checkpoints" in text:
        raise RuntimeError("llama-speculative-simple: no speed, or checkpoints:\n" + text[-2000:])
    n, secs = int(m.group(1)), float(m.group(2))
    rounds = max(counts["n_predict"] - counts["n_accept"], 1)
    return {
        "tok_s": float(m.group(3)),
        "tokens": n,
        "seconds": secs,
        "rounds": rounds,
        "drafted_per_round": counts["n_drafted"] / rounds,
        "kept_per_round": counts["n_accept"] / rounds,
        "round_s": secs / rounds,
    }


def bench(args: argparse.Namespace) -> float:
    exe = peer_bin(args.peer_home, "llama-bench")
    cmd = [str(exe), "-m", str(args.model), "-t", str(args.threads), "-p", "0"]
    cmd += ["-n", str(args.n), "-r", "2"]
    text = subprocess.run(cmd, capture_output=True, text=True, errors="replace", check=False).stdout
    m = TG.search(text)
    if m is None:
        raise RuntimeError("llama-bench printed no tg figure:\n" + text[-2000:])
    return float(m.group(2))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--peer-home", type=Path, default=PEER_HOME)
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6, help="rounds timed per kept length")
    ap.add_argument("--n-rs-seq", type=int, default=16, help="the cap (LoadConfig.n_rs_seq)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if not args.model.is_file():
        print(f"Error: no such model file: {args.model}", file=sys.stderr)
        return 2
    runs: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        order = ("ours", "peer") if rep % 2 == 0 else ("peer", "ours")
        run: dict[str, Any] = {}
        for side in order:
            run[side] = ours(args) if side == "ours" else peer(args)
        run["llama_bench_tg"] = bench(args)
        runs.append(run)
    fixed = np.median([r["ours"]["fixed"] for r in runs], axis=0)
    med = statistics.median
    peer_round = med(r["peer"]["round_s"] for r in runs)
    kept = med(r["peer"]["kept_per_round"] for r in runs)
    ours_at = float(np.interp(kept, np.arange(args.k + 1), fixed))
    plain = med(r["ours"]["target"]["tok_s"] for r in runs)
    tg = med(r["llama_bench_tg"] for r in runs)
    rs = {m: runs[0]["ours"][m]["n_rs_seq"] for m in ("target", "sd")}
    print(f"k = {args.k}, n_rs_seq = {rs} (cap {args.n_rs_seq}), threads = {args.threads}")
    for a, s in enumerate(fixed):
        print(f"  ours: one round keeping {a}: {s * 1e3:8.1f} ms")
    print(
        f"  llama.cpp draft-mtp: {peer_round * 1e3:.1f} ms a round at {kept:.2f} kept; ours "
        f"there {ours_at * 1e3:.1f} ms: {ours_at / peer_round:.2f}x"
    )
    sd_runs = [r["ours"]["sd"] for r in runs]
    sd_round = med(x["tokens"] / x["tok_s"] / max(x["rounds"], 1) for x in sd_runs)
    sd_kept = med(x["tokens"] / max(x["rounds"], 1) - 1 for x in sd_runs)
    print(
        f"  end to end: ours sd+mtp {sd_round * 1e3:.1f} ms a round at {sd_kept:.2f} kept, "
        f"llama.cpp {peer_round * 1e3:.1f} ms at {kept:.2f}: {sd_round / peer_round:.2f}x"
    )
    sd = med(r["ours"]["sd"]["tok_s"] for r in runs)
    peer_tok = med(r["peer"]["tok_s"] for r in runs)
    print(f"  tok/s: ours target {plain:.2f}, ours sd+mtp {sd:.2f}, llama.cpp mtp {peer_tok:.2f}")
    print(f"  plain decoding: ours {plain:.2f} tok/s, llama-bench tg {tg:.2f}: {plain / tg:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args), "runs": runs}, default=str, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
