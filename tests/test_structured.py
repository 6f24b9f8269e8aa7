"""Structured output end to end (issue 32): grammars through the engine, the CLI and the server.

- Lossless under the constraint, on the tiny ladder: greedy constrained answers are
  token-identical in ``target``, ``sd``, ``psd-exact`` and ``auto`` under ``--strict-identity``;
  sampled ones follow the target's distribution masked to the grammar and renormalised (a
  chi-square over thousands of seeds, computed from the target's raw logits and the grammar's
  masks), which the same samples show is neither the qualifier's nor the unmasked target's.
- Forced tokens are free drafts (``forced_n``, all accepted); an n-gram block is cut where the
  grammar refuses it; an answer cut by ``max_tokens`` ends by ``length``.
- ``run --json-schema / --grammar / --format json`` and their one-line errors.
- The server: ``response_format`` (json_object, json_schema), llama-server's ``json_schema`` and
  ``grammar``, streamed or not, on both endpoints; OpenAI-shaped 400s; fields we do not honour.
- Real Qwen2.5-Coder 0.5B (marked ``real``): answers validate on nested, array, enum and
  numeric schemas in ``auto`` and ``target``; the openai client's ``.parse()`` with a pydantic
  model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import llguidance
import numpy as np
import openai
import pydantic
import pytest
from click.testing import CliRunner
from conftest import TINY_LOAD, one_error_line
from lossless import chi_square_pvalue, shaped_costs
from serving_support import live_server
from tool_support import KEYED, bad_request

from pyramid_gguf import LoadConfig, Pyramid, SamplingConfig, SpecConfig
from pyramid_gguf.cli.main import main
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.core.grammar import Grammar
from pyramid_gguf.decoding.pricing.costs import CostCurve
from pyramid_gguf.decoding.runtime import guide as guide_module
from pyramid_gguf.decoding.runtime.engine import decode, make_guide, make_scheduler
from pyramid_gguf.decoding.runtime.sampling import Sampler, warp
from pyramid_gguf.decoding.runtime.stats import GenerationStats
from pyramid_gguf.decoding.runtime.tiers import ModelTier
from pyramid_gguf.grammar import Constraint, mask_logits
from pyramid_gguf.native import grammar_tokenizer
from pyramid_gguf.serving.schemas import UNSUPPORTED
from pyramid_gguf.serving.settings import ServerSettings

GREEDY = SamplingConfig(temperature=0, max_tokens=80)
#: Temperature 1, no truncation: every allowed token can show up.
HOT = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=4)
SEEDS = 1500
PROMPTS = ["the model of the tree", "def return if else", "a"]

#: Words of the tiny vocabulary (each one token, " the"...), or spelled out byte by byte: once
#: a spelling starts a word, its other letters are forced.
WORDS = r"( (the|of|and|tree|model|data|value|key)){5,8}"
#: Forty or more letters and spaces: long enough that no answer may end within ``HOT``'s four
#: tokens, and no token is ever forced (every position allows many).
LETTERS = r"[a-z ]{40,60}"
LARK = 'start: "def " NAME "(" NAME ")"\nNAME: /[a-z]{1,6}/'
LARK_RE = r"def [a-z]{1,6}\([a-z]{1,6}\)"
YES_NO = 'root ::= "yes" | "no"'
SMALL: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["a"],
    "additionalProperties": False,
}


def obeys(grammar: Grammar, text: str) -> bool:
    """Whether ``text`` is a complete answer of one of this file's grammars (checked without
    llguidance: Python's ``re`` and ``jsonschema``)."""
    if grammar.kind == "json_schema":
        try:
            jsonschema.validate(json.loads(text), json.loads(grammar.text))
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    pattern = LARK_RE if grammar.kind == "lark" else grammar.text
    return re.fullmatch(pattern, text) is not None


def constrained(
    p: Pyramid,
    prompt: list[int],
    spec: SpecConfig,
    sampling: SamplingConfig,
    costs: Mapping[str, CostCurve] | None = None,
) -> tuple[list[int], GenerationStats]:
    """A generation under ``sampling.grammar`` through the engine itself, ``auto`` priced by
    ``costs`` (GPU-shaped: it then runs model chains) instead of this machine's curves."""
    stats = GenerationStats(mode=spec.mode)
    sampler = Sampler(sampling)
    guide = make_guide(p.ladder, sampling, len(prompt))
    rounds, prefill = make_scheduler(
        p.ladder, spec, sampler, stats, costs=dict(costs or {}), guide=guide
    )
    tokens = list(decode(p.ladder, prompt, rounds, prefill, sampler, stats, None, guide))
    return tokens, stats


