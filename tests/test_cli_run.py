"""``pyramid-gguf run`` as a user runs it: streaming, JSON, stdin, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import invoke

FAST = ["-t", "1", "-c", "512", "--temp", "0", "-n", "12"]


def test_run_streams_text_and_prints_stats(
    tiny_target: Path, tiny_draft: Path, tiny_qualifier: Path
) -> None:
    ladder = ["--target", str(tiny_target), "--draft", str(tiny_draft)]
    ladder += ["--qualifier", str(tiny_qualifier), "-p", "the model", *FAST]
    code, out, err = invoke("run", *ladder, "--mode", "psd-exact", "-v")
    assert code == 0, err
    assert out.strip()
    assert "mode psd-exact" in err
    assert "draft_n=" in err
    code, out, err = invoke("run", *ladder, "-v")  # auto by default: says what it chose, and why
    assert code == 0, err
    assert "mode auto" in err and "auto: " in err
    outlook = next(line for line in err.splitlines() if "predicted speedup over target" in line)
    assert all(f"{chain} " in outlook for chain in ("draft", "qualifier", "pyramid"))


def test_run_json_and_modes_agree(tiny_target: Path, tiny_draft: Path) -> None:
    texts = {}
    for mode in ("target", "sd"):
        code, out, err = invoke(
            "run",
            "--target",
            str(tiny_target),
            "--draft",
            str(tiny_draft),
            "-p",
            "the model",
            *FAST,
            "--mode",
            mode,
            "--json",
        )
        assert code == 0, err
        doc = json.loads(out)
        assert doc["stats"]["mode"] == mode
        assert doc["stats"]["generated_tokens"] <= 12
        texts[mode] = doc["text"]
    assert texts["sd"] == texts["target"]


def test_prompt_from_stdin_and_file(tiny_target: Path, tmp_path: Path) -> None:
    code, out_stdin, _ = invoke("run", "--target", str(tiny_target), *FAST, input="the model")
    assert code == 0
    f = tmp_path / "prompt.txt"
    f.write_text("the model")
    code, out_file, _ = invoke("run", "--target", str(tiny_target), *FAST, "-f", str(f))
    assert code == 0
    assert out_file == out_stdin


def test_chat_template_is_applied_by_default_when_the_model_has_one(
    tiny_target: Path, tiny_draft: Path
) -> None:
    code, chat, err = invoke("run", "--target", str(tiny_target), "--chat", "-p", "hi", *FAST)
    assert code == 0, err
    assert chat.strip()
    _, auto, _ = invoke("run", "--target", str(tiny_target), "-p", "hi", *FAST)
    _, raw, _ = invoke("run", "--target", str(tiny_target), "--raw", "-p", "hi", *FAST)
    assert auto == chat
    assert raw != chat
    # A model without a template: raw by default, the built-in ChatML when a chat is demanded
    # (-v says which template rendered the prompt).
    code, _, err = invoke("run", "--target", str(tiny_draft), "-p", "hi", *FAST, "-v")
    assert code == 0 and "chat template" not in err, err
    code, _, err = invoke("run", "--target", str(tiny_draft), "--chat", "-p", "hi", *FAST, "-v")
    assert code == 0, err
    assert "chat template: builtin chatml" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "/nonexistent/model.gguf", "-p", "x"], "model file not found"),
        (["--target", "/", "-p", "x"], "is a directory"),
        (["--target", "{notgguf}", "-p", "x"], "not a GGUF file"),
        (["--target", "{truncated}", "-p", "x"], "could not load"),
        (["--target", "{target}", "-p", "x", "--temp", "-1"], "--temperature must be >= 0"),
        (["--target", "{target}", "-p", "x", "--top-p", "2"], "--top-p must be in"),
        (["--target", "{target}", "-p", "x", "-n", "0"], "--max-tokens must be at least 1"),
        (["--target", "{target}", "-p", "x", "--mode", "sd"], "needs a draft model"),
        (["--target", "{target}", "-p", "x", "--l-d", "0", "--draft", "ngram"], "--l-d must be"),
        (["--target", "{target}", "-p", "the " * 600], "does not fit the context"),
        (["--target", "{target}", "--draft", "{other}", "-p", "x"], "vocabularies differ"),
        (["--draft", "{target}", "-p", "x"], "--target is required"),
        (["--target", "{target}", "-p", "x", "-f", "{notgguf}"], "not both"),
        (["--target", "{target}", "-p", "x", "--vram", "lots"], "bad size"),
        (["--target", "{target}", "-p", "x", "--max-block", "0"], "--max-block must be"),
        (["--target", "{target}", "-p", "x", "--ngram-min", "1"], "--ngram-min must be"),
        # malformed command lines: one line too, not click's usage block
        (["--target", "{target}", "-p", "x", "--mode", "nonsense"], "Invalid value for '--mode'"),
        (["--target", "{target}", "-p", "x", "--temp", "hot"], "'hot' is not a valid float"),
        (["--target", "{target}", "-p", "x", "--bogus"], "No such option '--bogus'"),
        (["--target", "{target}", "-p", "x", "--top-k", "many"], "'many' is not a valid integer"),
    ],
)
def test_bad_input_is_one_line_error(
    args: list[str], message: str, tmp_path: Path, tiny_target: Path, tiny_other_vocab: Path
) -> None:
    notgguf = tmp_path / "x.gguf"
    notgguf.write_text("hello")
    truncated = tmp_path / "t.gguf"
    truncated.write_bytes(tiny_target.read_bytes()[:40_000])
    subst = {
        "{notgguf}": str(notgguf),
        "{truncated}": str(truncated),
        "{target}": str(tiny_target),
        "{other}": str(tiny_other_vocab),
    }
    argv = [subst.get(a, a) for a in args]
    code, out, err = invoke("run", *argv, "-t", "1", "-c", "512")
    assert code == 1, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert message in lines[0]
    assert "Traceback" not in err


def test_bad_flag_through_a_real_process(tiny_target: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyramid_gguf",
            "run",
            "--target",
            str(tiny_target),
            "-p",
            "x",
            "--mode",
            "warp-speed",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("Error: Invalid value for '--mode'")


@pytest.mark.parametrize("command", ["run", "bench", "tune", "serve", "calibrate"])
def test_zero_threads_is_refused_everywhere(command: str, tiny_target: Path) -> None:
    code, out, err = invoke(command, "--target", str(tiny_target), "-p", "x", "-t", "0")
    if command != "run":  # -p is run's flag; the others take prompts otherwise
        code, out, err = invoke(command, "--target", str(tiny_target), "-t", "0")
    assert code == 1, (out, err)
    assert err.strip() == "Error: --threads must be at least 1"


def test_interrupted_json_keeps_the_partial_answer(
    tiny_target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C in the middle of ``run --json``: the JSON object still comes, with the text so
    far and ``finish_reason: interrupted``, and the exit status is 130."""
    from pyramid_gguf.api import Pyramid

    real_stream = Pyramid.stream

    def interrupted(self: Pyramid, *args: object, **kwargs: object) -> Iterator[object]:
        for i, step in enumerate(real_stream(self, *args, **kwargs)):  # type: ignore[arg-type]
            if i == 5:
                raise KeyboardInterrupt
            yield step

    monkeypatch.setattr(Pyramid, "stream", interrupted)
    code, out, err = invoke("run", "--target", str(tiny_target), "-p", "the model", *FAST, "--json")
    assert code == 130
    doc = json.loads(out)
    assert doc["finish_reason"] == "interrupted" and doc["stats"]["finish_reason"] == "interrupted"
    assert len(doc["tokens"]) == 5 and doc["text"]
    assert err.strip() == "interrupted"
