"""Tune ``auto`` in seconds: replay recorded greedy answers through its scheduler, priced by a
cost curve, with no model loaded.

``record`` decodes every shipped prompt (and the README's first one) with plain greedy
decoding on the default ladder's target and saves prompt and answer tokens with the target's
measured cost curve. ``replay`` runs :class:`~pyramid_gguf.decoding.auto.AutoRounds` on those
answers against a scripted target (:mod:`pyramid_gguf.decoding.replay`) and prints, per prompt
set and answer length, the speedup over plain decoding that the cost model predicts: what
``auto`` would do on the real target, near-ties aside. Change a constant in
``decoding/policy.py`` or ``decoding/estimates.py``, replay, compare.

    python scripts/replay_auto.py record answers.json [-n 256] [-t 2]
    python scripts/replay_auto.py replay answers.json [--curve recorded|avx512|curve.json] \\
        [--lengths 64,160,256] [-v]

``--curve avx512`` is issue 12's 2-core AVX-512 machine (ms per decode of 1..8 tokens: 34,
51, 68, 80, 129, 140, 160, 188); a JSON file holds ``{"seconds": [c(1), c(2), ...]}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from pyramid_gguf.decoding.costs import CostCurve
from pyramid_gguf.decoding.replay import replay

FIRST_PROMPT = "Write a Python function that checks whether a number is prime."
AVX512_MS = (34, 51, 68, 80, 129, 140, 160, 188)


def record(args: argparse.Namespace) -> None:
    from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
    from pyramid_gguf.bench.prompts import load_prompt_sets
    from pyramid_gguf.models.presets import DEFAULT_PRESET, resolve_preset

    prompts = [(q.set, q.key, q.text) for q in load_prompt_sets()]
    prompts.append(("first", "first/prime", FIRST_PROMPT))
    load = LoadConfig(n_threads=args.threads, n_threads_batch=args.threads)
    out: dict[str, object] = {}
    with Pyramid.load(resolve_preset(DEFAULT_PRESET).paths, load=load) as p:
        out["seconds"] = list(p.costs()["target"].seconds)
        answers = {}
        for set_name, key, text in prompts:
            tokens = p.chat_tokens([{"role": "user", "content": text}])
            sampling = SamplingConfig(temperature=0, max_tokens=args.max_tokens)
            done = p.generate(tokens, sampling, SpecConfig(mode="target"))
            answers[key] = {"set": set_name, "prompt": list(tokens), "answer": done.token_ids}
            print(f"{key}: {len(done.token_ids)} tokens", flush=True)
        out["answers"] = answers
    args.file.write_text(json.dumps(out))


def curve_of(args: argparse.Namespace, recorded: list[float]) -> CostCurve:
    if args.curve == "recorded":
        return CostCurve(tuple(recorded))
    if args.curve == "avx512":
        return CostCurve(tuple(ms / 1000 for ms in AVX512_MS))
    return CostCurve(tuple(json.loads(Path(args.curve).read_text())["seconds"]))


def replay_all(args: argparse.Namespace) -> None:
    data = json.loads(args.file.read_text())
    curve = curve_of(args, data["seconds"])
    lengths = [int(n) for n in args.lengths.split(",")]
    table: dict[str, dict[int, list[float]]] = {}
    for key, rec in data["answers"].items():
        for n in lengths:
            r = replay(rec["prompt"], rec["answer"][:n], curve)
            table.setdefault(rec["set"], {}).setdefault(n, []).append(r.speedup)
            if args.verbose:
                bets = r.auto.choices.get("ngram")
                print(
                    f"{key:22s} n={n:<4d} {r.speedup:.3f}x  n-gram rounds "
                    f"{bets.rounds if bets else 0}, saved {r.auto.savings:+.3f} s, "
                    f"shadows {r.auto.shadows} ({r.auto.shadow_credit:+.3f} s), "
                    f"unfunded {r.auto.unfunded}"
                )
    print(f"{'set':8s}" + "".join(f"{'n=' + str(n):>9s}" for n in lengths))
    for name, by_n in table.items():
        print(f"{name:8s}" + "".join(f"{statistics.mean(by_n[n]):8.3f}x" for n in lengths))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="decode the prompts greedily and save the answers")
    rec.add_argument("file", type=Path)
    rec.add_argument("-n", "--max-tokens", type=int, default=256)
    rec.add_argument("-t", "--threads", type=int, default=2)
    rep = sub.add_parser("replay", help="replay saved answers through auto's scheduler")
    rep.add_argument("file", type=Path)
    rep.add_argument("--curve", default="recorded", help="recorded, avx512 or a JSON file")
    rep.add_argument("--lengths", default="64,160,256")
    rep.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    record(args) if args.command == "record" else replay_all(args)


if __name__ == "__main__":
    main()