def speculated(stats: GenerationStats) -> bool:
    return any(s.verifications for s in stats.stages)


def masked_joint(tier: ModelTier, prompt: list[int], grammar: Grammar, masked: bool) -> np.ndarray:
    """``p(t1, t2)`` of ``tier`` after ``prompt`` under :data:`HOT`, its rows restricted to the
    tokens ``grammar`` allows there and renormalised (``masked=False``: the raw distribution),
    flattened ``[V * V]``."""
    n_vocab = tier.n_vocab
    everything = np.ones(n_vocab, dtype=bool)
    c = Constraint(grammar, grammar_tokenizer(tier.model), n_vocab)
    p1 = warp(mask_logits(tier.score(prompt, [])[0], c.allowed() if masked else everything), HOT)
    out = np.zeros((n_vocab, n_vocab))
    for t1 in np.flatnonzero(p1 > 1e-7):  # the rest cannot show up in a few thousand samples
        allowed = everything
        if masked:
            c.consume([int(t1)])
            allowed = c.allowed()
            c.rollback(1)
        row = tier.score([*prompt, int(t1)], [])[0]
        out[t1] = p1[t1] * warp(mask_logits(row, allowed), HOT)
    tier.model.reset()
    return (out / out.sum()).ravel()


@pytest.fixture(scope="module")
def strict(tiny_target: Path, tiny_qualifier: Path, tiny_draft: Path) -> Iterator[Pyramid]:
    """The tiny three-tier ladder under ``--strict-identity``, its identity probe run."""
    load = replace(TINY_LOAD, strict_identity=True)
    with Pyramid.from_paths(
        tiny_target, draft=tiny_draft, qualifier=tiny_qualifier, load=load
    ) as p:
        p.calibrate()
        yield p


@pytest.fixture(scope="module")
def tok(pyramid: Pyramid) -> llguidance.LLTokenizer:
    """llguidance's tokenizer of the tiny vocabulary (every tiny model and server shares it)."""
    return grammar_tokenizer(pyramid.ladder.target.model)


def json_prefix(tok: llguidance.LLTokenizer, text: str) -> bool:
    """Whether ``text`` could begin a JSON object (llguidance's JSON grammar, byte by byte)."""
    c = Constraint(Grammar.json_object(), tok, tok.vocab_size)
    tokens = list(tok.tokenize_str(text))
    return c.validate(tokens) == len(tokens)


# --- lossless under the constraint ---------------------------------------------------------


@pytest.mark.parametrize(
    "grammar",
    [
        Grammar.regex(r"( (the|of|and|tree|model|data|value|key)){3,8}"),
        Grammar.lark(LARK),
        Grammar.json_schema(KEYED),
    ],
    ids=["regex", "lark", "json-schema"],
)
def test_constrained_greedy_is_identical_across_lossless_modes(
    strict: Pyramid, grammar: Grammar
) -> None:
    p = strict
    gpu = shaped_costs(p, per_token=0.02, draft=0.15)
    sampling = GREEDY.with_(grammar=grammar)
    ran: set[str] = set()
    for text in PROMPTS:
        prompt = p.tokenize(text)
        want = p.generate(prompt, sampling, SpecConfig(mode="target"))
        assert want.finish_reason == "stop" and obeys(grammar, want.text), want.text
        for spec in (SpecConfig(mode="sd", l_d=4), SpecConfig(mode="psd-exact", l_d=2, l_q=16)):
            got = p.generate(prompt, sampling, spec)
            assert got.token_ids == want.token_ids, (text, spec.mode, got.text, want.text)
            ran.update(s.name for s in got.stats.stages if s.verifications)
        tokens, stats = constrained(p, prompt, SpecConfig(mode="auto"), sampling, gpu)
        assert tokens == want.token_ids, (text, "auto")
        assert stats.auto is not None
        ran.update(f"auto {c}" for c in stats.auto.choices)
    # Every tier proposed and verified somewhere: the identity is not plain decoding's.
    assert {"draft->target", "draft->qualifier", "qualifier->target"} <= ran
    assert ran & {"auto draft", "auto qualifier", "auto pyramid"}


