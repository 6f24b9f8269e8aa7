"""llama.cpp's named chat templates (``--chat-template chatml``, ``llama3``, ``gemma``...) as
Jinja sources that render exactly what llama.cpp's ``llama_chat_apply_template`` renders for
the same name (``src/llama-chat.cpp``; ``tests/test_named_templates.py`` compares the two).

Like llama.cpp's, these templates hold no BOS token (the tokenizer adds it) and no tool
format; ``trim`` is llama.cpp's trimming of the message's surrounding whitespace.
"""

from __future__ import annotations

from ..core.errors import UserError

_NL = "\\n"


def _each(body: str, after: str = "", before: str = "") -> str:
    """A template: ``before``, then ``body`` for each message ``m``, then ``after`` when a
    generation prompt is asked for (all Jinja, no whitespace of its own)."""
    end = f"{{%- if add_generation_prompt %}}{after}{{%- endif %}}" if after else ""
    return f"{before}{{%- for m in messages %}}{body}{{%- endfor %}}{end}"


def _out(text: str) -> str:
    return "{{- " + text + " }}"


def _roles(by_role: dict[str, str], other: str = "") -> str:
    """``{% if m.role == ... %}`` branches; ``other`` for any other role."""
    parts = []
    for i, (role, out) in enumerate(by_role.items()):
        parts.append(f"{{%- {'if' if i == 0 else 'elif'} m.role == '{role}' %}}{out}")
    if other:
        parts.append(f"{{%- else %}}{other}")
    return "".join(parts) + "{%- endif %}"


def _llama2(system: bool, bos_inside: bool, strip: bool) -> str:
    content = "(m.content | trim)" if strip else "m.content"
    sys_out = (
        _out(f"'<<SYS>>{_NL}' + {content} + '{_NL}<</SYS>>{_NL}{_NL}'")
        if system
        else _out(f"{content} + '{_NL}'")
    )
    again = "<s>[INST] " if bos_inside else "[INST] "
    body = (
        f"{{%- if not ns.inside %}}{{%- set ns.inside = true %}}{_out(repr(again))}{{%- endif %}}"
        + _roles(
            {"system": sys_out, "user": _out(f"{content} + ' [/INST]'")},
            _out(f"{content} + '</s>'") + "{%- set ns.inside = false %}",
        )
    )
    return _each(body, before="{%- set ns = namespace(inside=true) %}" + _out("'[INST] '"))


def _mistral(leading: str, trailing: str, trim_assistant: bool) -> str:
    answer = "(m.content | trim)" if trim_assistant else "m.content"
    body = (
        "{%- if not ns.inside %}"
        + _out(repr(f"{leading}[INST]{trailing}"))
        + "{%- set ns.inside = true %}{%- endif %}"
        + _roles(
            {
                "system": _out(f"m.content + '{_NL}{_NL}'"),
                "user": _out(f"m.content + {leading!r} + '[/INST]'"),
            },
            _out(f"{trailing!r} + {answer} + '</s>'") + "{%- set ns.inside = false %}",
        )
    )
    return _each(body, before="{%- set ns = namespace(inside=false) %}")


def _mistral_v7(space: str) -> str:
    return _each(
        _roles(
            {
                "system": _out(f"'[SYSTEM_PROMPT]{space}' + m.content + '[/SYSTEM_PROMPT]'"),
                "user": _out(f"'[INST]{space}' + m.content + '[/INST]'"),
            },
            _out(f"'{space}' + m.content + '</s>'"),
        )
    )


def _vicuna(orca: bool) -> str:
    system = "'SYSTEM: ' + m.content + '\\n'" if orca else f"m.content + '{_NL}{_NL}'"
    return _each(
        _roles(
            {
                "system": _out(system),
                "user": _out(f"'USER: ' + m.content + '{_NL}'"),
                "assistant": _out(f"'ASSISTANT: ' + m.content + '</s>{_NL}'"),
            }
        ),
        _out("'ASSISTANT:'"),
    )


_GEMMA = _each(
    "{%- if m.role == 'system' %}{%- set ns.system = ns.system + (m.content | trim) %}{%- else %}"
    "{%- set role = 'model' if m.role == 'assistant' else m.role %}"
    + _out(f"'<start_of_turn>' + role + '{_NL}'")
    + "{%- if ns.system and role != 'model' %}"
    + _out(f"ns.system + '{_NL}{_NL}'")
    + "{%- set ns.system = '' %}{%- endif %}"
    + _out(f"(m.content | trim) + '<end_of_turn>{_NL}'")
    + "{%- endif %}",
    _out(f"'<start_of_turn>model{_NL}'"),
    before="{%- set ns = namespace(system='') %}",
)

_END = "<｜end▁of▁sentence｜>"
_TURN = "<|START_OF_TURN_TOKEN|>"

