"""Weight placement: CPU_REPACK by tensor overrides (the AMX-safe load), on any CPU.

This CPU may have no AMX: ``LoadConfig.force_repack_overrides`` loads as an AMX CPU with a
build carrying the AMX kernels would (extra buffer types off, the weights the repacking
kernels take put in CPU_REPACK by override). On a CPU-only build without AMX kernels, that
must be exactly llama.cpp's own placement, with bit-identical logits.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.decoding.runtime.calibrate import cache_key
from pyramid_gguf.native import (
    NativeModel,
    buffers,
    build_has_amx_kernels,
    compute,
    supports_gpu_offload,
)
from pyramid_gguf.native.buffers import (
    REPACK,
    Placement,
    extra_buffer_types,
    override_patterns,
    parse_buffer_sizes,
    plan_placement,
)

LOAD = LoadConfig(n_ctx=1024, n_batch=256, n_threads=2, n_threads_batch=2, n_gpu_layers=0)
FORCED = LoadConfig(
    n_ctx=1024, n_batch=256, n_threads=2, n_threads_batch=2, n_gpu_layers=0,
    force_repack_overrides=True,
)  # fmt: skip
#: A CPU-only build without AMX kernels: the default load is llama.cpp's own placement.
LLAMA_CPP_PLACES = not build_has_amx_kernels() and not supports_gpu_offload()


# --- without a model ------------------------------------------------------------------------


def test_override_patterns_match_exactly_the_names() -> None:
    names = ["blk.1.attn_q.weight", "blk.10.attn_q.weight", "blk.2.ffn_up.weight", "output.weight"]
    universe = [
        f"blk.{i}.{role}.weight" for i in range(12) for role in ("attn_q", "ffn_up", "ffn_down")
    ] + ["output.weight", "token_embd.weight", "output_norm.weight", "blk.1.attn_q.bias"]
    patterns = [re.compile(p) for p in override_patterns(names)]
    assert len(patterns) == 3  # one per name with the layers grouped
    hits = [n for n in universe if any(p.search(n) for p in patterns)]
    assert sorted(hits) == sorted(names)


def test_buffer_sizes_come_from_llama_cpps_load_lines() -> None:
    log = [
        b"load_tensors: loading model tensors, this can take a while... (mmap = true)\n",
        b"load_tensors:   CPU_Mapped model buffer size =  1059.88 MiB\n",
        b"load_tensors:   CPU_REPACK model buffer size =   596.50 MiB\n",
        b"load_tensors:   CPU_Mapped model buffer size =    10.12 MiB\n",
        b"llama_context:        CPU compute buffer size =   300.75 MiB\n",
    ]
    assert parse_buffer_sizes(log) == {"CPU_Mapped": 1070.0, "CPU_REPACK": 596.5}


def test_forcing_the_overrides_and_choosing_extra_buffers_conflict() -> None:
    with pytest.raises(UserError, match="force_repack_overrides"):
        LoadConfig(force_repack_overrides=True, extra_buffers=False)


@pytest.mark.parametrize(
    ("amx", "gpu", "extra", "want"),
    [
        (False, False, None, "extra"),  # llama.cpp's own choice: nothing changes without AMX
        (True, False, None, "repack"),  # the AMX kernels would be used: CPU_REPACK by override
        (True, True, None, "none"),  # a GPU build keeps CPU weights in its host buffer
        (True, False, True, "extra"),  # asked for: llama.cpp's choice, AMX included
        (False, False, False, "none"),
    ],
)
def test_placement_follows_the_build_and_the_config(
    monkeypatch: pytest.MonkeyPatch,
    tiny_target: Path,
    amx: bool,
    gpu: bool,
    extra: bool | None,
    want: str,
) -> None:
    monkeypatch.setattr(buffers, "build_has_amx_kernels", lambda: amx)
    monkeypatch.setattr(buffers, "supports_gpu_offload", lambda: gpu)
    assert plan_placement(tiny_target, LoadConfig(extra_buffers=extra)).kind == want


def test_load_reports_its_buffers_and_the_cache_key_follows_the_placement(
    tiny_target: Path, tiny_load: LoadConfig
) -> None:
    with (
        NativeModel(tiny_target, tiny_load) as default,
        NativeModel(tiny_target, replace(tiny_load, extra_buffers=False)) as off,
    ):
        assert default.weight_buffers and off.weight_buffers  # the log was read
        assert sum(off.weight_buffers.values()) > 0
        assert off.placement == Placement("none")
        assert "extra buffer types off" in off.describe_weights()
        assert cache_key(default) != cache_key(off)


# --- the 1.5B target of the default ladder ----------------------------------------------------


@pytest.fixture(scope="module")
def forced(qwen_target_path: Path) -> Iterator[NativeModel]:
    with NativeModel(qwen_target_path, FORCED) as m:
        if not m.placement.names:
            pytest.skip(f"this CPU's {REPACK} kernels take none of {qwen_target_path.name}")
        yield m


@pytest.fixture(scope="module")
def default(qwen_target_path: Path) -> Iterator[NativeModel]:
    with NativeModel(qwen_target_path, LOAD) as m:
        yield m


@pytest.mark.real
def test_overrides_put_the_repackable_weights_in_cpu_repack(forced: NativeModel) -> None:
    assert REPACK in extra_buffer_types()
    assert forced.placement.kind == "repack"
    assert forced.weight_buffers.get(REPACK, 0) > 100  # MiB: most of the 1.5B's matrices
    # Q4_K like the layers, but read row by row (GGML_OP_GET_ROWS): never repacked.
    assert "token_embd.weight" not in forced.placement.names
    assert "output.weight" not in forced.placement.names  # Q6_K: no x86 repack kernel
    assert f"in {REPACK} by override" in forced.describe_weights()


@pytest.mark.real
@pytest.mark.skipif(not LLAMA_CPP_PLACES, reason="the default load here is not llama.cpp's own")
def test_overrides_choose_exactly_what_llama_cpp_repacks(
    forced: NativeModel, default: NativeModel
) -> None:
    assert default.placement.kind == "extra"
    assert forced.weight_buffers == default.weight_buffers


@pytest.mark.real
def test_batched_decodes_of_2_to_16_tokens_complete_and_match_the_default_load(
    forced: NativeModel, default: NativeModel
) -> None:
    """Verification blocks of every size on the override placement; where the default load
    places the weights alike (same buffers), its logits are bit-identical."""
    rng = np.random.default_rng(7)
    prefix = [int(t) for t in rng.integers(100, 20000, size=40)]
    same = forced.weight_buffers == default.weight_buffers
    for m in (forced, default):
        m.reset()
        m.eval(prefix)
    for n in range(2, 17):
        block = [int(t) for t in rng.integers(100, 20000, size=n)]
        got = forced.eval(block, range(n))
        assert got.shape == (n, forced.n_vocab) and np.isfinite(got).all()
        want = default.eval(block, range(n))
        if same:
            np.testing.assert_array_equal(got, want)
        forced.rollback(len(prefix))
        default.rollback(len(prefix))


@pytest.mark.real
def test_greedy_target_equals_llama_cpp_python_with_the_same_buffers(
    qwen_target_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``target`` on the override placement is llama.cpp's own decoding of it: greedy text of
    ``llama_cpp.Llama`` loaded with the same placement."""
    placement = plan_placement(qwen_target_path, FORCED)
    if not placement.names:
        pytest.skip(f"this CPU's {REPACK} kernels take none of {qwen_target_path.name}")
    default_params = llama_cpp.llama_model_default_params
    keep: list[object] = []  # what the overrides point into, alive until the test ends

    def params() -> llama_cpp.llama_model_params:
        p = default_params()
        p.n_gpu_layers = 0
        keep.append(placement.apply(p))
        return p

    monkeypatch.setattr(llama_cpp.llama_cpp, "llama_model_default_params", params)
    ref = llama_cpp.Llama(
        str(qwen_target_path), n_ctx=1024, n_threads=2, n_threads_batch=2, verbose=False
    )
    greedy = SamplingConfig(temperature=0, max_tokens=24)
    # llama_cpp.Llama runs attention without flash attention unless asked; ours lets llama.cpp
    # decide (it picks it on a CPU), and the two kernels round differently at near-ties.
    with Pyramid.from_paths(qwen_target_path, load=replace(FORCED, flash_attn=False)) as p:
        assert p.ladder.target.model.placement == placement
        for prompt in ("def quicksort(xs):\n", "The three laws of thermodynamics are"):
            want = ref.create_completion(prompt, max_tokens=24, temperature=0.0)
            got = p.generate(prompt, greedy, SpecConfig(mode="target"))
            assert got.text == want["choices"][0]["text"]
            assert got.stats.generated_tokens == want["usage"]["completion_tokens"]
    ref.close()


