"""Predict ``auto`` against plain ``target`` decoding with the target behind a link (``--rpc``):
the shipped greedy answers replayed through the real scheduler, no model loaded.

Every figure this prints is **predicted**: the answers of
``pyramid_gguf/data/traces/qwen2.5-coder-demo.json`` (23 prompts, six sets, Qwen2.5-Coder 1.5B
Q4_K_M's greedy answers, with the 0.5B's argmax along each) replayed by
:func:`~pyramid_gguf.decoding.offline.replay.replay_trace` (``auto``'s own scheduler over scripted
tiers), every evaluation priced by the curves below. Plain decoding is one evaluation of one
token a round. A remote target's evaluation of ``n`` tokens costs, as the client sees it,

    C(n) = S(n) + 2 d + H(n) + 8 bytes(n) / B

- ``S(n)``: the server's evaluation of ``n`` tokens (``--servers``, below);
- ``2 d``: one round trip of the one-way delay ``d`` (``--delays``): ggml-rpc sends the inputs
  and the graph without waiting and waits once, for the result;
- ``H(n)``: the output layer for ``n`` rows on the client (the default; with ``--output there``
  it is part of ``S`` and ``H = 0``), priced by a CPU profile (``--local-cpu``);
- ``bytes(n)``: up, the ``n`` rows' embeddings (``4 n_embd`` each), positions and attention
  mask (``4 n_kv`` each, ``n_kv`` the answer's end rounded up to 256); down, ``4 n_embd`` per row,
  or ``4 n_vocab`` with the output layer there; over ``B`` = ``--mbps`` (0: unlimited). Not
  counted: the serialized graph (about 0.3 MB: ggml-rpc's 304-byte tensor records), which
  ggml-rpc sends again whenever the graph's shape changes (speculation's block sizes change it;
  plain decoding's mostly does not), so at low bandwidth these figures favour ``auto``.

Servers (``S``): ``cpu-rpc`` is **measured** end to end on the 2-core Xeon VM (one thread each
for an RPC server and the client; taken before the placement fix of ``native/rpc.py``, with
layer 0 on the client and the output layer on the server): the curve ``calibrate``
measured through a 10 ms relay (``docs/curves/xeon-rpc-1thread-...-calibrate-10ms.json``), its
20 ms round trip taken out, so ``S + H`` is measured there and the 0.5B draft's curve is the
client's measured one; ``cpu-rpc-bench`` is the same server timed alone by ``llama-bench -rpc``
(``...-llama-bench.json``), ``H`` priced by ``--local-cpu``. ``h100`` is the **measured**
H100 curve of the 1.5B's shape (``docs/gpu-h100/batch_cost.json``, every layer on the GPU),
less its output layer as the H100's profile prices it when the layer stays here. Any other
name is a shipped GPU profile (``pyramid-gguf plan --gpu list``): **profile-predicted** from
published llama.cpp figures (``published``) or the card's spec sheet (``spec-derived``). The
draft (the 0.5B, the traces' ``qualifier`` tier, as ``rpc_bench.py`` loads it) runs on the
client, priced by ``--local-cpu`` except with ``cpu-rpc``; ``--no-draft`` replays n-gram only.
``--local-cpu``: ``cpu-2core-epyc`` (the default, **measured**: this project's 2-core VM) or a
shipped desktop class (``ddr4-8core``, ``ddr5-16core``, ...: **spec-derived**). On a fast server
the client's output layer (a 191 MB matrix for the 1.5B) can cost more than the whole remote
evaluation, so the client matters as much as the card.

``--check`` replays what ``rpc_bench.py`` measured (10 ms, the first two prompts of ``edit``
and ``qa``, 64 tokens, each set priced by its own load's calibrated curves, then by the other
load's, then by the llama-bench server curve) and prints the measured figures beside them.

    python scripts/rpc_predict.py [--servers cpu-rpc,rtx-3060-12gb,rtx-4060-8gb,h100]
        [--delays 0.1,1.5,10] [--mbps 0] [--output here|there] [--sets edit,qa]
        [--prompts N] [-n 160] [--local-cpu cpu-2core-epyc] [--no-draft] [--json]
    python scripts/rpc_predict.py --check
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import geomean

from pyramid_gguf.core.errors import UserError
from pyramid_gguf.decoding.offline.replay import Replay, replay_trace
from pyramid_gguf.decoding.offline.traces import TierTrace, Trace, TraceSet
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.decoding.runtime.auto import ROUND_OVERHEAD
from pyramid_gguf.models.registry import get_preset
from pyramid_gguf.planning.compose import MAX_N, DeviceProfile, Shape
from pyramid_gguf.planning.devices import resolve
from pyramid_gguf.planning.memory import ModelMemory, shape_memory

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "pyramid_gguf/data/traces/qwen2.5-coder-demo.json"
CURVES = ROOT / "docs/curves"
CALIBRATED = CURVES / "xeon-rpc-1thread-qwen2.5-coder-1.5b-q4_k_m-calibrate-10ms.json"
BENCHED = CURVES / "xeon-rpc-1thread-qwen2.5-coder-1.5b-q4_k_m-llama-bench.json"
H100_MEASURED = ROOT / "docs/gpu-h100/batch_cost.json"
H100_MODEL = "synthetic-qwen-1.5b-q4_k_m.gguf"
PRESET = "qwen2.5-coder-demo"
#: Sizes every composed curve covers, as the device profiles do (beyond, a curve's own linear
#: extension).
SIZES = MAX_N
#: Row padding of llama.cpp's KV cache: what ``n_kv`` (the attention mask's width) rounds to.
KV_PAD = 256


@dataclass(frozen=True)
class Link:
    """The network between client and server: one-way ``delay`` (s), ``bandwidth`` (bits/s,
    0: unlimited), and where the output layer runs (``here``: the client)."""

    delay: float
    bandwidth: float
    output_here: bool

    def transfer(self, n: int, n_kv: int, mm: ModelMemory) -> float:
        """Seconds the bytes of one evaluation of ``n`` tokens take on the wire."""
        if self.bandwidth <= 0:
            return 0.0
        up = n * (4 * mm.n_embd + 4 + 4 * n_kv)
        down = n * 4 * (mm.n_embd if self.output_here else mm.n_vocab)
        return 8 * (up + down) / self.bandwidth


@dataclass(frozen=True)
class Server:
    """What evaluates the target's blocks: ``seconds(n)`` of ``S`` for ``n = 1..``, whether
    the client's output layer is already inside it (``with_head``, measured end to end), a
    measured draft curve of the client (``draft``, seconds) or None, and its ``basis``."""

    name: str
    basis: str
    seconds: tuple[float, ...]
    with_head: bool = False
    draft: tuple[float, ...] | None = None


def interpolate(points: Mapping[int, float], n_max: int) -> tuple[float, ...]:
    """Values at ``1..n_max`` from ``points`` (size -> value), linear between sizes and flat
    past the last (a curve extends itself beyond that)."""
    sizes = sorted(points)
    out = []
    for n in range(1, n_max + 1):
        if n >= sizes[-1]:
            out.append(points[sizes[-1]])
            continue
        hi = next(s for s in sizes if s >= n)
        lo = max(s for s in sizes if s <= n) if n >= sizes[0] else hi
        w = 0.0 if hi == lo else (n - lo) / (hi - lo)
        out.append(points[lo] + w * (points[hi] - points[lo]))
    return tuple(out)


def models() -> tuple[ModelMemory, ModelMemory]:
    """The target's and the 0.5B's memory facts, as ``models.toml`` ships their shapes."""
    preset = get_preset(PRESET)
    shapes = {}
    for name in ("target", "qualifier"):
        shape = preset.tiers[name].shape
        assert shape is not None, f"{PRESET}'s {name} ships no shape"
        shapes[name] = shape_memory(shape, f"{PRESET}/{name}")
    return shapes["target"], shapes["qualifier"]


def calibrated_server(set_name: str) -> Server:
    """``cpu-rpc``: the curve calibrated through the 10 ms link (``set_name``'s load), its
    round trip taken out; the client's draft as measured in the same load."""
    data = json.loads(CALIBRATED.read_text())
    run = data["runs"][set_name]
    rtt = 2 * data["delay_ms"] / 1000
    target = {n: ms / 1000 - rtt for n, ms in zip(data["sizes"], run["target_ms"], strict=True)}
    draft = {n: ms / 1000 for n, ms in zip(data["sizes"], run["draft_ms"], strict=True)}
    last = max(data["sizes"])
    return Server(
        "cpu-rpc",
        f"measured ({CALIBRATED.name}, {set_name} load)",
        interpolate(target, last),
        with_head=True,
        draft=interpolate(draft, last),
    )


def server(name: str, target: ModelMemory, output_here: bool) -> Server:
    """The server curve ``name`` stands for (see the module docstring)."""
    blocks = Shape(sum(target.layer_bytes), target.n_layer)
    if name in ("cpu-rpc", "cpu-rpc-bench") and not output_here:
        raise UserError(f"{name} is priced with the output layer here only (--output here)")
    if name == "cpu-rpc":
        return calibrated_server("edit")
    if name == "cpu-rpc-bench":
        data = json.loads(BENCHED.read_text())
        return Server(name, f"measured ({BENCHED.name})", tuple(data["seconds"]))
    try:
        entry = resolve("gpu", name)
    except UserError as e:
        raise UserError(f"server {name!r}: cpu-rpc, cpu-rpc-bench or a GPU profile ({e})") from e
    profile = DeviceProfile.load(entry.path)
    part = blocks if output_here else Shape(blocks.weight_bytes + target.head_bytes, blocks.n_layer)
    if entry.slug == "h100-80gb":
        measured = json.loads(H100_MEASURED.read_text())["ms_per_decode"][H100_MODEL]
        last = len(profile.per_byte)
        per_byte = [profile.per_byte[min(n, last) - 1] for n in range(1, len(measured) + 1)]
        head = [b * target.head_bytes if output_here else 0.0 for b in per_byte]
        seconds = tuple(ms / 1000 - h for ms, h in zip(measured, head, strict=True))
        return Server(entry.slug, f"measured ({H100_MEASURED.relative_to(ROOT)})", seconds)
    return Server(
        entry.slug,
        f"profile-predicted ({entry.basis}: {entry.fit_error})",
        tuple(profile.cost(n, part) for n in range(1, SIZES + 1)),
    )


def local_cpu(name: str) -> tuple[DeviceProfile, str]:
    """The client's CPU profile and its basis, in words."""
    entry = resolve("cpu", name)
    return DeviceProfile.load(entry.path), f"{entry.slug} ({entry.basis})"


def remote_curve(
    srv: Server, link: Link, cpu: DeviceProfile, target: ModelMemory, n_kv: int
) -> CostCurve:
    """``C(n)`` of the target behind ``link`` (module docstring), ``n = 1..SIZES``."""
    head = Shape(target.head_bytes, 0)
    base = CostCurve(srv.seconds)
    seconds = []
    for n in range(1, SIZES + 1):
        s = base(n) + 2 * link.delay + link.transfer(n, n_kv, target)
        if link.output_here and not srv.with_head:
            s += cpu.cost(n, head)
        seconds.append(s)
    return CostCurve(tuple(seconds))


def draft_curve(srv: Server, cpu: DeviceProfile, draft: ModelMemory) -> CostCurve:
    """The 0.5B on the client: measured with ``cpu-rpc``, else priced by the CPU profile."""
    if srv.draft is not None:
        return CostCurve(srv.draft)
    return cpu.curve(Shape.of(draft))


def as_two_tiers(trace: Trace, n: int, with_draft: bool) -> Trace:
    """``trace`` cut to ``n`` answer tokens, its ``qualifier`` (the 0.5B) as the draft of a
    target + draft ladder (``LadderPaths.of(target, None, draft)``, as ``rpc_bench`` loads)."""
    tiers = {}
    if with_draft and "qualifier" in trace.tiers:
        q = trace.tiers["qualifier"]
        tiers["draft"] = TierTrace(q.argmax[:n], q.top[:n], q.overlap[:n])
    return Trace(trace.key, trace.set, trace.prompt, trace.answer[:n], tiers)


def rounds(r: Replay) -> dict[str, int]:
    """Rounds per chain ``auto`` ran (``target``: plain rounds)."""
    return {c.chain: c.rounds for c in r.auto.choices.values()}


def predict_set(
    traces: Sequence[Trace],
    srv: Server,
    link: Link,
    cpu: DeviceProfile,
    shapes: tuple[ModelMemory, ModelMemory],
    n: int,
    with_draft: bool,
) -> dict[str, Any]:
    """One set at one link: per prompt and geometric means, tok/s (predicted)."""
    target, draft = shapes
    rows: list[dict[str, Any]] = []
    chains: dict[str, int] = {}
    for t in traces:
        cut = as_two_tiers(t, n, with_draft)
        n_kv = -(-(len(cut.prompt) + len(cut.answer)) // KV_PAD) * KV_PAD
        c = remote_curve(srv, link, cpu, target, n_kv)
        costs = {"target": c}
        if with_draft:
            costs["draft"] = draft_curve(srv, cpu, draft)
        r = replay_trace(cut, costs)
        plain = 1.0 / (c(1) + ROUND_OVERHEAD)
        rows.append({"key": t.key, "target_tps": plain, "auto_tps": plain * r.speedup})
        for chain, k in rounds(r).items():
            chains[chain] = chains.get(chain, 0) + k
    tps_t = geomean([r["target_tps"] for r in rows])
    tps_a = geomean([r["auto_tps"] for r in rows])
    return {
        "target_tps": tps_t,
        "auto_tps": tps_a,
        "ratio": tps_a / tps_t,
        "rounds": chains,
        "prompts": rows,
    }


def load_traces(sets: Sequence[str] | None, per_set: int) -> dict[str, list[Trace]]:
    """The shipped traces by set, the first ``per_set`` of each (0: all)."""
    ts = TraceSet.load(TRACES).select(sets)
    out: dict[str, list[Trace]] = {}
    for t in ts.traces:
        out.setdefault(t.set, []).append(t)
    return {k: v[:per_set] if per_set else v for k, v in out.items()}


def fmt_rounds(chains: Mapping[str, int]) -> str:
    return " ".join(f"{k} {v}" for k, v in sorted(chains.items(), key=lambda kv: -kv[1]))


def run_predict(args: argparse.Namespace) -> dict[str, Any]:
    shapes = models()
    cpu, cpu_basis = local_cpu(args.local_cpu)
    traces = load_traces(args.sets.split(",") if args.sets else None, args.prompts)
    output_here = args.output == "here"
    out: dict[str, Any] = {
        "predicted": True,
        "from": f"{TRACES.relative_to(ROOT)} replayed by auto's scheduler",
        "local_cpu": cpu_basis,
        "tokens": args.max_tokens,
        "output": args.output,
        "mbps": args.mbps,
        "draft": not args.no_draft,
        "servers": [],
    }
    for name in args.servers.split(","):
        srv = server(name, shapes[0], output_here)
        entry: dict[str, Any] = {"server": srv.name, "basis": srv.basis, "delays": []}
        for d in (float(x) for x in args.delays.split(",")):
            link = Link(d / 1000, args.mbps * 1e6, output_here)
            sets = {
                s: predict_set(ts, srv, link, cpu, shapes, args.max_tokens, not args.no_draft)
                for s, ts in traces.items()
            }
            entry["delays"].append({"delay_ms": d, "sets": sets})
        out["servers"].append(entry)
    return out


def print_predict(out: Mapping[str, Any]) -> None:
    link = "unlimited bandwidth" if not out["mbps"] else f"{out['mbps']:g} Mbit/s"
    draft = "the 0.5B draft and n-grams" if out["draft"] else "n-grams only"
    print(
        f"PREDICTED (not measured): {out['from']}, {out['tokens']} tokens, greedy; {link}; "
        f"output layer {out['output']}; auto with {draft}; client CPU {out['local_cpu']}"
    )
    for entry in out["servers"]:
        print(f"\nserver {entry['server']}: {entry['basis']}")
        print(
            f"{'delay':>8s} {'set':10s} {'target tok/s':>12s} {'auto tok/s':>11s} "
            f"{'auto/target':>11s}  rounds"
        )
        for row in entry["delays"]:
            for name, s in row["sets"].items():
                print(
                    f"{row['delay_ms']:>6g}ms {name:10s} {s['target_tps']:12.2f} "
                    f"{s['auto_tps']:11.2f} {s['ratio']:10.2f}x  {fmt_rounds(s['rounds'])}"
                )


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    """The replay of what ``rpc_bench.py`` measured at 10 ms, beside the measurement."""
    shapes = models()
    data = json.loads(CALIBRATED.read_text())
    cpu, cpu_basis = local_cpu(args.local_cpu)
    link = Link(data["delay_ms"] / 1000, 0.0, True)
    traces = load_traces(list(data["runs"]), 0)
    bench = server("cpu-rpc-bench", shapes[0], True)
    names = list(data["runs"])
    other = {a: b for a, b in zip(names, names[::-1], strict=True)}
    rows = {}
    for set_name, run in data["runs"].items():
        picked = [t for t in traces[set_name] if t.key in run["prompts"]]
        measured_t, measured_a = geomean(run["target_tps"]), geomean(run["auto_tps"])
        rows[set_name] = {
            "measured": {
                "target_tps": measured_t,
                "auto_tps": measured_a,
                "ratio": measured_a / measured_t,
            },
            "predicted, calibrated curve": predict_set(
                picked, calibrated_server(set_name), link, cpu, shapes, 64, True
            ),
            "predicted, the other load's calibrated curve": predict_set(
                picked, calibrated_server(other[set_name]), link, cpu, shapes, 64, True
            ),
            "predicted, llama-bench server + client head": predict_set(
                picked, bench, link, cpu, shapes, 64, True
            ),
            "answer tokens": {t.key: min(len(t.answer), 64) for t in picked},
        }
    return {"delay_ms": data["delay_ms"], "local_cpu": cpu_basis, "sets": rows}


def print_check(out: Mapping[str, Any]) -> None:
    print(
        f"check at {out['delay_ms']:g} ms one-way: measured (scripts/rpc_bench.py) against "
        f"predicted (replayed, 64 tokens; client head priced by {out['local_cpu']})"
    )
    print(f"{'set':5s} {'':45s} {'target tok/s':>12s} {'auto tok/s':>11s} {'auto/target':>11s}")
    for name, row in out["sets"].items():
        for label in ("measured", *(k for k in row if k.startswith("predicted"))):
            s = row[label]
            print(
                f"{name:5s} {label:45s} {s['target_tps']:12.2f} {s['auto_tps']:11.2f} "
                f"{s['ratio']:10.2f}x  {fmt_rounds(s.get('rounds', {}))}"
            )
        print(f"      trace answers replayed: {row['answer tokens']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default="cpu-rpc,rtx-3060-12gb,rtx-4060-8gb,h100")
    ap.add_argument("--delays", default="0.1,1.5,10", help="one-way delays, ms")
    ap.add_argument("--mbps", type=float, default=0.0, help="link bandwidth (0: unlimited)")
    where = "the target's output layer: here (the default) or there (--rpc-output)"
    ap.add_argument("--output", choices=("here", "there"), default="here", help=where)
    ap.add_argument("--sets", default="", help="prompt sets, comma-separated (default: all)")
    ap.add_argument("--prompts", type=int, default=0, help="prompts per set (0: all)")
    ap.add_argument("-n", "--max-tokens", type=int, default=160)
    ap.add_argument("--local-cpu", default="cpu-2core-epyc", help="the client's CPU profile")
    ap.add_argument("--no-draft", action="store_true", help="n-gram drafting only")
    ap.add_argument("--check", action="store_true", help="replay the measured 10 ms run")
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = ap.parse_args()
    if args.max_tokens < 2:
        ap.error("-n must be at least 2")
    try:
        delays = [float(d) for d in args.delays.split(",")]
    except ValueError:
        ap.error(f"--delays takes milliseconds, comma-separated, not {args.delays!r}")
    if any(d < 0 for d in delays) or args.mbps < 0:
        ap.error("delays and --mbps cannot be negative")
    try:
        out = run_check(args) if args.check else run_predict(args)
    except UserError as e:
        sys.exit(f"Error: {e}")
    if args.json:
        print(json.dumps(out, indent=1))
    elif args.check:
        print_check(out)
    else:
        print_predict(out)


if __name__ == "__main__":
    main()
