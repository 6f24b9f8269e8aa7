"""Write a synthetic hybrid GGUF with an MTP head, large enough that costs mean something on a CPU.

llama.cpp's ``qwen35`` architecture (Gated DeltaNet blocks with every fourth block full
attention, as Qwen3.5/3.6; one NextN block on top), random weights shaped as
``tests/synth_hybrid.py`` explains (the head agrees with its target on some tokens), Q8_0.
The default shape has about 0.25 B parameters (16 trunk blocks of width 1024, a vocabulary of
about 16.4 k tokens): one token reads about 0.27 GB, tens of milliseconds on a laptop CPU.

Usage::

    python scripts/hybrid_model.py [DST.gguf] [--seed 0] [--layers 16] [--embd 1024]
        [--vocab-extra 16000] [--dtype q8_0] [--no-nextn] [--trunk-scale 0.05] [--mtp-noise 0.1]

DST defaults to ``$PYRAMID_GGUF_HOME/synth/hybrid-mtp-q8_0.gguf`` (``~/.cache/pyramid-gguf``).
Check it with llama.cpp's own tools, e.g.
``llama-bench -m DST -t 2 -p 0 -n 32`` and
``llama-speculative-simple -m DST --spec-type draft-mtp -p "the model" -n 64``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from synth_hybrid import HybridSpec, write_hybrid

from pyramid_gguf.core.home import cache_home


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("dst", nargs="?", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=16, help="trunk blocks (multiple of 4)")
    ap.add_argument("--embd", type=int, default=1024)
    ap.add_argument("--vocab-extra", type=int, default=16000)
    ap.add_argument("--dtype", choices=("f32", "f16", "q8_0"), default="q8_0")
    ap.add_argument("--no-nextn", action="store_true", help="the same trunk without a head")
    ap.add_argument(
        "--trunk-scale", type=float, default=0.05, help="what each trunk block adds (see synth)"
    )
    ap.add_argument("--mtp-noise", type=float, default=0.1)
    args = ap.parse_args(argv)
    if args.layers % 4 or args.layers <= 0 or args.embd % 64:
        print("Error: --layers must be a positive multiple of 4, --embd of 64", file=sys.stderr)
        return 2
    e = args.embd
    spec = HybridSpec(
        n_embd=e,
        n_layer=args.layers,
        n_head=e // 128,
        n_head_kv=max(e // 512, 1),
        head_dim=128,
        n_ff=3 * e,
        attn_interval=4,
        ssm_k_heads=e // 128,
        ssm_v_heads=e // 64,
        ssm_head_dim=64,
        n_extra_tokens=args.vocab_extra,
        dtype=args.dtype,
        nextn=not args.no_nextn,
        trunk_scale=args.trunk_scale,
        mtp_noise=args.mtp_noise,
    )
    name = f"hybrid-{'mtp' if spec.nextn else 'plain'}-{args.dtype}.gguf"
    dst = args.dst or cache_home() / "synth" / name
    dst.parent.mkdir(parents=True, exist_ok=True)
    write_hybrid(dst, seed=args.seed, spec=spec, name="synthetic-qwen35-mtp")
    print(f"{dst} ({dst.stat().st_size / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
