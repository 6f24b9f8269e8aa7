"""Ours and llama-server loaded side by side, every request sent to both in turn: paired ratios.

``scripts/parallel_bench.py`` measures one server, stops it, then the other: on a shared VM
whose speed drifts by 10-20% between minutes, the ratio of two such runs moves by as much as
the gap it is meant to show. Here both servers stay loaded (neither runs while the other is
measured; an idle server costs nothing), and each measurement is a pair taken back to back:

- one at a time: each chat prompt goes to one server, then the same prompt to the other, the
  first alternating (ABBA: prompt i of repeat r starts with ours when ``i + r`` is even);
- all at once: the N prompts together to one server, then together to the other, the first
  alternating by repeat.

Each pair gives one ratio, ours / llama-server in tok/s (a request's completion tokens over
its wall time, ours counting an answer's end token as llama-server counts its own; a phase's
over the wall time from its first send to its last finish), so a
drift slower than a pair (about 10 s one at a time, 25 s all at once on a 2-core CPU) cancels.
It prints every pair's ratio, their median and geometric mean per phase, the worst first token
of each side per phase (median over repeats), our step split all at once (``/metrics``; both
sides' with ``--against-mode``), and the bars of issue 52: four at once >= 1.1x, one at a time
>= 0.97x, worst first token no worse than llama-server's. Same servers, flags, prompts and
request bodies as parallel_bench.py.
``--against-mode MODE`` pairs ours with ours in ``--mode MODE`` instead of llama-server (issue
52's last bar: ``auto`` never below ``--mode target`` all at once, >= 1.0x). Ours runs with
``--no-ngram-pool`` unless ``--ngram-pool``: every prompt is sent again and again, and the pool
would draft an answer from the same prompt's earlier one, which llama-server cannot.

    python scripts/paired_serving.py [--peer-home ~/.cache/llama-peer] [--mode target] \\
        [--draft GGUF] [--against-mode target] [--parallel 4] [--max-tokens 128] \\
        [--ctx-size 4096] [--repeats 3] [--ngram-pool] [--json out.json]
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import signal
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType

import httpx
from common import free_port, geomean, peer_bin
from parallel_bench import (
    READY,
    REQUEST_TIMEOUT,
    Phase,
    Record,
    ServerProcess,
    body,
    chat,
    counted,
    ours_cmd,
    ours_env,
    peer_cmd,
    prompts,
    server_args,
    split_line,
    timed_phase,
)

SIDES = ("ours", "peer")
#: Issue 52's bars: ours / llama-server all at once, and one at a time.
TOGETHER_BAR, SOLO_BAR = 1.1, 0.97
#: A pair this far off par either way has its step splits printed (one at a time).
OUTLIER = 1.25


@dataclass
class Pair:
    """One measurement taken on both servers back to back."""

    phase: str  # "solo" (one prompt) or "together" (all N)
    repeat: int
    first: str  # the side measured first
    ours: Phase
    peer: Phase

    @property
    def ratio(self) -> float:
        """Ours / llama-server, tok/s (nan when either produced nothing)."""
        o, p = self.ours.tok_s, self.peer.tok_s
        return o / p if o > 0 and p > 0 else math.nan


@dataclass
class Verdict:
    """One phase's pairs summarised."""

    phase: str
    ratios: list[float] = field(default_factory=list)
    median: float = math.nan
    geomean: float = math.nan
    worst_ttft_ours: float = math.nan
    worst_ttft_peer: float = math.nan


def first_side(index: int, repeat: int) -> str:
    """ABBA: which side is measured first in pair ``index`` of repeat ``repeat``."""
    return SIDES[(index + repeat) % 2]


def verdict(pairs: list[Pair], phase: str) -> Verdict:
    """The pairs of ``phase``: ratios in order, their median and geometric mean, and each
    side's worst first token (a repeat's worst over its pairs; the median over repeats)."""
    mine = [p for p in pairs if p.phase == phase]
    v = Verdict(phase, [p.ratio for p in mine])
    good = [r for r in v.ratios if r == r]
    if good:
        v.median = statistics.median(good)
        v.geomean = geomean(good)
    for side in SIDES:
        worst: dict[int, float] = {}
        for p in mine:
            phase_of = p.ours if side == "ours" else p.peer
            worst[p.repeat] = max(worst.get(p.repeat, 0.0), phase_of.worst_ttft)
        if worst:
            setattr(v, f"worst_ttft_{side}", statistics.median(worst.values()))
    return v


