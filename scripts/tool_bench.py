"""Tool-call latency: how long an assistant waits for its call, ``auto`` against ``target``.

Six tool tasks (a single call, an enum, a number with units, ``required``, a named function, a
question needing no tool) through ``create_chat_completion`` on one loaded ladder, greedy, the
modes interleaved per task and repeat, each call evaluating its whole prompt (no mode reuses
the other's cache). Prints each task's wall time per mode (prompt included: what the client
waits), the call made, and the total ratio.

    python scripts/tool_bench.py                    # the default ladder
    python scripts/tool_bench.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.serving.openai import create_chat_completion


def tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


WEATHER = tool(
    "get_weather",
    "Current weather in a city",
    {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
)
CONVERT = tool(
    "convert_length",
    "Convert a length between units",
    {
        "value": {"type": "number"},
        "from_unit": {"type": "string", "enum": ["km", "mi", "m", "ft"]},
        "to_unit": {"type": "string", "enum": ["km", "mi", "m", "ft"]},
    },
)
TOOLS = [WEATHER, CONVERT]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
TASKS: list[tuple[str, str, Any]] = [
    ("single", "What's the weather in Oslo right now, in celsius?", "auto"),
    ("enum", "Is it cold in Chicago today? Use fahrenheit.", "auto"),
    ("units", "How many kilometres is a marathon of 26.2 miles?", "auto"),
    ("required", "Tell me about Paris.", "required"),
    ("named", "Berlin, please.", NAMED),
    ("no tool", "What is 2 + 2? Answer with the number only.", "auto"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--preset", default="qwen2.5-coder-demo")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    load = LoadConfig(n_ctx=4096, n_threads=args.threads, n_threads_batch=args.threads)
    modes = ("target", "auto")
    seconds: dict[str, dict[str, list[float]]] = {m: {} for m in modes}
    answering: dict[str, dict[str, list[float]]] = {m: {} for m in modes}
    with Pyramid.from_preset(args.preset, load=load) as p:
        p.calibrate()
        greedy = SamplingConfig(temperature=0, max_tokens=160)
        for _ in range(args.repeats):
            for name, question, choice in TASKS:
                for mode in modes:
                    messages = [{"role": "user", "content": question}]
                    # every call evaluates its whole prompt: no mode reuses the other's cache
                    p.generate("x", SamplingConfig(max_tokens=1), SpecConfig(mode="target"))
                    t0 = time.perf_counter()
                    out = create_chat_completion(
                        p, messages, greedy, SpecConfig(mode=mode), tools=TOOLS, tool_choice=choice
                    )
                    seconds[mode].setdefault(name, []).append(time.perf_counter() - t0)
                    generation = out["timings"]["predicted_ms"] / 1000
                    answering[mode].setdefault(name, []).append(generation)
                    message = out["choices"][0]["message"]
                    calls = [
                        f"{c['function']['name']}({c['function']['arguments']})"
                        for c in message.get("tool_calls") or []
                    ]
                    said = calls or [json.dumps((message["content"] or "")[:40])]
                    forced = out["timings"]["forced_n"]
                    took = seconds[mode][name][-1]
                    print(
                        f"{name:<9} {mode:<6} {took:6.2f} s  forced {forced:>3}  {', '.join(said)}"
                    )
    print("\nmedian seconds: the whole call (prompt included), then the answer alone")
    head = f"{'target':>7} {'auto':>7} {'ratio':>6}"
    print(f"{'task':<9} {head}   {head}")
    for name in [*(task[0] for task in TASKS), "all"]:
        cells = []
        for table in (seconds, answering):
            if name == "all":
                t, a = (sum(statistics.median(v) for v in table[m].values()) for m in modes)
            else:
                t, a = (statistics.median(table[m][name]) for m in modes)
            cells.append(f"{t:>7.2f} {a:>7.2f} {t / a:>5.2f}x")
        print(f"{name:<9} " + "   ".join(cells))


if __name__ == "__main__":
    main()
