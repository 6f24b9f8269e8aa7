"""Do replayed traces predict measured speeds? Predicted beside measured, one run, this machine.

For every trace of a trace file (``pyramid-gguf traces``) and every mode, it generates the answer
on the real ladder (greedy, the trace's answer length, as ``bench`` runs it, modes interleaved
per prompt) and replays the trace through the same mode's rounds priced by this machine's cost
curves (``calibrate``, measured fresh at the start). It prints generated tokens per second per
prompt set, measured and predicted, their ratio, and how many generations wrote exactly the
trace's answer (a replay prices the trace's text: where a floating-point near-tie sends the
engine's text elsewhere, the two price different answers)::

    python scripts/lab/replay_check.py traces.json [--modes target,sd,psd-exact,auto] \\
        [--sets code,edit] [--limit 2] [--repeats 1] [-t 2] [--json out.json]

Lossy modes are not replayable: their text leaves the target's, which the trace records.
"""

from __future__ import annotations

import pyramid_gguf.api  # noqa: F401  (llama.cpp before numpy)

# isort: split
import argparse
import json
import statistics
from pathlib import Path

from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.decoding.offline.replay import replay_trace
from pyramid_gguf.decoding.offline.traces import TraceSet
from pyramid_gguf.models.presets import DEFAULT_PRESET, resolve_preset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", type=Path)
    ap.add_argument("--preset", default=DEFAULT_PRESET)
    ap.add_argument("--modes", default="target,sd,psd-exact,auto")
    ap.add_argument("--sets", default="")
    ap.add_argument("--limit", type=int, default=0, help="traces per set (0: all)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    traces = TraceSet.load(args.traces)
    if args.sets:
        traces = traces.select(args.sets.split(","))
    chosen = []
    per_set: dict[str, int] = {}
    for t in traces.traces:
        per_set[t.set] = per_set.get(t.set, 0) + 1
        if not args.limit or per_set[t.set] <= args.limit:
            chosen.append(t)
    modes = args.modes.split(",")
    load = LoadConfig(n_threads=args.threads, n_threads_batch=args.threads)
    measured: dict[tuple[str, str], list[tuple[int, float]]] = {}
    #: Per set and mode: generations whose tokens are the trace's answer, of all generations.
    same: dict[tuple[str, str], list[bool]] = {}
    predicted: dict[tuple[str, str], list[tuple[int, float]]] = {}
    with Pyramid.load(resolve_preset(args.preset).paths, load=load) as p:
        p.calibrate(refresh=True, say=print)
        costs = p.costs()
        for _ in range(args.repeats):
            for t in chosen:
                sampling = SamplingConfig(temperature=0, max_tokens=len(t.answer))
                for mode in modes:
                    spec = SpecConfig(mode=mode)  # type: ignore[arg-type]
                    done = p.generate(list(t.prompt), sampling, spec)
                    s = done.stats
                    measured.setdefault((t.set, mode), []).append(
                        (s.generated_tokens, s.generation_seconds)
                    )
                    same.setdefault((t.set, mode), []).append(
                        list(done.token_ids) == list(t.answer)
                    )
        for t in chosen:
            for mode in modes:
                r = replay_trace(t, costs, SpecConfig(mode=mode))  # type: ignore[arg-type]
                predicted.setdefault((t.set, mode), []).append((len(r.tokens), r.seconds))

    def tps(rows: list[tuple[int, float]]) -> float:
        return sum(n for n, _ in rows) / sum(s for _, s in rows)

    print(
        f"\n{'set':<10} {'mode':<10} {'measured':>9} {'predicted':>9} {'ratio':>7}  "
        "trace's text  (tok/s)"
    )
    out = []
    for key in measured:
        m, q = tps(measured[key]), tps(predicted[key])
        kept = f"{sum(same[key])}/{len(same[key])}"
        out.append(
            {"set": key[0], "mode": key[1], "measured": m, "predicted": q, "trace_text": kept}
        )
        print(f"{key[0]:<10} {key[1]:<10} {m:>9.2f} {q:>9.2f} {q / m:>6.3f}x  {kept:>12}")
    ratios = [abs(r["predicted"] / r["measured"] - 1) for r in out]
    print(f"largest error {max(ratios):.1%}, median {statistics.median(ratios):.1%}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
