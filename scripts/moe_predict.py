"""Mixtures of experts on small cards, predicted: the figures of docs/BENCHMARKS.md, "MoE on small
cards (predicted)".

1. The union of experts a block of k tokens reads, over one token's, for random routing
   (``planning/moe.py``), for each MoE preset's target.
2. Qwen3-30B-A3B Q4_K_M (the ``qwen3-0.6b-30b-a3b`` preset's shipped shape) in an 8 GiB budget on
   the shipped RTX 4060 8 GB profile with two desktop CPU profiles: the best ``-ngl`` layer split
   against the planned expert placement (``--n-cpu-moe N``), plain decoding and ``auto`` (replayed
   over the shipped traces, a stand-in for this ladder's own).
3. Checks against published figures: llmfit PR #755 (RTX 2080 8 GB, i9-10900X with quad-channel
   DDR4, Qwen3-30B-A3B-Instruct-2507 Q4_K_M, ``-ngl 99 --n-cpu-moe 36``: 36.7 tok/s generation as
   llama-server measured it), and InventiveHQ's CPU-only run on an i7-8700 (the 30B-A3B at
   10.6 tok/s beside a dense 3B at 11.8: the ratio checks the per-token bytes of an MoE).
   The CPUs are priced by the fitted CPU model of ``planning/hardware.py`` (the shipped DDR4
   profiles' parameters) on each machine's spec: bandwidth and cores as noted, assumed where the
   source does not say.

    python scripts/moe_predict.py
"""

from __future__ import annotations

import json

from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.models.registry import get_preset
from pyramid_gguf.planning import sources
from pyramid_gguf.planning.compose import DeviceProfile, composed_curve
from pyramid_gguf.planning.hardware import DEVICES_DIR, CpuModel, Spec
from pyramid_gguf.planning.memory import GiB, ModelMemory
from pyramid_gguf.planning.moe import ExpertUnion, block_bytes, moe_curve
from pyramid_gguf.planning.rank import EXPERTS_ON_CPU, placements, rank, replay_plain
from pyramid_gguf.planning.tiers import preset_memory

PRESETS = ("qwen3-0.6b-30b-a3b", "gpt-oss-20b", "gpt-oss-20b-120b")
QWEN = "qwen3-0.6b-30b-a3b"


def cpu_like(slug: str, bandwidth: float, cores: int, what: str) -> DeviceProfile:
    """The shipped CPU model (its DDR4 profiles' fitted parameters) on another machine's spec."""
    data = json.loads((DEVICES_DIR / "cpus" / "ddr4-8core.json").read_text())
    m = data["model"]
    model = CpuModel(
        m["eta"], m["fixed_us"] * 1e-6, m["core_rate_gb"] * 1e9, m["batch_slope"], m["softness"]
    )
    spec = Spec(slug, what, "cpu", "consumer", "cpu", bandwidth, cores=cores)
    return model.profile(spec, f"the CPU model of planning/hardware.py on {what}")


def unions() -> None:
    print("Union of experts a block of k tokens reads, over one token's (random routing)")
    print(f"{'model':<22} {'E':>4} {'K':>3} " + " ".join(f"{f'k={k}':>6}" for k in (2, 4, 8, 16)))
    for name in PRESETS:
        t = preset_memory(get_preset(name)).models["target"]
        assert t.experts is not None
        u = ExpertUnion.random(t.experts.n_expert, t.experts.n_used)
        ratios = " ".join(f"{u.ratio(k):>6.2f}" for k in (2, 4, 8, 16))
        print(f"{t.path.split(':')[0][:22]:<22} {u.n_expert:>4} {u.n_used:>3} {ratios}")
    print()


