"""pyramid-gguf against llama.cpp's own speculative tools, in one run, on the same prompts.

Builds nothing: point ``--peer-home`` at the folder ``../shared/tools/llama_peer.sh build``
filled (its ``PEER_HOME``). For every shipped prompt of the chosen sets (the target's chat
template applied, as ``bench`` does), it measures, interleaved, over ``--repeats`` passes:

- pyramid-gguf ``target`` (the reference), ``auto``, and ``sd --draft ngram``;
- llama.cpp's ``llama-speculative-simple --spec-type ngram-simple`` (greedy, same prompt text,
  same threads and token budget), via ``llama_peer.sh spec``;
- and, once, ``llama-bench`` tg against pyramid-gguf's plain decoding of the same length.

It prints tok/s per prompt set and ratios against ``target``, and ``auto`` against
llama.cpp's n-gram drafter. Every number comes from this one run: each repeat runs ours on every
prompt, unloads it, then runs llama.cpp's tools on every prompt (a process holding the same
model file changes the other's speed, so the two are never loaded together).

    python scripts/peer_bench.py --peer-home ~/.cache/llama-peer [--sets edit,code,chat,qa] \\
        [-n 160] [--repeats 2] [--threads 2] [--json out.json]
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

from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.bench.prompts import PROMPT_SETS, load_prompt_sets
from pyramid_gguf.models.presets import DEFAULT_PRESET, resolve_preset

TOOL = Path(__file__).resolve().parents[2] / "shared" / "tools" / "llama_peer.sh"
SPEED = re.compile(r"([0-9.]+)\s*t/s")


def peer(args: argparse.Namespace, *cmd: str) -> str:
    env = {**os.environ, "PEER_HOME": str(args.peer_home), "THREADS": str(args.threads)}
    r = subprocess.run(
        ["bash", str(args.tool), *cmd], capture_output=True, text=True, env=env, check=True
    )
    return r.stdout


def peer_ngram(
    args: argparse.Namespace, target: Path, prompt: str, n_max: int, spec_type: str
) -> float:
    """tok/s of ``llama-speculative-simple`` with ``spec_type``: ``ngram-simple`` through
    ``llama_peer.sh spec``; other n-gram drafters by calling the same binary the same way."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt)
    try:
        if spec_type == "ngram-simple":
            out = peer(args, "spec", str(target), f.name, "", str(n_max))
        else:
            binary = next(
                args.peer_home.glob("*/vendor/llama.cpp/build/bin/llama-speculative-simple")
            )
            cmd = [str(binary), "-m", str(target), "--spec-type", spec_type]
            cmd += ["--spec-draft-n-max", str(n_max), "-f", f.name, "-n", str(args.max_tokens)]
            cmd += ["-t", str(args.threads), "--temp", "0", "-c", "4096"]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            out = next(ln for ln in (done.stdout + done.stderr).splitlines() if "decoded" in ln)
    finally:
        os.unlink(f.name)
    m = SPEED.search(out)
    if m is None:
        raise SystemExit(f"no speed in llama.cpp's output: {out!r}")
    return float(m.group(1))


def tok_s(p: Pyramid, tokens: list[int], sampling: SamplingConfig, spec: SpecConfig) -> float:
    stats = p.generate(tokens, sampling, spec).stats
    return stats.generation_tps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-home", type=Path, default=Path("~/.cache/llama-peer").expanduser())
    ap.add_argument("--tool", type=Path, default=TOOL, help="llama_peer.sh")
    ap.add_argument("--preset", default=DEFAULT_PRESET)
    ap.add_argument("--sets", default=",".join(PROMPT_SETS))
    ap.add_argument("-n", "--max-tokens", type=int, default=160)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-max", type=int, default=4, help="llama.cpp's --spec-draft-n-max")
    ap.add_argument(
        "--also",
        default="",
        help="more llama.cpp n-gram drafters to run, e.g. ngram-map-k,ngram-mod",
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    ladder = resolve_preset(args.preset)
    load = LoadConfig(n_ctx=4096, n_threads=args.threads, n_threads_batch=args.threads)
    sampling = SamplingConfig(temperature=0, max_tokens=args.max_tokens)
    runs: dict[str, dict[str, list[float]]] = {}  # prompt -> config -> tok/s per repeat
    specs = {"target": SpecConfig(mode="target"), "auto": SpecConfig(mode="auto")}
    prompts = load_prompt_sets(args.sets.split(","))
    kinds = ["ngram-simple", *filter(None, args.also.split(","))]
    ours_tg = 0.0
    for repeat in range(args.repeats):
        # Ours and llama.cpp's in turn, never both loaded: a second process holding the same
        # model file changes its speed (measured here: llama.cpp 11% faster while ours was).
        with Pyramid.load(ladder.paths, load=load, name=ladder.name) as p:
            p.calibrate(say=print)
            texts = {
                q.key: p.apply_chat_template([{"role": "user", "content": q.text}]) for q in prompts
            }
            tokens = {k: p.tokenize(t) for k, t in texts.items()}
            for spec in specs.values():  # warm-up
                tok_s(p, tokens[prompts[0].key], sampling.with_(max_tokens=8), spec)
            for q in prompts:
                run = runs.setdefault(q.key, {})
                for name, spec in specs.items():
                    run.setdefault(name, []).append(tok_s(p, tokens[q.key], sampling, spec))
            if repeat == 0:
                plain = sampling.with_(max_tokens=128, ignore_eos=True)
                ours_tg = tok_s(p, p.tokenize("Hello"), plain, specs["target"])
        for q in prompts:
            run = runs[q.key]
            for kind in kinds:
                speed = peer_ngram(args, ladder.paths.target, texts[q.key], args.n_max, kind)
                run.setdefault(f"llama.cpp {kind}", []).append(speed)
            print(q.key, {k: round(v[-1], 1) for k, v in run.items()}, flush=True)
    rows: dict[str, dict[str, list[float]]] = {}  # set -> config -> tok/s of its prompts
    for q in prompts:
        for name, values in runs[q.key].items():
            rows.setdefault(q.set, {}).setdefault(name, []).extend(values)
    bench = peer(args, "bench", str(ladder.paths.target))
    tg = re.search(r"tg128\s*\|\s*([0-9.]+)", bench)

    head = ["set", "target tok/s", "auto", "llama.cpp ngram-simple", "auto / llama.cpp"]
    print(f"\n{head[0]:<6} {head[1]:>12} {head[2]:>7} {head[3]:>23} {head[4]:>17}")
    summary = {}
    for s, row in rows.items():
        med = {k: statistics.median(v) for k, v in row.items()}
        t = med["target"]
        summary[s] = med
        peer_x = med["llama.cpp ngram-simple"]
        print(
            f"{s:<6} {t:>12.1f} {med['auto'] / t:>6.2f}x {peer_x / t:>22.2f}x "
            f"{med['auto'] / peer_x:>16.2f}x"
        )
        for kind in kinds[1:]:
            print(f"{'':<6} llama.cpp {kind}: {med[f'llama.cpp {kind}'] / t:.2f}x target")
    print(f"\nplain decoding, 128 tokens: pyramid-gguf {ours_tg:.1f} tok/s, ", end="")
    print(f"llama-bench tg128 {tg.group(1) if tg else '?'} tok/s")
    print(bench)
    if args.json:
        doc = {
            "sets": summary,
            "tg128": {"ours": ours_tg, "llama_bench": tg and float(tg.group(1))},
        }
        args.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
