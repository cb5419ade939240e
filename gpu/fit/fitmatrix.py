"""The compile matrix of the multi-query TurboQuant verify kernel: ahead of time, on CPU, for foreign GPU targets.

Runs in any interpreter that has ``triton`` (no torch, no vLLM, no GPU): the kernel file
(``vllm/v1/attention/ops/triton_turboquant_verify.py`` of a patched tree) is loaded with tiny stand-ins for
``torch`` and the two vLLM modules it imports, and its own route planner is walked for each target
(``tq_mq_verify_select``) with a ``fits`` that compiles the candidate for that target
(``triton.compile(ASTSource(...), target=GPUTarget(...))``) and accepts it when the compile succeeds and
``metadata.shared`` is within the target's limit: the decision ``tq_mq_verify_probe`` makes on a device.
The compiled specialisation is the probe's own launch (one request of K+1 tokens, one KV head); for a kernel with
run-time variants (the current line's), every variant the probe launches: one KV split, two, and their merge.

Every compile is cached on disk, keyed by the kernel file's text, the Triton version, the target and the
compile's signature, constexprs and options. Results go to a JSON file; ``--table`` writes the Markdown table.

    python fitmatrix.py --kernel PATH --set ci|reduced|full --out results.json [--table docs/gpu-fit-...md]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import re
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path

KERNEL_REL = "vllm/v1/attention/ops/triton_turboquant_verify.py"
# Spill stores (CUDA, bytes) or scratch (HIP, bytes) above this are flagged in the table (never a failure).
SPILL_THRESHOLD = 4096


# ---------------------------------------------------------------------------------------------------------
# The matrix
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    name: str
    backend: str  # "cuda" or "hip"
    arch: int | str  # compute capability (cuda) or gfx name (hip)
    warp_size: int
    max_shared: int  # opt-in shared memory per block, bytes
    gpus: str  # the GPU class, for the summary

    @property
    def hip(self) -> bool:
        return self.backend == "hip"

    @property
    def capability(self) -> int:
        return 0 if self.hip else int(self.arch)


# CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN (CUDA), the LDS a workgroup may take (ROCm).
# gfx1100 (RDNA3) runs wave32, which is what Triton's HIP driver reports for it.
TARGETS = (
    Target("sm_75", "cuda", 75, 32, 65536, "T4, RTX 20xx"),
    Target("sm_80", "cuda", 80, 32, 166912, "A100, A30"),
    Target("sm_86", "cuda", 86, 32, 101376, "RTX 30xx, A10, A40, A5000/A6000"),
    Target("sm_89", "cuda", 89, 32, 101376, "RTX 40xx, L4, L40S"),
    Target("sm_90", "cuda", 90, 32, 232448, "H100, H200"),
    Target("sm_120", "cuda", 120, 32, 101376, "RTX 50xx, RTX PRO 6000"),
    Target("gfx90a", "hip", "gfx90a", 64, 65536, "MI200"),
    Target("gfx942", "hip", "gfx942", 64, 65536, "MI300"),
    Target("gfx1100", "hip", "gfx1100", 32, 65536, "RX 7900, W7900"),
)
TARGET = {t.name: t for t in TARGETS}
# torch.cuda.get_device_capability() on ROCm: what _use_fp8_e4b15 reads there (>= (8, 9): e4m3 keys).
HIP_CAPABILITY = {"gfx90a": (9, 0), "gfx942": (9, 4), "gfx1100": (11, 0)}


@dataclass(frozen=True)
class Preset:
    """A TurboQuant preset's slot layout, as tests/support/references.TQLayout gives it; kept here because
    this file runs in a Triton-only interpreter (the 3.8 venv has no torch, which references imports)."""

    name: str
    key_bits: int  # 8 = FP8 keys
    value_bits: int
    norm_correction: bool

    @property
    def key_fp8(self) -> bool:
        return self.key_bits == 8

    @property
    def mse_bits(self) -> int:
        return 0 if self.key_fp8 else self.key_bits

    def key_packed_size(self, head_dim: int) -> int:
        return head_dim if self.key_fp8 else math.ceil(head_dim * self.mse_bits / 8) + 2


PRESETS = (
    Preset("k8v4", 8, 4, False),
    Preset("4bit_nc", 4, 4, True),
    Preset("k3v4_nc", 3, 4, True),
    Preset("3bit_nc", 3, 3, True),
)
PRESET = {p.name: p for p in PRESETS}


@dataclass(frozen=True)
class Geometry:
    name: str
    q_heads: int
    kv_heads: int
    head_dim: int

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads


GEOMETRIES = (
    Geometry("Qwen3.6-27B TP1", 24, 4, 256),
    Geometry("Qwen3.6-27B TP2", 12, 2, 256),
    Geometry("Qwen3-Next", 16, 2, 256),
    Geometry("Llama-3.1-8B", 32, 8, 128),
    Geometry("Qwen3-30B-A3B", 32, 4, 128),
)
GEOMETRY = {g.name: g for g in GEOMETRIES}
DTYPES = ("bf16", "fp16")
BLOCK_SIZES = (16, 32)
K1S = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class Config:
    target: str
    preset: str
    dtype: str
    block_size: int
    k1: int
    geometry: str

    @property
    def plan_key(self) -> tuple:
        """Configs with the same plan key compile the same kernels (the geometry enters as G and D only)."""
        g = GEOMETRY[self.geometry]
        return (self.target, self.preset, self.dtype, self.block_size, self.k1, g.group, g.head_dim)


def full_matrix() -> list[Config]:
    """Every config, the most telling first (bf16 and block size 16, K+1 = 4 and 1, on every target and preset
    before the rest), so a run cut short still covers every target and preset."""
    out = []
    for dtype, bs in ((d, b) for b in BLOCK_SIZES for d in DTYPES):
        for k1 in (4, 1, 8, 2, 16):  # MTP K=3, plain decode, then the rest
            for geo in GEOMETRIES:
                for preset in PRESETS:
                    for t in TARGETS:
                        out.append(Config(t.name, preset.name, dtype, bs, k1, geo.name))
    return out


# The reduced set (``--set reduced``): what two shared CPU cores compile for one Triton in minutes, the run-time
# variants included. One geometry (Qwen3.6-27B TP1: 24/4 heads of 256, G = 6, the widest MSE tiles), bf16, block
# size 16, K+1 = 4 (MTP K = 3: 24 rows, the 32-row tiles that shrink on the 99 KiB parts), every preset and target.
REDUCED = {"geometry": "Qwen3.6-27B TP1", "dtype": "bf16", "block_size": 16, "k1s": (4,)}


def reduced_matrix() -> list[Config]:
    """The full matrix cut to REDUCED's geometry, dtype, block size and K+1 (every preset and target)."""
    return [c for c in full_matrix() if c.geometry == REDUCED["geometry"] and c.dtype == REDUCED["dtype"]
            and c.block_size == REDUCED["block_size"] and c.k1 in REDUCED["k1s"]]


