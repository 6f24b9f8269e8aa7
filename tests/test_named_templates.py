"""llama.cpp's named chat templates: each Jinja source renders exactly what llama.cpp's own
``llama_chat_apply_template`` renders for that name, over chats with a system prompt, several
turns and surrounding whitespace; an unknown name is a one-line error listing the known ones."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp
import pytest
from conftest import invoke

from pyramid_gguf.chat.named import NAMED_TEMPLATES, named_template
from pyramid_gguf.chat.templates import ChatTemplate
from pyramid_gguf.core.errors import UserError

CHATS = [
    [{"role": "user", "content": "Hello"}],
    [
        {"role": "system", "content": "You are terse. "},
        {"role": "user", "content": " What is 2+2?\n"},
        {"role": "assistant", "content": " 4 "},
        {"role": "user", "content": "And 3+3?"},
    ],
    [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "system", "content": "late system"},
        {"role": "user", "content": "three"},
    ],
]


def llama_cpp_renders(name: str, chat: list[dict[str, str]], add_ass: bool) -> str:
    """llama.cpp's own rendering of ``chat`` under its built-in template ``name``."""
    array = (llama_cpp.llama_chat_message * len(chat))(
        *(llama_cpp.llama_chat_message(m["role"].encode(), m["content"].encode()) for m in chat)
    )
    buf = ctypes.create_string_buffer(1 << 14)
    n = llama_cpp.llama_chat_apply_template(name.encode(), array, len(chat), add_ass, buf, 1 << 14)
    assert 0 < n < 1 << 14, f"llama.cpp does not know {name}"
    return buf.raw[:n].decode()


def builtin_names() -> set[str]:
    """The names llama.cpp lists in ``llama_chat_builtin_templates``."""
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    out = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(out, n)
    return {s.decode() for s in out if s is not None}


def render(name: str, chat: list[dict[str, str]], add_ass: bool) -> str:
    template = ChatTemplate.named(name)
    return template.render(chat, add_generation_prompt=add_ass, bos_token="<s>", eos_token="</s>")


@pytest.mark.parametrize("name", sorted(NAMED_TEMPLATES))
def test_named_template_renders_as_llama_cpp(name: str) -> None:
    assert name in builtin_names()
    for chat in CHATS:
        for add_ass in (True, False):
            assert render(name, chat, add_ass) == llama_cpp_renders(name, chat, add_ass), (
                name,
                chat,
                add_ass,
            )


def test_common_names_are_there() -> None:
    for name in ("chatml", "llama2", "llama3", "mistral-v7", "phi3", "gemma", "deepseek"):
        assert name in NAMED_TEMPLATES
    assert ChatTemplate.named("llama3").origin == "llama.cpp llama3"


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UserError) as e:
        named_template("llama9")
    message = str(e.value)
    assert "'llama9'" in message and "chatml" in message and "gemma" in message
    assert "\n" not in message


def test_chat_template_flag_takes_a_name_a_file_or_jinja(tmp_path: Path) -> None:
    from pyramid_gguf.cli.options import chat_template_from

    assert chat_template_from("gemma") == NAMED_TEMPLATES["gemma"]
    assert chat_template_from(None) is None
    inline = "{{ messages[0].content }}"
    assert chat_template_from(inline) == inline
    file = tmp_path / "t.jinja"
    file.write_text(inline, encoding="utf-8")
    assert chat_template_from(str(file)) == inline
    with pytest.raises(UserError, match="known names are chatml"):
        chat_template_from("no-such-template")


def test_serve_chat_template_takes_a_name(tiny_target: Path) -> None:
    """``serve --chat-template llama3`` (``--chat-format`` is the same flag): /apply-template
    renders llama.cpp's llama3 prompt, not the GGUF's ChatML."""
    import httpx
    from conftest import TINY_LOAD
    from serving_support import live_server

    from pyramid_gguf import Pyramid
    from pyramid_gguf.serving.settings import ServerSettings, resolve_chat_format

    messages = [{"role": "user", "content": "What is today?"}]
    settings = ServerSettings(chat_template=resolve_chat_format("llama3"))
    with Pyramid.from_paths(tiny_target, load=TINY_LOAD) as pyramid:
        gguf = pyramid.apply_chat_template(messages)
        with live_server(pyramid, settings) as live:
            r = httpx.post(f"{live.url}/apply-template", json={"messages": messages}, timeout=60)
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert prompt != gguf
    assert prompt.endswith(render("llama3", messages, True))


def test_run_chat_template_renders_the_prompt_with_it(tiny_target: Path, tiny_draft: Path) -> None:
    """``run --chat-template llama3``: the prompt is the llama3 rendering (its token count in
    the JSON stats), -v says a --chat-template rendered it, and it implies --chat on a model
    without a template of its own."""
    import json

    from conftest import TINY_LOAD

    from pyramid_gguf import Pyramid

    fast = ["-t", "1", "-c", "512", "--temp", "0", "-n", "4"]
    messages = [{"role": "user", "content": "hi"}]
    with Pyramid.from_paths(tiny_target, load=TINY_LOAD) as pyramid:
        want = len(pyramid.chat_tokens(messages, NAMED_TEMPLATES["llama3"]))
        gguf = len(pyramid.chat_tokens(messages))
    assert want != gguf
    for target in (tiny_target, tiny_draft):  # with and without a template of its own
        code, out, err = invoke(
            "run", "--target", str(target), "--chat-template", "llama3", "-p", "hi", *fast, "--json"
        )
        assert code == 0, err
        assert json.loads(out)["stats"]["prompt_tokens"] == want
    code, _, err = invoke(
        "run", "--target", str(tiny_target), "--chat-template", "llama3", "-p", "hi", *fast, "-v"
    )
    assert code == 0 and "chat template: --chat-template" in err, err
    code, out, err = invoke(
        "run", "--target", str(tiny_target), "--chat-template", "llama3", "--raw", "-p", "hi"
    )
    assert code == 1 and "drop --raw" in out + err


@pytest.mark.parametrize("extra", [["run", "-p", "x"], ["serve"]])
def test_an_unknown_template_name_is_one_error_line(extra: list[str], tmp_path: Path) -> None:
    """Refused before any model is loaded (the target file does not even exist)."""
    missing = str(tmp_path / "x.gguf")
    code, out, err = invoke(*extra, "--target", missing, "--chat-template", "llama9")
    assert code == 1
    lines = (out + err).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), lines
    assert "'llama9'" in lines[0] and "llama3" in lines[0]
