"""Tiers on llama.cpp's RPC backend: a loopback ``pyramid-gguf rpc-server`` holds the target.

Lossless over the wire (greedy identical to the local ladder, strict identity; chi-square at
T > 0), ggml-rpc's handshake spoken from Python (unreachable, busy, foreign and other-version
servers are one line, never llama.cpp's abort), a server killed mid-generation (``run``: one
``Error:`` line, exit 1, the partial answer kept; ``serve``: the request fails with a 503,
``/health`` says why, the next request after the server returns succeeds).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import TINY_LOAD
from lossless import HOT, PROMPT, chi_square_pvalue, generate, joint, pairs

from pyramid_gguf import Pyramid
from pyramid_gguf.core.endpoints import PROTO_MAJOR, PROTO_MINOR, Endpoint, parse_endpoints, probe
from pyramid_gguf.core.errors import UserError
from pyramid_gguf.core.gguf_header import read_header
from pyramid_gguf.core.ladder import LadderPaths
from pyramid_gguf.core.load import LoadConfig
from pyramid_gguf.core.remote import RpcConfig
from pyramid_gguf.core.sampling import SamplingConfig
from pyramid_gguf.core.spec import SpecConfig
from pyramid_gguf.native import rpc

if not rpc.available() and os.environ.get("CI"):  # CI runs them: scripts/test.sh builds RPC in
    raise RuntimeError(f"CI needs the RPC tests, and {rpc.REBUILD}")
pytestmark = pytest.mark.skipif(not rpc.available(), reason="llama.cpp built without RPC")

GREEDY = SamplingConfig(temperature=0.0, max_tokens=40, ignore_eos=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_rpc_server(port: int) -> subprocess.Popen[bytes]:
    """``pyramid-gguf rpc-server`` on loopback ``port``, answering the handshake."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyramid_gguf", "rpc-server", "--port", str(port), "-t", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    until = time.monotonic() + 30
    while time.monotonic() < until:
        try:
            probe(Endpoint("127.0.0.1", port), timeout=2.0)
            return proc
        except UserError:
            if proc.poll() is not None:
                raise AssertionError(proc.stderr.read() if proc.stderr else b"") from None
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("the RPC server did not come up")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="session")
def rpc_server() -> Iterator[str]:
    """A loopback RPC server for the session: its ``HOST:PORT``. It outlives every test of the
    session: a process that registered a server aborts (as llama.cpp's RPC client does) when
    it next asks a server that has gone for its devices."""
    port = free_port()
    proc = start_rpc_server(port)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop(proc)


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pyramid_gguf", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


# --- the handshake, without llama.cpp -------------------------------------------------------


def one_shot_server(answer: bytes | None) -> tuple[int, threading.Thread]:
    """A TCP server that reads one HELLO and sends ``answer`` (None: closes at once)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            if answer is not None:
                conn.recv(64)
                conn.sendall(answer)
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return int(srv.getsockname()[1]), t


def test_probe_reads_the_protocol_version(rpc_server: str) -> None:
    assert probe(Endpoint.parse(rpc_server))[:2] == (PROTO_MAJOR, PROTO_MINOR)


def test_probe_refuses_another_major_version() -> None:
    port, t = one_shot_server(b"\x1c" + bytes(7) + bytes([6, 1, 0, 0]) + bytes(24))
    with pytest.raises(UserError, match=r"speaks RPC protocol 6\.1\.0, this build 7\.0"):
        probe(Endpoint("127.0.0.1", port))
    t.join(5)


def test_probe_refuses_a_server_that_hangs_up() -> None:
    port, t = one_shot_server(None)
    with pytest.raises(UserError, match="closed the connection during the handshake"):
        probe(Endpoint("127.0.0.1", port))
    t.join(5)


def test_probe_refuses_nothing_listening() -> None:
    with pytest.raises(UserError, match=r"cannot reach the RPC server at 127\.0\.0\.1:\d+"):
        probe(Endpoint("127.0.0.1", free_port()))


def test_probe_says_when_the_server_is_busy(rpc_server: str) -> None:
    """ggml's server serves one client at a time: a second one waits, and we say why."""
    endpoint = Endpoint.parse(rpc_server)
    holder = socket.create_connection((endpoint.host, endpoint.port))
    try:
        holder.sendall(bytes([14]) + (24).to_bytes(8, "little") + bytes(24))
        holder.recv(64)
        with pytest.raises(UserError, match="serves one client at a time"):
            probe(endpoint, timeout=1.0)
    finally:
        holder.close()


