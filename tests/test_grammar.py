"""Structured output's library layer: grammars, their checks, and the per-sequence constraint.

Most tests run on the tiny synthetic vocabulary (byte-fallback tokens spell any JSON); one
``real`` test runs on Qwen2.5-Coder 0.5B's 151936-token vocabulary and model.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import llguidance
import numpy as np
import pydantic
import pytest

from pyramid_gguf.core.errors import UserError
from pyramid_gguf.core.grammar import Grammar, closed_schema
from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.grammar import (
    Constraint,
    check_grammar,
    compile_grammar,
    mask_logits,
    masked_argmax,
)
from pyramid_gguf.native import NativeModel
from pyramid_gguf.native.grammar import grammar_tokenizer

LOAD = LoadConfig(n_ctx=256, n_batch=64, n_threads=2, n_threads_batch=2, flash_attn=False)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}

#: Schemas every sampled answer must satisfy: nesting, arrays with bounds, enums, const,
#: optional and nullable fields, integer and number bounds (inclusive and exclusive).
SCHEMAS: dict[str, dict[str, Any]] = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "address": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string"},
                            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                        },
                        "required": ["city", "zip"],
                        "additionalProperties": False,
                    },
                },
                "required": ["name", "address"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "arrays": {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 8},
                "minItems": 2,
                "maxItems": 4,
            },
            "matrix": {
                "type": "array",
                "items": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "minItems": 1,
                    "maxItems": 3,
                },
                "maxItems": 2,
            },
        },
        "required": ["tags", "matrix"],
        "additionalProperties": False,
    },
    "enums": {
        "type": "object",
        "properties": {
            "label": {"enum": ["positive", "negative", "neutral"]},
            "mode": {"const": "fast"},
            "flag": {"type": "boolean"},
            "note": {"type": ["string", "null"], "maxLength": 10},
        },
        "required": ["label", "mode", "flag"],
        "additionalProperties": False,
    },
    "numbers": {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "score": {"type": "number", "minimum": -1.5, "maximum": 1.5},
            "count": {"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 1000},
            "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        },
        "required": ["age", "score", "count", "ratio"],
        "additionalProperties": False,
    },
    "top_level_array": {
        "type": "array",
        "items": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 5}]},
        "minItems": 1,
        "maxItems": 5,
    },
}


@pytest.fixture(scope="module")
def tiny_model(tiny_target: Path) -> Iterator[NativeModel]:
    with NativeModel(tiny_target, LOAD) as model:
        yield model


@pytest.fixture(scope="module")
def tok(tiny_model: NativeModel) -> llguidance.LLTokenizer:
    return grammar_tokenizer(tiny_model)


def constraint(grammar: Grammar, tok: llguidance.LLTokenizer, extra: int = 0) -> Constraint:
    return Constraint(grammar, tok, tok.vocab_size + extra)


def text_tokens(tok: llguidance.LLTokenizer, text: str) -> list[int]:
    return list(tok.tokenize_str(text))


def closer_bias(tok: llguidance.LLTokenizer, n_vocab: int) -> np.ndarray:
    """Logit bias ``[V]`` towards tokens that close strings, numbers and containers (and EOS),
    so random answers end after tens of tokens rather than thousands."""
    bias = np.zeros(n_vocab)
    for t in range(tok.vocab_size):
        if any(c in tok.decode_bytes([t]) for c in b'"]},'):
            bias[t] = 3.0
    bias[tok.eos_tokens] = 3.0
    return bias


def sample_answer(
    c: Constraint, rng: np.random.Generator, bias: np.ndarray, limit: int = 1000
) -> list[int]:
    """Tokens sampled from random logits masked to the grammar (Gumbel-max), EOS last."""
    out: list[int] = []
    while len(out) < limit:
        allowed = c.allowed()
        assert allowed[list(c.eos)].any() == c.accepting  # EOS exactly where it may end
        logits = bias + rng.gumbel(size=allowed.shape)
        token = int(masked_argmax(logits[None], allowed[None])[0])
        assert token >= 0, "the grammar allowed nothing before it was complete"
        c.consume([token])
        out.append(token)
        if token in c.eos:
            return out
    raise AssertionError(f"no EOS within {limit} tokens")


# --- Grammar: forms, compile, check ----------------------------------------------------


def test_checking_a_grammar_loads_neither_llama_cpp_nor_numpy() -> None:
    """The server checks requests without native code; numpy must not load before llama.cpp."""
    code = (
        "import sys, pyramid_gguf.grammar as g; from pyramid_gguf.core.grammar import Grammar"
        "; g.check_grammar(Grammar.json_schema({'type': 'object'}))"
        "; print('llama_cpp' in sys.modules, 'numpy' in sys.modules)"
        "; g.Constraint; print('llama_cpp' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False", "True"]


def test_json_schema_accepts_dict_text_and_pydantic_model() -> None:
    class Person(pydantic.BaseModel):
        name: str
        age: int

    from_model = Grammar.json_schema(Person)
    assert json.loads(from_model.text) == Person.model_json_schema()
    assert Grammar.json_schema(json.dumps(PERSON)) == Grammar.json_schema(PERSON)
    assert list(json.loads(Grammar.json_schema(PERSON).text)["properties"]) == [
        "name",
        "age",
        "city",
    ]  # the user's key order is the generation order
    check_grammar(from_model)


def test_compile_is_cached_with_fixed_whitespace() -> None:
    a, b = Grammar.json_schema(PERSON), Grammar.json_schema(dict(PERSON))
    assert compile_grammar(a) is compile_grammar(b)
    options = json.loads(compile_grammar(a))["grammars"][0]["json_schema"]["x-guidance"]
    assert options["whitespace_flexible"] is False


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Grammar.json_schema("{not json"), "the JSON schema is not JSON: "),
        (lambda: Grammar.json_schema("[1, 2]"), "a JSON schema must be a JSON object, not list"),
        (
            lambda: Grammar.json_schema({"type": "foo"}),
            "invalid JSON schema: Invalid type: foo",
        ),
        (
            lambda: Grammar.json_schema({"type": "object", "not": {"required": ["a"]}}),
            'invalid JSON schema: Unimplemented keys: ["not"]',
        ),
        (
            lambda: Grammar.json_schema({"type": "string", "format": "weird"}),
            "invalid JSON schema: Unknown format: weird",
        ),
        (
            lambda: Grammar.json_schema({"type": "string", "pattern": "(?<=a)b"}),
            "look-around, including look-ahead and look-behind, is not supported",
        ),
        (
            lambda: Grammar.json_schema({"$ref": "#/$defs/missing"}),
            "invalid JSON schema: Pointer '/$defs/missing' does not exist",
        ),
        (lambda: Grammar.gbnf('root ::= ( "a" '), "invalid GBNF grammar: Expected ')' at line 1"),
        (lambda: Grammar.gbnf("root ::= item"), "invalid GBNF grammar: Rule 'item' not found"),
        (lambda: Grammar.gbnf('item ::= "a"'), "invalid GBNF grammar: No 'root' rule found"),
        (lambda: Grammar.gbnf("root ::= <[1000]>"), "invalid GBNF grammar: Expected name"),
        (lambda: Grammar.lark("start: foo"), 'invalid Lark grammar: at 1(8): unknown name: "foo"'),
        (lambda: Grammar.regex("(abc"), "invalid regular expression: at 1(8): invalid regex"),
    ],
)
def test_bad_grammars_are_one_line_user_errors(make: Any, message: str) -> None:
    with pytest.raises(UserError) as err:
        check_grammar(make())
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_valid_grammars_pass_the_check() -> None:
    json_gbnf = (
        'root ::= "{" ws "\\"k\\":" ws value ws "}"\n'
        'value ::= [0-9]+ | "\\"" [^"]* "\\""\n'
        "ws ::= [ \\t\\n]{0,2}  # bounded repetition and comments"
    )
    for g in (
        Grammar.json_object(),
        Grammar.json_schema(PERSON),
        Grammar.gbnf(json_gbnf),
        Grammar.lark('start: "yes" | "no"'),
        Grammar.regex("[a-z]{3,6}-[0-9]{2}"),
    ):
        check_grammar(g)


def test_strict_false_ignores_unsupported_keywords() -> None:
    schema = {"type": "object", "not": {"required": ["a"]}}
    check_grammar(Grammar.json_schema(schema, strict=False))
    with pytest.raises(UserError):
        check_grammar(Grammar.json_schema(schema))


# --- masking ----------------------------------------------------------------------------


def test_mask_logits_and_masked_argmax() -> None:
    logits = np.array([[1.0, 5.0, 3.0, 3.0], [0.0, 1.0, 2.0, 3.0], [4.0, 3.0, 2.0, 1.0]])
    allowed = np.array(
        [[True, False, True, True], [False, False, False, False], [False, True, True, False]]
    )
    masked = mask_logits(logits.astype(np.float32), allowed)
    assert masked.dtype == np.float32
    assert np.isneginf(masked[~allowed]).all() and (masked[allowed] == logits[allowed]).all()
    assert masked_argmax(logits, allowed).tolist() == [2, -1, 1]  # lowest id on a tie


# --- Constraint on the tiny vocabulary --------------------------------------------------


def test_tokenizer_is_built_once_with_the_models_eos(
    tiny_model: NativeModel, tok: llguidance.LLTokenizer
) -> None:
    assert grammar_tokenizer(tiny_model) is tok
    assert tok.vocab_size == tiny_model.n_vocab
    assert tok.eos_tokens == [tiny_model.vocab.eos]


def test_forced_tokens_of_a_keyed_schema(tok: llguidance.LLTokenizer) -> None:
    c = constraint(Grammar.json_schema(PERSON), tok)
    forced = c.forced()
    assert tok.decode_bytes(forced) == b'{"name": "'  # one byte per token here: all forced
    assert c.forced() == forced and c.n_consumed == 0  # reading changes nothing
    assert c.allowed().sum() == 1
    c.consume(forced)
    assert c.forced() == [] and c.allowed().sum() > 10  # the name is the model's choice
    c.consume(text_tokens(tok, 'Bob"'))
    assert tok.decode_bytes(c.forced()) == b', "age": '  # json.dumps's layout


def test_masks_equal_consume_then_allowed(tok: llguidance.LLTokenizer) -> None:
    rng = np.random.default_rng(1)
    grammar = Grammar.json_schema(SCHEMAS["arrays"])
    bias = closer_bias(tok, tok.vocab_size + 3)
    answer = sample_answer(constraint(grammar, tok, extra=3), rng, bias)
    assert len(answer) > 20
    c = constraint(grammar, tok, extra=3)
    c.consume(answer[:4])
    draft = [*answer[4:14], answer[-1]]  # ten tokens, then an EOS the grammar refuses there
    rows = c.masks(draft)
    assert rows.shape == (len(draft) + 1, tok.vocab_size + 3) and rows.dtype == bool
    assert c.n_consumed == 4
    for i, token in enumerate(draft[:10]):
        assert (rows[i] == c.allowed()).all(), i
        c.consume([token])
    assert (rows[10] == c.allowed()).all()
    assert not rows[10][answer[-1]] and not rows[11].any()  # refused EOS: nothing after it
    assert not rows[:, tok.vocab_size :].any()  # ids past the tokenizer's never


def test_masks_and_validate_stop_at_a_refused_token(tok: llguidance.LLTokenizer) -> None:
    c = constraint(Grammar.json_schema(PERSON), tok)
    good = [*text_tokens(tok, json.dumps({"name": "Al", "age": 7, "city": "Rome"})), tok.eos_token]
    assert c.validate(good) == len(good)
    bad = text_tokens(tok, '{"name": "Al", "age": x')
    assert c.validate(bad) == len(bad) - 1
    rows = c.masks(bad + text_tokens(tok, "12"))
    assert rows[len(bad) - 1].any() and not rows[len(bad) - 1][bad[-1]]
    assert not rows[len(bad) :].any()
    assert c.validate([*good[:5], tok.eos_token]) == 5  # EOS before the object is complete
    assert c.validate([*good, tok.eos_token]) == len(good)  # nothing after EOS
    assert c.n_consumed == 0 and c.forced() == good[:10]


def test_validate_accepts_eos_only_where_the_grammar_may_end(tok: llguidance.LLTokenizer) -> None:
    c = constraint(Grammar.regex("[0-9]+"), tok)
    eos = tok.eos_token
    assert c.validate([eos]) == 0 and not c.allowed()[eos] and not c.accepting
    digits = text_tokens(tok, "42")
    assert c.validate([*digits, eos]) == len(digits) + 1
    rows = c.masks([*digits, eos, digits[0]])
    assert rows[len(digits)][eos] and not rows[len(digits) + 1 :].any() and c.n_consumed == 0
    c.consume(digits)
    assert c.accepting and not c.stopped and c.allowed()[eos] and c.allowed()[digits[0]]
    c.consume([eos])
    assert c.stopped and not c.allowed().any() and c.validate(digits) == 0


def test_rollback_restores_masks(tok: llguidance.LLTokenizer) -> None:
    rng = np.random.default_rng(2)
    grammar = Grammar.json_schema(SCHEMAS["nested"])
    answer = sample_answer(constraint(grammar, tok), rng, closer_bias(tok, tok.vocab_size))
    c = constraint(grammar, tok)
    seen = []
    for token in answer:
        seen.append(c.allowed())
        c.consume([token])
    assert c.stopped and c.n_consumed == len(answer)
    for back in (1, 3, len(answer) - 3):  # past the EOS, then deep into the answer
        c.rollback(back)
        assert (c.allowed() == seen[c.n_consumed]).all()
        c.consume(answer[c.n_consumed :])
    with pytest.raises(ValueError, match="cannot roll back"):
        c.rollback(len(answer) + 1)
    c.rollback(len(answer))
    assert (c.allowed() == seen[0]).all()


def test_refused_consume_changes_nothing(tok: llguidance.LLTokenizer) -> None:
    c = constraint(Grammar.json_schema(PERSON), tok)
    start = c.allowed()
    with pytest.raises(ValueError, match="refuses token"):
        c.consume([*c.forced(), tok.eos_token])  # EOS inside the object
    assert c.n_consumed == 0 and (c.allowed() == start).all()


def test_copy_is_independent(tok: llguidance.LLTokenizer) -> None:
    c = constraint(Grammar.json_schema(PERSON), tok)
    forced = c.forced()
    other = c.copy()
    other.consume(forced)
    assert c.n_consumed == 0 and c.forced() == forced
    assert other.n_consumed == len(forced) and other.forced() == []


def test_vocabulary_wider_than_the_logits_is_refused(tok: llguidance.LLTokenizer) -> None:
    with pytest.raises(ValueError, match="narrower"):
        Constraint(Grammar.json_object(), tok, tok.vocab_size - 1)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_masked_sampling_always_validates(name: str, tok: llguidance.LLTokenizer) -> None:
    schema = SCHEMAS[name]
    grammar = Grammar.json_schema(schema)
    rng = np.random.default_rng(sorted(SCHEMAS).index(name))
    bias = closer_bias(tok, tok.vocab_size)
    for _ in range(12):
        answer = sample_answer(constraint(grammar, tok), rng, bias)
        value = json.loads(tok.decode_bytes(answer[:-1]))
        jsonschema.validate(value, schema)


def test_masked_sampling_of_other_grammars(tok: llguidance.LLTokenizer) -> None:
    rng = np.random.default_rng(7)
    bias = closer_bias(tok, tok.vocab_size)
    cases = [
        (Grammar.json_object(), lambda s: isinstance(json.loads(s), dict)),
        (Grammar.regex("[a-z]{3,6}-[0-9]{2}"), re.compile("[a-z]{3,6}-[0-9]{2}").fullmatch),
        (Grammar.gbnf('root ::= "yes" | "no"'), {"yes", "no"}.__contains__),
        (
            Grammar.lark('start: "[" NUM ("," NUM)* "]"\nNUM: /[0-9]{1,3}/'),
            re.compile(r"\[[0-9]{1,3}(,[0-9]{1,3})*\]").fullmatch,
        ),
    ]
    for grammar, ok in cases:
        for _ in range(8):
            answer = sample_answer(constraint(grammar, tok), rng, bias)
            assert ok(tok.decode_bytes(answer[:-1]).decode()), grammar


# --- a real vocabulary --------------------------------------------------------------------


@pytest.mark.real
def test_qwen_vocabulary_forces_keys_and_decodes_a_valid_answer(qwen_draft_path: Path) -> None:
    # One thread: with another process on one of two cores, two threads decoded 50x slower.
    load = LoadConfig(n_ctx=512, n_batch=128, n_threads=1, n_threads_batch=1)
    with NativeModel(qwen_draft_path, load) as model:
        tok = grammar_tokenizer(model)
        assert tok.vocab_size == model.n_vocab == 151936
        im_end, endoftext = (
            model.vocab.eos,
            model.vocab.tokenize("<|endoftext|>", add_special=False),
        )
        assert tok.eos_tokens[0] == im_end and endoftext[0] in tok.eos_tokens
        schema = {**PERSON, "properties": {**PERSON["properties"]}}
        schema["properties"]["name"] = {"type": "string", "maxLength": 16}
        schema["properties"]["city"] = {"type": "string", "maxLength": 16}
        c = Constraint(Grammar.json_schema(schema), tok, model.n_vocab)
        assert c.forced() == model.vocab.tokenize('{"name":', add_special=False)  # 3 tokens
        text = json.dumps({"name": "Bob", "age": 42, "city": "Paris"})
        answer = model.vocab.tokenize(text, add_special=False)
        rows = c.masks([*answer, im_end])
        for i, token in enumerate(answer):
            assert rows[i][token] and (rows[i] == c.allowed()).all()
            c.consume([token])
        assert c.stopped and rows[-2][im_end] and rows[-2][endoftext[0]]
        c.rollback(len(answer))

        prompt = "Bob is 42 and lives in Paris. The same facts as JSON:\n"
        logits = model.eval(model.vocab.tokenize(prompt), [-1])
        out: list[int] = []
        while len(out) < 48:
            token = int(masked_argmax(logits, c.allowed()[None])[0])
            c.consume([token])
            if token in c.eos:
                break
            out.append(token)
            logits = model.eval([token], [0])
        text = model.vocab.detokenize(out)
        assert c.stopped, text
        jsonschema.validate(json.loads(text), schema)
        # json.dumps's layout keeps the model on its own path; compact separators made it
        # answer {"name":",",...} here.
        assert text == json.dumps({"name": "Bob", "age": 42, "city": "Paris"})


# --- llama.cpp's schema semantics: a missing additionalProperties means no extra keys ---


class City(pydantic.BaseModel):
    # pydantic writes no additionalProperties: clients rely on llama.cpp closing the object

    name: str
    country: str
    population_millions: float


def _accepts(c: Constraint, tok: llguidance.LLTokenizer, text: str) -> bool:
    tokens = [*text_tokens(tok, text), tok.eos_token]
    return c.validate(tokens) == len(tokens)


def test_closed_schema_reads_additional_properties_as_llama_cpp() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "string"}}},
            "open": {"type": "object", "properties": {}, "additionalProperties": True},
            "any": {"type": "object"},
            "list": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
        },
        "$defs": {"Item": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        "allOf": [{"properties": {"c": {"type": "string"}}}],
    }
    closed = closed_schema(schema)
    assert closed["additionalProperties"] is False
    props = closed["properties"]
    assert props["a"]["additionalProperties"] is False
    assert props["open"]["additionalProperties"] is True  # said so: kept
    assert "additionalProperties" not in props["any"]  # no properties: any object
    assert closed["$defs"]["Item"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["allOf"][0]  # allOf branches stay open
    assert "additionalProperties" not in schema  # the caller's schema is untouched


def test_pydantic_schema_allows_only_the_declared_keys(tok: llguidance.LLTokenizer) -> None:
    grammar = Grammar.json_schema(City)
    assert "additionalProperties" not in json.loads(grammar.text)  # as the user gave it
    good = json.dumps({"name": "Oslo", "country": "Norway", "population_millions": 0.7})
    extra = good[:-1] + ', "currency": "NOK"}'
    assert _accepts(constraint(grammar, tok), tok, good)
    assert not _accepts(constraint(grammar, tok), tok, extra)
    # the same schema as text and as a dict: the same semantics
    for given in (City.model_json_schema(), json.dumps(City.model_json_schema())):
        assert not _accepts(constraint(Grammar.json_schema(given), tok), tok, extra)


def test_additional_properties_true_or_a_schema_allows_extra_keys(
    tok: llguidance.LLTokenizer,
) -> None:
    base = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    extra = '{"a": 1, "b": "x"}'
    opened = constraint(Grammar.json_schema({**base, "additionalProperties": True}), tok)
    assert _accepts(opened, tok, extra)
    typed = {**base, "additionalProperties": {"type": "string"}}
    assert _accepts(constraint(Grammar.json_schema(typed), tok), tok, extra)
    assert not _accepts(constraint(Grammar.json_schema(typed), tok), tok, '{"a": 1, "b": 2}')
    assert not _accepts(constraint(Grammar.json_schema(base), tok), tok, extra)
    anything = constraint(Grammar.json_schema({"type": "object"}), tok)
    assert _accepts(anything, tok, extra)  # no properties: any object, as llama.cpp
    assert _accepts(constraint(Grammar.json_object(), tok), tok, extra)