@pytest.mark.parametrize(
    ("mode", "pattern"),
    [("sd", WORDS), ("auto", WORDS), ("psd-exact", LETTERS)],
    ids=["sd-words", "auto-words", "psd-exact-letters"],
)
def test_sampled_tokens_follow_the_masked_target_distribution(
    pyramid: Pyramid, mode: str, pattern: str
) -> None:
    """The first two sampled tokens (the second is the first one a speculative round decides;
    under :data:`WORDS` it is often forced) against the target's masked joint distribution."""
    grammar = Grammar.regex(pattern)
    prompt = pyramid.tokenize("the model of the tree")
    spec = SpecConfig(mode=mode, l_d=2, l_q=3)  # type: ignore[arg-type]
    gpu = shaped_costs(pyramid, per_token=0.02, draft=0.15) if mode == "auto" else None
    n_vocab = pyramid.ladder.target.n_vocab
    seen: set[str] = set()
    pairs = []
    forced = 0
    for seed in range(SEEDS):
        tokens, stats = constrained(
            pyramid, prompt, spec, HOT.with_(seed=seed, grammar=grammar), gpu
        )
        seen.update(s.name for s in stats.stages if s.verifications)
        forced += stats.forced_n
        pairs.append(tokens[0] * n_vocab + tokens[1])
    sampled = np.array(pairs)
    assert seen, "no speculative round ran: the test would prove nothing"
    assert (forced > 0) == (pattern == WORDS)  # forced drafts verified at T > 0 too
    target = pyramid.ladder.target
    assert chi_square_pvalue(sampled, masked_joint(target, prompt, grammar, True)) > 0.001
    # Power: the same samples reject the qualifier's masked distribution (the closest tier to
    # the target) and the target's own unmasked one.
    qualifier = pyramid.ladder.qualifier
    assert isinstance(qualifier, ModelTier)
    assert chi_square_pvalue(sampled, masked_joint(qualifier, prompt, grammar, True)) < 1e-4
    assert chi_square_pvalue(sampled, masked_joint(target, prompt, grammar, False)) < 1e-4


def test_psd_exact_when_forced_tokens_fill_the_block(pyramid: Pyramid) -> None:
    """``{"name": "`` is ten forced tokens on the tiny vocabulary, more than the default
    ``l_q`` of 8: the first round's block is forced tokens only."""
    sampling = GREEDY.with_(grammar=Grammar.json_schema(KEYED))
    prompt = pyramid.tokenize("the model")
    want = pyramid.generate(prompt, sampling, SpecConfig(mode="target"))
    got = pyramid.generate(prompt, sampling, SpecConfig(mode="psd-exact"))
    assert got.token_ids == want.token_ids


@pytest.mark.parametrize("mode", ["sd", "psd-exact"])
def test_sampled_blocks_that_end_the_answer(pyramid: Pyramid, mode: str) -> None:
    sampling = SamplingConfig(temperature=0.8, max_tokens=20, grammar=Grammar.gbnf(YES_NO))
    for seed in range(4):
        c = pyramid.generate("the model", sampling.with_(seed=seed), SpecConfig(mode=mode))  # type: ignore[arg-type]
        assert c.text in ("yes", "no") and c.finish_reason == "stop"


def test_ignore_eos_with_a_grammar_is_refused_in_one_line() -> None:
    """A grammar ends the answer (only EOS is allowed once it is complete), so generating past
    it cannot be honoured: refused when the config is made, before anything runs."""
    for grammar in (Grammar.gbnf(YES_NO), Grammar.json_object()):
        with pytest.raises(UserError, match="ignore_eos cannot go with a grammar"):
            SamplingConfig(max_tokens=8, ignore_eos=True, grammar=grammar)
    assert SamplingConfig(ignore_eos=True).grammar is None


# --- forced tokens, n-gram cuts, finish reasons -----------------------------------------------


def test_forced_tokens_are_free_drafts(strict: Pyramid) -> None:
    """Keys, quotes and braces the schema decides are verified as free drafts: at temperature
    0 the target keeps all of them, and they are counted apart from the drafted tokens."""
    p = strict
    sampling = GREEDY.with_(grammar=Grammar.json_schema(KEYED))
    prompt = p.tokenize("the model of the tree")
    target = p.generate(prompt, sampling, SpecConfig(mode="target"))
    assert target.stats.forced_n == target.stats.forced_n_accepted == 0
    sd = p.generate(prompt, sampling, SpecConfig(mode="sd", l_d=4))
    gpu = shaped_costs(p, per_token=0.02, draft=0.15)
    _, auto = constrained(p, prompt, SpecConfig(mode="auto"), sampling, gpu)
    for stats in (sd.stats, auto):
        assert stats.forced_n >= len(KEYED["properties"])  # at least the keys' quotes
        assert stats.forced_n_accepted == stats.forced_n
        # counted apart: the target's stage counts drafted tokens only
        top = [s for s in stats.stages if s.name.endswith("->target")]
        kept = sum(s.draft_n_accepted for s in top) + stats.forced_n_accepted
        assert kept < stats.generated_tokens
    assert sd.token_ids == target.token_ids


