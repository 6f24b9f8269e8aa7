"""Where a model's weights go: llama.cpp's buffer types, and repacking without the AMX kernels.

llama.cpp puts each CPU weight in the first buffer type able to run the op that uses it; with
``use_extra_bufts`` on, ggml-cpu's extra types come first, AMX before CPU_REPACK
(``make_cpu_buft_list`` in llama-model.cpp, ``ggml_backend_cpu_get_extra_buffer_types`` in
ggml-cpu.cpp). The AMX kernels of llama-cpp-python 0.3.36 crash on batched decodes (llama.cpp
issue #20824), so where they would be used (:func:`build_has_amx_kernels`) a model is loaded
with extra buffers off plus tensor buffer-type overrides that put into CPU_REPACK exactly the
weights its kernels take, and everything else stays in the plain CPU buffer.

An override to any buffer type but the plain CPU one places a tensor there unchecked
(``llama_model_loader::create_tensor``, "check overrides"), and a tensor CPU_REPACK has no kernel
for would crash the load (``ggml_backend_cpu_repack_buffer_set_tensor`` calls its null kernel).
So each weight is checked here as llama.cpp checks it (``weight_buft_supported``): the weight
must be one llama.cpp multiplies (:data:`MUL_MAT`, :data:`MUL_MAT_ID`), and ggml's CPU device
must accept that product with the weight in a CPU_REPACK buffer, which holds exactly when
``ggml_repack_get_optimal_repack_type`` (ggml-cpu/repack.cpp) has a kernel for the weight's
type and shape on this CPU (on x86: Q4_0, Q4_K, IQ4_NL and MXFP4 with AVX2, Q2_K with AVX-512,
rows a multiple of 8).

- :func:`plan_placement`: how to load a file under a :class:`LoadConfig` (a :class:`Placement`).
- :func:`repack_names`: the weights of a file that CPU_REPACK takes on this CPU.
- :func:`moe_patterns`: the overrides of llama.cpp's ``--n-cpu-moe N`` / ``--cpu-moe`` (routed
  experts in CPU memory), and :func:`experts_on_cpu`, the tensors of a file they match.
- :func:`parse_buffer_sizes`: MiB per buffer type from llama.cpp's load log.
- :func:`peer_llama`: llama-cpp-python's own ``Llama`` (a benchmark's peer), placed the same way
  and decoding on the process's compute thread (:mod:`.compute`).
"""

from __future__ import annotations

import ctypes
import functools
import re
import threading
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import llama_cpp
from gguf import GGMLQuantizationType
from llama_cpp._ctypes_extensions import load_shared_library

from ..core.errors import ModelFileError, UserError
from ..core.gguf_header import TensorInfo, read_header
from ..core.load import LoadConfig
from . import compute
from .backend import Override, init_backend, supports_gpu_offload

