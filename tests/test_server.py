"""The OpenAI-compatible server, live on uvicorn, driven by the official ``openai`` client.

Tiny synthetic GGUF models (written once per module) make every request take milliseconds;
the slow requests of the cancellation and queue tests are cut short by the test itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from click.testing import CliRunner
from openai.types.chat import ChatCompletionMessageParam
from serving_support import (
    LOAD,
    Live,
    Models,
    free_port,
    live_server,
    slow_generation,
    wait_idle,
    wait_until,
    write_models,
)

from pyramid_gguf.api import Pyramid
from pyramid_gguf.cli.main import main
from pyramid_gguf.core.spec import SpecConfig
from pyramid_gguf.serving.settings import ServerSettings, resolve_chat_format

API_KEY = "sk-test"
PROMPTS = [
    "the cat",
    "def fib",
    "import data",
    "class node",
    "for item in",
    "return value",
    "the model",
    "print text",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    return write_models(tmp_path_factory.mktemp("server-models"))


@pytest.fixture(scope="module")
def live(models: Models) -> Iterator[Live]:
    """The three-tier ladder (psd-exact) behind an API key."""
    pyramid = Pyramid.from_paths(
        models.target,
        draft=models.draft,
        qualifier=models.qualifier,
        load=LOAD,
        spec=SpecConfig(mode="psd-exact"),
        name="tiny",
    )
    with pyramid, live_server(pyramid, ServerSettings(api_key=API_KEY)) as server:
        yield server


@pytest.fixture(scope="module")
def small(models: Models) -> Iterator[Live]:
    """A target-only model without a chat template, behind a queue of one."""
    pyramid = Pyramid.from_paths(models.draft, load=LOAD, name="plain")
    with pyramid, live_server(pyramid, ServerSettings(queue_size=1)) as server:
        yield server


@pytest.fixture()
def client(live: Live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.v1, api_key=API_KEY, max_retries=0, timeout=30)


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}


def _complete(client: openai.OpenAI, prompt: str, **kw: Any) -> Any:
    return client.completions.create(
        model="tiny", prompt=prompt, max_tokens=kw.pop("max_tokens", 24), temperature=0, **kw
    )


# --- the happy paths ---------------------------------------------------------------------------


def test_health_and_models(live: Live, client: openai.OpenAI) -> None:
    health = httpx.get(f"{live.url}/health").json()  # no key needed
    assert health["status"] == "ok" and health["mode"] == "psd-exact"
    listed = client.models.list().data
    assert [m.id for m in listed] == ["tiny"]


def test_completion_usage_and_timings(client: openai.OpenAI, live: Live) -> None:
    out = _complete(client, "the cat")
    choice = out.choices[0]
    assert out.object == "text_completion" and choice.text
    assert choice.finish_reason in ("stop", "length")
    assert out.usage is not None and out.usage.completion_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    raw = httpx.post(
        f"{live.v1}/completions",
        headers=_auth(),
        json={"prompt": "the cat", "max_tokens": 24, "temperature": 0},
    ).json()
    assert raw["choices"][0]["text"] == choice.text
    t = raw["timings"]
    assert t["mode"] == "psd-exact" and t["predicted_n"] == out.usage.completion_tokens
    assert [s["name"] for s in t["stages"]] == ["draft->qualifier", "qualifier->target"]
    assert all({"draft_n", "draft_n_accepted"} <= s.keys() for s in t["stages"])
    assert t["draft_n"] == sum(s["draft_n"] for s in t["stages"]) > 0
    assert "predicted_per_second" in t


def test_chat_completion(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        temperature=0,
        max_completion_tokens=12,
    )
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content
    assert out.usage is not None and out.usage.completion_tokens <= 12
    parts = client.chat.completions.create(
        model="tiny",
        temperature=0,
        max_completion_tokens=12,
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    )
    assert parts.choices[0].message.content == out.choices[0].message.content


def test_seed_makes_sampling_repeatable(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        out = client.completions.create(
            model="tiny",
            prompt="the cat",
            max_tokens=16,
            temperature=1.0,
            seed=seed,
            extra_body={"top_k": 0, "min_p": 0.0},
        )
        return str(out.choices[0].text)

    assert sample(7) == sample(7)
    assert len({sample(s) for s in range(4)}) > 1


def test_streaming_joins_to_the_same_text(client: openai.OpenAI) -> None:
    full = _complete(client, "def fib").choices[0].text
    chunks = list(_complete(client, "def fib", stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.usage is None for c in chunks)  # usage only when asked

    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "write code"}]
    chat = client.chat.completions.create(
        model="tiny", messages=messages, temperature=0, max_tokens=16
    )
    stream = list(
        client.chat.completions.create(
            model="tiny",
            messages=messages,
            temperature=0,
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert stream[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == chat.choices[0].message.content
    usage, whole = stream[-1].usage, chat.usage
    assert stream[-1].choices == [] and usage is not None and whole is not None
    # the same counts; cached_tokens differ (the second request reuses the first's prompt)
    assert usage.model_dump(exclude={"prompt_tokens_details"}) == whole.model_dump(
        exclude={"prompt_tokens_details"}
    )
    assert all(not c.choices for c in stream if c.usage is not None)


def test_stop_and_spec_overrides(client: openai.OpenAI, live: Live) -> None:
    full = _complete(client, "the model").choices[0].text
    stop = full.strip().split()[1]
    cut = _complete(client, "the model", stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full[: full.index(stop)]

    body = {"prompt": "the model", "max_tokens": 24, "temperature": 0}
    sd = httpx.post(
        f"{live.v1}/completions", headers=_auth(), json=body | {"mode": "sd", "l_D": 2}
    ).json()
    assert sd["timings"]["mode"] == "sd"
    assert [s["name"] for s in sd["timings"]["stages"]] == ["draft->target"]
    assert sd["choices"][0]["text"] == full  # lossless at temperature 0
    fuzzy = _complete(client, "the model", extra_body={"mode": "psd-f", "tau_T": 0.3, "tau_q": 0.2})
    assert fuzzy.choices[0].text
    with pytest.raises(openai.BadRequestError) as e:
        _complete(client, "the model", extra_body={"l_Q": 0})
    assert "l-q" in e.value.message


def test_concurrent_clients_get_their_own_answers(client: openai.OpenAI, live: Live) -> None:
    sequential = [_complete(client, p).choices[0].text for p in PROMPTS]

    def ask(prompt: str) -> str:
        own = openai.OpenAI(base_url=live.v1, api_key=API_KEY, max_retries=0, timeout=60)
        if prompt in PROMPTS[::2]:
            return "".join(c.choices[0].text for c in _complete(own, prompt, stream=True))
        return str(_complete(own, prompt).choices[0].text)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        concurrent = list(pool.map(ask, PROMPTS))
    assert concurrent == sequential


# --- faults ------------------------------------------------------------------------------------


def _slow_body(**extra: Any) -> dict[str, Any]:
    """A request that would run for seconds: the tests cut it short."""
    return {"prompt": "the cat", "max_tokens": 900, "ignore_eos": True, "stream": True} | extra


def test_disconnect_cancels_the_generation(
    client: openai.OpenAI, live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_generation(live.pyramid, monkeypatch, pause=0.002)
    before = wait_idle(live.url)["cancelled"]
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", f"{live.v1}/completions", headers=_auth(), json=_slow_body()) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()  # keep a reference: a dropped iterator closes the response
        assert next(lines).startswith("data: ")
    after = wait_idle(live.url)
    assert after["cancelled"] == before + 1
    out = _complete(client, "print text")
    assert out.choices[0].text and out.usage is not None


def test_client_leaving_the_queue_is_skipped(
    client: openai.OpenAI, live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queued (not yet running) request whose client gives up never runs."""
    slow_generation(live.pyramid, monkeypatch, pause=0.01)  # runs for seconds: cut short below
    before = wait_idle(live.url)["cancelled"]
    with (
        httpx.Client(timeout=30) as http,
        http.stream(
            "POST", f"{live.v1}/completions", headers=_auth(), json=_slow_body()
        ) as running,
    ):
        lines = running.iter_lines()
        next(lines)
        with pytest.raises(httpx.ReadTimeout):  # waits behind the running one, then gives up
            httpx.post(
                f"{live.v1}/completions",
                headers=_auth(),
                timeout=0.5,
                json={"prompt": "x", "max_tokens": 4, "stream": False},
            )
        # the server marks the queued job cancelled once its event loop reads the disconnect
        # (a while on a busy machine: no fixed sleep); the worker skips it when it comes up
        pool = live.pyramid.slots
        deadline = time.monotonic() + 10
        while not (pool._queue and all(job.cancelled for job in pool._queue)):
            assert time.monotonic() < deadline, "the queued job was never cancelled"
            time.sleep(0.02)
        assert wait_until(live.url, lambda h: True)["in_flight"] == 2  # still queued, not run
    after = wait_idle(live.url)
    assert after["cancelled"] == before + 2, (before, after)
    assert _complete(client, "the cat").choices[0].text