def test_ngram_blocks_are_cut_where_the_grammar_refuses(
    tiny_target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prompt repeats "the tree", so the n-gram drafter proposes more of it; the grammar
    takes two such words and then only others: the block is cut at the first refused token
    (``Guide.valid``, in ``verification.verify``) and the answer is the target's."""
    grammar = Grammar.regex(r"( (the|tree)){2}( (of|and|model|data)){2,4}")
    cuts: list[tuple[int, int]] = []
    valid = guide_module.Guide.valid

    def spy(self: guide_module.Guide, context: Any, tokens: Any) -> int:
        n = valid(self, context, tokens)
        cuts.append((len(tokens), n))
        return n

    monkeypatch.setattr(guide_module.Guide, "valid", spy)
    load = replace(TINY_LOAD, strict_identity=True)
    with Pyramid.from_paths(tiny_target, draft="ngram", load=load) as p:
        sampling = GREEDY.with_(grammar=grammar)
        prompt = p.tokenize("the tree the tree the tree the tree the tree")
        want = p.generate(prompt, sampling, SpecConfig(mode="target"))
        got = p.generate(prompt, sampling, SpecConfig(mode="sd", l_d=6, ngram_min=2))
    assert got.token_ids == want.token_ids and obeys(grammar, got.text), got.text
    assert any(0 <= n < k for k, n in cuts), f"no block was cut: {cuts}"
    ngram = next(s for s in got.stats.stages if s.name == "ngram->target")
    # The cut blocks are what was proposed: never more than the grammar let through.
    assert ngram.draft_n <= sum(n for _, n in cuts)


@pytest.mark.parametrize("mode", ["target", "sd"])
def test_an_answer_cut_before_the_grammar_completes_ends_by_length(
    pyramid: Pyramid, mode: str
) -> None:
    spec = SpecConfig(mode=mode, l_d=4)  # type: ignore[arg-type]
    cut = pyramid.generate(
        "the model", GREEDY.with_(max_tokens=6, grammar=Grammar.json_schema(KEYED)), spec
    )
    assert cut.finish_reason == "length" and cut.text.startswith('{"name')
    done = pyramid.generate("the model", GREEDY.with_(grammar=Grammar.gbnf(YES_NO)), spec)
    assert done.finish_reason == "stop" and done.text in ("yes", "no")


# --- the CLI ----------------------------------------------------------------------------------


def run_cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, ["run", *args])
    return r.exit_code, r.stdout, r.stderr


def test_cli_takes_a_schema_a_gbnf_grammar_or_any_json(
    tiny_target: Path, tmp_path: Path, tok: llguidance.LLTokenizer
) -> None:
    base = ["--target", str(tiny_target), "-t", "1", "-c", "512", "--temp", "0", "-p", "the tree"]
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(KEYED))
    gbnf_file = tmp_path / "yes.gbnf"
    gbnf_file.write_text(YES_NO + "\n")
    for flags, check in [
        (["--json-schema", str(schema_file)], lambda t: jsonschema.validate(json.loads(t), KEYED)),
        (["--json-schema", json.dumps(SMALL)], lambda t: jsonschema.validate(json.loads(t), SMALL)),
        (["--grammar", str(gbnf_file)], lambda t: t in ("yes", "no") or pytest.fail(t)),
        (["--grammar", 'root ::= "no" | "yes"'], lambda t: t in ("yes", "no") or pytest.fail(t)),
    ]:
        code, out, err = run_cli(*base, *flags, "-n", "80", "--json")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["finish_reason"] == "stop", doc
        check(doc["text"])
    # Any JSON object: the tiny model never closes its first string, so the answer is cut, but
    # it is the beginning of an object, and streamed as text without --json.
    code, out, err = run_cli(*base, "--format", "json", "-n", "24")
    assert code == 0, err
    text = out.rstrip("\n")
    assert text.startswith("{") and json_prefix(tok, text), text
    assert not json_prefix(tok, "the tree")  # the check has teeth