#: Weights llama.cpp multiplies with ``GGML_OP_MUL_MAT`` (``LLM_TENSOR_INFOS`` in
#: src/llama-arch.cpp of llama-cpp-python 0.3.36), ``%d`` standing for a layer number; the
#: name in the file adds ``.weight``. A weight not listed is never overridden.
MUL_MAT = frozenset(
    """
    output cls cls.output dense_2 dense_3 fc conf_proj markov_w2 selector_hidden altup_proj
    altup_unembd_proj per_layer_model_proj nextn.pre_projection nextn.post_projection
    output_hc_down output_hc_fn output_hc_up convnext.%d.pw1 convnext.%d.pw2 posnet.%d.attn_q
    posnet.%d.attn_k posnet.%d.attn_v posnet.%d.attn_output dec.blk.%d.attn_q dec.blk.%d.attn_k
    dec.blk.%d.attn_v dec.blk.%d.attn_o dec.blk.%d.cross_attn_q dec.blk.%d.cross_attn_k
    dec.blk.%d.cross_attn_v dec.blk.%d.cross_attn_o dec.blk.%d.ffn_gate dec.blk.%d.ffn_down
    dec.blk.%d.ffn_up enc.blk.%d.attn_q enc.blk.%d.attn_k enc.blk.%d.attn_v enc.blk.%d.attn_o
    enc.blk.%d.ffn_gate enc.blk.%d.ffn_down enc.blk.%d.ffn_up
    """.split()  # noqa: SIM905 (a table of names reads best as words)
) | frozenset(
    "blk.%d." + role
    for role in """
    attn_q attn_k attn_v attn_qkv attn_output attn_gate attn_q_a attn_q_b attn_kv_a_mqa attn_kv_b
    attn_kv attn_k_b attn_v_b attn_output_a attn_output_b attn_compressor_kv attn_compressor_gate
    attn_conv_proj ffn_gate ffn_down ffn_up ffn_gate_shexp ffn_down_shexp ffn_up_shexp
    ffn_gate_inp ffn_gate_inp_shexp ffn_routed_down ffn_routed_up ffn_latent_down ffn_latent_up
    ffn_conv_proj hc_attn_fn hc_attn_down hc_attn_up hc_attn_inject hc_ffn_fn hc_ffn_down
    hc_ffn_up hc_ffn_inject ple_key ple_value ssm_in ssm_x ssm_dt ssm_out ssm_alpha ssm_ba
    ssm_beta ssm_f_a ssm_f_b ssm_g ssm_g_a ssm_g_b time_mix_w1 time_mix_w2 time_mix_a1
    time_mix_a2 time_mix_v1 time_mix_v2 time_mix_g1 time_mix_g2 time_mix_decay_w1
    time_mix_decay_w2 time_mix_key time_mix_value time_mix_receptance time_mix_gate
    time_mix_output channel_mix_key channel_mix_receptance channel_mix_value inp_gate proj
    altup_correct_coef altup_predict_coef altup_router laurel_l laurel_r shortconv.in_proj
    shortconv.out_proj vis_attn_qkv vis_attn_output vis_gate vis_down vis_up indexer.proj
    indexer.attn_k indexer.attn_q_b indexer.q_proj indexer.k_proj indexer_compressor_kv
    indexer_compressor_gate nextn.eh_proj nextn.shared_head_head
    """.split()  # noqa: SIM905
)
#: Expert weights llama.cpp multiplies with ``GGML_OP_MUL_MAT_ID`` (same source).
MUL_MAT_ID = frozenset(
    "blk.%d." + role
    for role in """
    ffn_gate_exps ffn_down_exps ffn_up_exps ffn_gate_up_exps ffn_gate_chexps ffn_down_chexps
    ffn_up_chexps
    """.split()  # noqa: SIM905
)

REPACK = "CPU_REPACK"
_F32 = int(GGMLQuantizationType.F32)
_I32 = int(GGMLQuantizationType.I32)
_DEVICE_CPU = 0  # GGML_BACKEND_DEVICE_TYPE_CPU
_INDEX = re.compile(r"\.(\d+)\.")
_BUFFER_LINE = re.compile(rb"(\S+) model buffer size =\s*([0-9.]+) MiB")

PlacementKind = Literal["extra", "repack", "none"]


# --- ggml, through the libraries llama_cpp loaded ---------------------------------------------


class _InitParams(ctypes.Structure):
    """``struct ggml_init_params`` (ggml.h)."""

    _fields_ = [
        ("mem_size", ctypes.c_size_t),
        ("mem_buffer", ctypes.c_void_p),
        ("no_alloc", ctypes.c_bool),
    ]