@pytest.mark.parametrize("text", ["localhost", "host:", ":50052", "h:0", "h:70000", "h:port"])
def test_bad_endpoints_are_one_line(text: str) -> None:
    with pytest.raises(UserError, match="--rpc wants HOST:PORT"):
        parse_endpoints(text)


def test_endpoint_lists_keep_order_and_drop_repeats() -> None:
    got = parse_endpoints("10.0.0.2:50052, 10.0.0.3:1,10.0.0.2:50052")
    assert [str(e) for e in got] == ["10.0.0.2:50052", "10.0.0.3:1"]


def test_rpc_tiers_place_only_the_named_tiers() -> None:
    cfg = RpcConfig(("127.0.0.1:1",), ("qualifier", "target"))
    base = LoadConfig(n_ctx=512, n_gpu_layers=0)
    out = cfg.place({"draft": 0, "qualifier": 0, "target": 0}, base)
    assert out["draft"] == base
    assert out["qualifier"].rpc == out["target"].rpc == ("127.0.0.1:1",)
    assert out["target"].n_gpu_layers == -1
    with pytest.raises(UserError, match="lacks"):
        cfg.place({"target": 0}, base)
    with pytest.raises(UserError, match="--rpc-tiers takes"):
        RpcConfig(("127.0.0.1:1",), ("teacher",))


# --- lossless over the wire -------------------------------------------------------------------


def ladder(paths: tuple[Path, Path, Path], endpoint: str | None, mode: str, **load: object):
    target, qualifier, draft = paths
    cfg = LoadConfig(**{**TINY_LOAD.__dict__, **load})
    return Pyramid.load(
        LadderPaths.of(target, qualifier, draft),
        load=cfg,
        spec=SpecConfig(mode=mode),
        rpc=RpcConfig((endpoint,)) if endpoint else None,
    )


@pytest.fixture(scope="module")
def paths(tiny_target: Path, tiny_qualifier: Path, tiny_draft: Path) -> tuple[Path, Path, Path]:
    return tiny_target, tiny_qualifier, tiny_draft


PROMPTS = ["The quick brown", "def main():", PROMPT]


@pytest.mark.parametrize("mode", ["sd", "psd-exact"])
def test_greedy_over_rpc_equals_local_target_decoding(
    paths: tuple[Path, Path, Path], rpc_server: str, mode: str
) -> None:
    with ladder(paths, None, "target", strict_identity=True) as local:
        want = [local.generate(p, GREEDY).token_ids for p in PROMPTS]
    with ladder(paths, rpc_server, mode, strict_identity=True) as remote:
        assert remote.ladder.target.loaded.weight_buffers, "no buffers reported"
        assert any(k.startswith("RPC") for k in remote.ladder.target.loaded.weight_buffers)
        assert not any(k.startswith("RPC") for k in remote.ladder.draft.loaded.weight_buffers)
        got = [remote.generate(p, GREEDY).token_ids for p in PROMPTS]
    assert got == want


def test_sampled_tokens_over_rpc_follow_the_target(
    paths: tuple[Path, Path, Path], rpc_server: str
) -> None:
    """Chi-square of the first two emitted tokens at T = 1, psd-exact with the target over
    RPC, against the local target's own joint distribution (tests/test_lossless.py's test)."""
    with ladder(paths, None, "target") as local:
        prompt = local.tokenize(PROMPT)
        want = joint(local.ladder.target, prompt)
        draft_joint = joint(local.ladder.draft, prompt)  # type: ignore[arg-type]
        n_vocab = local.ladder.target.n_vocab
    spec = SpecConfig(mode="psd-exact", l_d=2, l_q=3)
    with ladder(paths, rpc_server, "psd-exact") as remote:
        sampled = pairs(
            lambda seed: generate(remote, prompt, spec, HOT.with_(seed=seed))[0], n_vocab
        )
    assert chi_square_pvalue(sampled, want) > 0.001
    assert chi_square_pvalue(sampled, draft_joint) < 1e-4  # the test has the power to tell


# --- what crosses the wire -------------------------------------------------------------------


