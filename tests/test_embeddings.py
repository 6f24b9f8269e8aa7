"""Embeddings: the native path and :class:`Embedder` on tiny generated models, and every
embedding route live on uvicorn (OpenAI's through the official ``openai`` client, Ollama's
through ``ollama``'s, llama-server's raw), beside a tiny ladder.

The tiny embedding model is the tiny llama with ``llama.pooling_type = mean`` in its header, so
its pooling comes from the file as a real embedding model's does; the tiny target, without
one, gets llama.cpp's default (``none``: one vector per token). The tiny BERT of the
llama-server suite (``scripts/llama_server_suite/tiny_bert.py``) is the encoder: attention over
the whole input, CLS pooling from its header, WordPiece with ``[CLS]`` and ``[SEP]``.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gguf
import httpx
import numpy as np
import ollama
import openai
import pytest
from click.testing import CliRunner
from conftest import TINY_LOAD
from fastapi.testclient import TestClient
from serving_support import live_server
from synth import write_tiny_llama

from pyramid_gguf.api import Pyramid
from pyramid_gguf.cli.main import main
from pyramid_gguf.core.errors import ContextOverflow, UserError
from pyramid_gguf.embeddings import Embedder, EmbeddingConfig
from pyramid_gguf.serving.app import create_app
from pyramid_gguf.serving.settings import ServerSettings

KEY = "sk-embed"
AUTH = {"Authorization": f"Bearer {KEY}"}
ONE_THREAD = EmbeddingConfig(n_threads=1)
TEXTS = ["the cat is on the tree", "def fib return", "the data of the model", "import numpy"]


class _MeanPooled(gguf.GGUFWriter):
    """A GGUF writer that records mean pooling in the header, as embedding models do."""

    def write_header_to_file(self, *args: Any, **kwargs: Any) -> None:
        self.add_pooling_type(gguf.PoolingType.MEAN)
        super().write_header_to_file(*args, **kwargs)


@pytest.fixture(scope="module")
def embed_path(tiny_dir: Path) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFWriter", _MeanPooled)
        return write_tiny_llama(tiny_dir / "embed.gguf", seed=21, name="tiny-embed")


@pytest.fixture(scope="module")
def embedder(embed_path: Path) -> Iterator[Embedder]:
    with Embedder.load(embed_path, ONE_THREAD) as e:
        yield e


@pytest.fixture(scope="module")
def ladder(tiny_target: Path) -> Iterator[Pyramid]:
    with Pyramid.from_paths(tiny_target, load=TINY_LOAD, name="tiny") as p:
        yield p


@contextmanager
def serving(pyramid: Pyramid, settings: ServerSettings, embedder: Embedder | None) -> Iterator[str]:
    """``create_app`` (what ``serve`` runs) live; its URL."""
    with live_server(pyramid, settings, embedder) as live:
        yield live.url


@pytest.fixture(scope="module")
def url(ladder: Pyramid, embedder: Embedder) -> Iterator[str]:
    with serving(ladder, ServerSettings(api_key=KEY), embedder) as live:
        yield live


@pytest.fixture()
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY)


def post(url: str, path: str, body: Any) -> httpx.Response:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    headers = {**AUTH, "Content-Type": "application/json"}
    return httpx.post(f"{url}{path}", content=data, headers=headers, timeout=60)


def openai_error(r: httpx.Response, *fragments: str, code: str | None = None) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == code, error
    assert all(f in error["message"] for f in fragments), error


def ollama_error(r: httpx.Response, *fragments: str) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    assert set(body) == {"error"} and "Traceback" not in body["error"], body
    assert all(f in body["error"] for f in fragments), body


def vectors(r: Any) -> np.ndarray:
    return np.array([d.embedding for d in r.data], dtype=np.float32)


# --- the model -----------------------------------------------------------------------------------


def test_pooling_comes_from_the_file_or_llama_cpps_default(
    embedder: Embedder, tiny_target: Path
) -> None:
    assert embedder.pooling == "mean" and embedder.n_embd == 64 and embedder.n_ctx == 512
    with Embedder.load(tiny_target, ONE_THREAD) as plain:
        assert plain.pooling == "none"  # no pooling_type in the header: llama.cpp's default
        out = plain.run(["the cat", "def fib return"])
        assert [v.shape for v in out.vectors] == [(n, 64) for n in out.n_tokens]
        with pytest.raises(UserError, match="one vector per token"):
            plain.embed(["the cat"])
    with Embedder.load(tiny_target, EmbeddingConfig(pooling="last", n_threads=1)) as last:
        assert last.pooling == "last" and last.embed(["the cat"]).shape == (1, 64)
    with pytest.raises(UserError, match="reranker"):
        Embedder.load(tiny_target, EmbeddingConfig(pooling="rank", n_threads=1))


def test_batched_equals_one_at_a_time_and_vectors_are_unit_length(embedder: Embedder) -> None:
    texts = [f"{t} {i}" for i in range(5) for t in TEXTS]  # 20: more than one decode's inputs
    batched = embedder.embed(texts)
    assert batched.shape == (20, 64) and batched.dtype == np.float32
    alone = np.stack([embedder.embed([t])[0] for t in texts])
    np.testing.assert_allclose(batched, alone, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(embedder.embed(texts[:1]), embedder.embed(texts[:1]))
    distances = np.abs(batched[:, None, :] - batched[None, :, :]).max(axis=2)
    assert distances[~np.eye(20, dtype=bool)].min() > 1e-3  # different texts differ


def test_calls_from_many_threads_agree(embedder: Embedder) -> None:
    want = embedder.embed(TEXTS)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: embedder.embed(TEXTS), range(8)))
    for g in got:
        np.testing.assert_allclose(g, want, atol=1e-5)


def test_a_long_input_is_refused_or_truncated(embedder: Embedder) -> None:
    long = "the " * 700
    with pytest.raises(ContextOverflow, match="512"):
        embedder.embed([long])
    cut = embedder.run([long], truncate=True)
    assert cut.n_tokens == (512,)
    first = embedder.tokenize(long)[:512]
    np.testing.assert_allclose(cut.vectors, embedder.embed([first]), atol=1e-5)


def test_bad_inputs_are_user_errors(embedder: Embedder) -> None:
    with pytest.raises(UserError, match="not in the vocabulary"):
        embedder.embed([[1, 10**6]])
    with pytest.raises(UserError, match="empty"):
        embedder.embed([[]])


# --- OpenAI's route, through the openai client ---------------------------------------------------


def test_openai_single_batched_and_token_ids(client: openai.OpenAI, embedder: Embedder) -> None:
    one = client.embeddings.create(model="anything", input=TEXTS[0])
    assert one.object == "list" and one.model == "embed" and len(one.data) == 1
    assert one.data[0].index == 0 and one.data[0].object == "embedding"
    assert one.usage.prompt_tokens == one.usage.total_tokens == len(embedder.tokenize(TEXTS[0]))
    many = client.embeddings.create(model="anything", input=TEXTS)
    assert [d.index for d in many.data] == [0, 1, 2, 3]
    assert many.usage.prompt_tokens == sum(len(embedder.tokenize(t)) for t in TEXTS)
    np.testing.assert_allclose(vectors(many)[0], vectors(one)[0], atol=1e-5)
    np.testing.assert_allclose(vectors(many), embedder.embed(TEXTS), atol=1e-5)
    ids = [embedder.tokenize(t) for t in TEXTS[:2]]
    by_ids = client.embeddings.create(model="anything", input=ids)
    np.testing.assert_allclose(vectors(by_ids), vectors(many)[:2], atol=1e-5)
    single_ids = client.embeddings.create(model="anything", input=ids[0])
    assert len(single_ids.data) == 1
    np.testing.assert_allclose(vectors(single_ids)[0], vectors(one)[0], atol=1e-5)


def test_base64_is_the_same_vector(client: openai.OpenAI, url: str) -> None:
    floats = post(url, "/v1/embeddings", {"input": TEXTS[1], "encoding_format": "float"}).json()
    raw = client.embeddings.create(model="m", input=TEXTS[1], encoding_format="base64")
    packed = raw.data[0].embedding
    assert isinstance(packed, str)
    decoded = np.frombuffer(base64.b64decode(packed), dtype="<f4")
    assert np.array_equal(decoded, np.array(floats["data"][0]["embedding"], dtype=np.float32))


def test_openai_errors(url: str, embedder: Embedder) -> None:
    openai_error(post(url, "/v1/embeddings", b"{nope"), "JSON")
    too_long = post(url, "/v1/embeddings", {"input": "x " * 700})
    openai_error(too_long, "too large", "512", code="context_length_exceeded")
    openai_error(post(url, "/v1/embeddings", {"input": "x", "dimensions": 32}), "dimensions", "64")
    ok = post(url, "/v1/embeddings", {"input": "x", "dimensions": 64})
    assert ok.status_code == 200, ok.text
    openai_error(post(url, "/v1/embeddings", {"input": "x", "encoding_format": "int8"}), "base64")
    openai_error(post(url, "/v1/embeddings", {"input": []}), "non-empty")
    openai_error(post(url, "/v1/embeddings", {"input": [[1, 10**6]]}), "vocabulary")
    openai_error(post(url, "/v1/embeddings", {"model": "m"}), '"input"')
    openai_error(post(url, "/v1/embeddings", {"input": "x", "embd_normalize": 1}), "embd_normalize")
    assert httpx.post(f"{url}/v1/embeddings", json={"input": "x"}).status_code == 401


def test_embd_normalize_is_honoured(url: str) -> None:
    raw = post(url, "/v1/embeddings", {"input": TEXTS[0], "embd_normalize": -1}).json()
    unit = post(url, "/v1/embeddings", {"input": TEXTS[0]}).json()
    v, u = (np.array(x["data"][0]["embedding"]) for x in (raw, unit))
    assert abs(np.linalg.norm(v) - 1) > 1e-3
    np.testing.assert_allclose(v / np.linalg.norm(v), u, atol=1e-5)


# --- llama-server's routes -----------------------------------------------------------------------


def test_llama_server_routes(url: str, embedder: Embedder) -> None:
    want = embedder.embed(TEXTS[:2])
    for path in ("/embeddings", "/embedding"):
        r = post(url, path, {"content": TEXTS[:2]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert [b["index"] for b in body] == [0, 1]
        got = np.array([b["embedding"][0] for b in body])
        assert all(len(b["embedding"]) == 1 for b in body)
        np.testing.assert_allclose(got, want, atol=1e-5)
    mixed = post(url, "/embeddings", {"input": [*embedder.tokenize("the cat"), "is"]}).json()
    assert len(mixed) == 1  # ids and text mixed: one prompt, as llama-server reads it


def test_pooling_none_gives_token_vectors_and_no_openai_answer(
    ladder: Pyramid, tiny_target: Path
) -> None:
    with Embedder.load(tiny_target, ONE_THREAD) as plain:
        http = TestClient(create_app(ladder, ServerSettings(), plain))
        body = http.post("/embeddings", json={"input": "the cat"}).json()
        n = len(plain.tokenize("the cat"))
        rows = np.array(body[0]["embedding"])
        assert len(body) == 1 and rows.shape == (n, 64)
        assert np.all(np.abs(np.linalg.norm(rows, axis=1) - 1) > 1e-3)  # not normalised
        np.testing.assert_allclose(rows, plain.run(["the cat"]).vectors[0], atol=1e-5)
        r = http.post("/v1/embeddings", json={"input": "the cat"})
        assert r.status_code == 400 and "pooling 'none'" in r.json()["error"]["message"]
        r = http.post("/api/embed", json={"input": "the cat"})
        assert r.status_code == 400 and "pooling 'none'" in r.json()["error"]


def test_the_model_lists_name_the_embedding_model(
    client: openai.OpenAI, url: str, embedder: Embedder, ladder: Pyramid
) -> None:
    """Clients pick an embedding model from the lists (Open WebUI from /api/tags): it is there
    beside the ladder, and only when one is loaded."""
    ids = [m.id for m in client.models.list()]
    assert ids == ["tiny", embedder.name]
    tags = httpx.get(f"{url}/api/tags", headers=AUTH).json()["models"]
    assert [m["name"] for m in tags] == ["tiny", embedder.name]
    assert tags[1]["size"] == embedder.path.stat().st_size
    bare = TestClient(create_app(ladder, ServerSettings()))
    assert [m["id"] for m in bare.get("/v1/models").json()["data"]] == ["tiny"]
    assert [m["name"] for m in bare.get("/api/tags").json()["models"]] == ["tiny"]


def test_no_embedding_model_is_a_clear_400(ladder: Pyramid) -> None:
    http = TestClient(create_app(ladder, ServerSettings()))
    for path in ("/v1/embeddings", "/embeddings"):
        r = http.post(path, json={"input": "x"})
        assert r.status_code == 400 and "--embedding-model" in r.json()["error"]["message"]
    for path, body in (("/api/embed", {"input": "x"}), ("/api/embeddings", {"prompt": "x"})):
        r = http.post(path, json=body)
        assert r.status_code == 400 and set(r.json()) == {"error"}
        assert "--embedding-model" in r.json()["error"]


def test_every_input_form_embeds_as_its_text(url: str, embedder: Embedder) -> None:
    """Token ids, a prompt object and text content parts (joined) are the text; a text after
    ids gets no special tokens (llama-server's mixed prompt); usage counts what was embedded."""
    text = "the cat is on the tree"
    ids = embedder.tokenize(text)
    mixed_ids = ids[:3] + embedder.tokenize("is on the tree", add_special=False)
    forms: list[Any] = [
        text,
        ids,
        {"prompt_string": text},
        {"content": [{"type": "text", "text": "the cat "}, {"type": "text", "text": text[8:]}]},
        [*ids[:3], "is on the tree"],
    ]
    r = post(url, "/v1/embeddings", {"input": forms})
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]])
    want = embedder.embed([ids, ids, ids, ids, mixed_ids])
    np.testing.assert_allclose(got, want, atol=1e-5)
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] == 4 * len(ids) + len(mixed_ids)
    for single in forms[1:4]:
        one = post(url, "/v1/embeddings", {"input": single}).json()
        assert len(one["data"]) == 1 and one["usage"]["total_tokens"] == len(ids)
        np.testing.assert_allclose(one["data"][0]["embedding"], got[0], atol=1e-5)
    empty = post(url, "/v1/embeddings", {"input": ""})  # the model's BOS alone
    assert empty.status_code == 200 and empty.json()["usage"]["total_tokens"] == 1


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ([], "non-empty"),
        ({"content": "string"}, '{"content": [parts]}'),
        ({"content": [{"type": "unknown"}]}, "unknown content part type 'unknown'"),
        ({"content": [{"type": "text", "text": 3}]}, "text must be a text"),
        ({"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}, "not image_url"),
        ({"content": [{"type": "input_audio", "input_audio": {}}]}, "not input_audio"),
        (["a", {"content": [{"type": "input_video", "input_video": {}}]}], "input[1].content[0]"),
        ({"prompt_string": 3}, "prompt_string must be a text"),
        ({"prompt_string": "x", "multimodal_data": ["AAAA"]}, "reads text only"),
        ([["a", None]], "input[0]"),
    ],
)
def test_inputs_we_cannot_embed_are_400s(url: str, value: Any, fragment: str) -> None:
    openai_error(post(url, "/v1/embeddings", {"input": value}), fragment)