class _TensorHead(ctypes.Structure):
    """The first fields of ggml.h's public ``struct ggml_tensor``."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p)]


class _Ggml:
    """The few ggml functions :func:`repack_names` needs (libggml-base and libggml sit beside
    libllama; loading them again returns the same libraries)."""

    def __init__(self) -> None:
        lib_dir = llama_cpp.llama_cpp._base_path
        base = load_shared_library("ggml-base", lib_dir)
        reg = load_shared_library("ggml", lib_dir)
        p, i64p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)

        def bind(lib: Any, name: str, restype: Any, *argtypes: Any) -> Any:
            f = getattr(lib, name)
            f.restype, f.argtypes = restype, list(argtypes)
            return f

        self.dev_by_type = bind(reg, "ggml_backend_dev_by_type", p, ctypes.c_int)
        self.dev_backend_reg = bind(base, "ggml_backend_dev_backend_reg", p, p)
        self.reg_get_proc_address = bind(
            base, "ggml_backend_reg_get_proc_address", p, p, ctypes.c_char_p
        )
        self.buft_name = bind(base, "ggml_backend_buft_name", ctypes.c_char_p, p)
        self.buft_alloc_buffer = bind(base, "ggml_backend_buft_alloc_buffer", p, p, ctypes.c_size_t)
        self.buffer_free = bind(base, "ggml_backend_buffer_free", None, p)
        self.dev_supports_op = bind(base, "ggml_backend_dev_supports_op", ctypes.c_bool, p, p)
        self.tensor_overhead = bind(base, "ggml_tensor_overhead", ctypes.c_size_t)
        self.init = bind(base, "ggml_init", p, _InitParams)
        self.free = bind(base, "ggml_free", None, p)
        self.new_tensor = bind(base, "ggml_new_tensor", p, p, ctypes.c_int, ctypes.c_int, i64p)
        self.mul_mat = bind(base, "ggml_mul_mat", p, p, p, p)
        self.mul_mat_id = bind(base, "ggml_mul_mat_id", p, p, p, p, p)

    def tensor(self, ctx: int, ggml_type: int, shape: Sequence[int]) -> int:
        ne = (ctypes.c_int64 * 4)(*shape)
        return int(self.new_tensor(ctx, ggml_type, len(shape), ne))


@functools.cache
def _ggml() -> _Ggml:
    init_backend()
    return _Ggml()


@functools.cache
def extra_buffer_types() -> dict[str, int]:
    """ggml-cpu's extra buffer types in llama.cpp's order of preference, name -> handle
    (``ggml_backend_dev_get_extra_bufts``; ``AMX`` only on a build with AMX kernels, on a CPU
    and kernel that allow AMX tiles)."""
    g = _ggml()
    cpu = g.dev_by_type(_DEVICE_CPU)
    fn = g.reg_get_proc_address(g.dev_backend_reg(cpu), b"ggml_backend_dev_get_extra_bufts")
    if not fn:
        return {}
    get = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(fn)
    array = get(cpu)
    out: dict[str, int] = {}
    i = 0
    while array and array[i]:
        out[g.buft_name(array[i]).decode()] = int(array[i])
        i += 1
    return out


def build_has_amx_kernels() -> bool:
    """Whether llama.cpp would put weights in its AMX buffer here: this build has the AMX
    kernels and the CPU (and kernel) allow AMX tiles.

    With the llama.cpp bundled in llama-cpp-python 0.3.36, any batched ``llama_decode`` over
    weights in that buffer crashes with SIGSEGV (llama.cpp issue #20824; plain
    ``llama_cpp.Llama`` too), so :func:`plan_placement` keeps weights out of it.
    """
    return "AMX" in extra_buffer_types()


def _template(name: str) -> str:
    """``blk.7.attn_q.weight`` -> ``blk.%d.attn_q``: the name llama.cpp's tables use."""
    return _INDEX.sub(".%d.", name.removesuffix(".weight"), count=1)


def _repack_takes(g: _Ggml, buft: int, cpu: int, t: TensorInfo, expert: bool) -> bool:
    """``weight_buft_supported`` for CPU_REPACK: does the CPU run the weight's product from
    that buffer (a 512-token batch of f32 activations, as llama.cpp asks)."""
    ctx = g.init(_InitParams(g.tensor_overhead() * 8, None, True))
    try:
        shape = tuple(t.shape) + (1,) * (4 - len(t.shape))
        w = g.tensor(ctx, t.ggml_type, t.shape)
        if expert:
            b = g.tensor(ctx, _F32, (shape[0], 1, 512))
            op = g.mul_mat_id(ctx, w, b, g.tensor(ctx, _I32, (1, 512)))
        else:
            op = g.mul_mat(ctx, w, g.tensor(ctx, _F32, (shape[0], 512, shape[2], shape[3])))
        head = _TensorHead.from_address(w)
        head.buffer = g.buft_alloc_buffer(buft, 0)  # an empty buffer says which type holds w
        try:
            return bool(g.dev_supports_op(cpu, op))
        finally:
            g.buffer_free(head.buffer)
            head.buffer = None
    finally:
        g.free(ctx)


