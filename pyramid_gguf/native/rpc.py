"""llama.cpp's RPC backend (``ggml-rpc``): remote devices for a tier, and the server end.

A model placed on another machine runs there on llama.cpp's own ``rpc-server`` (or
:func:`serve`, the same C entry point, ``ggml_backend_rpc_start_server``, started in this
process). The client registers each endpoint's devices (``ggml_backend_rpc_add_server`` then
``ggml_backend_register``, as llama.cpp's ``--rpc`` does) and names them in
``llama_model_params.devices``: with only ``n_gpu_layers`` llama.cpp would report the layers
offloaded and keep every buffer on the CPU.

llama.cpp's RPC client cannot fail softly: a refused connection, a handshake of another
protocol version or a server that stops mid-graph ends in ``GGML_ABORT`` (ggml-rpc.cpp's
``RPC_STATUS_ASSERT``), which kills the process. So :func:`probe` speaks the protocol's HELLO
from Python before llama.cpp ever connects (an unreachable, busy or incompatible endpoint is a
:class:`~pyramid_gguf.core.errors.UserError`), and :func:`on_abort` turns the abort that
remains (the link lost mid-generation) into one line and an exit code instead of a backtrace
and a core dump.

No authentication, no encryption (llama.cpp's warning): a trusted network only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp

from ..core.endpoints import Endpoint, parse_endpoints, probe
from ..core.errors import UserError
from ..core.load import LoadConfig
from .backend import Override, init_backend

REBUILD = (
    "this llama-cpp-python is built without llama.cpp's RPC backend: rebuild it with CMAKE_ARGS=\""
    '-DGGML_RPC=on" pip install --force-reinstall --no-cache-dir llama-cpp-python'
)


# --- the library --------------------------------------------------------------------------


def _library() -> ctypes.CDLL | None:
    """``libggml-rpc`` of the loaded llama-cpp-python, or None where it was built without."""
    init_backend()
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml-rpc.so", "libggml-rpc.dylib", "ggml-rpc.dll"):
        if (lib_dir / name).exists():
            return ctypes.CDLL(str(lib_dir / name), mode=ctypes.RTLD_GLOBAL)
    return None


_lib_once: list[ctypes.CDLL | None] = []


def library() -> ctypes.CDLL:
    """``libggml-rpc`` with its signatures set, or a :class:`UserError` saying how to rebuild."""
    if not _lib_once:
        lib = _library()
        if lib is not None:
            lib.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
            lib.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
            lib.ggml_backend_rpc_start_server.restype = None
            lib.ggml_backend_rpc_start_server.argtypes = [
                ctypes.c_char_p,
                ctypes.c_char_p,
                ctypes.c_size_t,
                ctypes.c_size_t,
                ctypes.POINTER(ctypes.c_void_p),
            ]
            lib.ggml_backend_rpc_get_device_memory.restype = None
            lib.ggml_backend_rpc_get_device_memory.argtypes = [
                ctypes.c_char_p,
                ctypes.c_uint32,
                ctypes.POINTER(ctypes.c_size_t),
                ctypes.POINTER(ctypes.c_size_t),
            ]
        _lib_once.append(lib)
    lib = _lib_once[0]
    if lib is None:
        raise UserError(REBUILD)
    return lib


def available() -> bool:
    """Whether this build has the RPC backend."""
    try:
        library()
    except UserError:
        return False
    return True


# --- devices --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteDevice:
    """One device an RPC server offers: ``ptr`` is its ``ggml_backend_dev_t``."""

    endpoint: Endpoint
    name: str
    description: str
    free: int
    total: int
    ptr: int


_registered: dict[Endpoint, tuple[RemoteDevice, ...]] = {}
_lock = threading.Lock()


def devices(endpoints: Sequence[Endpoint]) -> tuple[RemoteDevice, ...]:
    """The devices of ``endpoints`` (each probed, then registered with llama.cpp once per
    process), in order."""
    out: list[RemoteDevice] = []
    with _lock:
        for endpoint in endpoints:
            if endpoint not in _registered:
                _registered[endpoint] = _register(endpoint)
            out.extend(_registered[endpoint])
    return tuple(out)


def _register(endpoint: Endpoint) -> tuple[RemoteDevice, ...]:
    lib = library()
    probe(endpoint)
    install_abort_handler()
    base = llama_cpp.llama_cpp._lib
    base.ggml_backend_register.argtypes = [ctypes.c_void_p]
    base.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    base.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    base.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    base.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    base.ggml_backend_dev_name.restype = ctypes.c_char_p
    base.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    base.ggml_backend_dev_description.restype = ctypes.c_char_p
    base.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
    base.ggml_backend_dev_memory.restype = None
    size_p = ctypes.POINTER(ctypes.c_size_t)
    base.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, size_p, size_p]
    reg = lib.ggml_backend_rpc_add_server(str(endpoint).encode())
    if not reg:
        raise UserError(f"llama.cpp could not register the RPC server at {endpoint}")
    base.ggml_backend_register(reg)
    found = []
    for i in range(base.ggml_backend_reg_dev_count(reg)):
        dev = base.ggml_backend_reg_dev_get(reg, i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        name = (base.ggml_backend_dev_name(dev) or b"").decode("utf-8", "replace")
        text = (base.ggml_backend_dev_description(dev) or b"").decode("utf-8", "replace")
        found.append(RemoteDevice(endpoint, name, text, int(free.value), int(total.value), dev))
    if not found:
        raise UserError(f"the RPC server at {endpoint} offers no device")
    return tuple(found)


def device_array(devs: Sequence[RemoteDevice], local: Sequence[int] = ()) -> Any:
    """A NULL-terminated ``ggml_backend_dev_t[]`` for ``llama_model_params.devices``: the
    local GPUs ``local`` first, then ``devs`` (llama.cpp's order for ``--rpc``: remote devices
    join the local ones). Keep it alive as long as the model."""
    ptrs = [*local, *(d.ptr for d in devs)]
    return (ctypes.c_void_p * (len(ptrs) + 1))(*ptrs, None)


#: The output layer's tensors (llama.cpp's names; a model whose output reuses the token
#: embeddings loads them as a second ``token_embd.weight``, which the input layer already
#: keeps here): pinned to this machine's CPU unless ``--rpc-output``.
OUTPUT_TENSORS = (r"^output\.", r"^output_norm\.", r"^token_embd\.")


@dataclass(frozen=True)
class RemotePlacement:
    """What ``llama_model_params`` points at while a model loads: the device array and the
    tensor overrides (None without). Keep it alive as long as the model."""

    devices: Any
    overrides: Any


def remote_devices(cfg: LoadConfig, params: Any) -> RemotePlacement | None:
    """Point ``params`` (``llama_model_params``) at ``cfg.rpc``'s devices, this machine's GPUs
    first, with every layer on them but the output layer, which stays on this machine's CPU
    (:data:`OUTPUT_TENSORS`, llama.cpp's tensor overrides: ``-ot``) unless ``cfg.rpc_output``:
    a verified row then brings back ``n_embd`` floats, not ``n_vocab`` logits. (``n_gpu_layers``
    cannot say it: llama.cpp offloads the last ``n`` of the repeating layers and the output
    layer together, so ``n_layer`` would keep layer 0 here and still send the logits.) A model
    without ``cfg.rpc`` in a process that registered RPC servers gets this machine's devices
    only (left to itself llama.cpp would use every registered device). None without RPC."""
    if not cfg.rpc and not _registered:
        return None
    remote = devices(parse_endpoints(cfg.rpc)) if cfg.rpc else ()
    local = [ptr for ptr, kind in _local_devices() if kind in _GPU]
    array = device_array(remote, local)
    params.devices = ctypes.cast(array, ctypes.c_void_p)
    overrides = None
    if cfg.rpc and cfg.n_gpu_layers < 0:
        params.n_gpu_layers = 0x7FFFFFFF
        if not cfg.rpc_output:
            overrides = output_here()
            params.tensor_buft_overrides = ctypes.addressof(overrides)
    return RemotePlacement(array, overrides)


def output_here() -> Any:
    """A NULL-terminated ``llama_model_tensor_buft_override[]`` putting
    :data:`OUTPUT_TENSORS` in the CPU buffer type (llama.cpp then also considers its repacked
    forms, as for any CPU weight)."""
    base = llama_cpp.llama_cpp._lib
    base.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
    cpu = base.ggml_backend_cpu_buffer_type()
    rows = [Override(p.encode(), cpu) for p in OUTPUT_TENSORS]
    return (Override * (len(rows) + 1))(*rows, Override(None, None))


#: ggml's device types: CPU, and the GPUs (``GGML_BACKEND_DEVICE_TYPE_GPU``, ``_IGPU``).
_CPU, _GPU = 0, (1, 2)


def _local_devices() -> list[tuple[int, int]]:
    """``(ggml_backend_dev_t, ggml device type)`` of every device but the RPC servers'."""
    base = llama_cpp.llama_cpp._lib
    base.ggml_backend_dev_count.restype = ctypes.c_size_t
    base.ggml_backend_dev_get.restype = ctypes.c_void_p
    base.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    base.ggml_backend_dev_type.restype = ctypes.c_int
    base.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    ours = {d.ptr for devs in _registered.values() for d in devs}
    every = [base.ggml_backend_dev_get(i) for i in range(base.ggml_backend_dev_count())]
    return [(d, base.ggml_backend_dev_type(d)) for d in every if d not in ours]


# --- a lost link ----------------------------------------------------------------------------

#: Called with llama.cpp's abort message (already one line) just before the process exits.
AbortHook = Callable[[str], None]
_hooks: list[AbortHook] = []
_abort_cb: list[Any] = []


@contextlib.contextmanager
def abort_hook(hook: AbortHook) -> Iterator[None]:
    """Inside the block, run ``hook`` (e.g. printing the answer so far) if llama.cpp aborts."""
    _hooks.append(hook)
    try:
        yield
    finally:
        _hooks.remove(hook)


def install_abort_handler() -> None:
    """Make llama.cpp's aborts one ``Error:`` line and exit code 1 instead of a backtrace and a
    core dump (``ggml_set_abort_callback``). Installed once an RPC server is used: that is where
    a network makes an abort an everyday event (a server stopped, a cable pulled)."""
    if _abort_cb:
        return
    base = llama_cpp.llama_cpp._lib
    proto = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
    base.ggml_set_abort_callback.restype = ctypes.c_void_p
    base.ggml_set_abort_callback.argtypes = [proto]
    cb = proto(_aborted)
    _abort_cb.append(cb)
    base.ggml_set_abort_callback(cb)


def abort_message(raw: str) -> str:
    """llama.cpp's abort text (``.../ggml-rpc.cpp:566: Remote RPC server crashed or returned
    malformed response``) as one line for a user."""
    text = raw.strip().splitlines()[0] if raw.strip() else "llama.cpp aborted"
    reason = text.split(": ", 1)[1] if ": " in text and ".c" in text.split(": ", 1)[0] else text
    if "Remote RPC server" in reason:
        names = ", ".join(str(e) for e in _registered) or "?"
        return f"lost the RPC server ({names}): it stopped, or the network failed ({reason})"
    return f"llama.cpp aborted: {reason}"


def _aborted(message: bytes | None) -> None:
    line = abort_message((message or b"").decode("utf-8", "replace"))
    for hook in list(_hooks):
        with contextlib.suppress(BaseException):  # nothing may stop the exit below
            hook(line)
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
    os.write(2, f"\nError: {line}\n".encode())
    os._exit(1)


# --- the server end -------------------------------------------------------------------------


def serve(endpoint: Endpoint, *, threads: int, cache_dir: Path | None = None) -> None:
    """Run ggml's RPC server on ``endpoint``, as llama.cpp's ``rpc-server`` does: this
    machine's GPUs, else its CPU (``threads`` threads), caching received tensors by hash in
    ``cache_dir`` (``rpc-server -c``: a second load sends no weights). Blocks for good (run
    it on a thread of its own); returns only if the socket cannot be opened."""
    lib = library()
    every = _local_devices()
    chosen = [p for p, kind in every if kind in _GPU] or [p for p, kind in every if kind == _CPU]
    if not chosen:
        raise UserError("llama.cpp reports no device to serve")
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
    devs = (ctypes.c_void_p * len(chosen))(*chosen)
    lib.ggml_backend_rpc_start_server(
        str(endpoint).encode(),
        str(cache_dir).encode() if cache_dir is not None else None,
        threads,
        len(chosen),
        devs,
    )
