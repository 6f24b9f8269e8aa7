"""pyramid-gguf against llama.cpp's own n-gram drafters, per prompt, in one run.

Builds nothing: point ``--peer-home`` at the folder ``../shared/tools/llama_peer.sh build``
filled (its ``PEER_HOME``). For every shipped prompt of the chosen sets (all six by default;
the target's chat template applied, as ``bench`` does), it measures over ``--repeats`` passes:

- pyramid-gguf ``target`` (the reference) and ``auto``;
- llama.cpp's ``llama-speculative-simple`` with each of ``--spec-type ngram-simple``,
  ``ngram-map-k`` and ``ngram-mod`` (``--kinds``), greedy, on the same prompt text, with the
  same threads and token budget, each drafter at llama.cpp's own default settings (in this
  llama.cpp, ``--spec-draft-n-max`` does not reach the n-gram drafters: ``ngram-simple`` and
  ``ngram-map-k`` look up 12-token keys and draft up to 48 tokens, ``ngram-mod`` 24-token
  keys and 48 to 64 tokens);
- and, once, ``llama-bench`` tg against pyramid-gguf's plain decoding of the same length.

It prints every prompt (tok/s of ``target``; the others as speedups over it; the best
llama.cpp drafter on that prompt, and ``auto`` over it), then each set's geometric means.
Every number comes from this one run, and the two sides take turns per prompt: ours loads,
decodes the prompt and unloads, then llama.cpp decodes it with each drafter; the next repeat
runs llama.cpp's side first. A process holding the same model file changes the other's speed,
so the two are never loaded together, and a machine whose speed drifts over minutes moves both
sides of a prompt alike. llama.cpp stops after the block that passes ``-n`` (up to 64 tokens
later, more tokens at its best speed where the answer copies), so ours decodes as far and each
of llama.cpp's runs is compared with ours over the tokens it decoded. ``--json`` keeps
everything: every repeat's tok/s, llama.cpp's drafted and kept token counts, the medians and
ratios.

    python scripts/peer_bench.py --peer-home ~/.cache/llama-peer [--sets summarize,edit,rag] \\
        [-n 160] [--repeats 2] [--threads 2] [--kinds ngram-simple,ngram-map-k,ngram-mod] \\
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from common import PEER_HOME, geomean, peer_bin

from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.bench.prompts import TEXT_SETS, BenchPrompt, load_prompt_sets
from pyramid_gguf.models.presets import DEFAULT_PRESET, resolve_preset

TOOL = Path(__file__).resolve().parents[2] / "shared" / "tools" / "llama_peer.sh"
KINDS = ("ngram-simple", "ngram-map-k", "ngram-mod")
#: Tokens past ``-n`` that llama-speculative-simple may decode (its last accepted block).
OVERSHOOT = 64
SPEED = re.compile(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds, speed:\s*([0-9.]+)\s*t/s")
COUNT = re.compile(r"\b(n_drafted|n_accept)\s*=\s*(\d+)")


def peer_tool(args: argparse.Namespace, *cmd: str) -> str:
    env = {**os.environ, "PEER_HOME": str(args.peer_home), "THREADS": str(args.threads)}
    r = subprocess.run(
        ["bash", str(args.tool), *cmd], capture_output=True, text=True, env=env, check=True
    )
    return r.stdout


def speculative_simple(args: argparse.Namespace) -> Path:
    return peer_bin(args.peer_home, "llama-speculative-simple")


def peer_ngram(args: argparse.Namespace, target: Path, prompt: str, kind: str) -> dict[str, float]:
    """One run of ``llama-speculative-simple --spec-type kind``: tok/s, tokens decoded, and
    its drafted and kept token counts."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt)
    try:
        cmd = [str(args.binary), "-m", str(target), "--spec-type", kind, "-f", f.name]
        cmd += ["-n", str(args.max_tokens), "-t", str(args.threads), "--temp", "0", "-c", "4096"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    finally:
        os.unlink(f.name)
    out = done.stdout + done.stderr
    m = SPEED.search(out)
    if m is None:
        raise SystemExit(f"no speed in llama.cpp's output: {out[-2000:]!r}")
    counts = {k: float(v) for k, v in COUNT.findall(out)}
    return {"tok_s": float(m.group(3)), "tokens": float(m.group(1)), **counts}


def tok_s(p: Pyramid, tokens: list[int], sampling: SamplingConfig, spec: SpecConfig) -> float:
    return p.generate(tokens, sampling, spec).stats.generation_tps


def timeline(
    p: Pyramid, tokens: list[int], sampling: SamplingConfig, spec: SpecConfig
) -> list[float]:
    """Seconds from the start of generation at which each generated token was committed
    (``[n]``), so one generation gives its speed over any first ``n`` tokens."""
    out: list[float] = []
    for r in p.stream(tokens, sampling, spec):
        out += [r.stats.generation_seconds] * len(r.token_ids)
    return out


def speed_at(times: list[float], n: int) -> float:
    """tok/s over the first ``n`` tokens of a :func:`timeline` (all of it when shorter)."""
    n = min(n, len(times))
    return n / max(times[n - 1], 1e-9)


def summarize(
    prompts: list[BenchPrompt], runs: dict[str, dict[str, list[float]]], kinds: list[str]
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, float]]]:
    """Per prompt: median tok/s of each config, ratios to ``target``, the best llama.cpp
    drafter and ``auto`` over it; per set: geometric means of the ratios. A llama.cpp drafter
    is compared with ours over as many tokens as it decoded (``target at KIND``, ``auto at
    KIND``)."""
    per_prompt: dict[str, dict[str, Any]] = {}
    for q in prompts:
        med = {k: statistics.median(v) for k, v in runs[q.key].items()}
        x = {"target": 1.0, "auto": med["auto"] / med["target"]}
        for k in kinds:
            x[f"llama.cpp {k}"] = med[f"llama.cpp {k}"] / med[f"target at {k}"]
        best = max(kinds, key=lambda k: x[f"llama.cpp {k}"])
        per_prompt[q.key] = {
            "set": q.set,
            "tok_s": med,
            "x_target": x,
            "best_llama_cpp": best,
            "auto_over_best": med[f"auto at {best}"] / med[f"llama.cpp {best}"],
        }
    per_set: dict[str, dict[str, float]] = {}
    for s in dict.fromkeys(q.set for q in prompts):
        rows = [r for r in per_prompt.values() if r["set"] == s]
        cols = {k: geomean([r["x_target"][k] for r in rows]) for k in rows[0]["x_target"]}
        cols["best llama.cpp"] = geomean(
            [r["x_target"][f"llama.cpp {r['best_llama_cpp']}"] for r in rows]
        )
        cols["auto / best"] = geomean([r["auto_over_best"] for r in rows])
        cols["target tok/s"] = geomean([r["tok_s"]["target"] for r in rows])
        per_set[s] = cols
    return per_prompt, per_set