def matrix(name: str) -> list[Config]:
    return {"full": full_matrix, "reduced": reduced_matrix, "ci": ci_matrix}[name]()


def set_description(name: str) -> str:
    """What a table's header says of the set it holds."""
    if name == "reduced":
        return (f"**Reduced set** (`--set reduced`): {REDUCED['geometry']} only, {REDUCED['dtype']}, block size "
                f"{REDUCED['block_size']}, K+1 = {', '.join(map(str, REDUCED['k1s']))}, every preset and target "
                f"({len(reduced_matrix())} of the full set's {len(full_matrix())} configurations), compiled on two "
                "shared CPU cores. The full set: `make gpu-fit GPU_FIT_ARGS=\"--set full\"` (hours on one core; "
                "see docs/gpu-fit.md).")
    if name == "ci":
        return "The CI subset (`--set ci`)."
    return "The full set (`--set full`)."


def ci_matrix() -> list[Config]:
    """Per target: FP8 keys at the widest tiles (k8v4, Llama-8B, K+1=4: 16 x 1), and MSE keys where the widest
    tiles exceed the 99 KiB and 64 KiB parts (3bit_nc, Qwen3.6-27B, D=256, K+1=4: 32 rows x 256 must shrink
    there, and takes the widest on sm_80/sm_90); and on the ROCm targets, the FP8 preset at K+1=1 (bf16,
    block size 16 throughout). And 4-bit keys at 64 rows x head dim 128 (4bit_nc, Llama-8B, K+1=16) on sm_80,
    where the widest BLOCK_N spills kilobytes, and sm_90, where it does not."""
    out = []
    for t in TARGETS:
        out.append(Config(t.name, "k8v4", "bf16", 16, 4, "Llama-3.1-8B"))
        out.append(Config(t.name, "3bit_nc", "bf16", 16, 4, "Qwen3.6-27B TP1"))
    out += [Config(t, "4bit_nc", "bf16", 16, 16, "Llama-3.1-8B") for t in ("sm_80", "sm_90")]
    return out


# ---------------------------------------------------------------------------------------------------------
# Loading the kernel file without torch or vLLM
# ---------------------------------------------------------------------------------------------------------


def _stub_modules() -> dict[str, types.ModuleType]:
    import triton
    import triton.language as tl

    torch = types.ModuleType("torch")
    for name in ("Tensor", "device", "dtype"):
        setattr(torch, name, type(name, (), {}))
    torch.float32 = torch.float16 = torch.bfloat16 = None
    utils = types.ModuleType("vllm.triton_utils")
    utils.tl, utils.triton = tl, triton
    decode = types.ModuleType("vllm.v1.attention.ops.triton_turboquant_decode")

    def _use_fp8_e4b15(device=0):  # never called here: FP8_E4B15 is set per target
        raise RuntimeError("not on a device")

    decode._use_fp8_e4b15 = _use_fp8_e4b15
    mods = {"torch": torch, "vllm.triton_utils": utils, "vllm.v1.attention.ops.triton_turboquant_decode": decode}
    for pkg in ("vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.ops"):
        mods[pkg] = types.ModuleType(pkg)
    return mods


