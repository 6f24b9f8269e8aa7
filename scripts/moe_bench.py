"""pyramid-gguf against llama.cpp's own draft-model speculation on one target, per prompt.

Built for the MoE target of ``scripts/moe_model.py`` (any GGUF ladder works). For the first
``--limit`` prompts of each shipped set (the target's chat template applied, as ``bench`` does)
it measures, greedy, ``-n`` tokens, over ``--repeats`` passes:

- pyramid-gguf ``target`` (plain decoding, the reference) and ``auto``, the ladder
  ``--draft`` -> ``--target`` (loaded per prompt, calibration cached);
- llama.cpp's ``llama-speculative-simple -m TARGET -md DRAFT --spec-type draft-simple
  --spec-draft-n-max N`` for every ``N`` of ``--n-max`` (its best is the peer), same threads,
  same prompt text, same token budget.

The two sides take turns per prompt (the next repeat runs llama.cpp's side first) and are
never loaded together. llama.cpp stops after the block that passes ``-n``, so ours decodes
``OVERSHOOT`` tokens longer and each llama.cpp run is compared with ours over as many tokens
as it decoded. ``--tg`` also measures plain decoding of 128 tokens against ``llama-bench -n 128``
(interleaved, ``--repeats`` times each). Each run writes ``--json``; ``--merge A.json B.json ...``
prints the table of several runs (split runs keep each measurement short).

    python scripts/moe_bench.py --target MOE.gguf --draft 0.5B.gguf --sets code,edit \\
        [--limit 1] [-n 160] [--repeats 2] [--n-max 2,4,8] [--tg] --json part1.json
    python scripts/moe_bench.py --merge part1.json part2.json ...
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.bench.prompts import TEXT_SETS, load_prompt_sets

OVERSHOOT = 64
SPEED = re.compile(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds, speed:\s*([0-9.]+)\s*t/s")
COUNT = re.compile(r"\b(n_drafted|n_accept)\s*=\s*(\d+)")
TG = re.compile(r"tg128\s*\|\s*([0-9.]+)")


def binary(home: Path, name: str) -> Path:
    found = sorted(home.glob(f"*/vendor/llama.cpp/build/bin/{name}"))
    if not found:
        raise SystemExit(f"no {name} under {home}: run ../shared/tools/llama_peer.sh build")
    return found[-1]


def llama_spec(args: argparse.Namespace, prompt: str, n_max: int) -> dict[str, float]:
    """One ``llama-speculative-simple`` run with the draft model: tok/s, tokens, counts."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt)
    try:
        cmd = [str(binary(args.peer_home, "llama-speculative-simple")), "-m", str(args.target)]
        cmd += ["-md", str(args.draft), "--spec-type", "draft-simple"]
        cmd += ["--spec-draft-n-max", str(n_max), "-f", f.name, "-n", str(args.max_tokens)]
        cmd += ["-t", str(args.threads), "-td", str(args.threads), "--temp", "0", "-c", "4096"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    finally:
        os.unlink(f.name)
    out = done.stdout + done.stderr
    m = SPEED.search(out)
    if m is None:
        raise SystemExit(f"no speed in llama.cpp's output: {out[-2000:]!r}")
    counts = {k: float(v) for k, v in COUNT.findall(out)}
    return {"tok_s": float(m.group(3)), "tokens": float(m.group(1)), **counts}


def timeline(p: Pyramid, tokens: list[int], sampling: SamplingConfig, mode: str) -> list[float]:
    """Seconds from the start of generation at which each token was committed ``[n]``."""
    out: list[float] = []
    for r in p.stream(tokens, sampling, SpecConfig(mode=mode)):  # type: ignore[arg-type]
        out += [r.stats.generation_seconds] * len(r.token_ids)
    return out


def speed_at(times: list[float], n: int) -> float:
    n = min(n, len(times))
    return n / max(times[n - 1], 1e-9)


def geomean(values: list[float]) -> float:
    return math.exp(statistics.mean(math.log(v) for v in values))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    load = LoadConfig(n_ctx=4096, n_threads=args.threads, n_threads_batch=args.threads)
    greedy = SamplingConfig(temperature=0, max_tokens=args.max_tokens + OVERSHOOT)
    prompts = []
    for s in args.sets.split(","):
        prompts += load_prompt_sets([s])[: args.limit]
    n_max = [int(v) for v in args.n_max.split(",")]
    doc: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(args).items()}, "prompts": {}}

    def ladder() -> Pyramid:
        return Pyramid.from_paths(args.target, draft=args.draft, load=load, name="moe")

    with ladder() as p:
        p.calibrate(say=print)
        texts = {
            q.key: p.apply_chat_template([{"role": "user", "content": q.text}]) for q in prompts
        }
        tokens = {k: p.tokenize(t) for k, t in texts.items()}
    for q in prompts:
        doc["prompts"][q.key] = {"set": q.set, "ours": {}, "llama.cpp": {}}
    for repeat in range(args.repeats):
        for q in prompts:
            row = doc["prompts"][q.key]

            def ours(q_key: str = q.key, row: dict[str, Any] = row) -> None:
                with ladder() as p:
                    p.generate(tokens[q_key], greedy.with_(max_tokens=4))  # warm-up
                    for mode in ("target", "auto"):
                        times = timeline(p, tokens[q_key], greedy, mode)
                        row["ours"].setdefault(mode, []).append(times)

            def theirs(q_key: str = q.key, row: dict[str, Any] = row) -> None:
                for n in n_max:
                    r = llama_spec(args, texts[q_key], n)
                    row["llama.cpp"].setdefault(str(n), []).append(r)

            for side in (ours, theirs) if repeat % 2 == 0 else (theirs, ours):
                side()
            now = {m: round(speed_at(t[-1], args.max_tokens), 2) for m, t in row["ours"].items()}
            peer = {n: r[-1]["tok_s"] for n, r in row["llama.cpp"].items()}
            print(q.key, now, peer, flush=True)
            if args.json:  # as it goes: a run cut short keeps its finished prompts
                args.json.write_text(json.dumps(doc))
    if args.tg:
        doc["tg128"] = {"ours": [], "llama_bench": []}
        plain = SamplingConfig(temperature=0, max_tokens=128, ignore_eos=True)
        bench = [str(binary(args.peer_home, "llama-bench")), "-m", str(args.target)]
        bench += ["-t", str(args.threads), "-p", "0", "-n", "128", "-r", "1"]
        for _ in range(args.repeats):
            with ladder() as p:
                hello = p.tokenize("Hello")
                p.generate(hello, plain.with_(max_tokens=4), SpecConfig(mode="target"))
                r = p.generate(hello, plain, SpecConfig(mode="target"))
                doc["tg128"]["ours"].append(r.stats.generation_tps)
            out = subprocess.run(bench, capture_output=True, text=True, check=True).stdout
            m = TG.search(out)
            doc["tg128"]["llama_bench"].append(float(m.group(1)) if m else float("nan"))
            print("tg128", doc["tg128"], flush=True)
    return doc