def print_table(
    per_prompt: dict[str, dict[str, Any]], per_set: dict[str, dict[str, float]], kinds: list[str]
) -> None:
    widths = [12, 6, *(max(len(k), 6) for k in kinds), 14, 11]

    def line(label: str, cells: list[str]) -> None:
        print(f"{label:<22}" + "".join(f" {c:>{w}}" for c, w in zip(cells, widths, strict=True)))

    print()
    line("prompt", ["target tok/s", "auto", *kinds, "best llama.cpp", "auto / best"])
    for key, r in per_prompt.items():
        x = r["x_target"]
        cells = [f"{r['tok_s']['target']:.1f}", f"{x['auto']:.2f}x"]
        cells += [f"{x[f'llama.cpp {k}']:.2f}x" for k in kinds]
        line(key, [*cells, r["best_llama_cpp"], f"{r['auto_over_best']:.2f}x"])
    print("\ngeometric means per set")
    for s, c in per_set.items():
        cells = [f"{c['target tok/s']:.1f}", f"{c['auto']:.2f}x"]
        cells += [f"{c[f'llama.cpp {k}']:.2f}x" for k in kinds]
        line(s, [*cells, f"{c['best llama.cpp']:.2f}x", f"{c['auto / best']:.2f}x"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-home", type=Path, default=PEER_HOME)
    ap.add_argument("--tool", type=Path, default=TOOL, help="llama_peer.sh (for llama-bench)")
    ap.add_argument("--preset", default=DEFAULT_PRESET)
    ap.add_argument("--sets", default=",".join(TEXT_SETS))
    ap.add_argument("-n", "--max-tokens", type=int, default=160)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kinds", default=",".join(KINDS), help="llama.cpp's --spec-type values")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    args.binary = speculative_simple(args)

    ladder = resolve_preset(args.preset)
    load = LoadConfig(n_ctx=4096, n_threads=args.threads, n_threads_batch=args.threads)
    sampling = SamplingConfig(temperature=0, max_tokens=args.max_tokens)
    runs: dict[str, dict[str, list[float]]] = {}  # prompt -> config -> tok/s per repeat
    times: dict[str, dict[str, list[list[float]]]] = {}  # prompt -> ours -> timeline per repeat
    counts: dict[str, dict[str, list[dict[str, float]]]] = {}  # prompt -> kind -> runs
    specs = {"target": SpecConfig(mode="target"), "auto": SpecConfig(mode="auto")}
    prompts = load_prompt_sets(args.sets.split(","))
    kinds = [k for k in args.kinds.split(",") if k]
    ours_tg = 0.0
    with Pyramid.load(ladder.paths, load=load, name=ladder.name) as p:
        p.calibrate(say=print)
        texts = {
            q.key: p.apply_chat_template([{"role": "user", "content": q.text}]) for q in prompts
        }
        tokens = {k: p.tokenize(t) for k, t in texts.items()}
        for spec in specs.values():  # warm-up
            tok_s(p, tokens[prompts[0].key], sampling.with_(max_tokens=8), spec)
        plain = sampling.with_(max_tokens=128, ignore_eos=True)
        ours_tg = tok_s(p, p.tokenize("Hello"), plain, specs["target"])

    # llama.cpp stops after the block that passes -n, up to OVERSHOOT tokens later: ours runs
    # that much longer, and each side's speed is taken over the same number of tokens.
    longer = sampling.with_(max_tokens=args.max_tokens + OVERSHOOT)

    def ours(q: BenchPrompt) -> None:
        # Loaded per prompt (calibration is cached), so llama.cpp never runs beside it.
        with Pyramid.load(ladder.paths, load=load, name=ladder.name) as p:
            tok_s(p, tokens[q.key], sampling.with_(max_tokens=4), specs["target"])  # warm-up
            for name, spec in specs.items():
                times.setdefault(q.key, {}).setdefault(name, []).append(
                    timeline(p, tokens[q.key], longer, spec)
                )

    def theirs(q: BenchPrompt) -> None:
        for kind in kinds:
            r = peer_ngram(args, ladder.paths.target, texts[q.key], kind)
            runs[q.key].setdefault(f"llama.cpp {kind}", []).append(r["tok_s"])
            counts.setdefault(q.key, {}).setdefault(kind, []).append(r)

    for repeat in range(args.repeats):
        for q in prompts:
            runs.setdefault(q.key, {})
            for side in (ours, theirs) if repeat % 2 == 0 else (theirs, ours):
                side(q)
            ours_now = {
                k: round(speed_at(v[-1], args.max_tokens), 1) for k, v in times[q.key].items()
            }
            theirs_now = {k: round(v[-1], 1) for k, v in runs[q.key].items()}
            print(q.key, ours_now, theirs_now, flush=True)
    for q in prompts:
        for name in specs:
            series = times[q.key][name]
            runs[q.key][name] = [speed_at(t, args.max_tokens) for t in series]
            for kind in kinds:
                n = [int(c["tokens"]) for c in counts[q.key][kind]]
                runs[q.key][f"{name} at {kind}"] = [
                    speed_at(t, k) for t, k in zip(series, n, strict=True)
                ]
    bench = peer_tool(args, "bench", str(ladder.paths.target))
    tg = re.search(r"tg128\s*\|\s*([0-9.]+)", bench)

    per_prompt, per_set = summarize(prompts, runs, kinds)
    print_table(per_prompt, per_set, kinds)
    print(f"\nplain decoding, 128 tokens: pyramid-gguf {ours_tg:.1f} tok/s, ", end="")
    print(f"llama-bench tg128 {tg.group(1) if tg else '?'} tok/s")
    print(bench)
    if args.json:
        doc = {
            "settings": {
                "max_tokens": args.max_tokens,
                "repeats": args.repeats,
                "threads": args.threads,
                "kinds": kinds,
                "preset": args.preset,
            },
            "prompts": {
                k: {**r, "runs": runs[k], "llama_cpp": counts.get(k, {})}
                for k, r in per_prompt.items()
            },
            "sets": per_set,
            "tg128": {"ours": ours_tg, "llama_bench": tg and float(tg.group(1))},
        }
        args.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