@pytest.mark.parametrize(
    ("flags", "fragments"),
    [
        (["--json-schema", '{"not": {}}'], ["invalid JSON schema", "not"]),
        (["--json-schema", '{"type": "object", "properties": 3}'], ["invalid JSON schema"]),
        (["--json-schema", "{oops"], ["the JSON schema is not JSON"]),
        (["--json-schema", "schema-that-is-missing.json"], ["--json-schema", "neither a file"]),
        (["--grammar", 'root ::= ( "a"'], ["invalid GBNF grammar", "Expected ')'"]),
        (["--grammar", "root ::= item"], ["invalid GBNF grammar", "item"]),
        (["--format", "json", "--grammar", YES_NO], ["give one of"]),
        (["--json-schema", json.dumps(SMALL), "--grammar", YES_NO], ["give one of"]),
    ],
)
def test_cli_bad_grammars_are_one_error_line(
    tiny_target: Path, flags: list[str], fragments: list[str]
) -> None:
    code, _, err = run_cli("--target", str(tiny_target), "-t", "1", "-c", "512", "-p", "x", *flags)
    one_error_line(code, err, *fragments)
    assert "Traceback" not in err


# --- the server (tiny ladder) -----------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tiny_target: Path, tiny_draft: Path) -> Iterator[str]:
    """The tiny target and draft behind ``serve`` in ``sd``: its ``/v1`` URL."""
    load = LoadConfig(n_ctx=1024, n_batch=256, n_threads=1, n_threads_batch=1)
    p = Pyramid.from_paths(
        tiny_target, draft=tiny_draft, load=load, spec=SpecConfig(mode="sd"), name="tiny"
    )
    with p, live_server(p, ServerSettings()) as live:
        yield live.v1


@pytest.fixture()
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server, api_key="unused", max_retries=0, timeout=60)


MESSAGES = [{"role": "user", "content": "the model"}]


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def answer(client: openai.OpenAI, chat: bool, stream: bool, **body: Any) -> tuple[str, str, Any]:
    """Text, finish reason and ``timings`` of one greedy request (streamed chunks joined)."""
    kw: dict[str, Any] = {"model": "tiny", "temperature": 0, "max_tokens": 80, **body}
    ours = (
        ("json_schema", "grammar", "mode")
        if chat
        else ("json_schema", "grammar", "mode", "response_format")
    )
    extra = {k: kw.pop(k) for k in ours if k in kw}
    if extra:
        kw["extra_body"] = extra
    if chat:
        if not stream:
            r = client.chat.completions.create(messages=MESSAGES, **kw)  # type: ignore[arg-type]
            choice = r.choices[0]
            return choice.message.content or "", choice.finish_reason, r.model_extra["timings"]  # type: ignore[index]
        chunks = list(client.chat.completions.create(messages=MESSAGES, stream=True, **kw))  # type: ignore[arg-type]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        last = chunks[-1]
        return text, last.choices[0].finish_reason, last.model_extra["timings"]  # type: ignore[index, return-value]
    if not stream:
        c = client.completions.create(prompt="the model", **kw)
        return c.choices[0].text, c.choices[0].finish_reason, c.model_extra["timings"]  # type: ignore[index]
    parts = list(client.completions.create(prompt="the model", stream=True, **kw))
    text = "".join(c.choices[0].text for c in parts if c.choices)
    last = parts[-1]
    return text, last.choices[0].finish_reason, last.model_extra["timings"]  # type: ignore[index, return-value]


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_response_format_json_schema(client: openai.OpenAI, chat: bool) -> None:
    fmt = schema_format(KEYED)
    answer(client, chat, False, response_format=fmt, max_tokens=1)  # one cache state for both
    whole, reason, _ = answer(client, chat, False, response_format=fmt)
    assert reason == "stop"
    jsonschema.validate(json.loads(whole), KEYED)
    streamed, reason, _ = answer(client, chat, True, response_format=fmt)
    assert (streamed, reason) == (whole, "stop")
    strict = {"type": "json_schema", "json_schema": {"name": "a", "schema": SMALL, "strict": True}}
    text, reason, _ = answer(client, chat, False, response_format=strict)
    assert reason == "stop" and json.loads(text)["a"] in range(10)


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_response_format_json_object(
    client: openai.OpenAI, chat: bool, tok: llguidance.LLTokenizer
) -> None:
    fmt = {"type": "json_object"}
    answer(client, chat, False, response_format=fmt, max_tokens=1)  # one cache state for both
    whole, reason, _ = answer(client, chat, False, response_format=fmt)
    streamed, _, _ = answer(client, chat, True, response_format=fmt)
    assert streamed == whole and whole.startswith("{")
    if reason == "stop":
        assert isinstance(json.loads(whole), dict)
    else:  # the tiny model may never close a string: the answer so far still begins an object
        assert reason == "length" and json_prefix(tok, whole), whole
    # "text" is no constraint at all: the same answer as no response_format
    answer(client, chat, False, max_tokens=1)
    free, _, _ = answer(client, chat, False, max_tokens=12)
    text, _, _ = answer(client, chat, False, max_tokens=12, response_format={"type": "text"})
    assert text == free


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_llama_server_json_schema_and_grammar_fields(
    client: openai.OpenAI, chat: bool, stream: bool
) -> None:
    text, reason, _ = answer(client, chat, stream, json_schema=KEYED)
    assert reason == "stop"
    jsonschema.validate(json.loads(text), KEYED)
    text, reason, _ = answer(client, chat, stream, grammar=YES_NO)
    assert reason == "stop" and text in ("yes", "no")


