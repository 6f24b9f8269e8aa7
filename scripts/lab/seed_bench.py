"""A mode against ``target`` on one prompt, sampled, over several seeds.

A sampled answer differs from seed to seed, and so do the bets ``auto`` makes on it; one seed
says little. For each seed this decodes the prompt (chat template applied) with ``target`` and
with the mode (which goes first alternates from seed to seed), the same number of tokens
(``ignore_eos``), and prints both speeds, their ratio and what ``auto`` bet; then the median
and mean ratio.

    python scripts/lab/seed_bench.py -p "Write a Python function that checks whether ..." \\
        [--mode auto] [--seeds 8] [-n 256] [--temp 0.8] [-t 2]
"""

from __future__ import annotations

import argparse
import statistics

from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.core.modes import MODE_NAMES, Mode
from pyramid_gguf.models.presets import DEFAULT_PRESET, resolve_preset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-p", "--prompt", required=True)
    ap.add_argument("--mode", default="auto", choices=MODE_NAMES)
    ap.add_argument("--preset", default=DEFAULT_PRESET)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("-n", "--max-tokens", type=int, default=256)
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    load = LoadConfig(n_threads=args.threads, n_threads_batch=args.threads)
    ratios = []
    with Pyramid.load(resolve_preset(args.preset).paths, load=load) as p:
        p.costs()  # measured or read before the first timed run
        prompt = p.chat_tokens([{"role": "user", "content": args.prompt}])
        for seed in range(args.seeds):
            sampling = SamplingConfig(
                temperature=args.temp, max_tokens=args.max_tokens, seed=seed, ignore_eos=True
            )
            runs = {}
            mine: Mode = args.mode
            order: tuple[Mode, Mode] = ("target", mine) if seed % 2 == 0 else (mine, "target")
            for mode in order:  # alternating, so that running second is no one's handicap
                runs[mode] = p.generate(prompt, sampling, SpecConfig(mode=mode)).stats
            stats = runs[args.mode]
            speeds = [r.generated_tokens / r.generation_seconds for r in (runs["target"], stats)]
            ratios.append(speeds[1] / speeds[0])
            bets = ""
            if stats.auto is not None:
                ngram = stats.auto.choices.get("ngram")
                rounds, kept = (ngram.rounds, ngram.committed - ngram.rounds) if ngram else (0, 0)
                proposed = ngram.proposed if ngram else 0
                bets = f"  n-gram rounds {rounds}, kept {kept}/{proposed}"
                bets += f", saved {stats.auto.savings:+.3f} s"
            print(
                f"seed {seed}: target {speeds[0]:.2f} tok/s, {args.mode} {speeds[1]:.2f} tok/s, "
                f"{ratios[-1]:.3f}x{bets}",
                flush=True,
            )
    print(f"median {statistics.median(ratios):.3f}x, mean {statistics.mean(ratios):.3f}x")


if __name__ == "__main__":
    main()