#: Jinja sources of llama.cpp's named templates, by llama.cpp's name.
NAMED_TEMPLATES: dict[str, str] = {
    "chatml": _each(
        _out(f"'<|im_start|>' + m.role + '{_NL}' + m.content + '<|im_end|>{_NL}'"),
        _out(f"'<|im_start|>assistant{_NL}'"),
    ),
    "llama2": _llama2(system=False, bos_inside=False, strip=False),
    "llama2-sys": _llama2(system=True, bos_inside=False, strip=False),
    "llama2-sys-bos": _llama2(system=True, bos_inside=True, strip=False),
    "llama2-sys-strip": _llama2(system=True, bos_inside=False, strip=True),
    "mistral-v1": _mistral(" ", " ", trim_assistant=False),
    "mistral-v3": _mistral("", " ", trim_assistant=True),
    "mistral-v3-tekken": _mistral("", "", trim_assistant=False),
    "mistral-v7": _mistral_v7(" "),
    "mistral-v7-tekken": _mistral_v7(""),
    "phi3": _each(
        _out(f"'<|' + m.role + '|>{_NL}' + m.content + '<|end|>{_NL}'"),
        _out(f"'<|assistant|>{_NL}'"),
    ),
    "phi4": _each(
        _out("'<|im_start|>' + m.role + '<|im_sep|>' + m.content + '<|im_end|>'"),
        _out("'<|im_start|>assistant<|im_sep|>'"),
    ),
    "falcon3": _each(
        _out(f"'<|' + m.role + '|>{_NL}' + m.content + '{_NL}'"),
        _out(f"'<|assistant|>{_NL}'"),
    ),
    "zephyr": _each(
        _out(f"'<|' + m.role + '|>{_NL}' + m.content + '<|endoftext|>{_NL}'"),
        _out(f"'<|assistant|>{_NL}'"),
    ),
    "monarch": _each(
        _out(f"('' if loop.first else '<s>') + m.role + '{_NL}' + m.content + '</s>{_NL}'"),
        _out(f"'<s>assistant{_NL}'"),
    ),
    "gemma": _GEMMA,
    "openchat": _each(
        _roles(
            {"system": _out("m.content + '<|end_of_turn|>'")},
            _out(
                "'GPT4 Correct ' + m.role[:1] | upper + m.role[1:] + ': ' + m.content"
                " + '<|end_of_turn|>'"
            ),
        ),
        _out("'GPT4 Correct Assistant:'"),
    ),
    "vicuna": _vicuna(orca=False),
    "vicuna-orca": _vicuna(orca=True),
    "deepseek": _each(
        _roles(
            {
                "system": _out("m.content"),
                "user": _out(f"'### Instruction:{_NL}' + m.content + '{_NL}'"),
                "assistant": _out(f"'### Response:{_NL}' + m.content + '{_NL}<|EOT|>{_NL}'"),
            }
        ),
        _out(f"'### Response:{_NL}'"),
    ),
    "deepseek2": _each(
        _roles(
            {
                "system": _out(f"m.content + '{_NL}{_NL}'"),
                "user": _out(f"'User: ' + m.content + '{_NL}{_NL}'"),
                "assistant": _out(f"'Assistant: ' + m.content + '{_END}'"),
            }
        ),
        _out("'Assistant:'"),
    ),
    "deepseek3": _each(
        _roles(
            {
                "system": _out(f"m.content + '{_NL}{_NL}'"),
                "user": _out("'<｜User｜>' + m.content"),
                "assistant": _out(f"'<｜Assistant｜>' + m.content + '{_END}'"),
            }
        ),
        _out("'<｜Assistant｜>'"),
    ),
    "command-r": _each(
        _roles(
            {
                "system": _out(f"'{_TURN}<|SYSTEM_TOKEN|>' + (m.content | trim)"),
                "user": _out(f"'{_TURN}<|USER_TOKEN|>' + (m.content | trim)"),
                "assistant": _out(f"'{_TURN}<|CHATBOT_TOKEN|>' + (m.content | trim)"),
            }
        )
        + "{%- if m.role in ['system', 'user', 'assistant'] %}"
        + _out("'<|END_OF_TURN_TOKEN|>'")
        + "{%- endif %}",
        _out(f"'{_TURN}<|CHATBOT_TOKEN|>'"),
    ),
    "llama3": _each(
        _out(
            f"'<|start_header_id|>' + m.role + '<|end_header_id|>{_NL}{_NL}' + (m.content | trim)"
            " + '<|eot_id|>'"
        ),
        _out(f"'<|start_header_id|>assistant<|end_header_id|>{_NL}{_NL}'"),
    ),
}


def named_template(name: str) -> str:
    """The Jinja source of llama.cpp's template ``name``; an unknown name is a one-line
    :class:`UserError` listing the known ones."""
    if name not in NAMED_TEMPLATES:
        known = ", ".join(NAMED_TEMPLATES)
        raise UserError(f"unknown chat template {name!r}: known names are {known}")
    return NAMED_TEMPLATES[name]