def test_metrics_count_embedded_tokens(ladder: Pyramid, embedder: Embedder) -> None:
    """llama-server's counters: embedded tokens are prompt tokens, each batch of inputs a
    decode, nothing predicted."""
    http = TestClient(create_app(ladder, ServerSettings(metrics=True), embedder))

    def metrics() -> dict[str, float]:
        lines = http.get("/metrics").text.splitlines()
        samples = (x.split(" ") for x in lines if not x.startswith("#") and "{" not in x)
        return {name: float(value) for name, value in samples}

    before = metrics()
    r = http.post("/v1/embeddings", json={"input": ["hello world", "goodbye world"]})
    n = r.json()["usage"]["total_tokens"]
    assert n == len(embedder.tokenize("hello world")) + len(embedder.tokenize("goodbye world"))
    after = metrics()
    for prefix in ("llamacpp:", "pyramid_gguf:"):
        assert after[prefix + "prompt_tokens_total"] - before[prefix + "prompt_tokens_total"] == n
        assert after[prefix + "n_decode_total"] - before[prefix + "n_decode_total"] == 1
        assert after[prefix + "tokens_predicted_total"] == before[prefix + "tokens_predicted_total"]
    assert after["pyramid_gguf:embedding_tokens_total"] == embedder.counts().tokens


