"""The adapter: exact logits rows, rollback, snapshot rollback, tokenization, bad files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llama_cpp import Llama
from lossless import kernel_atol

from pyramid_gguf.core.errors import ContextOverflow, ModelFileError
from pyramid_gguf.core.files import check_gguf_path
from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.native import NativeModel

TEXT = "the model of the tree and the graph return data"


def test_rows_equal_llama_cpp_python_logits(tiny_target: Path, tiny_load: LoadConfig) -> None:
    with NativeModel(tiny_target, tiny_load) as m:
        tokens = m.vocab.tokenize(TEXT)
        rows = m.eval(tokens, [0, 3, -1])
    ref = Llama(
        str(tiny_target), n_ctx=512, logits_all=True, verbose=False, flash_attn=False, n_threads=1
    )
    ref.eval(tokens)
    scores = np.asarray(ref.scores[: len(tokens)])
    assert rows.shape == (3, m.n_vocab)
    np.testing.assert_allclose(rows, scores[[0, 3, len(tokens) - 1]], atol=kernel_atol(1e-4))
    ref.close()


def test_eval_returns_exactly_the_rows_asked_in_order(
    tiny_target: Path, tiny_load: LoadConfig
) -> None:
    with NativeModel(tiny_target, tiny_load) as m:
        tokens = m.vocab.tokenize(TEXT)
        all_rows = m.eval(tokens, range(len(tokens)))
        m.reset()
        picked = m.eval(tokens, [5, 2, -1])
        assert m.n_past == len(tokens)
    np.testing.assert_allclose(picked, all_rows[[5, 2, len(tokens) - 1]], atol=kernel_atol(1e-5))


@pytest.mark.parametrize("force_snapshot", [False, True])
def test_rollback_then_eval_matches_fresh_evaluation(
    tiny_target: Path, force_snapshot: bool
) -> None:
    load = LoadConfig(
        n_ctx=512,
        n_batch=128,
        n_threads=1,
        n_threads_batch=1,
        force_snapshot_rollback=force_snapshot,
    )
    g = np.random.default_rng(0)
    with NativeModel(tiny_target, load) as m, NativeModel(tiny_target, load) as fresh:
        assert (m.snapshot_reason == "forced") is force_snapshot
        seq = [int(t) for t in g.integers(3, m.n_vocab, size=60)]
        m.eval(seq[:40])
        for _ in range(25):
            cut = int(g.integers(1, m.n_past + 1))
            m.rollback(cut)
            assert m.tokens == seq[:cut]
            extra = int(g.integers(1, 12))
            got = m.eval(seq[cut : cut + extra], [-1])[0]
            fresh.reset()
            want = fresh.eval(seq[: cut + extra], [-1])[0]
            np.testing.assert_allclose(got, want, atol=kernel_atol(1e-3))


def test_prompt_longer_than_batch_is_chunked(tiny_target: Path) -> None:
    load = LoadConfig(n_ctx=512, n_batch=16, n_threads=1, n_threads_batch=1)
    big = LoadConfig(n_ctx=512, n_batch=128, n_threads=1, n_threads_batch=1)
    seq = list(range(3, 80))
    with NativeModel(tiny_target, load) as a, NativeModel(tiny_target, big) as b:
        # Different micro-batch shapes round differently through the f16 KV cache.
        np.testing.assert_allclose(
            a.eval(seq, [-1, 20]), b.eval(seq, [-1, 20]), atol=kernel_atol(2e-2)
        )


def test_context_overflow_is_a_user_error(tiny_target: Path) -> None:
    load = LoadConfig(n_ctx=256, n_threads=1, n_threads_batch=1)
    with NativeModel(tiny_target, load) as m, pytest.raises(ContextOverflow, match="context full"):
        m.eval(list(range(3, 3 + m.n_ctx + 1)))


def test_tokenize_detokenize_roundtrip(tiny_target: Path, tiny_load: LoadConfig) -> None:
    with NativeModel(tiny_target, tiny_load) as m:
        tokens = m.vocab.tokenize("the tree é")
        assert tokens[0] == m.vocab.bos
        assert m.vocab.detokenize(tokens[1:]).strip() == "the tree é"
        assert m.vocab.is_eog(m.vocab.eos)


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "not found"), (b"not a gguf at all", "not a GGUF"), (b"GGUF", "truncated")],
)
def test_bad_model_files(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "m.gguf"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelFileError, match=message):
        check_gguf_path(path)
    with pytest.raises(ModelFileError, match="directory"):
        check_gguf_path(tmp_path)


def test_truncated_gguf_fails_to_load_cleanly(tmp_path: Path, tiny_target: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_target.read_bytes()[:50_000])
    with pytest.raises(ModelFileError, match="could not load"):
        NativeModel(cut, LoadConfig(n_threads=1, n_threads_batch=1))


@pytest.fixture
def frees(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What llama.cpp is asked to free, in order (``batch``, ``context``, ``model``); a
    pointer freed again is logged as ``<what> again`` and not passed on (glibc would abort)."""
    import ctypes

    import llama_cpp

    log: list[str] = []
    freed: set[int] = set()

    def address(ptr: Any) -> int:
        return int(ptr) if isinstance(ptr, int) else ctypes.cast(ptr.token, ctypes.c_void_p).value

    def recording(real: Any, what: str) -> Any:
        def free(ptr: Any) -> None:
            if address(ptr) in freed:
                log.append(f"{what} again")
                return
            freed.add(address(ptr))
            log.append(what)
            real(ptr)

        return free

    for name, what in (
        ("llama_batch_free", "batch"),
        ("llama_free", "context"),
        ("llama_model_free", "model"),
    ):
        monkeypatch.setattr(llama_cpp, name, recording(getattr(llama_cpp, name), what))
    return log