def repack_names(path: Path) -> tuple[str, ...]:
    """The weights of the GGUF at ``path`` that CPU_REPACK takes on this CPU, as llama.cpp
    with extra buffers on and no AMX would place them ((): no CPU_REPACK in this build, or a
    header the gguf package cannot read).

    A weight the file ties to the token embeddings (no ``output.weight``) stays out: its name
    is the input embedding's, which llama.cpp reads row by row.
    """
    buft = extra_buffer_types().get(REPACK)
    if buft is None:
        return ()
    try:
        tensors = read_header(path).tensors
    except ModelFileError:
        return ()
    g = _ggml()
    cpu = g.dev_by_type(_DEVICE_CPU)
    seen: dict[tuple[int, tuple[int, ...], bool], bool] = {}
    out = []
    for t in tensors:
        if not t.name.endswith(".weight"):
            continue
        template = _template(t.name)
        expert = template in MUL_MAT_ID
        if not expert and template not in MUL_MAT:
            continue
        key = (t.ggml_type, t.shape, expert)
        if key not in seen:
            seen[key] = _repack_takes(g, buft, cpu, t, expert)
        if seen[key]:
            out.append(t.name)
    return tuple(out)


def override_patterns(names: Iterable[str]) -> list[str]:
    """Anchored regular expressions (ECMAScript, as ``std::regex``) matching exactly ``names``,
    one per name with its layer number replaced by the layers that share it."""
    layers: dict[tuple[str, str], list[str]] = defaultdict(list)
    whole: list[str] = []
    for name in names:
        m = _INDEX.search(name)
        if m is None:
            whole.append(f"^{re.escape(name)}$")
        else:
            layers[(name[: m.start()], name[m.end() :])].append(m.group(1))
    grouped = [
        f"^{re.escape(head)}\\.(?:{'|'.join(sorted(idx, key=int))})\\.{re.escape(tail)}$"
        for (head, tail), idx in layers.items()
    ]
    return whole + grouped


# --- mixture-of-experts placement: llama.cpp's --n-cpu-moe ----------------------------------------

#: llama.cpp's ``LLM_FFN_EXPS_REGEX`` (common/common.h): the routed experts' weights (a
#: shared expert's ``ffn_*_shexp`` does not match, so it goes where its layer goes).
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


def moe_patterns(n_cpu_moe: int, cpu_moe: bool = False, n_layer: int | None = None) -> list[str]:
    """The tensor-override patterns llama.cpp's common/arg.cpp builds, each for the CPU buffer
    type (matched with ``std::regex_search``): ``--cpu-moe``, one pattern for every layer's
    experts (:data:`FFN_EXPS_REGEX`); ``--n-cpu-moe N``, ``blk\\.<i>`` + that pattern for
    ``i < N`` (``llm_add_n_cpu_ffn_overrides``). With ``n_layer`` known, an ``N`` that covers
    every layer becomes the one ``--cpu-moe`` pattern (the same tensors match)."""
    if cpu_moe or (n_layer is not None and n_cpu_moe >= n_layer > 0):
        return [FFN_EXPS_REGEX]
    return [f"blk\\.{i}{FFN_EXPS_REGEX}" for i in range(n_cpu_moe)]


def experts_on_cpu(names: Iterable[str], patterns: Sequence[str]) -> list[str]:
    """The tensors of ``names`` that ``patterns`` (from :func:`moe_patterns`) keep in CPU
    memory, searched as llama.cpp searches them (these patterns mean the same in Python's
    ``re`` as in ECMAScript)."""
    compiled = [re.compile(p) for p in patterns]
    return [n for n in names if any(c.search(n) for c in compiled)]


def _cpu_buffer_type() -> int:
    """``ggml_backend_cpu_buffer_type()``: the plain CPU buffer, the type llama.cpp's
    ``--n-cpu-moe`` overrides name (the loader then considers the CPU's extra types too)."""
    lib = llama_cpp.llama_cpp._lib
    lib.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
    return int(lib.ggml_backend_cpu_buffer_type())