def test_the_benchmark_peer_is_placed_as_ours(
    tiny_target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``native.peer_llama``: llama-cpp-python's own ``Llama`` with our placement of the
    weights (on an AMX CPU, CPU_REPACK by overrides instead of the AMX buffer, whose batched
    decodes crash), so the JSON benchmark's peer runs everywhere: a batched prompt decodes and
    its greedy text is ours. Its decodes run on the compute thread, as ours do."""
    from pyramid_gguf.native import peer_llama

    threads: list[threading.Thread] = []
    native_decode = llama_cpp.llama_cpp.llama_decode  # what llama-cpp-python's Llama calls

    def decode(*args: object) -> int:
        threads.append(threading.current_thread())
        return int(native_decode(*args))

    monkeypatch.setattr(llama_cpp.llama_cpp, "llama_decode", decode)

    load = LoadConfig(n_ctx=256, n_threads=1, n_threads_batch=1, n_gpu_layers=0)
    llm = peer_llama(
        tiny_target, load, n_ctx=256, n_threads=1, n_threads_batch=1, n_gpu_layers=0,
        flash_attn=False, verbose=False,
    )  # fmt: skip
    placement, _ = llm._pyramid_placement
    assert placement == plan_placement(tiny_target, load)
    want: list[int] = []
    for token in llm.generate(llm.tokenize(b"the model of the"), temp=0.0, top_k=1):
        want.append(token)
        if len(want) == 6:
            break
    assert threads and set(threads) == {compute.compute_thread()}
    greedy = SamplingConfig(temperature=0, max_tokens=6, ignore_eos=True)
    with Pyramid.from_paths(tiny_target, load=replace(load, flash_attn=False)) as p:
        got = p.generate("the model of the", greedy, SpecConfig(mode="target"))
    assert got.token_ids == want