def test_queue_overflow_answers_503(small: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    slow_generation(small.pyramid, monkeypatch, pause=0.002)
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", f"{small.v1}/completions", json=_slow_body()) as r:
            assert r.status_code == 200
            lines = r.iter_lines()  # keep a reference: a dropped iterator closes the response
            next(lines)  # the slow request holds the only slot
            busy = http.post(f"{small.v1}/completions", json={"prompt": "hi", "max_tokens": 2})
        assert busy.status_code == 503
        assert busy.headers["Retry-After"] == "1"
        assert busy.json()["error"]["code"] == "queue_full"
        wait_idle(small.url)
        ok = http.post(f"{small.v1}/completions", json={"prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_model_without_chat_template_uses_the_builtin_chatml(small: Live) -> None:
    plain = openai.OpenAI(base_url=small.v1, api_key="unused", max_retries=0)
    out = plain.chat.completions.create(
        model="plain", messages=[{"role": "user", "content": "x"}], max_tokens=3
    )
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage is not None and out.usage.prompt_tokens > 3  # the ChatML scaffolding


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b'{"prompt": "x", "temperature": "hot"}', "temperature"),
        (b'{"prompt": "x", "max_tokens": 0}', "max_tokens"),
        (b'{"prompt": "x", "mode": "warp"}', "mode"),
        (b'{"max_tokens": 3}', "prompt"),
        (b'{"prompt": "x", "top_p": 1.5}', "top_p"),
        (b'{"prompt": "x", "stop": [""]}', None),  # UserError from SamplingConfig
    ],
)
def test_bad_requests_are_openai_400s(live: Live, body: bytes, param: str | None) -> None:
    headers = _auth() | {"Content-Type": "application/json"}
    r = httpx.post(f"{live.v1}/completions", headers=headers, content=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param and "code" in error


def test_api_key_is_checked(live: Live) -> None:
    wrong = openai.OpenAI(base_url=live.v1, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.models.list()
    assert e.value.status_code == 401
    r = httpx.post(f"{live.v1}/completions", json={"prompt": "x"})  # no key at all
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


# --- CLI ---------------------------------------------------------------------------------------


def test_chat_format_names() -> None:
    assert "<|im_start|>" in (resolve_chat_format("chatml") or "")
    assert resolve_chat_format("{{ messages }}") == "{{ messages }}"
    assert resolve_chat_format(None) is None


def test_cli_load_error_is_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["serve", "--target", str(tmp_path / "missing.gguf")])
    assert result.exit_code == 1 and result.exception is not None
    assert "model file not found" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    bad = runner.invoke(main, ["serve", "--target", "x.gguf", "--chat-format", "nonsense"])
    assert bad.exit_code == 1 and "unknown chat format" in bad.output


def test_cli_serves(models: Models) -> None:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "pyramid_gguf",
        "serve",
        "--target",
        str(models.target),
        "--draft",
        str(models.draft),
        "--mode",
        "sd",
        "--port",
        str(port),
        "-c",
        "512",
        "-t",
        "1",
        "--api-key",
        "k",
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
        deadline = time.monotonic() + 30
        while True:
            try:
                models_listed = client.models.list().data
                break
            except openai.APIConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        assert models_listed[0].id == "target"
        out = client.completions.create(model="target", prompt="the", max_tokens=4)
        raw = out.model_dump()
        assert raw["timings"]["mode"] == "sd" and json.dumps(raw)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