# --- Ollama's routes, through the ollama client --------------------------------------------------


def test_ollama_embed(url: str, embedder: Embedder) -> None:
    c = ollama.Client(host=url, headers=AUTH, timeout=60)
    r = c.embed("whatever", input=TEXTS[:3], keep_alive="5m", options={"num_ctx": 4096})
    assert r.model == "whatever" and r.load_duration == 0 and (r.total_duration or 0) > 0
    assert r.prompt_eval_count == sum(len(embedder.tokenize(t)) for t in TEXTS[:3])
    np.testing.assert_allclose(np.array(r.embeddings), embedder.embed(TEXTS[:3]), atol=1e-5)
    single = c.embed("whatever", input=TEXTS[0])
    assert len(single.embeddings) == 1
    legacy = np.array(c.embeddings("whatever", prompt=TEXTS[0]).embedding)
    assert abs(np.linalg.norm(legacy) - 1) > 1e-3  # Ollama's legacy route does not normalise
    np.testing.assert_allclose(legacy / np.linalg.norm(legacy), single.embeddings[0], atol=1e-5)
    assert c.embed("whatever", input="").embeddings == []


def test_ollama_truncates_unless_told_not_to(url: str, embedder: Embedder) -> None:
    long = "the " * 700
    cut = post(url, "/api/embed", {"model": "m", "input": long})
    assert cut.status_code == 200 and cut.json()["prompt_eval_count"] == 512
    first = embedder.embed([embedder.tokenize(long)[:512]])
    np.testing.assert_allclose(cut.json()["embeddings"], first, atol=1e-5)
    ollama_error(post(url, "/api/embed", {"input": long, "truncate": False}), "512")
    ollama_error(post(url, "/api/embed", b"{nope"), "JSON")
    ollama_error(post(url, "/api/embed", {"input": [1, 2]}), "strings")
    ollama_error(post(url, "/api/embed", {"input": "x", "dimensions": 3}), "dimensions")
    r = httpx.post(f"{url}/api/embed", json={"input": "x"}, headers={"Authorization": "Bearer no"})
    assert r.status_code == 401 and set(r.json()) == {"error"}