def load_kernel(path: Path) -> types.ModuleType:
    """The kernel file as a module, its imports of torch and vLLM served by stand-ins."""
    text = path.read_text()
    name = "_gpu_fit_verify_" + hashlib.sha256(text.encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    saved = {k: sys.modules.get(k) for k in _stub_modules()}
    sys.modules.update(_stub_modules())
    try:
        mod = types.ModuleType(name)
        mod.__file__ = str(path)
        sys.modules[name] = mod
        # Triton's JIT reads a kernel's source through inspect (linecache): register the file's text.
        import linecache

        linecache.cache[str(path)] = (len(text), None, text.splitlines(True), str(path))
        exec(compile(text, str(path), "exec"), mod.__dict__)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    mod.FILE_SHA256 = hashlib.sha256(text.encode()).hexdigest()
    mod.SOURCE_SHA256 = kernels_sha256(mod)
    return mod


def kernels_sha256(mod) -> str:
    """The hash of the file's Triton kernels: the source of every @triton.jit function in it (what a compile
    reads; the planner and the launch code around them may change without invalidating the compile cache)."""
    from triton.runtime.jit import JITFunction

    srcs = [f"{name}\0{obj.src}" for name, obj in sorted(vars(mod).items()) if isinstance(obj, JITFunction)]
    return hashlib.sha256("\0".join(srcs).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------------------
# Compiling one kernel for one target (cached)
# ---------------------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    env = os.environ.get("VLLM_PATCH_GPU_FIT_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("VLLM_PATCH_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "vllm-patch") / "gpu-fit"


class _Ptr:
    """What Triton's specialiser sees of a tensor argument: an aligned pointer to a small buffer."""

    def __init__(self, ty: str):
        self.ty = ty

    def data_ptr(self) -> int:
        return 1 << 20

    def ptr_range(self) -> int:
        return 1 << 20


def _tensor_specialization(backend_cls, arg: _Ptr) -> str:
    """The backend's attribute string of a pointer argument. Triton 3.7's HIP backend imports torch there (its
    buffer-op range check) before it reads the argument's ``ptr_range``: with no torch in this interpreter it
    gets a stand-in for that call (``_Ptr`` has ``ptr_range``, so the stand-in's ``Tensor`` is never matched)."""
    try:
        return backend_cls.get_tensor_specialization(arg, align=True)
    except ModuleNotFoundError as e:
        if e.name != "torch" or "torch" in sys.modules:
            raise
    stub = types.ModuleType("torch")
    stub.Tensor = type("Tensor", (), {})
    sys.modules["torch"] = stub
    try:
        return backend_cls.get_tensor_specialization(arg, align=True)
    finally:
        sys.modules.pop("torch", None)


def _specialize(backend_cls, arg):
    """(type, attribute string) as Triton's JIT gives them at launch: pointers aligned (and within 2 GB),
    ints equal to 1 constexpr, ints divisible by 16 marked so."""
    if isinstance(arg, _Ptr):
        return "*" + arg.ty, _tensor_specialization(backend_cls, arg)
    if isinstance(arg, bool) or not isinstance(arg, (int, float)):
        raise TypeError(arg)
    if isinstance(arg, float):
        return "fp32", None
    if arg == 1:
        return "constexpr", 1
    ty = "i32" if -(2**31) <= arg < 2**31 else "i64"
    return ty, backend_cls.get_int_specialization(arg, align=True)


def _gpu_target(target: Target):
    from triton.backends.compiler import GPUTarget

    return GPUTarget(target.backend, target.arch, target.warp_size)


def _parse_ptxas(log: str) -> dict:
    out = {}
    m = re.search(r"Used (\d+) registers", log)
    if m:
        out["regs"] = int(m.group(1))
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if m:
        out["spill"] = int(m.group(1))
        out["spill_loads"] = int(m.group(2))
    m = re.search(r"(\d+) bytes stack frame", log)
    if m:
        out["stack"] = int(m.group(1))
    return out


def _parse_amdgcn(asm: str) -> dict:
    out = {}
    for key, field in (("regs", ".vgpr_count"), ("sgprs", ".sgpr_count"), ("vgpr_spills", ".vgpr_spill_count"),
                       ("spill", ".private_segment_fixed_size")):
        m = re.search(re.escape(field) + r":\s*(\d+)", asm)
        if m:
            out[key] = int(m.group(1))
    return out


def compile_kernel(mod, fn_name: str, target: Target, args: dict, num_warps: int, num_stages: int | None) -> dict:
    """Compile ``mod.fn_name`` for target with the named arguments (``_Ptr`` for tensors, Python ints and
    floats as at launch; constexprs as values). Returns {"shared", "regs", "spill", ...} or {"error"}."""
    signature, constexprs, attrs = _compile_inputs(getattr(mod, fn_name), target, args)
    # The options the file's launches add (a register allowance on CUDA), where the file has any.
    launch_options = getattr(mod, "tq_mq_launch_options", None)
    options = {"num_warps": num_warps, **(launch_options(target.hip) if launch_options else {})}
    if num_stages is not None:
        options["num_stages"] = num_stages
    return _compile(mod, fn_name, target, (signature, constexprs, attrs), options)


def compile_launch(mod, fn_name: str, target: Target, specialization: list, options: dict) -> dict:
    """Compile ``mod.fn_name`` for target as one launch was specialized: Triton's own binder's
    ``[(type, attribute or constexpr value), ...]`` per parameter, and the launch's options (num_warps,
    num_stages, maxnreg). What tests recorded at a launch compiles here exactly as the JIT would."""
    fn = getattr(mod, fn_name)
    backend_cls = _backend_class(target)
    signature, constexprs, attrs = {}, {}, {}
    for i, (name, (ty, spec)) in enumerate(zip(fn.arg_names, specialization, strict=True)):
        signature[name] = ty
        if ty == "constexpr":
            constexprs[(i,)] = spec
        elif spec:
            attrs[(i,)] = backend_cls.parse_attr(spec)
    return _compile(mod, fn_name, target, (signature, constexprs, attrs), dict(options))


def _compile(mod, fn_name: str, target: Target, inputs: tuple, options: dict) -> dict:
    import triton
    from triton import knobs
    from triton.compiler import ASTSource

    fn = getattr(mod, fn_name)
    signature, constexprs, attrs = inputs
    num_warps, num_stages = options.get("num_warps"), options.get("num_stages")
    path = _cache_path(mod.SOURCE_SHA256, target, fn_name, signature, constexprs, attrs, options)
    if path.is_file():
        return json.loads(path.read_text())
    src = ASTSource(fn, signature, constexprs, attrs)
    log = io.StringIO()
    start = time.monotonic()
    knobs.nvidia.dump_ptxas_log = True
    try:
        with contextlib.redirect_stdout(log), knobs.compilation.scope():
            knobs.compilation.always_compile = True
            kernel = triton.compile(src, target=_gpu_target(target), options=options)
        result = {"shared": int(kernel.metadata.shared)}
        if target.hip:
            result.update(_parse_amdgcn(kernel.asm.get("amdgcn", "")))
            result["stage"] = "hsaco" if "hsaco" in kernel.asm else "amdgcn"
        else:
            result.update(_parse_ptxas(log.getvalue()))
            result["stage"] = "cubin"
    except Exception as e:  # a compile error, recorded (the planner refuses the tiling)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        result = {"error": f"{type(e).__name__}: {first}"[:400]}
    result["seconds"] = round(time.monotonic() - start, 2)
    result["num_warps"] = num_warps
    result["num_stages"] = num_stages
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(result, sort_keys=True))
    tmp.replace(path)
    return result


def _compile_inputs(fn, target: Target, args: dict) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) for ASTSource, as Triton's JIT builds them at a launch with args."""
    backend_cls = _backend_class(target)
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        value = args[name]
        if fn.params[i].is_constexpr:
            signature[name] = "constexpr"
            constexprs[(i,)] = value
            continue
        if fn.params[i].do_not_specialize and isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            continue
        ty, spec = _specialize(backend_cls, value)
        signature[name] = ty
        if ty == "constexpr":
            constexprs[(i,)] = spec
        elif spec is not None:
            attrs[(i,)] = backend_cls.parse_attr(spec)
    return signature, constexprs, attrs