def bars(
    solo: Verdict, together: Verdict, against: str | None = None
) -> list[tuple[str, bool, str]]:
    """Issue 52's bars on the medians of the pairs: (what, met, the numbers); against ours in
    ``--mode against``, the one bar: all at once never below it."""
    if against is not None:
        return [
            (
                f"all at once never below --mode {against}",
                together.median >= 1.0,
                f"{together.median:.3f}x",
            )
        ]
    return [
        (
            f"four at once >= {TOGETHER_BAR}x llama-server",
            together.median >= TOGETHER_BAR,
            f"{together.median:.3f}x",
        ),
        (
            f"one at a time >= {SOLO_BAR}x llama-server",
            solo.median >= SOLO_BAR,
            f"{solo.median:.3f}x",
        ),
        (
            "worst first token no worse than llama-server's, one at a time",
            solo.worst_ttft_ours <= solo.worst_ttft_peer,
            f"{solo.worst_ttft_ours:.2f} s vs {solo.worst_ttft_peer:.2f} s",
        ),
        (
            "worst first token no worse than llama-server's, all at once",
            together.worst_ttft_ours <= together.worst_ttft_peer,
            f"{together.worst_ttft_ours:.2f} s vs {together.worst_ttft_peer:.2f} s",
        ),
    ]


def in_turn(index: int, repeat: int) -> tuple[str, str]:
    """Both sides, the one measured first (:func:`first_side`) first."""
    first = first_side(index, repeat)
    return first, next(s for s in SIDES if s != first)


def checked(side: str, phase: Phase) -> Phase:
    """``phase``, or a one-line exit naming ``side``'s first failed request."""
    errors = [rec.error for rec in phase.records if rec.error]
    if errors:
        raise SystemExit(f"error: {side}: {len(errors)} request(s) failed: {errors[0]}")
    return phase


def one_request(
    args: argparse.Namespace, base: str, text: str, index: int, ours: bool = False
) -> Phase:
    """One streamed chat on a fresh connection, as a phase of one request; with ``ours``, the
    change of the server's counters over it (:func:`~parallel_bench.counted`)."""

    def run() -> Phase:
        with httpx.Client(timeout=REQUEST_TIMEOUT) as client:
            rec: Record = chat(client, base, body(args, text, args.max_tokens), index)
        return Phase([rec], rec.wall)

    return counted(base, ours, run)


def outlier(pair: Pair) -> bool:
    """Whether ``pair``'s ratio is off par by more than :data:`OUTLIER` either way (a stall of
    the VM, or a regression): its step splits are printed, to tell which."""
    r = pair.ratio
    return r == r and not 1 / OUTLIER <= r <= OUTLIER


def start(args: argparse.Namespace, side: str) -> ServerProcess:
    port = free_port()
    if side == "ours":
        cmd, env, ready = ours_cmd(args, port), ours_env(), READY
    elif args.against_mode is not None:
        other = argparse.Namespace(**{**vars(args), "mode": args.against_mode})
        cmd, env, ready = ours_cmd(other, port), ours_env(), READY
    else:
        cmd, env, ready = peer_cmd(args, port), None, None
    print(f"[{side}] {' '.join(cmd)}", flush=True)
    proc = ServerProcess(side, cmd, port, env)
    proc.wait_ready(ready)
    with httpx.Client(timeout=REQUEST_TIMEOUT) as client:
        warm = chat(client, proc.base, body(args, "Say hello.", 8), -1)
    if warm.error:
        raise SystemExit(f"error: {side}: warm-up failed: {warm.error}\n{proc.log_tail()}")
    return proc