def small_card() -> None:
    models = preset_memory(get_preset(QWEN)).models
    target = models["target"]
    print(
        f"Qwen3-30B-A3B Q4_K_M: {target.weight_bytes / 1e9:.2f} GB of weights, a token reads "
        f"{block_bytes(target, 1) / 1e9:.2f} GB (8 of 128 experts), 4 tokens "
        f"{block_bytes(target, 4) / 1e9:.2f} GB, 8 tokens {block_bytes(target, 8) / 1e9:.2f} GB"
    )
    gpu = sources.gpu_profile("rtx-4060-8gb", detect=False).profile
    traces = sources.traces_for(QWEN, None)
    load = LoadConfig(n_ctx=4096)
    for cpu_name in ("ddr4-8core", "ddr5-8core"):
        cpu = sources.cpu_profile(cpu_name).profile
        ranked = rank(placements(models, 8 * GiB, load), models, traces, cpu, gpu)
        split = max(
            (p for p in ranked if not p.placement.name.endswith(EXPERTS_ON_CPU)),
            key=lambda p: p.tps,
        )
        moe = max((p for p in ranked if p.placement.name.endswith(EXPERTS_ON_CPU)),
                  key=lambda p: p.tps)  # fmt: skip
        sp, mp = split.placement, moe.placement
        print(
            f"  rtx-4060-8gb + {cpu_name}, 8 GiB, ctx 4096: best layer split {sp.name} "
            f"(-ngl {sp.n_gpu_layers('target')}): plain {split.plain_tps:.1f}, auto "
            f"{split.tps:.1f} tok/s; planned {mp.name} (-ngl {mp.n_gpu_layers('target')} "
            f"--n-cpu-moe {mp.n_cpu_moe('target')}): plain {moe.plain_tps:.1f}, auto "
            f"{moe.tps:.1f} tok/s; expert placement / layer split: plain "
            f"{moe.plain_tps / split.plain_tps:.2f}x, auto {moe.tps / split.tps:.2f}x"
        )
        c = moe.costs["target"]
        print(
            "    target cost, expert placement (ms, k = 1 2 4 8 16): "
            + " ".join(f"{c(k) * 1000:.1f}" for k in (1, 2, 4, 8, 16))
        )
    print(f"  traces: {traces.ladder} ({len(traces.traces)}), a stand-in for this ladder's own")
    print()


def published(target: ModelMemory) -> None:
    print("Against published figures (plain decoding)")
    gpu = sources.gpu_profile("rtx-2080-8gb", detect=False).profile
    cpu = cpu_like("i9-10900x", 102.4e9, 10, "i9-10900X, quad-channel DDR4 (~102 GB/s, 10 cores)")
    tps = replay_plain(moe_curve(target, target.n_layer + 1, 36, cpu, gpu))
    print(
        f"  RTX 2080 8 GB + i9-10900X, -ngl 99 --n-cpu-moe 36: predicted {tps:.1f} tok/s, "
        f"published 36.7 (llmfit PR #755): {tps / 36.7 - 1:+.0%}"
    )
    i7 = cpu_like("i7-8700", 42.7e9, 6, "i7-8700, dual-channel DDR4-2666 (42.7 GB/s, 6 cores)")
    moe = replay_plain(moe_curve(target, 0, 0, i7, None))
    dense3b = preset_memory(get_preset("qwen2.5-0.5b-1.5b-3b")).models["target"]
    dense = replay_plain(composed_curve(dense3b, 0, i7, None))
    print(
        f"  i7-8700 CPU only: 30B-A3B predicted {moe:.1f} tok/s (published 10.6), a dense "
        f"Qwen2.5-3B Q4_K_M {dense:.1f} (published 11.8 for their dense 3B); MoE / dense "
        f"predicted {moe / dense:.2f}, published {10.6 / 11.8:.2f} (InventiveHQ, "
        "inventivehq.com/blog/moe-on-cpu-benchmark)"
    )


def main() -> None:
    unions()
    small_card()
    published(preset_memory(get_preset(QWEN)).models["target"])


if __name__ == "__main__":
    main()