class CountingRelay:
    """A loopback TCP relay in front of an RPC server, counting the bytes that come back."""

    def __init__(self, to: str) -> None:
        host, port = to.rsplit(":", 1)
        self.to = (host, int(port))
        self.back = 0
        self._lock = threading.Lock()
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self._srv.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self._srv.accept()
            server = socket.create_connection(self.to)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, back: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                if back:
                    with self._lock:
                        self.back += len(data)
                dst.sendall(data)
            # the end passed on at once (a close() would wait for the other pump's recv): the
            # server serves one client at a time and must see the last one go
            dst.shutdown(socket.SHUT_WR)


@pytest.fixture(scope="session")
def relay(rpc_server: str) -> CountingRelay:
    """The session's RPC server behind a counting relay; it lives as long (see rpc_server)."""
    return CountingRelay(rpc_server)


def test_the_output_layer_stays_here_unless_asked(tiny_target: Path, relay: CountingRelay) -> None:
    """By default every repeating layer is on the server and the head here: an evaluation
    brings back the hidden state (n_embd floats), never a row of logits (n_vocab); with
    ``--rpc-output`` the logits cross. (llama.cpp's ``n_gpu_layers`` cannot say this: it
    offloads the head with the last layers, so ``n_layer`` kept layer 0 here instead.)"""
    steps = 8
    back: dict[bool, float] = {}
    for there in (False, True):
        rpc = RpcConfig((relay.endpoint,), remote_output=there)
        with Pyramid.load(LadderPaths.of(tiny_target, None, None), load=TINY_LOAD, rpc=rpc) as p:
            weights = p.ladder.target.loaded.weight_buffers
            assert any(k.startswith("RPC") for k in weights), weights
            prompt = p.tokenize(PROMPT)
            p.generate(prompt, SamplingConfig(temperature=0, max_tokens=2))  # the prompt, cached
            n_vocab = p.ladder.target.n_vocab
            before = relay.back
            greedy = SamplingConfig(temperature=0, max_tokens=steps, ignore_eos=True)
            got = p.generate(prompt, greedy, SpecConfig(mode="target"))
            assert len(got.token_ids) == steps
            back[there] = (relay.back - before) / steps  # one evaluation per token
    n_embd = int(read_header(tiny_target).metadata["llama.embedding_length"])
    assert 4 * n_embd <= back[False] < 4 * n_vocab <= back[True], (back, n_embd, n_vocab)


# --- the CLI ----------------------------------------------------------------------------------


def test_run_over_rpc_prints_what_the_local_run_prints(
    paths: tuple[Path, Path, Path], rpc_server: str
) -> None:
    target, _, draft = paths
    common = ["run", "--target", str(target), "--draft", str(draft), "--mode", "sd", "--raw"]
    common += ["-p", "The quick brown", "-n", "24", "--temp", "0", "-t", "1", "-c", "512"]
    here = run_cli(*common, "--strict-identity")
    there = run_cli(*common, "--strict-identity", "--rpc", rpc_server)
    assert here.returncode == 0 and there.returncode == 0, there.stderr
    assert there.stdout == here.stdout and here.stdout.strip()


def test_unreachable_server_is_one_line(paths: tuple[Path, Path, Path]) -> None:
    target = paths[0]
    r = run_cli(
        "run",
        "--target",
        str(target),
        "-p",
        "x",
        "-t",
        "1",
        "-c",
        "512",
        "--rpc",
        f"127.0.0.1:{free_port()}",
    )
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert r.stderr.startswith("Error: cannot reach the RPC server at 127.0.0.1:")


def test_build_without_rpc_says_how_to_rebuild(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "_lib_once", [None])
    with pytest.raises(UserError, match=r'CMAKE_ARGS="-DGGML_RPC=on"'):
        rpc.devices(parse_endpoints("127.0.0.1:1"))


def test_rpc_tiers_without_rpc_is_refused(tiny_target: Path) -> None:
    r = run_cli("run", "--target", str(tiny_target), "-p", "x", "--rpc-tiers", "target")
    assert r.returncode == 1 and r.stderr.strip() == "Error: --rpc-tiers needs --rpc"


def test_rpc_server_refuses_a_port_in_use() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = run_cli("rpc-server", "--port", str(port), timeout=60)
    assert r.returncode == 1
    assert r.stderr.startswith(f"Error: cannot listen on 127.0.0.1:{port}"), r.stderr