def test_timings_report_forced_tokens(client: openai.OpenAI) -> None:
    for chat in (True, False):
        _, _, sd = answer(client, chat, False, json_schema=KEYED)
        assert sd["forced_n"] > 0 and sd["forced_n_accepted"] == sd["forced_n"]
        assert sd["draft_n"] > 0  # the draft still proposed what the schema left open
        _, _, auto = answer(client, chat, False, json_schema=KEYED, mode="auto")
        assert auto["forced_n"] > 0 and auto["forced_n_accepted"] == auto["forced_n"]
        _, _, target = answer(client, chat, False, json_schema=KEYED, mode="target")
        assert target["forced_n"] == target["forced_n_accepted"] == target["draft_n"] == 0
        _, _, streamed = answer(client, chat, True, json_schema=KEYED)
        assert streamed["forced_n"] == sd["forced_n"]


def test_sampled_constrained_answers_on_the_server(server: str) -> None:
    for seed in range(4):
        body = {"json_schema": SMALL, "seed": seed, "max_tokens": 40, "temperature": 0.8}
        r = post(server, body)
        assert r.status_code == 200, r.text
        jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), SMALL)


CHAT_LOGPROBS = {"logprobs": True, "top_logprobs": 3}


def strict_json(text: str) -> Any:
    """JSON as the spec (and every JavaScript client) reads it: no NaN or Infinity."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_logprobs_under_a_grammar(server: str, stream: bool) -> None:
    for path, asked in (("completions", {"logprobs": 3}), ("chat/completions", CHAT_LOGPROBS)):
        r = post(server, {"grammar": YES_NO, "max_tokens": 5, "stream": stream, **asked}, path)
        assert r.status_code == 200, r.text
        events = [e for e in r.text.split("data: ") if e.strip()] if stream else [r.text]
        for event in events:
            if event.strip() != "[DONE]":
                strict_json(event)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_max_tokens_before_the_grammar_completes_is_length(
    client: openai.OpenAI, chat: bool, stream: bool
) -> None:
    text, reason, _ = answer(client, chat, stream, json_schema=KEYED, max_tokens=7)
    assert reason == "length" and text.startswith('{"name')
    with pytest.raises(ValueError):
        json.loads(text)


def post(server: str, body: dict[str, Any], path: str = "chat/completions") -> httpx.Response:
    if path == "chat/completions":
        body = {"messages": MESSAGES, **body}
    else:
        body = {"prompt": "the model", **body}
    return httpx.post(
        f"{server}/{path}", json={"max_tokens": 4, "temperature": 0, **body}, timeout=60
    )


@pytest.mark.parametrize("path", ["chat/completions", "completions"])
@pytest.mark.parametrize(
    ("body", "param", "fragments"),
    [
        ({"json_schema": {"not": {}}}, "json_schema", ["invalid JSON schema", "not"]),
        (
            {"response_format": schema_format({"type": "object", "not": {"required": ["a"]}})},
            "response_format",
            ["invalid JSON schema", "not"],
        ),
        (
            {"response_format": schema_format({"type": "string", "format": "weird"})},
            "response_format",
            ["weird"],
        ),
        ({"grammar": 'root ::= ( "a"'}, "grammar", ["invalid GBNF grammar"]),
        ({"grammar": "root ::= missing"}, "grammar", ["invalid GBNF grammar", "missing"]),
        ({"response_format": {"type": "xml"}}, "response_format", ["xml"]),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
            ["schema"],
        ),
        ({"response_format": "json"}, "response_format", []),
        ({"json_schema": SMALL, "grammar": YES_NO}, "grammar", ["json_schema", "grammar"]),
        (
            {"response_format": {"type": "json_object"}, "json_schema": SMALL},
            "json_schema",
            ["response_format", "json_schema"],
        ),
    ],
)
def test_bad_structured_requests_are_openai_400s(
    server: str, path: str, body: dict[str, Any], param: str, fragments: list[str]
) -> None:
    bad_request(post(server, body, path), param, *fragments)
    ok = post(server, {"grammar": YES_NO}, path)  # nothing was lost: the next one is answered
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("body", [{"grammar": ""}, {"response_format": {}}], ids=["grammar", "rf"])
def test_empty_grammar_fields_are_not_500s(server: str, body: dict[str, Any]) -> None:
    r = post(server, body)
    assert r.status_code in (200, 400), r.text


#: Each unsupported field: a value that changes the answer, and the neutral ones clients send.
UNHONOURED: dict[str, tuple[Any, list[Any]]] = {
    "mirostat": (2, [0]),
    "best_of": (3, [1]),
    "echo": (True, [False]),
    "suffix": ("}", [""]),
    "functions": ([{"name": "f", "parameters": {}}], [[]]),
    "function_call": ("auto", [None]),
    "n_probs": (3, [0]),
    "continue_final_message": (True, [False]),
    "n_indent": (4, [0]),
    "t_max_predict_ms": (500, [0]),
}


def test_n_predict_is_llama_servers_max_tokens(server: str) -> None:
    """llama-server's ``n_predict`` bounds the answer as ``max_tokens`` does (asked for 3,
    never more), on both routes; ``max_tokens`` wins when both are sent."""
    for path in ("chat/completions", "completions"):
        r = post(server, {"n_predict": 3, "max_tokens": None, "ignore_eos": True}, path)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3
        both = post(server, {"n_predict": 3, "max_tokens": 5, "ignore_eos": True}, path)
        assert both.json()["usage"]["completion_tokens"] == 5
    bad_request(post(server, {"n_predict": -2}), "n_predict", "n_predict")


def test_the_unhonoured_fields_are_all_tested() -> None:
    assert set(UNHONOURED) == set(UNSUPPORTED)


@pytest.mark.parametrize("field", sorted(UNHONOURED))
def test_unhonoured_fields_are_400_unless_neutral(server: str, field: str) -> None:
    bad, neutral = UNHONOURED[field]
    for path in ("chat/completions", "completions"):
        bad_request(post(server, {field: bad}, path), field, field)
        for value in neutral:
            r = post(server, {field: value}, path)
            assert r.status_code == 200, (field, value, r.text)


# --- real Qwen2.5-Coder 0.5B ------------------------------------------------------------------

#: Schemas with nesting, arrays with bounds, enums, required keys, no other keys, and numbers
#: and integers with bounds (inclusive and exclusive); strings bounded so answers end.
REAL_SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "nested": (
        "Alice Smith lives at 12 Main Street in Springfield, zip code 12345. Her record as JSON.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "address": {
                    "type": "object",
                    "properties": {
                        "street": {"type": "string", "maxLength": 40},
                        "city": {"type": "string", "maxLength": 30},
                        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                    },
                    "required": ["street", "city", "zip"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "address"],
            "additionalProperties": False,
        },
    ),
    "arrays": (
        "Name two or three programming languages and give up to four exam scores out of 100.",
        {
            "type": "object",
            "properties": {
                "languages": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 20},
                    "minItems": 2,
                    "maxItems": 3,
                },
                "scores": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0, "maximum": 100},
                    "minItems": 1,
                    "maxItems": 4,
                },
            },
            "required": ["languages", "scores"],
            "additionalProperties": False,
        },
    ),
    "enums": (
        "Classify this review: 'The battery died after a day and support never answered.'",
        {
            "type": "object",
            "properties": {
                "sentiment": {"enum": ["positive", "negative", "neutral"]},
                "topics": {
                    "type": "array",
                    "items": {"enum": ["battery", "support", "price", "screen"]},
                    "minItems": 1,
                    "maxItems": 2,
                },
                "urgent": {"type": "boolean"},
            },
            "required": ["sentiment", "topics", "urgent"],
            "additionalProperties": False,
        },
    ),
    "numbers": (
        "Bob is 42 years old, 1.82 m tall, owns 3 bikes, and it is 21.5 degrees outside.",
        {
            "type": "object",
            "properties": {
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "height_m": {"type": "number", "minimum": 0.3, "maximum": 2.5},
                "bikes": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
                "temperature": {"type": "number", "exclusiveMinimum": -50, "maximum": 60},
            },
            "required": ["age", "height_m", "bikes", "temperature"],
            "additionalProperties": False,
        },
    ),
    "records": (
        "Order: two apples and five pears. List the items with quantities.",
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "item": {"type": "string", "maxLength": 20},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                },
                "required": ["item", "qty"],
                "additionalProperties": False,
            },
            "minItems": 1,
            "maxItems": 3,
        },
    ),
}

#: test_real's load settings, so that auto reuses the cost curves measured there.
REAL_LOAD = LoadConfig(n_ctx=1024, n_batch=256, n_threads=2, n_threads_batch=2)


@pytest.fixture(scope="module")
def qwen_small(qwen_draft_path: Path) -> Iterator[Pyramid]:
    """Qwen2.5-Coder 0.5B Instruct alone (auto: plain decoding or the n-gram drafter)."""
    with Pyramid.from_paths(qwen_draft_path, load=REAL_LOAD, name="qwen") as p:
        yield p


@pytest.mark.real
def test_real_answers_validate(qwen_small: Pyramid) -> None:
    p = qwen_small
    forced = 0
    for name, (question, schema) in REAL_SCHEMAS.items():
        sampling = SamplingConfig(
            temperature=0, max_tokens=160, grammar=Grammar.json_schema(schema)
        )
        prompt = p.chat_tokens([{"role": "user", "content": question}])
        for mode in ("auto", "target"):
            c = p.generate(prompt, sampling, SpecConfig(mode=mode))  # type: ignore[arg-type]
            assert c.finish_reason == "stop", (name, mode, c.text)
            jsonschema.validate(json.loads(c.text), schema)
            if mode == "auto":
                forced += c.stats.forced_n
                assert c.stats.forced_n_accepted <= c.stats.forced_n
    assert forced > 0


class Person(pydantic.BaseModel):
    name: str
    age: int
    city: str


@pytest.mark.real
def test_openai_parse_returns_a_pydantic_object(qwen_small: Pyramid) -> None:
    with live_server(qwen_small, ServerSettings()) as live:
        client = openai.OpenAI(base_url=live.v1, api_key="unused", max_retries=0, timeout=300)
        r = client.beta.chat.completions.parse(
            model="qwen",
            messages=[{"role": "user", "content": "Bob is 42 and lives in Paris. His details?"}],
            response_format=Person,
            temperature=0,
            max_tokens=60,
            extra_body={"mode": "auto"},
        )
        person = r.choices[0].message.parsed
        assert isinstance(person, Person) and r.choices[0].finish_reason == "stop"
        assert (person.name, person.age, person.city) == ("Bob", 42, "Paris")
        timings = r.model_extra["timings"]  # type: ignore[index]
        assert timings["forced_n"] > 0 and timings["mode"] == "auto"


# --- llama.cpp's schema semantics through every door --------------------------------------------

#: What pydantic writes for ``class Person(BaseModel): name: constr(max_length=6); age: int``:
#: no ``additionalProperties``, which llama.cpp (and so clients) read as no other keys.
PYDANTIC_STYLE: dict[str, Any] = {
    "title": "Person",
    "type": "object",
    "properties": {
        "name": {"title": "Name", "type": "string", "maxLength": 6},
        "age": {"title": "Age", "type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "age"],
}


def declared_keys_only(text: str) -> None:
    doc = json.loads(text)
    assert list(doc) == ["name", "age"], text
    jsonschema.validate(doc, PYDANTIC_STYLE)


def test_a_schema_without_additional_properties_gets_only_its_keys_through_every_door(
    server: str, tiny_target: Path
) -> None:
    sampled = {"temperature": 1.5, "max_tokens": 60}
    for seed in range(6):
        fmt = {"response_format": schema_format(PYDANTIC_STYLE), "seed": seed, **sampled}
        r = post(server, fmt)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == "stop"
        declared_keys_only(r.json()["choices"][0]["message"]["content"])
        for path in ("chat/completions", "completions"):
            r = post(server, {"json_schema": PYDANTIC_STYLE, "seed": seed, **sampled}, path)
            choice = r.json()["choices"][0]
            declared_keys_only(
                choice["message"]["content"] if "message" in choice else choice["text"]
            )
    base = ["--target", str(tiny_target), "-t", "1", "-c", "512", "--temp", "1.5", "-p", "the tree"]
    for seed in range(3):
        code, out, err = run_cli(
            *base, "--seed", str(seed), "--json-schema", json.dumps(PYDANTIC_STYLE), "--json"
        )
        assert code == 0, err
        declared_keys_only(json.loads(out)["text"])
