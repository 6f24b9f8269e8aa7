"""The planner tests' shared facts: a Llama-3 ladder's header shapes and two device profiles."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner

from pyramid_gguf.cli.main import main
from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.planning.compose import DeviceProfile
from pyramid_gguf.planning.memory import ModelMemory


def memory(name: str, n_layer: int, layer: int, head: int, embd: int, n_embd: int) -> ModelMemory:
    """Header facts of a Llama-3-shaped Q4_K_M model (bytes as ``plan`` reads them)."""
    return ModelMemory(
        path=name, arch="llama", n_layer=n_layer, n_embd=n_embd, n_head=32, n_ff=4 * n_embd,
        n_vocab=128256, n_embd_k=(1024,) * n_layer, n_embd_v=(1024,) * n_layer,
        layer_bytes=(layer,) * n_layer, head_bytes=head, file_head_bytes=head,
        embd_bytes=embd, other_bytes=0, tied_output=False,
        tensor_bytes=n_layer * layer + head + embd,
    )  # fmt: skip


#: The Llama 3.2 1B / 3.2 3B / 3.1 8B Q4_K_M shapes (synthetic header-only GGUFs, read by plan).
LADDER = {
    "draft": memory("1b", 16, 36_500_000, 215_478_272, 215_470_080, 2048),
    "qualifier": memory("3b", 28, 60_300_000, 323_217_408, 323_205_120, 3072),
    "target": memory("8b", 32, 130_800_000, 430_956_544, 295_501_824, 4096),
}
#: A GPU streaming weights at ~1 TB/s; a desktop CPU at 40 GB/s whose batches cost a little
#: more per token (0.15 of a token each).
GPU = DeviceProfile(
    "gpu", "test", tuple(1e-12 * (1 + 0.05 * i) for i in range(16)), (5e-5,) * 16, (3e-4,) * 16
)
CPU = DeviceProfile(
    "cpu", "test", tuple(2.5e-11 * (1 + 0.15 * i) for i in range(16)), (0.0,) * 16, (1e-3,) * 16
)
LOAD = LoadConfig(n_ctx=4096)


def plan_json(*args: str) -> dict[str, Any]:
    """``pyramid-gguf plan ARGS --json``, run in-process, as a dict (exit 0 asserted)."""
    res = CliRunner().invoke(main, ["plan", *args, "--json"])
    assert res.exit_code == 0, res.output
    doc: dict[str, Any] = json.loads(res.output)
    return doc