# --- the command line ----------------------------------------------------------------------------


def test_serve_refuses_a_bad_embedding_model(tiny_target: Path, tmp_path: Path) -> None:
    base = ["serve", "--target", str(tiny_target), "--port", "0"]
    missing = CliRunner().invoke(main, [*base, "--embedding-model", str(tmp_path / "no.gguf")])
    assert missing.exit_code == 1
    assert missing.output.strip().splitlines() == [
        f"Error: model file not found: {tmp_path / 'no.gguf'}"
    ]
    (tmp_path / "text.gguf").write_text("not a model")
    bad = CliRunner().invoke(main, [*base, "--embedding-model", str(tmp_path / "text.gguf")])
    assert bad.exit_code == 1 and bad.output.startswith("Error: not a GGUF file")
    alone = CliRunner().invoke(main, [*base, "--pooling", "mean"])
    assert alone.exit_code == 1 and "--embedding-model" in alone.output


def test_the_python_api_imports_without_a_web_framework() -> None:
    code = (
        "import sys\n"
        "class NoWeb:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('fastapi', 'starlette', 'uvicorn'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, NoWeb())\n"
        "import pyramid_gguf.embeddings\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr[-500:]


# --- an encoder: the llama-server suite's tiny BERT, and its shim ---------------------------------

SUITE = Path(__file__).parents[1] / "scripts" / "llama_server_suite"
BERT_WORDS = ("i", "believe", "the", "meaning", "of", "life", "is", "this", "a", "test", "hello")


def _suite_module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(
        f"llama_server_suite_{name}", SUITE / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bert_path(tiny_dir: Path) -> Path:
    path: Path = _suite_module("tiny_bert").write_tiny_bert(
        tiny_dir / "bert.gguf", BERT_WORDS, ["s", "ing"]
    )
    return path


@pytest.fixture(scope="module")
def bert(bert_path: Path) -> Iterator[Embedder]:
    with Embedder.load(bert_path, ONE_THREAD) as e:
        yield e


def test_the_tiny_bert_is_an_encoder_with_wordpiece_and_cls_pooling(bert: Embedder) -> None:
    assert bert.pooling == "cls" and bert.metadata()["general.architecture"] == "bert"
    assert bert.n_ctx == 512  # its learned positions
    text = "I believe the meaning of life is"
    tokens = bert.tokenize(text)
    assert len(tokens) == len(text.split()) + 2 and (tokens[0], tokens[-1]) == (101, 102)
    hellos = bert.tokenize("Hellos")  # a word start and a continuation, lowercased
    assert len(hellos) == 4 and hellos[1] == bert.tokenize("hello")[1]
    v = bert.embed([text, "this is a test"])
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    # an encoder: the first (CLS) token's vector sees the words after it
    assert np.abs(v[0] - bert.embed(["I believe"])[0]).max() > 1e-3


def test_an_encoders_batched_inputs_do_not_see_each_other(bert: Embedder) -> None:
    """Identical inputs in one batch give identical vectors, each as it is alone: attention
    stays within each input's sequence."""
    same = "I believe the meaning of life is"
    texts = [same, "hello world", same, "a test", same, same, same]
    batched = bert.embed(texts)
    np.testing.assert_allclose(batched, np.stack([bert.embed([t])[0] for t in texts]), atol=1e-5)
    # rows of one batch differ by ~1e-6 on some CPUs' kernels (1.25e-6 seen on an EPYC);
    # another input differs by more than 1e-3 (below), so 1e-5 still catches a leak
    assert np.abs(batched[[2, 4, 5, 6]] - batched[0]).max() < 1e-5
    assert np.abs(batched[1] - batched[0]).max() > 1e-3


def test_an_encoders_routes(ladder: Pyramid, bert_path: Path, bert: Embedder) -> None:
    """usage counts the tokenizer's tokens ([CLS] and [SEP] too); pooling none gives every
    token's vector unnormalised on /embeddings and a 400 on /v1/embeddings."""
    http = TestClient(create_app(ladder, ServerSettings(), bert))
    r = http.post("/v1/embeddings", json={"input": ["I believe the meaning of life is", ""]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["total_tokens"] == (7 + 2) + 2
    with Embedder.load(bert_path, EmbeddingConfig(pooling="none", n_threads=1)) as tokens:
        http = TestClient(create_app(ladder, ServerSettings(), tokens))
        body = http.post("/embeddings", json={"input": "hello hello hello"}).json()
        rows = np.array(body[0]["embedding"])
        assert rows.shape == (5, 64)
        assert np.all(np.abs(np.linalg.norm(rows, axis=1) - 1) > 1e-3)
        r = http.post("/v1/embeddings", json={"input": "hello hello hello"})
        assert r.status_code == 400 and "pooling 'none'" in r.json()["error"]["message"]


def test_the_suites_shim_serves_embeddings(
    tiny_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--embedding``: the model (or, for bge-small, the tiny BERT beside the SmolLM2
    stand-in) as --embedding-model, with --pooling and inputs up to the micro-batch."""
    shim = _suite_module("shim")
    monkeypatch.setenv("PYRAMID_GGUF_HOME", str(tmp_path))
    smol = tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    smol.parent.mkdir()
    shutil.copy(tiny_target, smol)
    bge = ["--hf-repo", "ggml-org/models", "--hf-file", "bert-bge-small/ggml-model-f16.gguf"]

    def pairs(argv: list[str]) -> dict[str, str]:
        args = shim.translate(argv)
        return {a: b for a, b in zip(args, [*args[1:], ""], strict=True) if a.startswith("--")}

    args = pairs([*bge, "--embedding", "--pooling", "last", "--ctx-size", "512",
                  "--parallel", "2", "--batch-size", "128", "--ubatch-size", "128"])  # fmt: skip
    bert = tmp_path / "llama-server-tests" / "tiny-bert.gguf"
    assert args["--target"] == str(smol) and args["--embedding-model"] == str(bert)
    assert args["--pooling"] == "last" and args["--embedding-ctx-size"] == "256"
    with Embedder.load(bert, ONE_THREAD) as e:
        assert e.pooling == "cls" and e.tokenize("the")[0] == 101
    fa = pairs([*bge, "--embedding", "-c", "1024", "-np", "2", "-b", "300", "-ub", "300"])
    assert fa["--embedding-ctx-size"] == "300" and "--pooling" not in fa
    own = pairs(["--model", str(smol), "--embedding"])
    assert own["--target"] == own["--embedding-model"] == str(smol)
    assert "--embedding-model" not in pairs(["--model", str(smol), "--pooling", "mean"])
    with pytest.raises(shim.Refused, match="--embedding"):
        shim.translate(bge)
