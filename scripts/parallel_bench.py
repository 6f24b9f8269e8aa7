"""Parallel slots: ``pyramid-gguf serve --parallel N`` against llama.cpp's ``llama-server -np N``.

Builds nothing: point ``--peer-home`` at the folder ``../shared/tools/llama_peer.sh build``
filled (its ``PEER_HOME``; the binary is ``llama_cpp_python-*/vendor/llama.cpp/build/bin/
llama-server``). Each server is started on the same GGUF file with the same threads, ``N``
slots of ``--ctx-size`` tokens each (``-c N*C`` for llama-server, whose ``-c`` is the total),
and otherwise its own defaults; the exact command lines are printed. The two are never loaded
together: one starts, is measured and stops, then the other; each repeat swaps which goes
first. After ``GET /health`` answers 200 and one short untimed warm-up request, each server
gets ``N`` chat prompts (four short coding and chat questions, cycled with a number when ``N``
is larger) on ``/v1/chat/completions``, the same request bodies on both sides (greedy:
``temperature: 0``, ``max_tokens``, ``stream: true`` with ``stream_options.include_usage``):

- one at a time: the prompts in turn, each sent when the previous one finished;
- all at once: every prompt sent together, one thread each.

Per request it records wall time, completion tokens (the usage of the final chunk; content
chunks counted where a server sends none), time to first token (until the first SSE chunk
carrying content), the prompt tokens evaluated and reused from a cache (``timings``'
``prompt_n`` and ``cache_n``, printed per request) and the answer. A phase's tok/s is its
completion tokens over the wall time from its first send to its last finish. Answers of the
concurrent phase are compared with the same prompt's answer one at a time (batched evaluation
may move floating-point near-ties).
Both servers keep their prompt caches on, as by default, so the phase that runs second (all at
once, unless ``--together-first``) may reuse the prompts the first one evaluated, alike on both
sides: its time to first token is then mostly the wait for a slot, not prompt evaluation.

It prints, per server (medians over repeats): tok/s one at a time and all at once, the speedup,
worst TTFT of each phase, answers equal to solo; then ours over llama-server all at once, and
the goals: ours all at once >= 1.5x ours one at a time, >= 1.0x llama-server all at once, and
ours worst TTFT all at once <= 4x ours solo TTFT (the median one-at-a-time TTFT) + 2 s.
``--json`` keeps every request's record.

Ours runs with ``--no-ngram-pool`` unless ``--ngram-pool``: each phase sends the prompts
the other phase sent, and the pool would draft every answer from the same prompt's earlier one
(up to 2.5x llama-server all at once on a 2-core Xeon, against about 1.0x without it; llama-server
has no such recall). ``--ours-arg`` passes more flags to ours. On a VM whose
speed drifts between minutes, ``scripts/paired_serving.py`` (both loaded, each request sent to
both in turn) gives the ratio this script's whole-run pairs blur.

    python scripts/parallel_bench.py --peer-home ~/.cache/llama-peer [--parallel 4] \\
        [--max-tokens 128] [--threads 2] [--mode auto] [--draft GGUF] [--repeats 1] \\
        [--only ours|peer | --skip-peer] [--together-first] [--ngram-pool] [--ours-arg=FLAG] \\
        [--json out.json]
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar

import httpx

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT.parent / "shared" / "tools" / "llama_peer.sh"
DEFAULT_MODEL = "~/.cache/pyramid-gguf/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
PEER_BINARY = "llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server"
PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain what a Python generator is, with a short example.",
    "Write a bash one-liner that counts lines in all .py files.",
    "Summarise what a hash map is in three sentences.",
)
READY = re.compile(r"serving .* on (http://\S+)/v1")
#: Seconds a server may take to load before /health must answer 200.
START_TIMEOUT = 600.0
#: Seconds one streamed request may take.
REQUEST_TIMEOUT = 1800.0


def prompts(n: int) -> list[str]:
    """``n`` prompts: the four shipped ones, cycled with a number after the first round."""
    out = []
    for i in range(n):
        base = PROMPTS[i % len(PROMPTS)]
        out.append(base if i < len(PROMPTS) else f"{base} ({i // len(PROMPTS) + 1})")
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# ---------------------------------------------------------------------------------------------
# servers


class ServerProcess:
    """A server in its own process group, its output in a log file; stopped (the whole group)
    on :meth:`stop`, on leaving the ``with`` block and on the interpreter's exit."""

    live: ClassVar[set[ServerProcess]] = set()

    def __init__(self, name: str, cmd: list[str], port: int, env: dict[str, str] | None = None):
        self.name, self.cmd, self.port = name, cmd, port
        self.base = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed in stop)
            "w+", prefix=f"parallel_bench_{name}_", suffix=".log", delete=False
        )
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
        ServerProcess.live.add(self)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, n: int = 25) -> str:
        self.log.flush()
        lines = Path(self.log.name).read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def wait_ready(self, ready_line: re.Pattern[str] | None = None) -> float:
        """Seconds until ``GET /health`` answers 200 (and ``ready_line`` is in the log); a
        ``SystemExit`` with the log's tail if the process dies or takes too long."""
        t0 = time.perf_counter()
        with httpx.Client(timeout=5.0) as client:
            while time.perf_counter() - t0 < START_TIMEOUT:
                if self.proc.poll() is not None:
                    raise SystemExit(
                        f"{self.name} exited with {self.proc.returncode} while loading:\n"
                        f"  {' '.join(self.cmd)}\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.base}/health").status_code == 200 and (
                        ready_line is None or ready_line.search(self.log_tail(200))
                    ):
                        return time.perf_counter() - t0
                time.sleep(0.5)
        raise SystemExit(f"{self.name} not ready after {START_TIMEOUT:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self in ServerProcess.live:
            ServerProcess.live.discard(self)
            for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
                if self.proc.poll() is not None:
                    break
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(wait)
            self.log.close()
            with contextlib.suppress(OSError):
                os.unlink(self.log.name)

    @classmethod
    def stop_all(cls) -> None:
        for s in list(cls.live):
            s.stop()


def ours_has_parallel() -> bool:
    """Whether this tree's ``pyramid-gguf serve`` takes ``--parallel``."""
    r = subprocess.run(
        [sys.executable, "-m", "pyramid_gguf", "serve", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=ours_env(),
    )
    if r.returncode != 0:
        raise SystemExit(f"pyramid-gguf serve --help failed:\n{r.stdout}{r.stderr}")
    return "--parallel" in r.stdout


def ours_env() -> dict[str, str]:
    """The environment ours runs in: this checkout's ``pyramid_gguf`` first on the path."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)}


def ours_cmd(args: argparse.Namespace, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "pyramid_gguf", "serve", "-m", str(args.model)]
    if args.ours_parallel:
        cmd += ["--parallel", str(args.parallel)]
    cmd += ["--threads", str(args.threads), "--ctx-size", str(args.ctx_size)]
    cmd += ["--mode", args.mode]
    if args.draft is not None:
        cmd += ["--draft", str(args.draft)]
    if not args.ngram_pool:  # the prompts come again: the pool would recall their answers
        cmd.append("--no-ngram-pool")
    cmd += [flag for extra in args.ours_arg for flag in extra.split()]
    return [*cmd, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]


def peer_cmd(args: argparse.Namespace, port: int) -> list[str]:
    n, t = args.parallel, str(args.threads)
    return [
        str(args.peer_binary),
        *("-m", str(args.model), "-np", str(n), "-c", str(args.ctx_size * n)),
        *("-t", t, "-tb", t, "--temp", "0", "--host", "127.0.0.1", "--port", str(port)),
    ]


def peer_binary(args: argparse.Namespace) -> Path:
    path: Path = args.peer_home / PEER_BINARY
    if path.is_file():
        return path
    found = sorted(args.peer_home.glob("*/vendor/llama.cpp/build/bin/llama-server"))
    if found:
        return found[-1]
    raise SystemExit(
        f"no llama-server at {path}: run `PEER_HOME={args.peer_home} {TOOL} build` "
        "(several minutes), or pass --skip-peer"
    )


# ---------------------------------------------------------------------------------------------
# requests


@dataclass
class Record:
    prompt: int
    text: str = ""
    tokens: int = 0
    usage: bool = False  # tokens from the server's usage (else content chunks counted)
    chunks: int = 0
    sent: float = 0.0  # perf_counter at send
    ttft: float = float("nan")
    wall: float = 0.0
    finish_reason: str | None = None
    error: str | None = None
    #: llama-server's own ``timings`` of the request (final chunk): ms per generated token.
    ms_per_token: float = float("nan")
    #: ``timings`` (both servers): prompt tokens evaluated, and reused from a cache.
    prompt_n: int | None = None
    cache_n: int | None = None


def body(args: argparse.Namespace, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": args.model.name,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def sse_events(resp: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON payloads of ``data: ...`` lines, until ``data: [DONE]``."""
    for line in resp.iter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        if data:
            yield json.loads(data)


def chat(client: httpx.Client, base: str, payload: dict[str, Any], index: int) -> Record:
    """One streamed chat completion, timed."""
    rec = Record(prompt=index)
    parts: list[str] = []
    rec.sent = time.perf_counter()
    try:
        with client.stream("POST", f"{base}/v1/chat/completions", json=payload) as resp:
            if resp.status_code != 200:
                resp.read()
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
            for event in sse_events(resp):
                if "error" in event:
                    raise RuntimeError(f"error event: {json.dumps(event)[:300]}")
                for choice in event.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if not parts:
                            rec.ttft = time.perf_counter() - rec.sent
                        parts.append(content)
                        rec.chunks += 1
                    if choice.get("finish_reason"):
                        rec.finish_reason = choice["finish_reason"]
                timings = event.get("timings") or {}
                if timings.get("predicted_per_token_ms") is not None:
                    rec.ms_per_token = float(timings["predicted_per_token_ms"])
                if timings.get("prompt_n") is not None:
                    rec.prompt_n = int(timings["prompt_n"])
                    rec.cache_n = int(timings.get("cache_n") or 0)
                usage = event.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    rec.tokens, rec.usage = int(usage["completion_tokens"]), True
    except (httpx.HTTPError, RuntimeError, json.JSONDecodeError) as e:
        rec.error = f"{type(e).__name__}: {e}"
    rec.wall = time.perf_counter() - rec.sent
    rec.text = "".join(parts)
    if not rec.usage:
        rec.tokens = rec.chunks
    return rec


@dataclass
class Phase:
    records: list[Record]
    wall: float
    #: Ours: the /metrics counters' change over the phase (``pyramid_gguf:`` names).
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.records)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall if self.wall > 0 else 0.0

    @property
    def worst_ttft(self) -> float:
        """The longest time to first token (``inf`` if an answer had no content)."""
        return max(r.ttft if r.ttft == r.ttft else math.inf for r in self.records)


def one_at_a_time(args: argparse.Namespace, base: str, texts: list[str]) -> Phase:
    with httpx.Client(timeout=REQUEST_TIMEOUT) as client:
        t0 = time.perf_counter()
        recs = [chat(client, base, body(args, p, args.max_tokens), i) for i, p in enumerate(texts)]
    return Phase(recs, time.perf_counter() - t0)


def all_at_once(args: argparse.Namespace, base: str, texts: list[str]) -> Phase:
    recs: list[Record | None] = [None] * len(texts)
    go = threading.Barrier(len(texts) + 1)

    def worker(i: int, p: str) -> None:
        with httpx.Client(timeout=REQUEST_TIMEOUT) as client:
            go.wait()
            recs[i] = chat(client, base, body(args, p, args.max_tokens), i)

    threads = [
        threading.Thread(target=worker, args=(i, p), daemon=True) for i, p in enumerate(texts)
    ]
    for th in threads:
        th.start()
    go.wait()
    for th in threads:
        th.join()
    done = [r for r in recs if r is not None]
    first = min(r.sent for r in done)
    last = max(r.sent + r.wall for r in done)
    return Phase(done, last - first)


def read_metrics(client: httpx.Client, base: str) -> dict[str, float]:
    """Our ``/metrics`` as ``{name{labels}: value}`` (``pyramid_gguf:`` ones, prefix cut)."""
    out: dict[str, float] = {}
    resp = client.get(f"{base}/metrics")
    if resp.status_code != 200:
        return out
    for line in resp.text.splitlines():
        if line.startswith("pyramid_gguf:"):
            name, _, value = line[len("pyramid_gguf:") :].rpartition(" ")
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


def timed_phase(
    args: argparse.Namespace, base: str, texts: list[str], together: bool, ours: bool
) -> Phase:
    """One phase, with the change of our counters over it (:func:`counted`)."""
    phase = all_at_once if together else one_at_a_time
    return counted(base, ours, lambda: phase(args, base, texts))


def counted(base: str, ours: bool, run: Callable[[], Phase]) -> Phase:
    """The phase ``run`` measures; on our server (``ours``), with the change of its counters
    over it (read before and after, outside the phase's wall time) and our end tokens counted
    (:func:`with_end_tokens`)."""
    if not ours:
        return run()
    with httpx.Client(timeout=30.0) as client:
        before = read_metrics(client, base)
        phase = run()
        after = read_metrics(client, base)
    phase.metrics = {k: after[k] - before.get(k, 0.0) for k in after}
    return with_end_tokens(phase)


def with_end_tokens(phase: Phase) -> Phase:
    """Our records counted as llama-server counts its own: an answer that ended at its
    end-of-generation token (``finish_reason`` "stop"; these requests send no stop strings)
    has that token counted too. Our ``completion_tokens`` leave it out, llama-server's
    include it (54 against 55 for the same text): without this, every answer that stops
    early reads 1-2% slower on our side for the same work."""
    for rec in phase.records:
        if rec.finish_reason == "stop" and rec.usage:
            rec.tokens += 1
    return phase


#: The step split's parts: (label, /metrics sample) for all steps, and for shared ones.
SPLIT = (
    ("llama_decode", 'step_seconds_total{part="llama_decode"}'),
    ("rest of batch", 'step_seconds_total{part="batch_other"}'),
    ("slots' work", 'step_seconds_total{part="slot_work"}'),
    ("hand-off", 'step_seconds_total{part="handoff"}'),
)
SHARED = (
    ("llama_decode", 'shared_step_seconds_total{part="llama_decode"}'),
    ("rest of batch", 'shared_step_seconds_total{part="batch_other"}'),
    ("between batches", 'shared_step_seconds_total{part="between"}'),
)


def step_split(m: dict[str, float]) -> dict[str, float]:
    """Per step, in ms: the parts of a step (all batches), of a batch of several slots and the
    gap before it, and the share of those several-slot steps outside ``llama_decode``; and the
    padding rows the batches carried."""
    out: dict[str, float] = {}
    if not m:
        return out
    n = m.get("n_decode_total", 0.0)
    shared = m.get("shared_steps_total", 0.0)
    out["batches"], out["shared_batches"] = n, shared
    for label, key in SPLIT:
        out[label] = 1000 * m.get(key, 0.0) / n if n else 0.0
    total = 0.0
    for label, key in SHARED:
        v = m.get(key, 0.0)
        total += v
        out[f"shared {label}"] = 1000 * v / shared if shared else 0.0
    out["shared step"] = 1000 * total / shared if shared else 0.0
    dec = m.get(SHARED[0][1], 0.0)
    out["shared outside"] = 1 - dec / total if total else 0.0
    out["slot wake"] = 1000 * m.get("slot_wake_seconds_total", 0.0) / n if n else 0.0
    out["slot work"] = 1000 * m.get("slot_work_seconds_total", 0.0) / n if n else 0.0
    out["padding rows"] = m.get("batch_padding_rows_total", 0.0)
    return out


def split_line(name: str, m: dict[str, float]) -> str:
    s = step_split(m)
    if not s:
        return ""
    parts = ", ".join(f"{label} {s[label]:.1f}" for label, _ in SPLIT)
    line = f"    {name}: {s['batches']:.0f} batches, per batch ms: {parts}"
    if s["shared_batches"]:
        line += (
            f"; {s['shared_batches']:.0f} of several slots: step {s['shared step']:.1f} ms, "
            f"llama_decode {s['shared llama_decode']:.1f}, rest of batch "
            f"{s['shared rest of batch']:.1f}, between {s['shared between batches']:.1f} "
            f"({100 * s['shared outside']:.1f}% outside llama_decode)"
        )
    if s["padding rows"]:
        line += f"; {s['padding rows']:.0f} padding rows (a cheaper kernel)"
    return line


def prompt_line(name: str, phase: Phase) -> str:
    """Per request (the server's ``timings``): prompt tokens evaluated + reused from a cache,
    and time to first token, in send order."""
    recs = [r for r in phase.records if r.prompt_n is not None]
    if not recs:
        return ""
    cells = ", ".join(f"{r.prompt_n}+{r.cache_n} in {r.ttft:.2f} s" for r in recs)
    return f"    {name}: prompt tokens evaluated+cached, and TTFT, per request: {cells}"


@dataclass
class Run:
    """One server's measurement in one repeat."""

    server: str
    repeat: int
    cmd: list[str]
    load_s: float
    solo: Phase
    together: Phase
    equal: list[bool] = field(default_factory=list)


def measure(args: argparse.Namespace, server: str, repeat: int) -> Run:
    port = free_port()
    if server == "ours":
        cmd, env, ready = ours_cmd(args, port), ours_env(), READY
    else:
        cmd, env, ready = peer_cmd(args, port), None, None
    print(f"\n[{server}, repeat {repeat + 1}] {' '.join(cmd)}", flush=True)
    with ServerProcess(server, cmd, port, env) as proc:
        load_s = proc.wait_ready(ready)
        with httpx.Client(timeout=REQUEST_TIMEOUT) as client:
            warm = chat(client, proc.base, body(args, "Say hello.", 8), -1)
        if warm.error:
            raise SystemExit(f"{server}: warm-up failed: {warm.error}\n{proc.log_tail()}")
        texts = prompts(args.parallel)
        ours = server == "ours"
        if args.together_first:
            together = timed_phase(args, proc.base, texts, True, ours)
            solo = timed_phase(args, proc.base, texts, False, ours)
        else:
            solo = timed_phase(args, proc.base, texts, False, ours)
            together = timed_phase(args, proc.base, texts, True, ours)
        errors = [r.error for r in (*solo.records, *together.records) if r.error]
        if errors:
            raise SystemExit(f"{server}: {len(errors)} request(s) failed: {errors[0]}")
    equal = [a.text == b.text for a, b in zip(solo.records, together.records, strict=True)]
    run = Run(server, repeat, cmd, load_s, solo, together, equal)
    print(
        f"  loaded in {load_s:.1f} s; one at a time {solo.tokens} tokens in {solo.wall:.1f} s "
        f"({solo.tok_s:.2f} tok/s), all at once {together.tokens} tokens in "
        f"{together.wall:.1f} s ({together.tok_s:.2f} tok/s); "
        f"answers equal to solo {sum(equal)}/{len(equal)}; worst TTFT one at a time "
        f"{solo.worst_ttft:.2f} s, all at once {together.worst_ttft:.2f} s",
        flush=True,
    )
    for name, phase in (("one at a time", solo), ("all at once", together)):
        if line := prompt_line(name, phase):
            print(line, flush=True)
        if line := split_line(name, phase.metrics):
            print(line, flush=True)
        own = [r.ms_per_token for r in phase.records if r.ms_per_token == r.ms_per_token]
        if own:  # llama-server's: with every slot decoding, a token per slot per step
            print(
                f"    {name}: ms per generated token by llama-server's own timings, median "
                f"{statistics.median(own):.1f} (of {len(own)} requests)",
                flush=True,
            )
    return run


# ---------------------------------------------------------------------------------------------
# summary


def summarize(runs: list[Run]) -> dict[str, dict[str, Any]]:
    """Per server: medians over repeats of each phase's tok/s and worst TTFT, the speedup, the
    median one-at-a-time TTFT of every request, and answers equal to solo over all repeats."""
    out: dict[str, dict[str, Any]] = {}
    for server in dict.fromkeys(r.server for r in runs):
        mine = [r for r in runs if r.server == server]
        solo = statistics.median(r.solo.tok_s for r in mine)
        together = statistics.median(r.together.tok_s for r in mine)
        out[server] = {
            "solo_tok_s": solo,
            "together_tok_s": together,
            "speedup": together / solo if solo > 0 else float("nan"),
            "worst_ttft_solo": statistics.median(r.solo.worst_ttft for r in mine),
            "worst_ttft_together": statistics.median(r.together.worst_ttft for r in mine),
            "median_ttft_solo": statistics.median(
                t.ttft if t.ttft == t.ttft else math.inf for r in mine for t in r.solo.records
            ),
            "equal": sum(sum(r.equal) for r in mine),
            "compared": sum(len(r.equal) for r in mine),
            "all_tokens_from_usage": all(t.usage for r in mine for t in r.solo.records),
        }
    return out


def goals(summary: dict[str, dict[str, Any]]) -> list[tuple[str, bool | None, str]]:
    """The three goals: (what, met or None where not measured, the numbers)."""
    out: list[tuple[str, bool | None, str]] = []
    ours, peer = summary.get("ours"), summary.get("peer")
    if ours is None:
        return out
    out.append(
        (
            "ours all at once >= 1.5x ours one at a time",
            ours["speedup"] >= 1.5,
            f"{ours['speedup']:.2f}x",
        )
    )
    if peer is not None:
        ratio = ours["together_tok_s"] / peer["together_tok_s"]
        out.append(
            ("ours all at once >= 1.0x llama-server all at once", ratio >= 1.0, f"{ratio:.2f}x")
        )
    else:
        out.append(("ours all at once >= 1.0x llama-server all at once", None, "not measured"))
    bound = 4 * ours["median_ttft_solo"] + 2
    out.append(
        (
            "ours worst TTFT all at once <= 4x solo TTFT + 2 s",
            ours["worst_ttft_together"] <= bound,
            f"{ours['worst_ttft_together']:.2f} s <= {bound:.2f} s "
            f"(solo {ours['median_ttft_solo']:.2f} s)",
        )
    )
    return out


def print_table(summary: dict[str, dict[str, Any]], n: int) -> None:
    names = {"ours": "pyramid-gguf", "peer": "llama-server"}
    head = [
        "server",
        "one at a time tok/s",
        "all at once tok/s",
        "speedup",
        "worst TTFT one at a time (s)",
        "worst TTFT all at once (s)",
        "answers equal to solo",
    ]
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
    for server, s in summary.items():
        cells = [
            f"{names.get(server, server)} (N={n})",
            f"{s['solo_tok_s']:.2f}",
            f"{s['together_tok_s']:.2f}",
            f"{s['speedup']:.2f}x",
            f"{s['worst_ttft_solo']:.2f}",
            f"{s['worst_ttft_together']:.2f}",
            f"{s['equal']}/{s['compared']}",
        ]
        print("| " + " | ".join(cells) + " |")
    if "ours" in summary and "peer" in summary:
        ratio = summary["ours"]["together_tok_s"] / summary["peer"]["together_tok_s"]
        print(f"\nours / llama-server, all at once: {ratio:.2f}x")
    print()
    for what, met, numbers in goals(summary):
        verdict = "n/a " if met is None else ("PASS" if met else "MISS")
        print(f"{verdict}  {what}: {numbers}")


def server_args(ap: argparse.ArgumentParser, *, ctx_size: int, mode: str) -> None:
    """The flags that say which servers run and how (both serving benchmarks take them)."""
    ap.add_argument("--model", type=Path, default=Path(DEFAULT_MODEL))
    ap.add_argument("--parallel", type=int, default=4, help="slots, and prompts all at once")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-size", type=int, default=ctx_size, help="context per slot, in tokens")
    ap.add_argument("--peer-home", type=Path, default=Path("~/.cache/llama-peer"))
    ap.add_argument("--mode", default=mode, help="ours: --mode")
    ap.add_argument("--draft", type=Path, default=None, help="ours: --draft GGUF|ngram")
    ap.add_argument(
        "--ours-arg",
        action="append",
        default=[],
        help="more flags for ours' serve (repeatable), e.g. --ours-arg=--no-ngram-pool",
    )
    ap.add_argument(
        "--ngram-pool",
        action="store_true",
        help="keep ours' n-gram pool: the prompts are sent more than once, so it drafts their "
        "answers from the earlier ones (llama-server cannot)",
    )
    ap.add_argument("--json", type=Path, default=None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    server_args(ap, ctx_size=2048, mode="auto")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--only", choices=("ours", "peer"), default=None)
    ap.add_argument("--skip-peer", action="store_true", help="the same as --only ours")
    ap.add_argument(
        "--together-first",
        action="store_true",
        help="run all at once before one at a time (its prompts not yet in any prompt cache)",
    )
    args = ap.parse_args()
    args.model = args.model.expanduser()
    args.peer_home = args.peer_home.expanduser()
    if args.draft is not None and str(args.draft) != "ngram":
        args.draft = args.draft.expanduser()
        if not args.draft.is_file():
            raise SystemExit(f"no draft model at {args.draft}")
    if args.parallel < 1 or args.repeats < 1:
        raise SystemExit("--parallel and --repeats must be at least 1")
    if not args.model.is_file():
        raise SystemExit(
            f"no model at {args.model}: pass --model PATH.gguf "
            "(`pyramid-gguf pull` fetches the default ladder's files)"
        )
    servers = ["ours", "peer"]
    if args.skip_peer:
        servers.remove("peer")
    if args.only:
        servers = [args.only]
    if "peer" in servers:
        args.peer_binary = peer_binary(args)
    args.ours_parallel = True
    if "ours" in servers and not ours_has_parallel():
        if args.parallel > 1:
            raise SystemExit("this checkout's `pyramid-gguf serve` has no --parallel yet")
        print("note: `pyramid-gguf serve` has no --parallel; ours runs without it (N=1)")
        args.ours_parallel = False

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    atexit.register(ServerProcess.stop_all)
    runs: list[Run] = []
    try:
        for repeat in range(args.repeats):
            order = servers if repeat % 2 == 0 else servers[::-1]
            runs += [measure(args, server, repeat) for server in order]
    finally:
        ServerProcess.stop_all()

    summary = summarize(runs)
    print_table(summary, args.parallel)
    if not all(s["all_tokens_from_usage"] for s in summary.values()):
        print("note: a server sent no usage; its tokens are content chunks counted")
    if args.json:
        out = {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "prompts": prompts(args.parallel),
            "summary": summary,
            "goals": [{"goal": g, "met": m, "numbers": s} for g, m, s in goals(summary)],
            "runs": [asdict(r) for r in runs],
        }
        args.json.write_text(json.dumps(out, indent=2))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
