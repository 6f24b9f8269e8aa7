"""What each API dialect costs: the same chat through every door of one running server.

Starts nothing: ``--url`` is a running ``pyramid-gguf serve``. Four fixed prompts, greedy, at
most 128 tokens each, go through OpenAI's chat completions, OpenAI's Responses API,
Anthropic's Messages and Ollama's ``/api/chat``, not streamed, ``--repeats`` times; within a
repetition each prompt visits every dialect, in an order rotated per prompt and repetition so
that none is always first to a cold cache. Each dialect's tokens are its own usage count
(``completion_tokens``, ``output_tokens``, ``eval_count``) over the client's wall time, prompt
included. Prints tokens per second per dialect, its ratio to chat completions, and how many
answers differ from chat completions' text (greedy: none but floating-point near-ties).

    pyramid-gguf serve --port 8080 --mode target &
    python scripts/dialect_bench.py --url http://127.0.0.1:8080 --repeats 3

For ``auto``, start the server with ``--no-ngram-pool``: the prompts repeat (per dialect and
per round), and with the pool every repeat drafts from the earlier answers to it, which
measures the pool, not the dialect.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

PROMPTS = (
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash map is in three sentences.",
    "List five uses of the Linux command grep, one per line.",
    "Rewrite this loop as a list comprehension: out = []\nfor x in xs:\n    out.append(x * 2)",
)
MAX_TOKENS = 128


@dataclass(frozen=True)
class Dialect:
    """One door: its path, the body of a prompt, and ``(text, output tokens)`` of an answer."""

    name: str
    path: str
    body: Callable[[str], dict[str, Any]]
    read: Callable[[dict[str, Any]], tuple[str, int]]


def _user(prompt: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": prompt}]


def _responses_text(answer: dict[str, Any]) -> str:
    parts = [p for item in answer["output"] if item["type"] == "message" for p in item["content"]]
    return "".join(p["text"] for p in parts if p["type"] == "output_text")


DIALECTS = (
    Dialect(
        "chat completions",
        "/v1/chat/completions",
        lambda p: {"messages": _user(p), "max_tokens": MAX_TOKENS, "temperature": 0},
        lambda a: (a["choices"][0]["message"]["content"] or "", a["usage"]["completion_tokens"]),
    ),
    Dialect(
        "responses",
        "/v1/responses",
        lambda p: {"input": p, "max_output_tokens": MAX_TOKENS, "temperature": 0},
        lambda a: (_responses_text(a), a["usage"]["output_tokens"]),
    ),
    Dialect(
        "anthropic messages",
        "/v1/messages",
        lambda p: {"messages": _user(p), "max_tokens": MAX_TOKENS, "temperature": 0},
        lambda a: (
            "".join(b["text"] for b in a["content"] if b["type"] == "text"),
            a["usage"]["output_tokens"],
        ),
    ),
    Dialect(
        "ollama /api/chat",
        "/api/chat",
        lambda p: {
            "messages": _user(p),
            "stream": False,
            "options": {"temperature": 0, "num_predict": MAX_TOKENS},
        },
        lambda a: (a["message"]["content"], a["eval_count"]),
    ),
)


@dataclass
class Tally:
    """One dialect's sums over its requests."""

    tokens: int = 0
    seconds: float = 0.0
    requests: int = 0
    differing: int = 0
    texts: dict[tuple[int, int], str] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def ask(client: httpx.Client, model: str, dialect: Dialect, prompt: str) -> tuple[str, int, float]:
    """One request: the answer's text, its output tokens, and the wall seconds it took."""
    body = {"model": model, **dialect.body(prompt)}
    start = time.perf_counter()
    r = client.post(dialect.path, json=body)
    seconds = time.perf_counter() - start
    if r.status_code != 200:
        raise SystemExit(f"{dialect.name}: HTTP {r.status_code}: {r.text[:300]}")
    text, tokens = dialect.read(r.json())
    return text, tokens, seconds


def run(client: httpx.Client, model: str, repeats: int) -> dict[str, Tally]:
    """Every prompt through every dialect, ``repeats`` times, the order rotated each time."""
    tallies = {d.name: Tally() for d in DIALECTS}
    for prompt in PROMPTS[:1]:  # a warm-up: loads, caches and first-request costs
        for dialect in DIALECTS:
            ask(client, model, dialect, prompt)
    turn = 0
    for rep in range(repeats):
        for i, prompt in enumerate(PROMPTS):
            order = DIALECTS[turn % len(DIALECTS) :] + DIALECTS[: turn % len(DIALECTS)]
            turn += 1
            for dialect in order:
                text, tokens, seconds = ask(client, model, dialect, prompt)
                tally = tallies[dialect.name]
                tally.tokens += tokens
                tally.seconds += seconds
                tally.requests += 1
                tally.texts[rep, i] = text
    reference = tallies[DIALECTS[0].name].texts
    for tally in tallies.values():
        tally.differing = sum(text != reference[key] for key, text in tally.texts.items())
    return tallies


def report(tallies: dict[str, Tally]) -> str:
    base = tallies[DIALECTS[0].name].rate
    rows = [
        f"{'dialect':<20} {'requests':>8} {'tokens':>7} {'seconds':>8} {'tok/s':>8} "
        f"{'vs chat':>8} {'differ':>6}"
    ]
    for name, t in tallies.items():
        ratio = t.rate / base if base else 0.0
        rows.append(
            f"{name:<20} {t.requests:>8} {t.tokens:>7} {t.seconds:>8.2f} {t.rate:>8.2f} "
            f"{ratio:>7.3f}x {t.differing:>6}"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url", required=True, help="a running pyramid-gguf serve")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of the four prompts")
    ap.add_argument("--api-key", default=None, help="the server's --api-key, if it has one")
    ap.add_argument("--model", default="pyramid", help="the model name sent (any is served)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = ap.parse_args()
    headers = {}
    if args.api_key:
        headers = {"Authorization": f"Bearer {args.api_key}", "X-Api-Key": args.api_key}
    with httpx.Client(base_url=args.url, headers=headers, timeout=600) as client:
        tallies = run(client, args.model, args.repeats)
    if args.json:
        out = {
            name: {"requests": t.requests, "tokens": t.tokens, "seconds": round(t.seconds, 3),
                   "tokens_per_second": round(t.rate, 2), "differing": t.differing}
            for name, t in tallies.items()
        }  # fmt: skip
        print(json.dumps(out, indent=2))
    else:
        print(report(tallies))


if __name__ == "__main__":
    main()