def _cache_path(sha: str, target: Target, fn_name: str, signature, constexprs, attrs, options) -> Path:
    import triton

    key = json.dumps([sha, triton.__version__, dataclasses.astuple(target), fn_name, signature,
                      sorted((k[0], repr(v)) for k, v in constexprs.items()),
                      sorted((k[0], v) for k, v in attrs.items()), options], sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()
    return cache_dir() / triton.__version__ / target.name / f"{fn_name}-{digest[:24]}.json"


def _backend_class(target: Target):
    if target.hip:
        from triton.backends.amd.compiler import HIPBackend

        return HIPBackend
    from triton.backends.nvidia.compiler import CUDABackend

    return CUDABackend


# ---------------------------------------------------------------------------------------------------------
# The three kernels' arguments, as the launch code passes them
# ---------------------------------------------------------------------------------------------------------


def _fp8_e4b15(target: Target) -> int:
    """_use_fp8_e4b15: 1 below capability (8, 9), as torch reports it (on ROCm too)."""
    cap = HIP_CAPABILITY[target.arch] if target.hip else divmod(int(target.arch), 10)
    return 1 if cap < (8, 9) else 0


def probe_args(mod, tiles, cfg: Config, split: bool = False, norm_correction: bool = False,
               heads_outer: bool = False) -> dict:
    """The arguments tq_mq_verify_probe's first launch gives _tq_mq_verify_fwd: one request of K+1 tokens in a
    cache of one block and one KV head, one split, no lse (see _launch_fwd). For a kernel whose split count is
    an argument (``num_splits``) it is 1 with ``SPLIT`` off; for one whose split count is a constexpr,
    ``NUM_SPLITS`` 1. split: the probe's second launch (two splits, the partials to a float32 buffer, ``SPLIT``
    on); norm_correction: ``NORM_CORRECTION`` (the preset's, in the route's launches). heads_outer: the current
    probe's cache, (blocks, KV heads, block size, slot) seen through its transpose(1, 2), whose KV-head stride is
    block size x slot; else line v0.20's probe's (blocks, block size, KV heads, slot), whose is the slot."""
    target, preset, geo = TARGET[cfg.target], PRESET[cfg.preset], GEOMETRY[cfg.geometry]
    d, g, k1 = geo.head_dim, geo.group, cfg.k1
    kps = preset.key_packed_size(d)
    slot = kps + math.ceil(d * preset.value_bits / 8) + 4
    slot = -(-slot // 2) * 2
    q_ty = cfg.dtype if preset.key_fp8 else "fp32"
    out = _Ptr(cfg.dtype)
    # With two splits the partials go to a float32 (K+1, heads, splits, D + 1) buffer; its strides and the split
    # count are do_not_specialize arguments of the current kernel (plain i32 there, whatever their value).
    mid = _Ptr("fp32") if split else out
    splits = 2 if split else 1
    mid_strides = (g * splits * (d + 1), splits * (d + 1), d + 1) if split else (0, 0, 0)
    return dict(
        Q_ptr=_Ptr(q_ty), KV_ptr=_Ptr("u8"), Block_table_ptr=_Ptr("i32"), Seq_lens_ptr=_Ptr("i32"),
        Centroids_ptr=_Ptr("fp32"), Mid_ptr=mid, Out_ptr=out, Lse_ptr=out,
        qk_scale=1.0 * mod._LOG2E,
        stride_qt=g * d, stride_qh=d,
        stride_kv_block=cfg.block_size * slot, stride_kv_pos=slot,
        stride_kv_head=cfg.block_size * slot if heads_outer else slot,
        stride_bt=1, stride_mid_t=mid_strides[0], stride_mid_h=mid_strides[1], stride_mid_s=mid_strides[2],
        stride_ot=g * d, stride_oh=d, stride_lse_t=0, num_splits=splits,
        K1=k1, GROUP=g, M_TILES=tiles.m_tiles, BLOCK_M=tiles.block_m, HEAD_DIM=d, BLOCK_N=tiles.block_n,
        PAGE_SIZE=cfg.block_size, NUM_SPLITS=splits, SPLIT=split, MIN_SPLIT=4 * tiles.block_n,
        MSE_BITS=preset.mse_bits, MSE_BYTES=math.ceil(d * preset.mse_bits / 8), KPS=kps,
        VQB=preset.value_bits, VAL_DATA_BYTES=math.ceil(d * preset.value_bits / 8),
        KEY_FP8=1 if preset.key_fp8 else 0, NORM_CORRECTION=1 if norm_correction else 0, FP8_E4B15=_fp8_e4b15(target),
        HAS_LSE=False, SLOT_ALIGN=math.gcd(cfg.block_size * slot, slot, 16),
        # The score precision: a constexpr string in the current kernel, an ieee flag in earlier ones.
        SCORE_PRECISION=tiles.precision, SCORE_IEEE=1 if tiles.precision == "ieee" else 0,
    )


def merge_args(tiles, cfg: Config, splits: int = 2) -> dict:
    """_tq_mq_verify_reduce as tq_mq_verify_probe launches it after the split launch: the probe's K+1 and buffers
    (one KV head's G query heads), the tiling's BLOCK_N and MIN_SPLIT, two splits, no lse."""
    geo = GEOMETRY[cfg.geometry]
    d, g = geo.head_dim, geo.group
    out = _Ptr(cfg.dtype)
    return dict(Seq_lens_ptr=_Ptr("i32"), Mid_ptr=_Ptr("fp32"), Out_ptr=out, Lse_ptr=out,
                stride_mid_t=g * splits * (d + 1), stride_mid_h=splits * (d + 1), stride_mid_s=d + 1,
                stride_ot=g * d, stride_oh=d, stride_lse_t=0, num_splits=splits,
                K1=cfg.k1, HEAD_DIM=d, BLOCK_N=tiles.block_n, NUM_SPLITS=splits, MIN_SPLIT=4 * tiles.block_n,
                HAS_LSE=False)


# The run-time variants of one tiling that the route's probe launches (tq_mq_verify_probe) and each layer compiles
# at its first call (tq_mq_verify_warm), in the probe's order: the verify kernel with one KV split (straight to
# the output), with several (to the partials), and the merge of the partials. Each with the preset's norm
# correction. Kernels without a SPLIT constexpr (line v0.20's) have one variant: the probe's first launch.
VARIANTS = ("unsplit", "split", "merge")


def has_variants(mod) -> bool:
    """Whether mod's verify kernel has the split variants (a SPLIT constexpr and a merge kernel)."""
    return "SPLIT" in mod._tq_mq_verify_fwd.arg_names and hasattr(mod, "_tq_mq_verify_reduce")


def compile_variants(mod, tiles, cfg: Config, limit: int | None = None) -> dict[str, dict]:
    """{variant: compile result} of tiles for cfg's target, in VARIANTS' order; stops after the first variant that
    fails to compile or needs more than limit bytes (the probe refuses the tiling then, whatever the rest give)."""
    target, preset = TARGET[cfg.target], PRESET[cfg.preset]
    out: dict[str, dict] = {}
    for variant in VARIANTS:
        if variant == "merge":
            res = compile_kernel(mod, "_tq_mq_verify_reduce", target, merge_args(tiles, cfg), 4, 1)
        else:
            args = probe_args(mod, tiles, cfg, split=variant == "split", norm_correction=preset.norm_correction,
                              heads_outer=True)
            res = compile_kernel(mod, "_tq_mq_verify_fwd", target, args, tiles.num_warps, tiles.num_stages)
        out[variant] = res
        if "error" in res or (limit is not None and res["shared"] > limit):
            break
    return out


_WORST_KEYS = ("shared", "regs", "spill", "stack", "sgprs", "vgpr_spills", "stage", "error")


def worst_variant(variants: dict[str, dict]) -> dict:
    """One record of a tiling's variants: the first error (and its variant); else the largest shared memory
    (``shared_variant`` names it) with that variant's fields, then the largest spill (``spill_variant``) and the
    most registers over all variants. Ties go to the earlier variant in VARIANTS' order."""
    failed = [(v, r) for v, r in variants.items() if "error" in r]
    if failed:
        v, r = failed[0]
        return {"error": r["error"], "error_variant": v}
    names = list(variants)
    vs = max(names, key=lambda v: (variants[v]["shared"], -names.index(v)))
    out = {k: variants[vs][k] for k in _WORST_KEYS if k in variants[vs]}
    out["shared_variant"] = vs
    vp = max(names, key=lambda v: (variants[v].get("spill") or 0, -names.index(v)))
    if variants[vp].get("spill"):
        out["spill"] = variants[vp]["spill"]
        out["spill_variant"] = vp
    else:
        out.pop("spill", None)
    regs = [variants[v]["regs"] for v in names if "regs" in variants[v]]
    if regs:
        out["regs"] = max(regs)
    return out


def rotate_tiles(mod, target: Target, head_dim: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_J) of _tq_mq_rotate_queries on target: the file's tq_mq_rotate_tiles where it has one
    (the tiles from the device's limit), else the fixed 32 x min(64, D)."""
    if hasattr(mod, "tq_mq_rotate_tiles"):
        return tuple(mod.tq_mq_rotate_tiles(head_dim, limits_for(mod, target)))
    return 32, min(64, head_dim)


def rotate_args(geo: Geometry, dtype: str, tokens: int = 64, tiles: tuple[int, int] | None = None) -> dict:
    """_tq_mq_rotate_queries as triton_turboquant_mq_verify_attention launches it (MSE keys)."""
    d, hq = geo.head_dim, geo.q_heads
    block_r, block_j = tiles or (32, min(64, d))
    return dict(Q_ptr=_Ptr(dtype), PiT_ptr=_Ptr("fp32"), Out_ptr=_Ptr("fp32"), num_rows=tokens * hq,
                stride_qt=hq * d, stride_qh=d, stride_ot=hq * d, stride_oh=d,
                NUM_Q_HEADS=hq, HEAD_DIM=d, BLOCK_R=block_r, BLOCK_J=block_j)


def reduce_args(geo: Geometry, dtype: str, k1: int = 4, splits: int = 32) -> dict:
    """_tq_mq_verify_reduce after a split launch (no lse), 32 splits as at batch 1."""
    d, hq = geo.head_dim, geo.q_heads
    block_n = 128 if d <= 128 else 64
    return dict(Seq_lens_ptr=_Ptr("i32"), Mid_ptr=_Ptr("fp32"), Out_ptr=_Ptr(dtype), Lse_ptr=_Ptr(dtype),
                stride_mid_t=hq * splits * (d + 1), stride_mid_h=splits * (d + 1), stride_mid_s=d + 1,
                stride_ot=hq * d, stride_oh=d, stride_lse_t=0, num_splits=splits,
                K1=k1, HEAD_DIM=d, BLOCK_N=block_n, NUM_SPLITS=splits, MIN_SPLIT=4 * block_n, HAS_LSE=False)


# ---------------------------------------------------------------------------------------------------------
# Walking the planner
# ---------------------------------------------------------------------------------------------------------


def limits_for(mod, target: Target):
    return mod.TQMQLimits(target.max_shared, target.capability, target.hip)


def compiled_fits(mod, cfg: Config, attempts: list, ignore_limit: bool = False):
    """The fits() the planner walks: compile the candidate for cfg's target; None (accepted) when it compiled
    and its shared memory is within the limit (ignore_limit: any compiled kernel, a broken check)."""
    target = TARGET[cfg.target]
    variants = has_variants(mod)

    def fits(tiles):
        if variants:  # every variant the probe launches; the worst decides, as on the device
            results = compile_variants(mod, tiles, cfg, None if ignore_limit else target.max_shared)
            res = worst_variant(results)
            attempts.append({"tiles": _tiles_dict(tiles), **res, "variants": results})
        else:
            res = compile_kernel(mod, "_tq_mq_verify_fwd", target, probe_args(mod, tiles, cfg),
                                 tiles.num_warps, tiles.num_stages)
            attempts.append({"tiles": _tiles_dict(tiles), **res})
        if "error" in res:
            return res["error"]
        if res["shared"] > target.max_shared and not ignore_limit:
            return f"needs {res['shared']} B of shared memory, the limit is {target.max_shared} B"
        return None

    return fits


def _tiles_dict(tiles) -> dict:
    return dataclasses.asdict(tiles)


def plan(mod, cfg: Config, ignore_limit: bool = False, no_limits: bool = False) -> dict:
    """The route of one config: the planner's choice for the target, with the compile behind each try.
    no_limits plans from shapes alone (the widest tiles, as a planner blind to the device would)."""
    target, preset, geo = TARGET[cfg.target], PRESET[cfg.preset], GEOMETRY[cfg.geometry]
    attempts: list = []
    limits = None if no_limits else limits_for(mod, target)
    tiles, refused = mod.tq_mq_verify_select(
        cfg.k1, geo.group, geo.head_dim, preset.mse_bits, preset.key_fp8, limits,
        compiled_fits(mod, cfg, attempts, ignore_limit))
    candidates = mod.tq_mq_verify_candidates(cfg.k1, geo.group, geo.head_dim, preset.mse_bits, preset.key_fp8,
                                             limits)
    rec = {"config": dataclasses.asdict(cfg), "limit": target.max_shared, "candidates": len(candidates),
           "attempts": attempts, "refused": refused}
    if tiles is None:
        rec["route"] = "fallback"
    else:
        chosen = attempts[-1]
        rec["route"] = "multi-query"
        rec["tiles"] = _tiles_dict(tiles)
        for k in (*_WORST_KEYS, "shared_variant", "spill_variant", "error_variant", "variants"):
            if k in chosen:
                rec[k] = chosen[k]
        rec["widest"] = len(attempts) == 1 and tiles == candidates[0] and _is_widest(mod, cfg, tiles)
    return rec


def _is_widest(mod, cfg: Config, tiles) -> bool:
    geo, preset = GEOMETRY[cfg.geometry], PRESET[cfg.preset]
    widest = mod.tq_mq_verify_candidates(cfg.k1, geo.group, geo.head_dim, preset.mse_bits, preset.key_fp8, None)[0]
    return (tiles.block_m, tiles.block_n) == (widest.block_m, widest.block_n)


def check_route(rec: dict) -> list[str]:
    """What is wrong with a planned route: a chosen tiling whose compile failed or whose shared memory exceeds
    the target's limit, or neither a tiling nor an explicit fallback. Empty when the route is sound."""
    cfg = rec["config"]
    where = "{target} {preset} {dtype} bs{block_size} K+1={k1} {geometry}".format(**cfg)
    route = rec.get("route")
    if route == "fallback":
        return []
    if route != "multi-query" or "tiles" not in rec:
        return [f"{where}: no route (neither a tiling nor the fallback)"]
    problems = []
    for variant, res in (rec.get("variants") or {}).items():
        if "error" in res:
            problems.append(f"{where}: the chosen tiling's {variant} variant does not compile: {res['error']}")
        elif res.get("shared", 0) > rec["limit"]:
            problems.append(f"{where}: the chosen tiling's {variant} variant needs {res['shared']} B of shared "
                            f"memory, the limit is {rec['limit']} B")
    if rec.get("variants") and set(rec["variants"]) != set(VARIANTS) and not problems:
        problems.append(f"{where}: the chosen tiling lacks variants {sorted(set(VARIANTS) - set(rec['variants']))}")
    if problems:
        return problems
    if "error" in rec:
        problems.append(f"{where}: the chosen tiling does not compile: {rec['error']}")
    elif rec.get("shared") is None:
        problems.append(f"{where}: the chosen tiling has no compiled shared-memory size")
    elif rec["shared"] > rec["limit"]:
        problems.append(f"{where}: the chosen tiling needs {rec['shared']} B of shared memory, "
                        f"the limit is {rec['limit']} B")
    return problems


def helper_jobs(kernel: Path, targets, dtypes, dims) -> list[tuple]:
    """_tq_mq_rotate_queries and _tq_mq_verify_reduce once per (target, D, dtype)."""
    return [(str(kernel), fn, t, d, dtype) for t in targets for d in dims for dtype in dtypes
            for fn in ("_tq_mq_rotate_queries", "_tq_mq_verify_reduce")]


def _helper(job) -> dict:
    kernel, fn, tname, d, dtype = job
    mod = load_kernel(Path(kernel))
    target = TARGET[tname]
    geo = next(g for g in GEOMETRIES if g.head_dim == d)
    if fn == "_tq_mq_rotate_queries":  # Triton's default stages, as the launch passes none
        res = compile_kernel(mod, fn, target, rotate_args(geo, dtype, tiles=rotate_tiles(mod, target, d)), 4, None)
    else:
        res = compile_kernel(mod, fn, target, reduce_args(geo, dtype), 4, 1)
    return {"kernel": fn, "target": tname, "head_dim": d, "dtype": dtype, "limit": target.max_shared,
            "geometry": geo.name, **res}


def check_helper(rec: dict) -> list[str]:
    where = f"{rec['kernel']} {rec['target']} D={rec['head_dim']} {rec['dtype']}"
    if "error" in rec:
        return [f"{where}: does not compile: {rec['error']}"]
    if rec["shared"] > rec["limit"]:
        return [f"{where}: needs {rec['shared']} B of shared memory, the limit is {rec['limit']} B"]
    return []


# ---------------------------------------------------------------------------------------------------------
# Running a set and writing the table
# ---------------------------------------------------------------------------------------------------------


def _plan_group(job):
    kernel, cfgs = job
    mod = load_kernel(Path(kernel))
    rec = plan(mod, cfgs[0])
    out = []
    for cfg in cfgs:
        r = dict(rec)
        r["config"] = dataclasses.asdict(cfg)
        out.append(r)
    return out


def run_matrix(kernel: Path, configs: list[Config], helpers: list[tuple], jobs: int = 1, out: Path | None = None,
               progress: bool = False) -> tuple[list[dict], list[dict]]:
    """Compile the helper kernels, then plan every config (configs sharing a plan key are planned once), in
    order, over jobs processes; results are appended to out's ``.jsonl`` twin as they come, so a run cut
    short keeps what it finished."""
    groups: dict[tuple, list[Config]] = {}
    for cfg in configs:
        groups.setdefault(cfg.plan_key, []).append(cfg)
    work = [(str(kernel), cfgs) for cfgs in groups.values()]
    results: list[dict] = []
    sink = open(out.with_suffix(".jsonl"), "w") if out else None  # noqa: SIM115
    start = time.monotonic()
    pool = None
    if jobs > 1:
        import multiprocessing as mp

        pool = mp.get_context("spawn").Pool(jobs)
    mapper = pool.imap if pool else map
    try:
        helper_recs = list(mapper(_helper, helpers))
        if progress:
            print(f"helpers: {len(helper_recs)} compiled, {time.monotonic() - start:.0f}s", file=sys.stderr,
                  flush=True)
        for i, recs in enumerate(mapper(_plan_group, work), 1):
            results.extend(recs)
            if sink:
                for r in recs:
                    sink.write(json.dumps(r, sort_keys=True) + "\n")
                sink.flush()
            if progress:
                print(f"[{i}/{len(work)}] {time.monotonic() - start:.0f}s "
                      f"{recs[0]['config']['target']} {recs[0]['config']['preset']} -> {recs[0]['route']}",
                      file=sys.stderr, flush=True)
    finally:
        if pool:
            pool.close()
            pool.join()
        if sink:
            sink.close()
    return results, helper_recs


def _tiles_text(rec: dict) -> str:
    t = rec["tiles"]
    text = f"{t['block_m']}x{t['m_tiles']} n{t['block_n']}"
    # The score precision applies to MSE keys; FP8 keys always score with a float16 dot.
    return text if PRESET[rec["config"]["preset"]].key_fp8 else f"{text} {t['precision']}"


def _cell(rec: dict, threshold: int) -> str:
    if rec["route"] == "fallback":
        why = "; ".join(rec["refused"])
        return f"**fallback** ({why})" if len(why) < 160 else f"**fallback** ({why[:157]}...)"
    # With run-time variants: the largest shared memory and the largest spill over them, each naming its
    # variant, and the most registers any of them takes.
    text = f"{_tiles_text(rec)}: {rec['shared']} B"
    if rec.get("shared_variant"):
        text += f" {rec['shared_variant']}"
    if "regs" in rec:
        text += f", r{rec['regs']}"
    spill = rec.get("spill")
    if spill:
        text += f", spill {spill} B" + (f" {rec['spill_variant']}" if rec.get("spill_variant") else "")
        text += " **SPILL**" if spill > threshold else ""
    shrunk = len(rec["attempts"]) > 1
    if shrunk:
        text += f" (after {len(rec['attempts']) - 1} refused)"
    return text


def summary_rows(results: list[dict]) -> list[str]:
    """GPU class x preset: the routes the configs took (multi-query at the widest tiles, multi-query shrunk to
    which tiles, or the fallback), with how many configs each."""
    cells: dict[tuple[str, str], dict[str, int]] = {}
    for r in results:
        c = r["config"]
        if r["route"] == "fallback":
            what = "fallback"
        elif r.get("widest"):
            what = "widest"
        else:
            t = r["tiles"]
            what = f"{t['block_m']}x{t['m_tiles']} n{t['block_n']}"
        slot = cells.setdefault((c["target"], c["preset"]), {})
        slot[what] = slot.get(what, 0) + 1
    rows = ["| target (limit) | GPUs | " + " | ".join(p.name for p in PRESETS) + " |",
            "|" + "---|" * (2 + len(PRESETS))]
    for t in TARGETS:
        cols = []
        for p in PRESETS:
            got = cells.get((t.name, p.name))
            if not got:
                cols.append("n/a")
                continue
            parts = []
            if "widest" in got:
                parts.append(f"MQ widest ({got.pop('widest')})")
            shrunk = {k: v for k, v in got.items() if k != "fallback"}
            if shrunk:
                parts.append("MQ shrunk to " + ", ".join(f"{k} ({v})" for k, v in sorted(shrunk.items())))
            if "fallback" in got:
                parts.append(f"**fallback** ({got['fallback']})")
            cols.append("; ".join(parts))
        rows.append(f"| {t.name} ({t.max_shared}) | {t.gpus} | " + " | ".join(cols) + " |")
    return rows


def write_table(path: Path, results: list[dict], helpers: list[dict], triton_version: str, line: str,
                kernel_sha: str, total: int, threshold: int = SPILL_THRESHOLD, set_name: str = "full") -> None:
    targets = [t.name for t in TARGETS]
    with_variants = any("variants" in r for r in results)
    variants_text = (
        " Each cell covers the run-time variants of its tiling that the route probes and serving launches: the "
        "verify kernel with one KV split (`unsplit`) and with several (`split`), and the merge of the partials "
        "(`merge`), at the row's K+1, with the preset's norm correction. The shared memory shown is the largest "
        "over them and names its variant, the spill likewise, the registers are the most any variant takes; the "
        "planner refuses a tiling when any variant fails, as the device's probe does."
        if with_variants else
        " Each cell is the probe's first launch only (one KV split, no norm correction); the split and merge "
        "variants are not compiled for this kernel.")
    lines = [
        f"# GPU fit of the multi-query verify kernel: Triton {triton_version} ({line})",
        "",
        "Generated by `make gpu-fit` (gpu/fit/fitmatrix.py); see docs/gpu-fit.md for how to read it. "
        "Every number is from an ahead-of-time compile for the target on a CPU host: `metadata.shared` and, "
        "for CUDA, ptxas -v (registers, spill stores); for ROCm the code object's VGPR count and scratch "
        "(`.private_segment_fixed_size`).",
        "",
        set_description(set_name),
        "",
        f"Kernel file sha256 {kernel_sha[:16]}; {len(results)} of {total} configurations planned. "
        f"Cell: the chosen tiling (BLOCK_M x M tiles, BLOCK_N, MSE score precision): compiled shared memory, "
        f"registers/thread, spill stores or scratch (**SPILL** above {threshold} B); "
        "`(after n refused)` = the planner shrank; **fallback** = no tiling fits, the backend takes the "
        "release's decode route." + variants_text,
        "",
    ]
    lines += ["## Summary: routes per target and preset", "",
              "Configurations per route (count in brackets); `MQ` = the multi-query kernel, `widest` = the widest "
              "tiles for the shape, `BxT nN` = BLOCK_M x M tiles, BLOCK_N after shrinking.", ""]
    lines += summary_rows(results) + [""]
    flagged = [r for r in results if r["route"] == "multi-query" and (r.get("spill") or 0) > threshold]
    if flagged:
        lines += [f"Spills above {threshold} B (performance risk, not a failure): {len(flagged)} configurations, "
                  "marked **SPILL** below.", ""]
    by = {}
    for r in results:
        c = r["config"]
        by[(c["preset"], c["geometry"], c["k1"], c["dtype"], c["block_size"], c["target"])] = r
    rows = sorted({k[:5] for k in by}, key=lambda k: (
        [p.name for p in PRESETS].index(k[0]), [g.name for g in GEOMETRIES].index(k[1]), k[2],
        DTYPES.index(k[3]), k[4]))
    lines.append("## `_tq_mq_verify_fwd`: route per target")
    lines.append("")
    head = "| preset | model (Hq/Hk, D) | K+1 | dtype | bs | " + " | ".join(
        f"{t} ({TARGET[t].max_shared})" for t in targets) + " |"
    lines += [head, "|" + "---|" * (5 + len(targets))]
    for key in rows:
        g = GEOMETRY[key[1]]
        cells = [_cell(by[key + (t,)], threshold) if key + (t,) in by else "n/a" for t in targets]
        lines.append(f"| {key[0]} | {g.name} ({g.q_heads}/{g.kv_heads}, {g.head_dim}) | {key[2]} | {key[3]} | "
                     f"{key[4]} | " + " | ".join(cells) + " |")
    if helpers:
        lines += ["", "## Helper kernels (once per target, D, dtype)", "",
                  "| kernel | D | dtype | " + " | ".join(targets) + " |", "|" + "---|" * (3 + len(targets))]
        hb = {(h["kernel"], h["head_dim"], h["dtype"], h["target"]): h for h in helpers}
        for key in sorted({k[:3] for k in hb}):
            cells = []
            for t in targets:
                h = hb.get(key + (t,))
                if h is None:
                    cells.append("n/a")
                elif "error" in h:
                    cells.append(f"**ERROR** {h['error'][:80]}")
                else:
                    s = f"{h['shared']} B" + (" **EXCEEDS**" if h["shared"] > h["limit"] else "")
                    s += f", r{h['regs']}" if "regs" in h else ""
                    if h.get("spill"):
                        s += f", spill {h['spill']} B" + (" **SPILL**" if h["spill"] > threshold else "")
                    cells.append(s)
            lines.append(f"| `{key[0]}` | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", required=True, type=Path, help="the kernel file (or a tree holding it)")
    ap.add_argument("--set", choices=("ci", "reduced", "full"), default="ci")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--table", type=Path)
    ap.add_argument("--line", default="")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--from-jsonl", action="store_true", help="write the table from a (partial) .jsonl only")
    ap.add_argument("--blind", metavar="TARGET:PRESET",
                    help="plan the set's configs of TARGET and PRESET as a planner blind to the device would (the "
                         "widest tiles from shapes, any compiled kernel accepted): the checker must flag them")
    args = ap.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    import triton

    kernel = args.kernel / KERNEL_REL if args.kernel.is_dir() else args.kernel
    mod = load_kernel(kernel)
    configs = matrix(args.set)
    # The helpers at every D and dtype of the full matrix; at D=256 (their largest tiles) and bf16 in CI.
    dtypes, dims = (DTYPES, (128, 256)) if args.set == "full" else (("bf16",), (256,))
    helpers = helper_jobs(kernel, [t.name for t in TARGETS], dtypes, dims)
    if args.blind:
        target, preset = args.blind.split(":")
        configs = [c for c in configs if (c.target, c.preset) == (target, preset)]
        results = [plan(mod, c, ignore_limit=True, no_limits=True) for c in configs]
        helper_recs = []
    elif args.from_jsonl:
        results = [json.loads(x) for x in args.out.with_suffix(".jsonl").read_text().splitlines() if x.strip()]
        helper_recs = [_helper(h) for h in helpers]
    else:
        results, helper_recs = run_matrix(kernel, configs, helpers, args.jobs, args.out, progress=True)
    helpers = helper_recs
    problems = [p for r in results for p in check_route(r)] + [p for h in helpers for p in check_helper(h)]
    doc = {"triton": triton.__version__, "kernel_file_sha256": mod.FILE_SHA256, "kernels_sha256": mod.SOURCE_SHA256,
           "set": args.set, "total": len(configs), "results": results, "helpers": helpers, "problems": problems}
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=True))
    if args.table:
        write_table(args.table, results, helpers, triton.__version__, args.line, mod.FILE_SHA256, len(configs),
                    set_name=args.set)
    for p in problems:
        print("PROBLEM:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
