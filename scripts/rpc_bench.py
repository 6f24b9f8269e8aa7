"""The target on another machine, priced on one: speculation over llama.cpp's RPC backend.

Starts ``pyramid-gguf rpc-server`` (loopback, tensors cached so a load sends no weights twice)
and, for each one-way delay of ``--delays`` (milliseconds; LAN, Wi-Fi, WAN), a TCP relay that
adds it (``scripts/rpc_relay.py``) between the client and that server. Through each relay it
measures, per prompt, greedy, ``-n`` tokens:

- pyramid-gguf ``target`` with the target over RPC (the reference), and ``auto`` with the draft
  (and the n-gram drafter) here and the target there, its costs calibrated through the link;
- llama.cpp's ``llama-bench`` tg with ``--rpc`` (its plain decoding over the same link) and
  ``llama-speculative-simple --rpc -md DRAFT -ngld 0`` (its speculation with the same draft
  here, the best of ``--spec-draft-n-max`` 3, its default, and 8), from
  ``../shared/tools/llama_peer.sh build`` (``--peer-home``).

``--mbps`` caps the relay's bandwidth too. ``--outputs here,there`` measures ours twice: the
target's output layer kept here (the default: a row brings back ``n_embd`` floats) and on the
server (``--rpc-output``: ``n_vocab`` logits a row cross the link).

llama.cpp's RPC server serves one client at a time, so each side loads, decodes and unloads in
turn. Prompts: the ``edit`` set (answers copy the prompt) and the ``qa`` set (they do not). Every
figure comes from this one run; ratios are taken within it.

    python scripts/rpc_bench.py --target 1.5b.gguf --draft 0.5b.gguf \\
        [--delays 0.1,1.5,10] [--mbps 100] [--outputs here,there] [-n 96] [--threads 2] \\
        [--peer-home ~/.cache/llama-peer] [--json F]
"""

from __future__ import annotations

# llama.cpp's libraries before numpy's (docs/ARCHITECTURE.md, "Loading order").
from pyramid_gguf import native  # noqa: F401  # isort: skip

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import PEER_HOME, free_port, geomean, peer_bin
from rpc_relay import Link, Relay

from pyramid_gguf import Pyramid
from pyramid_gguf.bench.prompts import BenchPrompt, load_prompt_sets
from pyramid_gguf.core.endpoints import Endpoint, probe
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.core.ladder import LadderPaths
from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.core.remote import RpcConfig
from pyramid_gguf.core.sampling import SamplingConfig
from pyramid_gguf.core.spec import SpecConfig

SPEED = re.compile(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds, speed:\s*([0-9.]+)\s*t/s")


def start_server(port: int, threads: int, cache: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "pyramid_gguf", "rpc-server", "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "-t", str(threads), "--cache", str(cache)], stdout=subprocess.DEVNULL
    )
    for _ in range(300):
        try:
            probe(Endpoint("127.0.0.1", port), 2.0)
            return proc
        except UserError:
            time.sleep(0.1)
    raise SystemExit("the RPC server did not start")


def peer_spec(args: argparse.Namespace, endpoint: str, prompt: str) -> float:
    """llama.cpp's speculation, the target on the RPC server and the draft here: tok/s at the
    best ``--spec-draft-n-max`` of ``--peer-n-max``."""
    return max(peer_spec_at(args, endpoint, prompt, int(n)) for n in args.peer_n_max.split(","))


def peer_spec_at(args: argparse.Namespace, endpoint: str, prompt: str, n_max: int) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt)
    cmd = [str(peer_bin(args.peer_home, "llama-speculative-simple")), "-m", str(args.target)]
    cmd += ["-md", str(args.draft), "--spec-type", "draft-simple"]
    cmd += ["--spec-draft-n-max", str(n_max), "--rpc", endpoint, "-ngl", "99", "-ngld", "0"]
    cmd += ["-f", f.name]
    cmd += ["-n", str(args.max_tokens), "-t", str(args.threads), "--temp", "0", "-c", "4096"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    Path(f.name).unlink()
    m = SPEED.search(done.stdout + done.stderr)
    if m is None:
        raise SystemExit(f"no speed in llama.cpp's output: {(done.stdout + done.stderr)[-1500:]}")
    return float(m.group(3))


def peer_plain(args: argparse.Namespace, endpoint: str) -> float:
    """llama.cpp's plain decoding over the same link: llama-bench tg, tok/s."""
    cmd = [str(peer_bin(args.peer_home, "llama-bench")), "-m", str(args.target), "--rpc"]
    cmd += [endpoint, "-ngl", "99", "-p", "0", "-n", str(args.max_tokens), "-r", "1"]
    cmd += ["-t", str(args.threads), "-o", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout)[0]["avg_ts"])