def table(docs: list[dict[str, Any]]) -> None:
    """Per prompt and per set (geometric means): target tok/s, auto / target, llama.cpp's
    draft speculation at each n_max over ours at as many tokens, and auto / best llama.cpp."""
    rows: dict[str, dict[str, Any]] = {}
    tg: dict[str, list[float]] = {"ours": [], "llama_bench": []}
    for d in docs:
        n = int(d["settings"]["max_tokens"])
        for key, r in d["prompts"].items():
            if not r["ours"].get("auto") or not r["llama.cpp"]:
                continue  # not measured (a run cut short)
            target = [speed_at(t, n) for t in r["ours"]["target"]]
            auto = [speed_at(t, n) for t in r["ours"]["auto"]]
            peer: dict[str, float] = {}
            auto_at: dict[str, float] = {}
            for n_max, runs in r["llama.cpp"].items():
                peer[n_max] = statistics.median(x["tok_s"] for x in runs)
                k = [int(x["tokens"]) for x in runs]
                auto_at[n_max] = statistics.median(
                    speed_at(t, m) for t, m in zip(r["ours"]["auto"], k, strict=False)
                )
            best = max(peer, key=lambda m: peer[m])
            rows[key] = {
                "set": r["set"],
                "target": statistics.median(target),
                "auto": statistics.median(auto) / statistics.median(target),
                "peer": {m: v / statistics.median(target) for m, v in peer.items()},
                "best": best,
                "auto_over_best": auto_at[best] / peer[best],
            }
        for side in tg:
            tg[side] += d.get("tg128", {}).get(side, [])
    n_maxes = list(next(iter(rows.values()))["peer"]) if rows else []
    head = f"{'prompt':<20}{'target tok/s':>13}{'auto':>7}"
    head += "".join(f"{'n_max ' + m:>9}" for m in n_maxes) + f"{'auto/best':>11}"
    print(head)
    for key, r in rows.items():
        cells = f"{key:<20}{r['target']:>13.1f}{r['auto']:>6.2f}x"
        cells += "".join(f"{r['peer'][m]:>8.2f}x" for m in n_maxes)
        print(cells + f"{r['auto_over_best']:>10.2f}x")
    print("geometric means per set")
    for s in dict.fromkeys(r["set"] for r in rows.values()):
        rs = [r for r in rows.values() if r["set"] == s]
        cells = f"{s:<20}{geomean([r['target'] for r in rs]):>13.1f}"
        cells += f"{geomean([r['auto'] for r in rs]):>6.2f}x"
        cells += "".join(f"{geomean([r['peer'][m] for r in rs]):>8.2f}x" for m in n_maxes)
        print(cells + f"{geomean([r['auto_over_best'] for r in rs]):>10.2f}x")
    if tg["ours"]:
        ours, theirs = statistics.median(tg["ours"]), statistics.median(tg["llama_bench"])
        print(
            f"plain decoding, 128 tokens: pyramid-gguf {ours:.2f} tok/s, llama-bench tg128 ", end=""
        )
        print(f"{theirs:.2f} tok/s ({ours / theirs:.3f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--peer-home", type=Path, default=Path("~/.cache/llama-peer").expanduser())
    ap.add_argument("--sets", default=",".join(TEXT_SETS))
    ap.add_argument("--limit", type=int, default=1, help="prompts per set")
    ap.add_argument("-n", "--max-tokens", type=int, default=160)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-max", default="2,4,8", help="llama.cpp's --spec-draft-n-max values")
    ap.add_argument("--tg", action="store_true", help="also plain 128 tokens vs llama-bench")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--merge", type=Path, nargs="+", default=None, help="print these runs")
    args = ap.parse_args()
    if args.merge:
        table([json.loads(p.read_text()) for p in args.merge])
        return
    if args.target is None or args.draft is None:
        raise SystemExit("Error: --target and --draft are required")
    doc = measure(args)
    if args.json:
        args.json.write_text(json.dumps(doc))
    table([doc])


if __name__ == "__main__":
    main()
