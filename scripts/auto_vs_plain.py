"""``auto`` against plain decoding on one target, generation time only, over the shipped sets.

Issue 50's bar: on a hybrid target with a draft that never agrees (``scripts/hybrid_model.py
DST --mtp-noise 4``), ``auto`` must stay within 3% of plain decoding. Two pyramids share the
process, as two users' would not, so that their turns interleave within seconds:

- plain decoding loaded as ``run --mode target`` loads it (no recurrent-state snapshots);
- ``auto`` with ``--draft`` (``mtp``: the target's own head; a GGUF; ``none``) loaded for
  ``auto`` (its snapshots, its calibration), one :class:`~pyramid_gguf.Pyramid` for every
  answer, so each answer starts from what the last one learned (``KeepMemory``).

For the first prompt of each set, cut to ``--chars`` characters (raw text, no chat template),
each pass generates ``-n`` tokens with each pyramid, greedy, ``ignore_eos``, the order swapped
every pass. Per answer it prints both generation rates (tokens over the seconds after the
prompt's evaluation) and what ``auto`` chose; then the median ratio per set and the total:
plain decoding's generation seconds over ``auto``'s, summed over every answer.

    python scripts/auto_vs_plain.py TARGET.gguf [--draft mtp] [--passes 3] [-n 128] \\
        [--chars 1500] [--threads 2] [--ctx-size 4096]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.bench.prompts import TEXT_SETS, load_prompt_sets
from pyramid_gguf.core.errors import UserError


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("--draft", default="mtp", help="mtp, ngram, a GGUF, or none")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("-n", type=int, default=128, help="tokens per answer")
    ap.add_argument("--chars", type=int, default=1500, help="each prompt cut to this many")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-size", type=int, default=4096)
    args = ap.parse_args()
    load = LoadConfig(n_ctx=args.ctx_size, n_threads=args.threads, n_threads_batch=args.threads)
    draft = None if args.draft == "none" else args.draft
    try:  # a missing or non-GGUF file, a head the target lacks: one line
        pyramids = {
            "plain": Pyramid.from_paths(args.target, load=load, spec=SpecConfig(mode="target")),
            "auto": Pyramid.from_paths(args.target, draft=draft, load=load, spec=SpecConfig()),
        }
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    sampling = SamplingConfig(temperature=0.0, max_tokens=args.n, ignore_eos=True)
    prompts: dict[str, str] = {}
    for p in load_prompt_sets(TEXT_SETS):
        prompts.setdefault(p.set, p.text[: args.chars])
    ratios: dict[str, list[float]] = {s: [] for s in prompts}
    seconds = dict.fromkeys(pyramids, 0.0)
    for k in range(args.passes):
        order = ("plain", "auto") if k % 2 == 0 else ("auto", "plain")
        for name, text in prompts.items():
            rate: dict[str, float] = {}
            chose = ""
            for which in order:
                stats = pyramids[which].generate(text, sampling).stats
                rate[which] = stats.generation_tps
                seconds[which] += stats.generation_seconds
                if which == "auto" and stats.auto is not None:
                    chose = ", ".join(
                        f"{c} {s.rounds} rounds, {s.proposed} proposed"
                        for c, s in stats.auto.choices.items()
                    )
            ratios[name].append(rate["auto"] / rate["plain"])
            print(
                f"pass {k} {name}: plain {rate['plain']:.2f} tok/s, auto {rate['auto']:.2f} "
                f"({ratios[name][-1]:.3f}x; {chose})",
                flush=True,
            )
    per_set = ", ".join(f"{s} {statistics.median(v):.3f}" for s, v in ratios.items())
    print(f"auto / plain, median per set: {per_set}")
    total = seconds["plain"] / seconds["auto"]
    print(f"total: plain {seconds['plain']:.2f} s, auto {seconds['auto']:.2f} s: {total:.3f}x")
    for p in pyramids.values():
        p.close()


if __name__ == "__main__":
    main()
