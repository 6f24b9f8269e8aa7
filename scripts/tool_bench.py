"""Tool-call latency: how long an assistant waits for its call, ``auto`` against ``target``.

Six tool tasks (a single call, an enum, a number with units, ``required``, a named function, a
question needing no tool) through ``create_chat_completion`` on one loaded ladder, greedy, the
modes interleaved per task and repeat. Prints each task's wall time per mode (prompt included:
what the client waits), the call made, and the total ratio.

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
    with Pyramid.from_preset(args.preset, load=load) as p:
        p.calibrate()
        greedy = SamplingConfig(temperature=0, max_tokens=160)
        for _ in range(args.repeats):
            for name, question, choice in TASKS:
                for mode in modes:
                    messages = [{"role": "user", "content": question}]
                    t0 = time.perf_counter()
                    out = create_chat_completion(
                        p, messages, greedy, SpecConfig(mode=mode), tools=TOOLS, tool_choice=choice
                    )
                    seconds[mode].setdefault(name, []).append(time.perf_counter() - t0)
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
    print(f"\n{'task':<9} {'target s':>9} {'auto s':>7} {'ratio':>6}")
    for name, _, _ in TASKS:
        t, a = (statistics.median(seconds[m][name]) for m in modes)
        print(f"{name:<9} {t:>9.2f} {a:>7.2f} {t / a:>5.2f}x")
    total = [sum(statistics.median(v) for v in seconds[m].values()) for m in modes]
    print(f"{'all':<9} {total[0]:>9.2f} {total[1]:>7.2f} {total[0] / total[1]:>5.2f}x")


if __name__ == "__main__":
    main()
