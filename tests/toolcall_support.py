"""Tool-call formats as the chat tests check them (a support module, not a test module): two
tools, call ids in order, a byte-level tokenizer whose grammar checks need no model, and a
format's answer rebuilt from streamed deltas."""

from __future__ import annotations

from typing import Any

from llguidance import LLMatcher, LLTokenizer

from pyramid_gguf.chat import (
    CallIds,
    Message,
    ToolCallFormat,
    diff,
)
from pyramid_gguf.core.grammar import Grammar

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}


ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "a + b",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"$ref": "#/$defs/number"}},
            "required": ["a", "b"],
            "$defs": {"number": {"type": "number"}},
        },
    },
}


def ids() -> CallIds:
    return CallIds(lambda i: f"call_{i}")


def rebuild(fmt: ToolCallFormat, cuts: list[int], text: str) -> tuple[Any, list[dict[str, Any]]]:
    """Stream ``text`` cut at ``cuts`` through diff() into OpenAI chunks, accumulated by the
    openai client itself: the final message it builds."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    state, sent = ChatCompletionStreamState(), []
    calls, previous = CallIds(lambda i: f"call_{i}"), Message("")
    for n in [*cuts, len(text)]:
        current = fmt.parse(text, calls) if n == len(text) else fmt.parse_partial(text[:n], calls)
        delta = diff(previous, current)
        previous = current
        body: dict[str, Any] = {"content": delta.content or None}
        if delta.tool_calls:
            body["tool_calls"] = list(delta.tool_calls)
            sent.extend(delta.tool_calls)
        chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        chunk["choices"] = [{"index": 0, "delta": body, "finish_reason": None}]
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    return state.get_final_completion().choices[0].message, sent


SPECIALS = ["<|eos|>", "<tool_call>", "</tool_call>", "<|python_tag|>"]


class ByteTokenizer:
    """Every byte a token, and the special tokens above (EOS first)."""

    eos_token_id = 256
    bos_token_id = None
    special_token_ids = tuple(range(256, 256 + len(SPECIALS)))
    tokens = (*(bytes([b]) for b in range(256)), *(s.encode() for s in SPECIALS))

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text.encode() if isinstance(text, str) else text)


def tokens(text: str, special: set[str]) -> list[int]:
    """``text`` as bytes, with the special tokens in ``special`` as their single tokens."""
    out: list[int] = []
    while text:
        marker = next((s for s in special if text.startswith(s)), None)
        if marker is not None:
            out.append(256 + SPECIALS.index(marker))
            text = text[len(marker) :]
        else:
            out.extend(text[0].encode())
            text = text[1:]
    return out


def accepts(tokenizer: LLTokenizer, grammar: Grammar, text: str, special: set[str]) -> bool:
    """Whether ``grammar`` takes all of ``text`` and then the end of the answer."""
    assert grammar.kind == "lark"
    lark = LLMatcher.grammar_from_lark(grammar.text)
    assert LLMatcher.validate_grammar(lark, tokenizer) == ""
    matcher = LLMatcher(tokenizer, lark)
    sequence = [*tokens(text, special), ByteTokenizer.eos_token_id]
    return matcher.validate_tokens(sequence) == len(sequence)