def _n_layer(path: Path) -> int | None:
    try:
        header = read_header(path)
    except ModelFileError:
        return None
    return next((int(v) for k, v in header.metadata.items() if k.endswith(".block_count")), None)


# --- the placement of one load ------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """How a load places weights.

    ``kind``: ``extra`` (llama.cpp's extra buffer types on: it picks CPU_REPACK, AMX, ...),
    ``repack`` (extra types off; ``names`` go to CPU_REPACK by overrides) or ``none`` (extra
    types off: every CPU weight in the plain buffer, no repacked kernels).
    """

    kind: PlacementKind
    names: tuple[str, ...] = ()
    #: Override patterns keeping routed experts in CPU memory (:func:`moe_patterns`).
    cpu_experts: tuple[str, ...] = ()
    #: Map the file (llama.cpp's default), else read the weights into memory: the GPU's pinned
    #: host buffer on a build that offloads (``LoadConfig.use_mmap``).
    use_mmap: bool = True
    #: Skip the GPU's host buffer for CPU weights (``LoadConfig.no_host``).
    no_host: bool = False

    def apply(self, params: llama_cpp.llama_model_params) -> object:
        """Set ``params``' ``use_extra_bufts``, ``load_mode``, ``no_host`` and overrides;
        returns what the overrides point into, which must outlive the load (the model keeps
        it)."""
        params.use_extra_bufts = self.kind == "extra"
        params.load_mode = LOAD_MODE_AUTO if self.use_mmap else LOAD_MODE_NONE
        params.no_host = self.no_host
        if not self.names and not self.cpu_experts:
            return None
        rows: list[tuple[bytes, int]] = []
        if self.names:
            buft = extra_buffer_types()[REPACK]
            rows += [(p.encode(), buft) for p in override_patterns(self.names)]
        if self.cpu_experts:  # after CPU_REPACK's: a weight it names is on the CPU already
            cpu = _cpu_buffer_type()
            rows += [(p.encode(), cpu) for p in self.cpu_experts]
        patterns = [p for p, _ in rows]
        array = (Override * (len(rows) + 1))(*(Override(p, b) for p, b in rows))
        # llama_cpp declares the field c_void_p (its stub says an array): an address goes in.
        params.tensor_buft_overrides = ctypes.addressof(array)  # type: ignore[assignment]
        return array, patterns

    def describe(self) -> str:
        text = {
            "extra": "extra buffer types on",
            "repack": f"extra buffer types off, {len(self.names)} weights in {REPACK} by override",
            "none": "extra buffer types off",
        }[self.kind]
        if not self.use_mmap:
            text += "; weights read, not mapped (pinned beside a GPU)"
        if self.no_host:
            text += "; no GPU host buffer"
        if self.cpu_experts == (FFN_EXPS_REGEX,):
            text += "; experts of every layer in CPU memory"
        elif self.cpu_experts:
            text += f"; experts of layers 0-{len(self.cpu_experts) - 1} in CPU memory"
        return text


def plan_placement(path: Path, cfg: LoadConfig) -> Placement:
    """:func:`plan_buffers`, with the routed experts ``cfg.n_cpu_moe`` / ``cfg.cpu_moe`` keep
    in CPU memory (:func:`moe_patterns`) overriding wherever layer offloading puts them."""
    placement = replace(plan_buffers(path, cfg), use_mmap=cfg.use_mmap, no_host=cfg.no_host)
    if not cfg.n_cpu_moe and not cfg.cpu_moe:
        return placement
    patterns = moe_patterns(cfg.n_cpu_moe, cfg.cpu_moe, _n_layer(path))
    return replace(placement, cpu_experts=tuple(patterns))


def plan_buffers(path: Path, cfg: LoadConfig) -> Placement:
    """How to load ``path`` under ``cfg``: as asked (``cfg.extra_buffers``), else llama.cpp's
    own choice unless it would use the AMX buffer, then the AMX-safe ``repack`` placement.

    On a build that offloads to a GPU no override is set (an override beats layer offloading,
    and llama.cpp prefers the GPU's host buffer to any extra type for weights left on the CPU):
    there the AMX case keeps extra types off (``none``), as before.
    """
    if cfg.extra_buffers is not None:
        return Placement("extra" if cfg.extra_buffers else "none")
    if cfg.no_host and supports_gpu_offload() and build_has_amx_kernels():
        raise UserError(
            "--no-host on a build with llama.cpp's AMX kernels is not supported: the repacked "
            "CPU weights would go to the AMX buffer, whose batched decodes crash (llama.cpp "
            "#20824); drop --no-host"
        )
    if cfg.rpc:  # overrides would pull the remote layers back here; the head stays unrepacked
        return Placement("none" if build_has_amx_kernels() else "extra")
    if cfg.force_repack_overrides:
        return Placement("repack", repack_names(path))
    if not build_has_amx_kernels():
        return Placement("extra")
    if supports_gpu_offload():
        return Placement("none")
    return Placement("repack", repack_names(path))


def parse_buffer_sizes(log: Iterable[bytes]) -> dict[str, float]:
    """MiB per buffer type from llama.cpp's ``<type> model buffer size = <MiB> MiB`` lines."""
    out: dict[str, float] = {}
    for text in log:
        for name, mib in _BUFFER_LINE.findall(text):
            key = name.decode("utf-8", "replace")
            out[key] = round(out.get(key, 0.0) + float(mib), 2)
    return out


def describe_buffers(sizes: dict[str, float]) -> str:
    """``CPU_REPACK 748.0 MiB, CPU_Mapped 313.5 MiB``: largest first."""
    ordered = sorted(sizes.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{name} {mib:.1f} MiB" for name, mib in ordered) or "unknown"


#: ``llama_model_params.load_mode``: llama.cpp's own choice (a mapping where every device
#: supports one) and plain reads (``--no-mmap``; llama-bench's ``-lm none``).
LOAD_MODE_AUTO = int(llama_cpp.LLAMA_LOAD_MODE_AUTO)
LOAD_MODE_NONE = int(llama_cpp.LLAMA_LOAD_MODE_NONE)

_PEER_LOCK = threading.Lock()


def peer_llama(path: Path, cfg: LoadConfig, **kwargs: Any) -> llama_cpp.Llama:
    """llama-cpp-python's own ``Llama`` on ``path`` (a benchmark's peer), its weights placed as
    :func:`plan_placement` places ours: on a build with the AMX kernels, whose batched decodes
    crash (llama.cpp #20824), the AMX-safe ``repack`` placement instead of llama.cpp's default,
    so a comparison runs the same kernels on both sides and does not die with SIGILL. Its
    graphs run on the process's compute thread, as ours do (:mod:`.compute`: a second thread
    that decodes would make every graph of both sleep at its barriers).
    ``kwargs`` go to ``Llama`` (``n_ctx``, ``n_threads``, ``flash_attn``...)."""
    from .rpc import remote_devices

    placement = plan_placement(path, cfg)
    kwargs.setdefault("use_mmap", cfg.use_mmap)  # Llama() sets load_mode from it
    keep: list[object] = []  # what the overrides point into: the Llama holds it below
    module = llama_cpp.llama_cpp  # where Llama() looks its default params up
    default_params = module.llama_model_default_params

    def params() -> llama_cpp.llama_model_params:
        p = default_params()
        keep.append(placement.apply(p))
        keep.append(remote_devices(cfg, p))  # this machine's devices, RPC servers' if asked
        return p

    with _PEER_LOCK:  # Llama() reads llama_model_default_params once, in its constructor
        module.llama_model_default_params = params
        try:
            llm = llama_cpp.Llama(str(path), **kwargs)
        finally:
            module.llama_model_default_params = default_params
    setattr(llm, "_pyramid_placement", (placement, keep))  # noqa: B010 (alive as long as it)
    ctx = llm._ctx  # every graph of a Llama runs in its context's decode or encode
    for name in ("decode", "encode"):
        setattr(ctx, name, functools.partial(compute.run, getattr(ctx, name)))
    return llm