def ours(
    args: argparse.Namespace, endpoint: str, prompts: list[BenchPrompt], remote_output: bool
) -> tuple[dict[str, list[float]], list[str]]:
    """pyramid-gguf's ``target`` and ``auto`` over the link, the output layer here or (with
    ``remote_output``) on the server: tok/s per prompt; and each prompt in the target's chat
    template (what llama.cpp is given)."""
    load = LoadConfig(n_ctx=4096, n_threads=args.threads, n_threads_batch=args.threads)
    paths = LadderPaths.of(args.target, None, args.draft)
    out: dict[str, list[float]] = {"target": [], "auto": []}
    texts: list[str] = []
    rpc = RpcConfig((endpoint,), remote_output=remote_output)
    with Pyramid.load(paths, load=load, rpc=rpc) as p:
        p.calibrate(refresh=True)
        if args.verbose:
            for name, curve in p.costs().items():
                ms = " ".join(f"{curve(n) * 1e3:.0f}" for n in (1, 2, 4, 8, 16))
                print(f"    {name} ms at 1/2/4/8/16 tokens: {ms}", file=sys.stderr)
        sampling = SamplingConfig(temperature=0, max_tokens=args.max_tokens)
        for q in prompts:
            texts.append(p.apply_chat_template([{"role": "user", "content": q.text}]))
            tokens = p.tokenize(texts[-1])
            for mode in out:
                r = p.generate(tokens, sampling, SpecConfig(mode=mode))
                out[mode].append(r.stats.generation_tps)
                if args.verbose:
                    print(f"    {mode}: {r.stats.summary()}", file=sys.stderr)
    return out, texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--draft", type=Path, required=True)
    ap.add_argument("--delays", default="0.1,1.5,10", help="one-way delays, ms")
    ap.add_argument("--mbps", type=float, default=0.0, help="link bandwidth (0: unlimited)")
    ap.add_argument(
        "--outputs",
        default="here",
        help="where our target's output layer goes: here (the default), there (--rpc-output) "
        "or both, comma-separated",
    )
    ap.add_argument("-n", "--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=2, help="prompts per set")
    ap.add_argument("--sets", default="edit,qa", help="prompt sets (edit: answers copy)")
    ap.add_argument("--peer-n-max", default="3,8", help="llama.cpp's draft lengths tried")
    ap.add_argument("--peer-home", type=Path, default=PEER_HOME)
    ap.add_argument("--json", type=Path)
    ap.add_argument("-v", "--verbose", action="store_true", help="each generation's stats line")
    args = ap.parse_args()
    sets = {s: load_prompt_sets([s])[: args.prompts] for s in args.sets.split(",")}
    port = free_port()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as cache:
        server = start_server(port, args.threads, Path(cache))
        try:
            for delay in (float(d) for d in args.delays.split(",")):
                relay_port = free_port()
                link = Link(delay / 1000, args.mbps * 1e6)
                with Relay(("127.0.0.1", relay_port), ("127.0.0.1", port), link):
                    endpoint = f"127.0.0.1:{relay_port}"
                    row: dict[str, Any] = {"delay_ms": delay, "mbps": args.mbps}
                    for name, prompts in sets.items():
                        row[name] = {}
                        for place in args.outputs.split(","):
                            mine, texts = ours(args, endpoint, prompts, place == "there")
                            suffix = "" if place == "here" else "_there"
                            row[name]["target" + suffix] = mine["target"]
                            row[name]["auto" + suffix] = mine["auto"]
                        row[name]["peer_spec"] = [peer_spec(args, endpoint, t) for t in texts]
                    row["peer_plain"] = peer_plain(args, endpoint)
                results.append(row)
                report(row)
        finally:
            server.terminate()
            server.wait(10)
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args), "rows": results}, default=str))


def report(row: dict[str, Any]) -> None:
    link = f"one-way delay {row['delay_ms']:g} ms" + (
        f", {row['mbps']:g} Mbit/s" if row["mbps"] else ""
    )
    print(f"{link}: llama-bench tg over RPC {row['peer_plain']:.2f}")
    for name in (k for k in row if isinstance(row[k], dict)):
        r = row[name]
        s = geomean(r["peer_spec"])
        for suffix, where in (("", "output here"), ("_there", "output there")):
            if "target" + suffix not in r:
                continue
            t, a = geomean(r["target" + suffix]), geomean(r["auto" + suffix])
            print(
                f"  {name:5} {where:12} target {t:6.2f} tok/s  auto {a:6.2f} ({a / t:.2f}x)  "
                f"llama-speculative-simple {s:6.2f} (auto/it {a / s:.2f}x)",
                flush=True,
            )


if __name__ == "__main__":
    main()