def test_a_model_freed_first_frees_its_context_first(
    tiny_target: Path, tiny_load: LoadConfig, frees: list[str]
) -> None:
    """In a reference cycle the collector finalizes objects in no set order: the model's
    handle may go before the context's (``~llama_context`` reads the model)."""
    m = NativeModel(tiny_target, tiny_load)
    m._model.close()
    assert frees == ["context", "model"]
    m.close()
    assert frees == ["context", "model", "batch"]


@pytest.mark.parametrize(
    ("interrupted_call", "freed"),
    [
        ("llama_model_get_vocab", ["model"]),  # inside ModelHandle, after the load
        ("llama_get_memory", ["context", "model"]),  # inside ContextHandle, after its creation
        ("llama_batch_init", ["context", "model"]),  # between the context and the batch
        ("llama_model_is_recurrent", ["batch", "context", "model"]),  # late in NativeModel
    ],
)
def test_an_interrupted_load_frees_what_it_made_context_first(
    tiny_target: Path,
    tiny_load: LoadConfig,
    monkeypatch: pytest.MonkeyPatch,
    frees: list[str],
    interrupted_call: str,
    freed: list[str],
) -> None:
    """A Ctrl-C lands at the first line of Python after a native call: wherever it lands in
    a load, each native object is freed once, the context before its model
    (``~llama_context`` reads the model: freeing it first corrupted the heap)."""
    import gc

    import llama_cpp

    def interrupt(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(llama_cpp, interrupted_call, interrupt)
    with pytest.raises(KeyboardInterrupt):
        NativeModel(tiny_target, tiny_load)
    gc.collect()
    assert frees == freed


@pytest.mark.parametrize("call", ["llama_batch_free", "llama_free", "llama_model_free"])
def test_an_interrupted_close_never_frees_twice(
    tiny_target: Path,
    tiny_load: LoadConfig,
    monkeypatch: pytest.MonkeyPatch,
    frees: list[str],
    call: str,
) -> None:
    """A Ctrl-C that lands just after a free, in ``close``: the collector's ``close`` later
    must not free that pointer again (glibc aborts on a double free)."""
    import gc

    import llama_cpp

    recorded = getattr(llama_cpp, call)

    def free_then_interrupt(ptr: object) -> None:
        recorded(ptr)
        raise KeyboardInterrupt

    m = NativeModel(tiny_target, tiny_load)
    monkeypatch.setattr(llama_cpp, call, free_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        m.close()
    monkeypatch.setattr(llama_cpp, call, recorded)
    m.close()
    del m
    gc.collect()
    assert sorted(frees) == ["batch", "context", "model"]
