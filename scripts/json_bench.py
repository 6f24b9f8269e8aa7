"""Structured output against llama-cpp-python's own: the ``json`` prompt set, one model, one run.

For every prompt of the shipped ``json`` set (extraction, classification, nested records; each
with its JSON schema) and every repeat, in turn: our constrained ``target`` (plain decoding
under the schema), our constrained ``auto`` (forced tokens as free drafts, the n-gram drafter
and the ladder's models where they pay), and llama-cpp-python's ``create_chat_completion`` with
``response_format={"type": "json_object", "schema": ...}`` (llama.cpp's GBNF sampler) on the
target file. Greedy, the same chat template, the same attention kernel on both sides
(``--flash-attn``, default off: llama-cpp-python's own default). Prints generation tok/s (prompt
processing excluded on every side), each side's speed over our constrained target, whether
every answer parsed and validated, forced tokens, and our grammar time per token against a
target step.

    python scripts/json_bench.py                       # the default ladder's 1.5B target
    python scripts/json_bench.py --repeats 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema

from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.bench.prompts import load_prompt_sets


def llama_cpp_python(path: Path, threads: int, n_ctx: int, flash_attn: bool) -> Any:
    """llama-cpp-python's own ``Llama`` on ``path`` (CPU, ``threads`` threads), its weights
    placed as ours are: llama-cpp-python's default load on a CPU with AMX puts them in the AMX
    buffer, whose kernels crash on batched decodes (SIGILL, llama.cpp #20824); ours, and so
    this peer's, uses the repacked kernels without AMX (``native.peer_llama``)."""
    from pyramid_gguf.native import peer_llama

    load = LoadConfig(n_threads=threads, n_threads_batch=threads, n_gpu_layers=0)
    return peer_llama(
        path,
        load,
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        n_gpu_layers=0,
        flash_attn=flash_attn,
        verbose=False,
    )


def peer_run(llm: Any, prompt: str, schema: dict[str, Any], n: int) -> tuple[str, int, float]:
    """llama-cpp-python's answer under ``schema``: text, tokens, generation seconds (wall time
    less its prompt evaluation)."""
    import llama_cpp

    ctx = llm._ctx.ctx
    llama_cpp.llama_perf_context_reset(ctx)
    t0 = time.perf_counter()
    out = llm.create_chat_completion(
        messages=[{"role": "user", "content": prompt}],
        response_format={"type": "json_object", "schema": schema},
        temperature=0.0,
        max_tokens=n,
    )
    wall = time.perf_counter() - t0
    prompt_s = llama_cpp.llama_perf_context(ctx).t_p_eval_ms / 1000
    return (
        out["choices"][0]["message"]["content"],
        out["usage"]["completion_tokens"],
        wall - prompt_s,
    )


def valid(text: str, schema: dict[str, Any]) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--preset", default="qwen2.5-coder-demo")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("-n", "--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", dest="json_out", type=Path, default=None)
    ap.add_argument(
        "--flash-attn", choices=("on", "off"), default="off", help="both sides' attention kernel"
    )
    args = ap.parse_args()
    flash = args.flash_attn == "on"
    load = LoadConfig(
        n_ctx=4096, n_threads=args.threads, n_threads_batch=args.threads, flash_attn=flash
    )
    prompts = load_prompt_sets(["json"])
    sides = ("target", "auto", "llama-cpp-python")
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    with Pyramid.from_preset(args.preset, load=load) as p:
        step = p.costs()["target"](1)
        llm = llama_cpp_python(p.model_path, args.threads, 4096, flash)
        for r in range(args.repeats):
            for q in prompts:
                assert q.schema is not None
                schema = json.loads(q.schema)
                tokens = p.chat_tokens([{"role": "user", "content": q.text}])
                sampling = SamplingConfig(
                    temperature=0, max_tokens=args.max_tokens, grammar=q.grammar
                )
                for mode in ("target", "auto"):
                    c = p.generate(tokens, sampling, SpecConfig(mode=mode))
                    s = c.stats
                    rows[mode].append(
                        {
                            "prompt": q.key,
                            "repeat": r,
                            "tokens": s.generated_tokens,
                            "seconds": s.generation_seconds,
                            "valid": valid(c.text, schema),
                            "forced": s.forced_n,
                            "grammar_seconds": s.grammar_seconds,
                        }
                    )
                text, n, seconds = peer_run(llm, q.text, schema, args.max_tokens)
                rows["llama-cpp-python"].append(
                    {
                        "prompt": q.key,
                        "repeat": r,
                        "tokens": n,
                        "seconds": seconds,
                        "valid": valid(text, schema),
                    }
                )
                print(
                    f"{q.key:<16} r{r}  "
                    + "  ".join(
                        f"{s} {rows[s][-1]['tokens'] / rows[s][-1]['seconds']:.1f} tok/s"
                        for s in sides
                    ),
                    file=sys.stderr,
                )
    summary = {}
    for s in sides:
        tok = sum(x["tokens"] for x in rows[s])
        sec = sum(x["seconds"] for x in rows[s])
        summary[s] = {
            "tok_s": tok / sec,
            "valid": sum(x["valid"] for x in rows[s]),
            "answers": len(rows[s]),
        }
    base = summary["target"]["tok_s"]
    print(f"{'side':<18} {'tok/s':>7} {'vs target':>9} {'valid':>7}")
    for s in sides:
        v = summary[s]
        print(
            f"{s:<18} {v['tok_s']:>7.1f} {v['tok_s'] / base:>8.2f}x {v['valid']:>3}/{v['answers']}"
        )
    auto, peer = summary["auto"]["tok_s"], summary["llama-cpp-python"]["tok_s"]
    ours = rows["auto"] + rows["target"]
    per_token = sum(x["grammar_seconds"] for x in ours) / sum(x["tokens"] for x in ours)
    forced = sum(x["forced"] for x in rows["auto"]) / sum(x["tokens"] for x in rows["auto"])
    print(
        f"auto / llama-cpp-python: {auto / peer:.2f}x; forced tokens {100 * forced:.0f}% of auto's"
    )
    print(
        f"grammar time {1000 * per_token:.3f} ms per token = {100 * per_token / step:.1f}% of a "
        f"target step ({1000 * step:.1f} ms, the cached cost curve)"
    )
    if args.json_out:
        args.json_out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
