"""Greedy check of every lossless mode against ``target`` on a (synthetic) ladder.

The near-tie-aware form of the tests, for ladders too large for the test suite (the GPU check
runs it on synthetic Llama 3.2 1B / 3B / 3.1 8B and Qwen2.5 0.5B / 1.5B / 7B shapes, every
layer offloaded)::

    python scripts/gpu/lossless.py DRAFT.gguf QUALIFIER.gguf TARGET.gguf [--json out.json]

For each prompt, ``sd``, ``psd-exact`` (both rules) and ``auto`` must give the target's greedy
tokens, or first differ where both tokens are within ``--bound`` logits of the target's top
logit there (read from the target's own logits, evaluated as ``target`` decoding evaluates
them). Exits 1 if any does not.
"""

from __future__ import annotations

# llama.cpp's libraries load before numpy's (docs/ARCHITECTURE.md, "Loading order": a CUDA
# model load segfaults in the GPU machines' PyTorch environment when numpy came first).
from pyramid_gguf import native  # noqa: F401

# isort: split
import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from lossless import REAL_TIE, first_difference, target_logits_at

from pyramid_gguf import Pyramid
from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.core.sampling import SamplingConfig
from pyramid_gguf.core.spec import SpecConfig

PROMPTS = (
    "the model reads the file and the test writes a line of code",
    "import data from the cache then batch the token layer",
    "code code test model file line text word",
)
MODES = {
    "sd": SpecConfig(mode="sd", l_d=4),
    "psd-exact": SpecConfig(mode="psd-exact", l_d=4, l_q=8),
    "psd-exact/greedy-match": SpecConfig(mode="psd-exact", l_d=4, l_q=8, exact_rule="greedy-match"),
    "auto": SpecConfig(mode="auto"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("draft", type=Path)
    ap.add_argument("qualifier", type=Path)
    ap.add_argument("target", type=Path)
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("--bound", type=float, default=REAL_TIE)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    greedy = SamplingConfig(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    load = LoadConfig(n_ctx=1024)
    rows = []
    ok = True
    with Pyramid.from_paths(
        args.target, draft=args.draft, qualifier=args.qualifier, load=load
    ) as p:
        p.calibrate()
        for text in PROMPTS:
            prompt = p.tokenize(text)
            want = p.generate(prompt, greedy, SpecConfig(mode="target")).token_ids
            for name, spec in MODES.items():
                got = p.generate(prompt, greedy, spec)
                i = first_difference(got.token_ids, want)
                row: dict[str, object] = {"prompt": text, "mode": name, "first_diff": i}
                if i is not None:
                    z = target_logits_at(p, prompt, want[:i]).astype(np.float64)
                    gaps = [float(z.max() - z[s[i]]) for s in (got.token_ids, want)]
                    row["gap"] = max(gaps)
                    ok &= row["gap"] < args.bound
                if got.stats.auto is not None:
                    row["auto"] = got.stats.auto.summary()
                row["tps"] = round(got.stats.generation_tps, 1)
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"bound": args.bound, "ok": ok, "rows": rows}, indent=1))
    print("all lossless modes match target (or differ at near-ties)" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