def measure(args: argparse.Namespace, servers: dict[str, ServerProcess]) -> list[Pair]:
    texts = prompts(args.parallel)
    pairs: list[Pair] = []
    for r in range(args.repeats):
        for i, text in enumerate(texts):
            got = {
                side: checked(
                    side,
                    one_request(args, servers[side].base, text, i, ours_side(args, side)),
                )
                for side in in_turn(i, r)
            }
            pairs.append(Pair("solo", r, first_side(i, r), got["ours"], got["peer"]))
            print(f"  repeat {r + 1} prompt {i}: one at a time {pairs[-1].ratio:.3f}x", flush=True)
            if outlier(pairs[-1]):
                print_splits(args, got, "this one (off par)")
        got = {
            side: checked(
                side, timed_phase(args, servers[side].base, texts, True, ours_side(args, side))
            )
            for side in in_turn(0, r)
        }
        pairs.append(Pair("together", r, first_side(0, r), got["ours"], got["peer"]))
        print(
            f"  repeat {r + 1}: all at once {got['ours'].tok_s:.2f} vs "
            f"{got['peer'].tok_s:.2f} tok/s, {pairs[-1].ratio:.3f}x",
            flush=True,
        )
        print_splits(args, got, "all at once")
    return pairs


def print_splits(args: argparse.Namespace, got: dict[str, Phase], what: str) -> None:
    """Each of our sides' step split over its phase in ``got`` (llama-server has none)."""
    for side in SIDES:
        mode = args.against_mode
        label = side if side == "ours" or mode is None else f"--mode {mode}"
        if line := split_line(f"{label} {what}", got[side].metrics):
            print(line, flush=True)


def ours_side(args: argparse.Namespace, side: str) -> bool:
    """Whether ``side`` is one of our servers (whose ``/metrics`` give the step split)."""
    return side == "ours" or args.against_mode is not None


def report(args: argparse.Namespace, pairs: list[Pair]) -> tuple[Verdict, Verdict]:
    solo, together = verdict(pairs, "solo"), verdict(pairs, "together")
    other = "llama-server" if args.against_mode is None else f"--mode {args.against_mode}"
    print()
    for v, name in ((solo, "one at a time"), (together, "all at once")):
        cells = " ".join(f"{r:.3f}" for r in v.ratios)
        print(
            f"{name}: {len(v.ratios)} pairs, ours / {other}: {cells}; "
            f"median {v.median:.3f}x, geometric mean {v.geomean:.3f}x; worst first token "
            f"{v.worst_ttft_ours:.2f} s vs {v.worst_ttft_peer:.2f} s"
        )
    print()
    for what, met, numbers in bars(solo, together, args.against_mode):
        print(f"{'PASS' if met else 'MISS'}  {what}: {numbers}")
    return solo, together


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    server_args(ap, ctx_size=4096, mode="target")
    ap.add_argument("--against-mode", default=None, help="pair with ours in this --mode")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    args.model, args.peer_home = args.model.expanduser(), args.peer_home.expanduser()
    if args.parallel < 1 or args.repeats < 1 or args.max_tokens < 1:
        ap.exit(2, "error: --parallel, --repeats and --max-tokens must be at least 1\n")
    if not args.model.is_file():
        ap.exit(2, f"error: no model at {args.model}: pass --model PATH.gguf\n")
    if args.draft is not None and str(args.draft) != "ngram":
        args.draft = args.draft.expanduser()
        if not args.draft.is_file():
            ap.exit(2, f"error: no draft model at {args.draft}\n")
    if args.against_mode is None:
        try:
            args.peer_binary = peer_bin(args.peer_home, "llama-server")
        except SystemExit as e:
            ap.exit(2, f"error: {e}\n")
    args.ours_parallel = True
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    atexit.register(ServerProcess.stop_all)
    try:
        servers = {side: start(args, side) for side in ("peer", "ours")}
        pairs = measure(args, servers)
    finally:
        ServerProcess.stop_all()
    solo, together = report(args, pairs)
    if args.json:
        out = {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "verdicts": [asdict(solo), asdict(together)],
            "bars": [
                {"bar": b, "met": m, "numbers": n}
                for b, m, n in bars(solo, together, args.against_mode)
            ],
            "pairs": [asdict(p) for p in pairs],
        }
        args.json.write_text(json.dumps(out, indent=2))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