def test_killed_server_mid_generation_keeps_the_partial_answer(tiny_target: Path) -> None:
    port = free_port()
    server = start_rpc_server(port)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pyramid_gguf",
            "run",
            "--target",
            str(tiny_target),
            "--raw",
            "-p",
            "Once upon a time",
            "-n",
            "100000",
            "--ignore-eos",
            "--temp",
            "0",
            "-t",
            "1",
            "-c",
            "16384",
            "--rpc",
            f"127.0.0.1:{port}",
            "--mode",
            "target",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.read1(64)  # type: ignore[attr-defined]
        assert first, proc.stderr.read() if proc.stderr else b""
        stop(server)
        out, err = proc.communicate(timeout=60)
    finally:
        stop(server)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    text = err.decode().strip()
    assert text.splitlines()[-1].startswith("Error: lost the RPC server (127.0.0.1:"), text
    assert "Traceback" not in text and "backtrace" not in text.lower()
    assert len(first + out) > 0


# --- serve --------------------------------------------------------------------------------------


def test_serve_survives_a_lost_rpc_server(tiny_target: Path) -> None:
    rpc_port, http_port = free_port(), free_port()
    server = start_rpc_server(rpc_port)
    front = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pyramid_gguf",
            "serve",
            "--target",
            str(tiny_target),
            "--port",
            str(http_port),
            "-t",
            "1",
            "-c",
            "16384",
            "--mode",
            "target",
            "--rpc",
            f"127.0.0.1:{rpc_port}",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{http_port}"
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
    try:
        wait_health(base, 200)
        ok = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"]

        long = {**body, "max_tokens": 15000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{base}/v1/completions", json=long, timeout=60) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            stop(server)
            rest = [line for line in lines if line.startswith("data: {")]
        assert rest and "lost the RPC server" in json.loads(rest[-1][6:])["error"]["message"]

        health = wait_health(base, 503)
        assert "lost the RPC server" in health["error"]["message"]
        refused = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
        assert refused.status_code == 503
        assert "lost the RPC server" in refused.json()["error"]["message"]

        server = start_rpc_server(rpc_port)
        wait_health(base, 200, within=120)
        again = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
        assert again.status_code == 200
        assert again.json()["choices"][0]["text"] == ok.json()["choices"][0]["text"]
    finally:
        front.send_signal(signal.SIGINT)
        try:
            front.wait(30)
        except subprocess.TimeoutExpired:
            front.kill()
        stop(server)


def wait_health(base: str, status: int, within: float = 60) -> dict:
    until = time.monotonic() + within
    last = None
    while time.monotonic() < until:
        try:
            r = httpx.get(f"{base}/health", timeout=5)
            last = (r.status_code, r.text)
            if r.status_code == status:
                return r.json()
        except httpx.HTTPError as e:
            last = (0, str(e))
        time.sleep(0.2)
    raise AssertionError(f"/health never answered {status}: last {last}")


# --- plan -------------------------------------------------------------------------------------


def test_plan_places_the_target_on_the_servers_memory(
    paths: tuple[Path, Path, Path], rpc_server: str
) -> None:
    target, _, draft = paths
    r = run_cli(
        "plan",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--rpc",
        rpc_server,
        "-c",
        "512",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["fits"] is True and doc["devices"][0]["endpoint"] == rpc_server
    assert doc["free_bytes"] > doc["remote_bytes"] > 0
    assert doc["tiers"][0].startswith("draft here") and "target on the RPC" in doc["tiers"][1]


def test_remote_fit_counts_layers_and_cache_there_and_the_head_here(tiny_target: Path) -> None:
    from pyramid_gguf.planning.memory import model_memory
    from pyramid_gguf.planning.remote import RemoteDevice, remote_fit

    mm = model_memory(tiny_target)
    load = LoadConfig(n_ctx=512)
    kv = mm.kv_bytes(512)
    small = [RemoteDevice("h:1", "CPU", free=sum(mm.layer_bytes), total=1 << 30)]
    kept = remote_fit({"target": mm}, RpcConfig(("h:1",)), small, load)
    moved = remote_fit({"target": mm}, RpcConfig(("h:1",), remote_output=True), small, load)
    assert kept.remote_bytes >= sum(mm.layer_bytes) + kv
    assert moved.remote_bytes - kept.remote_bytes == mm.head_bytes
    assert kept.local_bytes - moved.local_bytes == mm.head_bytes
    assert not kept.fits  # the layers alone fill the device: the cache does not fit beside them
    roomy = [RemoteDevice("h:1", "CPU", free=1 << 30, total=1 << 30)]
    assert remote_fit({"target": mm}, RpcConfig(("h:1",)), roomy, load).fits
