"""Load vLLM 0.33's TurboQuant / UltraQuant backend modules from a source tree with light stubs.

Only the two backend files run for real (exec'd from the tree with their own ``__import__``); every
``vllm.*`` name they import comes from the small stand-ins below. ``AttentionCGSupport`` is the tree's
own enum, cut out of ``vllm/v1/attention/backend.py`` with ``ast``. The TurboQuant and UltraQuant
decode kernels are replaced by one dense reference: for row r it attends over the first
``seq_lens[r]`` cache positions of ``block_table[r]`` and records the ``seq_lens`` it was given.
The cache in these tests is a plain float tensor ``(num_blocks, block_size, Hk, 2 * D)`` holding K|V.

``split_decodes_and_prefills``, ``max_decode_query_len`` and the builder's ``_init_reorder_batch_threshold``
are the tree's own code, cut out with ``ast``. The multi-query verify kernel (the line's patch 0003) is, by
default, a stand-in that gives the ``Recorder`` one row per query with its causal length
``seq_lens[r] - K1 + 1 + j`` and records the call; ``load(tree, mq=module)`` uses a real module instead.

``load_backend(tree)`` runs the TurboQuant backend file with its real kernels instead, whatever modules the
tree routes to: every ``vllm/v1/attention/ops`` module it imports is the tree's own file, as are its
TurboQuantConfig, centroids and ``vllm.envs``; FlyDSL (AMD) reports itself unavailable whatever its names.
Tests that must hold on newer unpatched trees (``Obsolete-If: test``) use that and vLLM's own
``CommonAttentionMetadata`` (``cam_class``), never the line's module or function names.
``load_ultraquant_backend(tree)`` runs ``ultraquant_attn.py`` the same way, on top of that TurboQuant module, with
one exception: UltraQuant's attention kernels are ``uq_kernel_stand_in``: the tree's own launcher
(``ultraquant_unified_attention``) with each kernel it launches computed program by program in float64 over the
tree's own cache format, since Triton's interpreter has no ``tl.dot_scaled`` (the kernel's FP4 x FP8 dot) and the
kernel cannot run on a CPU host. ``build_uq_cache`` fills an UltraQuant
cache with the tree's own encoder.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import enum
import inspect
import itertools
import logging
import math
import os
import sys
from collections.abc import Callable, Hashable, Iterator
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, ClassVar, Generic, TypeVar, cast

import numpy as np
import pytest
import torch

import vllm_tree
from helpers import VllmLogger
from references import TQLayout

TQ = "vllm/v1/attention/backends/turboquant_attn.py"
UQ = "vllm/v1/attention/backends/ultraquant_attn.py"
BACKEND = "vllm/v1/attention/backend.py"

_real_import = builtins.__import__


def tree_class(tree: Path, relpath: str, name: str, **scope) -> Any:
    """One top-level class or function (``Class.method`` for a method) of a tree file, compiled on its own."""
    path = tree / relpath
    found: Any = ast.parse(path.read_text(), str(path))
    for part in name.split("."):
        found = next(n for n in found.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == part)
    ns: dict[str, Any] = dict(scope)
    exec(compile(ast.Module(body=[found], type_ignores=[]), str(path), "exec"), ns)
    return ns[found.name]


def bind_tree_methods(obj: Any, tree: Path, relpath: str, class_name: str, **scope) -> Any:
    """Binds to ``obj`` (a stand-in instance holding data) every method of the tree file's class ``class_name``
    that ``obj`` lacks, each compiled on its own with the module names ``scope`` gives and its ``import vllm...``
    statements resolved in the tree (``vllm_tree.load_function``): an object whose methods are the tree's,
    whichever helpers a release splits its code into. Returns ``obj``."""
    path = tree / relpath
    cls = next(n for n in ast.parse(path.read_text(), str(path)).body
               if isinstance(n, ast.ClassDef) and n.name == class_name)
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("__") and not hasattr(obj, node.name):
            method = vllm_tree.load_function(tree, relpath, f"{class_name}.{node.name}", **scope)
            setattr(obj, node.name, method.__get__(obj))
    return obj


def tree_defines(tree: Path, relpath: str, name: str) -> bool:
    """Whether a tree file defines a top-level class or function ``name`` (0.27 has no
    ``max_decode_query_len``)."""
    path = tree / relpath
    return any(isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == name
               for n in ast.parse(path.read_text(), str(path)).body)


def has_ultraquant(tree: Path) -> bool:
    """Whether the tree has the UltraQuant backend (0.33 does; 0.27.1 and 0.32.0's predecessors do not)."""
    return (Path(tree) / UQ).is_file()


def ultraquant_or_obsolete(tree: Path) -> bool:
    """Whether ``tree`` has UltraQuant to test. Without it, the line's own runs skip the case (no line can carry an
    UltraQuant fix there); run as an ``Obsolete-If`` check on a new base ($VLLM_PATCH_BASE_UNDER_TEST), there is no
    UltraQuant left for the fix to fix, so the check reads obsolete: False, and the caller's test returns (passes)."""
    if has_ultraquant(tree):
        return True
    if os.environ.get("VLLM_PATCH_BASE_UNDER_TEST"):
        return False
    skip_without_ultraquant(tree)
    return False


def skip_without_ultraquant(tree: Path) -> None:
    """Skip an UltraQuant case on a tree without UltraQuant: no line can carry an UltraQuant fix there (a line
    that patched the missing file would not have applied)."""
    if not has_ultraquant(tree):
        pytest.skip(f"this vLLM has no UltraQuant backend ({UQ}): the line carries no UltraQuant fix")


def forward_cache(tq: ModuleType, storage: torch.Tensor) -> torch.Tensor:
    """0.33's cache ``(blocks, Hk, block_size, slot)`` (``storage``) as the ``forward`` of ``tq`` (a loaded
    ``turboquant_attn.py``) takes it: as is, or its ``transpose(1, 2)`` view where that file's
    ``get_kv_cache_shape`` puts ``block_size`` before the KV heads (0.25: ``(num_blocks, block_size,
    num_kv_heads, slot)``, which ``forward`` hands its kernels untransposed)."""
    path = Path(tq.__file__)
    shape = next((n for n in ast.walk(ast.parse(path.read_text(), str(path)))
                  if isinstance(n, ast.FunctionDef) and n.name == "get_kv_cache_shape"), None)
    if shape is not None:
        returned = next(n.value for n in ast.walk(shape) if isinstance(n, ast.Return))
        dims = [getattr(e, "id", None) for e in getattr(returned, "elts", [])]
        if "block_size" in dims and "num_kv_heads" in dims and dims.index("block_size") < dims.index("num_kv_heads"):
            return storage.transpose(1, 2)
    return storage


class Recorder:
    """The reference decode kernel: records the causal lengths each call was given."""

    def __init__(self) -> None:
        self.seq_lens: list[list[int]] = []
        self.mq_calls: list[dict] = []  # the multi-query kernel's calls: k1, rows, scratch shapes
        self.warmed: list[tuple[int, ...]] = []  # the K+1 values each layer compiled its variants for

    def attend(self, query, kv_cache, block_table, seq_lens, scale) -> torch.Tensor:
        lens = [int(x) for x in seq_lens.tolist()]
        self.seq_lens.append(lens)
        B, Hq, D = query.shape
        bs, Hk = kv_cache.shape[1], kv_cache.shape[2]
        out = torch.zeros(B, Hq, D, dtype=torch.float32)
        for r in range(B):
            L = lens[r]
            if L <= 0:
                continue
            pos = torch.arange(L)
            blocks = block_table[r, pos // bs].long()
            kv = kv_cache[blocks, pos % bs].float()  # (L, Hk, 2D)
            k, v = kv[..., :D], kv[..., D:]
            for h in range(Hq):
                kh = h // (Hq // Hk)
                w = torch.softmax((k[:, kh] @ query[r, h].float()) * scale, dim=0)
                out[r, h] = w @ v[:, kh]
        return out.to(query.dtype)


def mq_stand_in(rec: Recorder) -> ModuleType:
    """The multi-query kernel module as the Recorder: row j of request r attends over seq_lens[r] - K1 + 1 + j
    positions (0 if fewer), written into ``output``."""

    def attention(query, kv_cache, block_table, seq_lens, k1, centroids, scale, mse_bits, key_packed_size,
                  value_bits, output, mid_o_buf, q_rot_buf, **kw):
        n = query.shape[0]
        b = n // k1
        rec.mq_calls.append(dict(k1=k1, rows=n, mid_o=tuple(mid_o_buf.shape), q_rot=tuple(q_rot_buf.shape),
                                 mid_o_dtype=mid_o_buf.dtype, q_rot_dtype=q_rot_buf.dtype))
        lens = (seq_lens[:b, None] + torch.arange(1 - k1, 1, dtype=seq_lens.dtype)).clamp_min(0).reshape(-1)
        output[:n] = rec.attend(query, kv_cache, block_table[:b].repeat_interleave(k1, dim=0), lens, scale)
        return output

    def unused(*a, **k):
        raise AssertionError("the stand-in kernel needs no probe")

    def supports(head_dim: int) -> bool:
        return 16 <= head_dim <= 256 and head_dim & (head_dim - 1) == 0

    # On a GPU the backend's route asks the module for tiles that fit: the stand-in fits any device.
    def limits(device) -> SimpleNamespace:
        return SimpleNamespace(max_shared=1 << 20)

    def select(*a, **k) -> tuple[SimpleNamespace, list[str]]:
        return SimpleNamespace(describe=lambda: "the stand-in"), []

    # The stand-in splits every launch in two: the scratch the backend reserves and hands over is checked.
    def split_rows(num_reqs: int, k1: int, num_kv_heads: int, device, max_num_kv_splits: int) -> int:
        return num_reqs * k1 * 2

    def num_splits(num_programs: int, num_sms: int, max_num_kv_splits: int) -> int:
        return min(2, max_num_kv_splits)

    # A layer's first call compiles the real kernel's variants for its cache: the stand-in has none to compile.
    def warm(kv_cache, k1s, *a, **k) -> None:
        rec.warmed.append(tuple(k1s))

    return _module("mq", triton_turboquant_mq_verify_attention=attention, tq_mq_verify_supports=supports,
                   tq_mq_device_limits=limits, tq_mq_verify_probe=unused, tq_mq_verify_select=select,
                   tq_mq_verify_split_rows=split_rows, tq_mq_verify_num_splits=num_splits,
                   tq_mq_verify_warm=warm)


def _module(name: str, **attrs) -> ModuleType:
    m = ModuleType(name)
    m.__dict__.update(attrs)
    return m


M = TypeVar("M")


def make_stubs(tree: Path, rec: Recorder, mq: ModuleType | None = None,
               current_config: Any = None) -> dict[str, ModuleType]:
    AttentionCGSupport = tree_class(tree, BACKEND, "AttentionCGSupport", Enum=enum.Enum)
    max_decode_query_len = (tree_class(tree, BACKEND, "max_decode_query_len")
                            if tree_defines(tree, BACKEND, "max_decode_query_len") else None)

    class AttentionMetadataBuilder(Generic[M]):
        _cudagraph_support: ClassVar[Any] = AttentionCGSupport.NEVER
        reorder_batch_threshold: int | None = None

        def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
            self.kv_cache_spec, self.layer_names = kv_cache_spec, layer_names
            self.vllm_config, self.device = vllm_config, device

        @classmethod
        def get_cudagraph_support(cls, vllm_config, kv_cache_spec):
            return cls._cudagraph_support  # as 0.33's AttentionMetadataBuilder

        _init_reorder_batch_threshold = tree_class(
            tree, BACKEND, "AttentionMetadataBuilder._init_reorder_batch_threshold",
            max_decode_query_len=max_decode_query_len)

    class AttentionImpl(Generic[M]):
        pass

    class AttentionBackend:
        pass

    class AttentionMetadata:
        pass

    @dataclass
    class CommonAttentionMetadata:
        query_start_loc: torch.Tensor
        query_start_loc_cpu: torch.Tensor
        seq_lens: torch.Tensor
        num_reqs: int
        num_actual_tokens: int
        max_query_len: int
        max_seq_len: int
        block_table_tensor: torch.Tensor
        slot_mapping: torch.Tensor
        seq_lens_cpu_upper_bound: torch.Tensor | None = None

    split_decodes_and_prefills = tree_class(tree, "vllm/v1/attention/backends/utils.py",
                                            "split_decodes_and_prefills", CommonAttentionMetadata=Any, torch=torch)

    def tq_decode(*, query, kv_cache, block_table, seq_lens, scale, **_):
        return rec.attend(query, kv_cache, block_table, seq_lens, scale)

    def uq_unified(*, query, kv_cache, block_table, seq_lens, scale, max_query_len=1, output=None, **_):
        assert max_query_len == 1
        return rec.attend(query, kv_cache, block_table, seq_lens, scale)

    def unused(*a, **k):
        raise AssertionError("not expected in this test")

    def tq_config(cache_dtype: str, head_size: int) -> SimpleNamespace:
        lay = TQLayout.from_preset(cache_dtype, head_size)
        return SimpleNamespace(key_mse_bits=lay.mse_bits, key_fp8=lay.key_fp8, key_packed_size=lay.key_packed_size,
                               effective_value_quant_bits=lay.value_bits, norm_correction=lay.norm_correction)

    class KVCacheLayout(enum.Enum):
        LBNHC = "LBNHC"

    vllm_config = current_config or SimpleNamespace(
        attention_config=SimpleNamespace(tq_max_kv_splits_for_cuda_graph=4),
        model_config=SimpleNamespace(max_model_len=4096),
    )
    return {
        "vllm.config": _module("vllm.config", get_current_vllm_config=lambda: vllm_config,
                               get_layers_from_vllm_config=lambda config, cls, names=None: {}),
        "vllm.envs": _module("vllm.envs", VLLM_TURBOQUANT_ATTENTION_KERNEL="multi_query"),
        "vllm.model_executor.layers.attention": _module("a", Attention=type("Attention", (), {})),
        "vllm.model_executor.layers.quantization.turboquant.config": _module(
            "tc", TurboQuantConfig=SimpleNamespace(from_cache_dtype=tq_config)),
        "vllm.config.cache": _module("vllm.config.cache", CacheDType=str),
        "vllm.logger": _module("vllm.logger", init_logger=VllmLogger.named),
        "vllm.model_executor.layers.quantization.turboquant.centroids": _module(
            "c", get_centroids=unused),
        "vllm.triton_utils": _module("vllm.triton_utils", triton=SimpleNamespace(
            next_power_of_2=lambda n: 1 << (n - 1).bit_length())),
        "vllm.utils.math_utils": _module("m", round_up=lambda x, m: (x + m - 1) // m * m),
        "vllm.v1.attention.backend": _module(
            "vllm.v1.attention.backend", AttentionBackend=AttentionBackend, AttentionCGSupport=AttentionCGSupport,
            AttentionImpl=AttentionImpl, AttentionLayer=Any, AttentionMetadata=AttentionMetadata,
            AttentionMetadataBuilder=AttentionMetadataBuilder,
            AttentionType=SimpleNamespace(DECODER="decoder"), CommonAttentionMetadata=CommonAttentionMetadata,
            MultipleOf=int, max_decode_query_len=max_decode_query_len),
        "vllm.v1.attention.backends.fa_utils": _module(
            "fa", get_flash_attn_version=lambda **_: None, is_flash_attn_varlen_func_available=lambda: False),
        "vllm.v1.attention.backends.utils": _module("u", split_decodes_and_prefills=split_decodes_and_prefills),
        "vllm.v1.attention.ops.flydsl_turboquant_decode": _module(
            "f", flydsl_turboquant_decode_attention=unused, is_flydsl_available=lambda: False,
            is_flydsl_gqa6_available=lambda: False),
        "vllm.v1.attention.ops.triton_turboquant_decode": _module(
            "d", _tq_full_dequant_kv=None, _use_fp8_e4b15=unused, triton_turboquant_decode_attention=tq_decode),
        "vllm.v1.attention.ops.triton_turboquant_store": _module("s", triton_turboquant_store=unused),
        "vllm.v1.attention.ops.triton_turboquant_verify": mq if mq is not None else mq_stand_in(rec),
        "vllm.v1.kv_cache_interface": _module("k", AttentionSpec=object, KVCacheLayout=KVCacheLayout),
        "vllm.v1.worker.workspace": _module(
            "w", current_workspace_manager=unused, is_workspace_manager_initialized=lambda: False),
        "vllm.v1.attention.ops.flydsl_ultraquant_decode": _module(
            "fu", flydsl_ultraquant_decode_attention=unused, is_ultraquant_flydsl_available=lambda: False,
            ultraquant_flydsl_decode_eligible=lambda **_: False),
        "vllm.v1.attention.ops.ultraquant.format": _module("uf", slot_size=lambda d: d),
        "vllm.v1.attention.ops.ultraquant.triton_unified_attention": _module(
            "uu", ultraquant_unified_attention=uq_unified),
    }


def _exec_file(tree: Path, relpath: str, name: str, stubs: dict[str, ModuleType],
               real: Any = None) -> ModuleType:
    """Run a tree file with ``stubs`` for its ``vllm.*`` imports; ``real(name)`` gives the others, if any."""

    def _import(mod_name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and (mod_name == "vllm" or mod_name.startswith("vllm.")):
            found = stubs.get(mod_name) or (real(mod_name) if real is not None else None)
            if found is None:
                raise ImportError(f"no stand-in for {mod_name}")
            if not fromlist and mod_name.count(".") == 1:
                # ``import vllm.envs as envs`` takes the attribute of the package.
                return _module("vllm", **{mod_name.split(".")[1]: found})
            return found
        return _real_import(mod_name, globals, locals, fromlist, level)

    path = tree / relpath
    module = ModuleType(name)
    module.__file__ = str(path)
    module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": _import}
    sys.modules[name] = module  # dataclasses look the module up
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module


def load(tree: Path, mq: ModuleType | None = None) -> tuple[ModuleType, ModuleType, Recorder]:
    """(turboquant_attn, ultraquant_attn, recorder) of ``tree`` (ultraquant_attn None where the tree has no
    UltraQuant); ``mq``: the multi-query kernel module to use."""
    tree = Path(tree).resolve()
    rec = Recorder()
    stubs = make_stubs(tree, rec, mq)
    key = abs(hash((str(tree), id(mq))))
    tq = _exec_file(tree, TQ, f"_tq_under_test_{key}", stubs)
    stubs["vllm.v1.attention.backends.turboquant_attn"] = tq
    uq = _exec_file(tree, UQ, f"_uq_under_test_{key}", stubs) if has_ultraquant(tree) else None
    return tq, uq, rec


# The tree's own files behind the backend's imports in load_backend: kernels (any module of this package),
# the quantizer's config and centroids, the environment.
REAL_PACKAGES = ("vllm.v1.attention.ops.", "vllm.model_executor.layers.quantization.turboquant.")
REAL_MODULES = ("vllm.envs",)


class _Unavailable(ModuleType):
    """A hardware-specific kernel module (FlyDSL, AMD gfx950) that is not there, whatever it names: its
    ``is_*`` / ``*_available`` / ``*_eligible`` functions say False; anything else must not be called."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr.startswith("is_") or attr.endswith(("_available", "_eligible")):
            return lambda *a, **k: False

        def unused(*a, **k):
            raise AssertionError(f"{self.__name__}.{attr} called, but the module is unavailable here")

        return unused


def cam_class(tree: Path) -> type:
    """The tree's own ``CommonAttentionMetadata`` dataclass (vllm/v1/attention/backend.py)."""
    return tree_class(tree, BACKEND, "CommonAttentionMetadata", dataclass=dataclass, replace=dataclasses.replace,
                      torch=torch, np=np, Any=Any,
                      deprecated=lambda *a, **k: lambda fn: fn)  # 0.25/0.27's deprecated properties


def _real_kernel_stubs(tree: Path, vllm_config: Any) -> tuple[dict[str, ModuleType], Any]:
    """The stand-ins of ``load_backend`` (the tree's kernels, config, centroids and environment removed from
    them) and the function that gives those modules from the tree."""
    stubs = make_stubs(tree, Recorder(), current_config=vllm_config)
    for name in list(stubs):
        if name.startswith(REAL_PACKAGES) or name in REAL_MODULES:
            del stubs[name]
    stubs["vllm.v1.attention.backend"].CommonAttentionMetadata = cam_class(tree)

    def real(mod_name: str) -> ModuleType | None:
        if not (mod_name.startswith(REAL_PACKAGES) or mod_name in REAL_MODULES):
            return None
        if "flydsl" in mod_name:
            return _Unavailable(mod_name)
        return vllm_tree.load_module(tree, mod_name.replace(".", "/") + ".py")

    return stubs, real


def load_backend(tree: Path, vllm_config: Any = None) -> ModuleType:
    """The tree's ``turboquant_attn.py`` with its real kernels (see the module docstring); its
    ``CommonAttentionMetadata`` is the tree's own; ``get_current_vllm_config()`` returns ``vllm_config``."""
    tree = Path(tree).resolve()
    stubs, real = _real_kernel_stubs(tree, vllm_config)
    key = abs(hash((str(tree), "real", id(vllm_config))))
    return _exec_file(tree, TQ, f"_tq_real_kernels_{key}", stubs, real)


UQ_KERNEL = "vllm.v1.attention.ops.ultraquant.triton_unified_attention"
UQ_FORMAT = "vllm/v1/attention/ops/ultraquant/format.py"
UQ_REFERENCE = "vllm/v1/attention/ops/ultraquant/reference.py"


def load_ultraquant_backend(tree: Path, vllm_config: Any = None, tq: ModuleType | None = None, *,
                            real_kernel: bool = False) -> ModuleType:
    """The tree's ``ultraquant_attn.py`` as ``load_backend`` runs TurboQuant's, on top of ``tq`` (that tree's
    ``load_backend(tree, vllm_config)``, loaded here if not given): UltraQuant subclasses TurboQuant's backend,
    builder, metadata and impl. Its kernel is ``uq_kernel_stand_in`` (``real_kernel``: the tree's own, which
    needs a GPU with FP8, sm_89 or newer); its format and everything else under ``vllm/v1/attention/ops`` are
    the tree's own."""
    tree = Path(tree).resolve()
    if tq is None:
        tq = load_backend(tree, vllm_config)
    stubs, real = _real_kernel_stubs(tree, vllm_config)
    stubs["vllm.v1.attention.backends.turboquant_attn"] = tq
    if not real_kernel:
        stubs[UQ_KERNEL] = uq_kernel_stand_in(tree)
    key = abs(hash((str(tree), "real", id(vllm_config), id(tq), real_kernel)))
    return _exec_file(tree, UQ, f"_uq_real_format_{key}", stubs, real)


def uq_read(tree: Path, slots: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, V) float32 ``(..., Hk, D)`` of UltraQuant cache slots ``(..., Hk, slot)`` (uint8), decoded with the
    tree's own format (``format.py``'s offsets, ``reference.py``'s dequantization). K is in the rotated basis
    the cache stores it in."""
    fmt = vllm_tree.load_module(tree, UQ_FORMAT)
    ref = vllm_tree.load_module(tree, UQ_REFERENCE)
    d = head_dim

    def field(offset: int, size: int) -> torch.Tensor:
        return slots[..., offset: offset + size]

    k = ref.UltraQuantEncoded(field(fmt.k_codes_offset(d), fmt.k_codes_bytes(d)),
                              field(fmt.k_scales_offset(d), fmt.k_scales_bytes(d)))
    v = ref.UltraQuantEncoded(field(fmt.v_codes_offset(d), fmt.v_codes_bytes(d)),
                              field(fmt.v_scales_offset(d), fmt.v_scales_bytes(d)))
    return ref.ultraquant_dequant(k, d), ref.ultraquant_dequant(v, d)


def _find_seq_idx(qsl: list[int], target: int, num_seqs: int, block_q: int, q_blocks: bool) -> int:
    """The kernels' binary search over query_start_loc: the sequence of q-block (``q_blocks``) or token
    ``target``."""
    left, right = 0, num_seqs
    while left < right:
        mid = (left + right) // 2
        val = qsl[mid] // block_q + mid if q_blocks else qsl[mid]
        if val <= target:
            left = mid + 1
        else:
            right = mid
    return left - 1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _UQPrograms:
    """The programs of UltraQuant's three Triton kernels (the unified 2D and split-KV 3D attention kernels and the
    segment reduce), each computed in float64 from exactly the launch it is given: the grid, the constexprs
    (BLOCK_M, BLOCK_Q, TILE_SIZE, NUM_SEGMENTS_PER_SEQ, SLIDING_WINDOW, USE_SINKS, the slot offsets), the strides
    and the device tensors. Program by program as the kernels run them: a q-block finds its sequence with the
    kernels' binary search over ``query_start_len_ptr``, returns past its sequence's query rows, reads the tiles
    its loop bounds give (``seq_lens_ptr``'s length, its rows' causal prefix, its KV segment, the sliding window)
    through the block table, and stores what the kernel stores: the 2D kernel a row's attention, the 3D kernel its
    segment's running max, sum and unnormalised accumulator, which the reduce combines over the segments the
    sequence's length gives. A row no program writes keeps what ``output`` held. Exact: the query values are the
    float64 rotated query ``exact`` (the launch's FP8 ``query_ptr`` is its rounding), K/V the cache bytes decoded
    with the tree's format (``uq_read``)."""

    def __init__(self, tree: Path, exact: torch.Tensor, launches: list) -> None:
        self.tree, self.exact, self.launches = tree, exact, launches
        self.fmt = vllm_tree.load_module(tree, UQ_FORMAT)

    def kernel(self, name: str):
        programs = self

        class Kernel:
            def __getitem__(self, grid):
                def launch(**kw):
                    programs.launches.append(dict(kernel=name, grid=tuple(int(g) for g in grid), **{
                        k: v for k, v in kw.items() if k.isupper() or k in ("num_seqs", "scale")}))
                    getattr(programs, name)(tuple(int(g) for g in grid), kw)

                return launch

        return Kernel()

    # --- what one attention program reads and computes --------------------------------------------------------
    def _program(self, kw: dict, q_block: int, kv_head: int, segment: int | None):
        """None if the program returns early, else (rows, heads, M, L, acc) of its live rows: the running max,
        sum and accumulator its loop ends with (float64)."""
        qsl = [int(x) for x in kw["query_start_len_ptr"].tolist()]
        lens = [int(x) for x in kw["seq_lens_ptr"].tolist()]
        block_q, block_m, tile = kw["BLOCK_Q"], kw["BLOCK_M"], kw["TILE_SIZE"]
        group, hq, window = kw["num_queries_per_kv"], kw["num_query_heads"], kw.get("SLIDING_WINDOW", 0)
        seq = _find_seq_idx(qsl, q_block, kw["num_seqs"], block_q, True)
        local = q_block - (qsl[seq] // block_q + seq)
        q_len = qsl[seq + 1] - qsl[seq]
        if local * block_q >= q_len:
            return None
        seq_len = lens[seq]
        tile_lo, tile_hi = 0, None
        if segment is not None:
            per_segment = _cdiv(seq_len, kw["NUM_SEGMENTS_PER_SEQ"] * tile)
            if segment * per_segment * tile >= seq_len:
                return None
        context = seq_len - q_len
        prefix = min(context + local * block_q + (block_m - 1) // group + 1, seq_len)
        num_tiles = _cdiv(prefix, tile)
        tile_hi = num_tiles
        if segment is not None:
            tile_lo, tile_hi = segment * per_segment, min((segment + 1) * per_segment, num_tiles)
        if window > 0:
            lo = local * block_q
            hi = min(lo + (block_m - 1) // group, q_len - 1)
            tile_lo = max(tile_lo, max(0, (context + lo - window + 1) // tile))
            tile_hi = min(tile_hi, (context + hi) // tile + 1)
        m = torch.arange(block_m)
        qpos, heads = local * block_q + m // group, kv_head * group + m % group
        live = (qpos < q_len) & (heads < hq)
        qpos, heads = qpos[live], heads[live]
        rows = qsl[seq] + qpos
        dev = self.exact.device
        assert self.exact.shape == kw["query_ptr"].shape, "the launch's query is not the rotated query's rows"
        sinks = (segment is None or segment == 0) and kw.get("USE_SINKS", 0)
        M = (kw["sinks_ptr"][heads.to(dev)].double() if sinks
             else torch.full((len(rows),), float("-inf"), dtype=torch.float64, device=dev))
        L = torch.ones(len(rows), dtype=torch.float64, device=dev)
        d = kw["HEAD_SIZE"]
        acc = torch.zeros(len(rows), d, dtype=torch.float64, device=dev)
        if tile_lo >= tile_hi:
            return rows, heads, M, L, acc
        pos = torch.arange(tile_lo * tile, min(tile_hi * tile, prefix), device=dev)
        keys, values = self._read(kw, seq, kv_head, pos)
        q = self.exact[rows.to(dev), heads.to(dev)]
        scores = kw["scale"] * (q @ keys.T)
        abs_pos = (context + qpos.to(dev))[:, None]
        allowed = pos[None, :] <= abs_pos
        if window > 0:
            allowed &= (abs_pos - pos[None, :]) < window
        scores = scores.masked_fill(~allowed, float("-inf"))
        m_new = torch.maximum(M, scores.max(1).values)
        m_new = torch.where(m_new > float("-inf"), m_new, torch.zeros_like(m_new))
        p = (scores - m_new[:, None]).exp()
        L = L * (M - m_new).exp() + p.sum(1)
        return rows, heads, m_new, L, p @ values

    def _read(self, kw: dict, seq: int, kv_head: int, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) float64 (n, D) at positions ``pos`` of sequence ``seq``, KV head ``kv_head``: the slot bytes at
        the addresses the kernel computes (block table row ``seq`` at its stride, the cache strides, the slot
        offsets of the launch, which must be the tree format's)."""
        d, fmt = kw["HEAD_SIZE"], self.fmt
        assert (kw["K_SCALES_OFFSET"], kw["V_CODES_OFFSET"], kw["V_SCALES_OFFSET"]) == (
            fmt.k_scales_offset(d), fmt.v_codes_offset(d), fmt.v_scales_offset(d)), "slot offsets not the format's"
        table = kw["block_tables_ptr"].reshape(-1)
        block = table[seq * kw["block_table_stride"] + torch.div(pos, kw["BLOCK_SIZE"], rounding_mode="floor")]
        base = (block.long() * kw["stride_cache_block"] + (pos % kw["BLOCK_SIZE"]) * kw["stride_cache_pos"]
                + kv_head * kw["stride_cache_head"])
        slots = kw["KV_cache_ptr"][base[:, None] + torch.arange(fmt.slot_size(d), device=base.device)]
        k, v = uq_read(self.tree, slots, d)
        return k.double(), v.double()

    # --- the three kernels -------------------------------------------------------------------------------------
    def _head_rows(self, kw: dict, out: torch.Tensor, rows, heads) -> tuple[torch.Tensor, torch.Tensor]:
        assert (out.stride(0), out.stride(1)) == (kw["output_stride_0"], kw["output_stride_1"])
        return rows.to(out.device), heads.to(out.device)

    def kernel_ultraquant_unified_attention_2d(self, grid, kw) -> None:
        out = kw["output_ptr"]
        for q_block in range(grid[0]):
            for kv_head in range(grid[1]):
                got = self._program(kw, q_block, kv_head, None)
                if got is None:
                    continue
                rows, heads, _, L, acc = got
                rows, heads = self._head_rows(kw, out, rows, heads)
                out[rows, heads, : kw["HEAD_SIZE"]] = (acc / L[:, None]).to(out.dtype)

    def kernel_ultraquant_unified_attention_3d(self, grid, kw) -> None:
        for q_block in range(grid[0]):
            for kv_head in range(grid[1]):
                for segment in range(grid[2]):
                    got = self._program(kw, q_block, kv_head, segment)
                    if got is None:
                        continue
                    rows, heads, M, L, acc = got
                    dev = kw["segm_output_ptr"].device
                    rows, heads = rows.to(dev), heads.to(dev)
                    kw["segm_output_ptr"][rows, heads, segment, : kw["HEAD_SIZE"]] = acc.float()
                    kw["segm_max_ptr"][rows, heads, segment] = M.float()
                    kw["segm_expsum_ptr"][rows, heads, segment] = L.float()

    def reduce_segments(self, grid, kw) -> None:
        qsl = [int(x) for x in kw["query_start_len_ptr"].tolist()]
        lens = [int(x) for x in kw["seq_lens_ptr"].tolist()]
        out, segments, tile, d = kw["output_ptr"], kw["NUM_SEGMENTS_PER_SEQ"], kw["TILE_SIZE"], kw["HEAD_SIZE"]
        assert (out.stride(0), out.stride(1)) == (kw["output_stride_0"], kw["output_stride_1"])
        for token in range(grid[0]):
            if token >= qsl[kw["num_seqs"]]:
                continue
            seq_len = lens[_find_seq_idx(qsl, token, kw["num_seqs"], kw["BLOCK_Q"], False)]
            if seq_len <= 0:
                continue
            per_segment = _cdiv(seq_len, segments * tile)
            active = _cdiv(seq_len, per_segment * tile)
            for head in range(grid[1]):
                m = kw["segm_max_ptr"][token, head, :active].double()
                s = kw["segm_expsum_ptr"][token, head, :active].double()
                o = kw["segm_output_ptr"][token, head, :active, :d].double()
                valid = (s > 0) & (m != float("-inf"))
                if not bool(valid.any()):
                    out[token, head, :d] = 0
                    continue
                w = torch.where(valid, (m - m[valid].max()).exp(), torch.zeros_like(m))
                total = (s * w).sum()
                acc = (o * w[:, None]).sum(0)
                out[token, head, :d] = torch.where(total == 0, torch.zeros_like(acc), acc / total).to(out.dtype)


UQ_KERNEL_FILE = "vllm/v1/attention/ops/ultraquant/triton_unified_attention.py"
UQ_KERNELS = ("kernel_ultraquant_unified_attention_2d", "kernel_ultraquant_unified_attention_3d", "reduce_segments")


def uq_kernel_stand_in(tree: Path) -> ModuleType:
    """UltraQuant's kernel module with ``ultraquant_unified_attention`` the tree's own launcher, run as it is,
    with each kernel it launches (2D, 3D split-KV, the segment reduce) computed program by program in float64
    (``_UQPrograms``): every argument the launcher takes (``max_query_len``, ``max_seq_len``, ``num_kv_splits``,
    ``force_2d``, ``tile_size``, ``sinks``, ``sliding_window``, ...) decides what it decides in the tree, the
    kernel, its grid, tiles and KV segments, and every program reads what that launch gives it. Exact: the kernel
    rounds the rotated query to FP8 and P to bfloat16; the stand-in attends with the float64 rotated query (the
    launcher's ``PiT``, or its own rotation). The module's ``launches`` lists each kernel launch (its name, grid
    and constexprs), for tests of the route's launches. Lengths, rows and block tables are read on the host: no
    graph runs it."""
    tree = Path(tree).resolve()
    launcher = vllm_tree.load_module(tree, UQ_KERNEL_FILE)
    launches: list[dict] = []

    def ultraquant_unified_attention(query, kv_cache, block_table, seq_lens, query_start_loc, scale, PiT=None,
                                     *args, **kwargs):
        rot = launcher._get_pit(query.shape[-1], query.device, torch.float32) if PiT is None else PiT
        programs = _UQPrograms(tree, query.double() @ rot.double(), launches)
        with pytest.MonkeyPatch.context() as mp:
            for name in UQ_KERNELS:
                mp.setattr(launcher, name, programs.kernel(name))
            return launcher.ultraquant_unified_attention(query, kv_cache, block_table, seq_lens, query_start_loc,
                                                         scale, PiT, *args, **kwargs)

    ultraquant_unified_attention.launches = launches
    return _module("uq_kernel", ultraquant_unified_attention=ultraquant_unified_attention, launches=launches)


def build_uq_cache(tree: Path, seq_lens: list[int], num_kv_heads: int, head_dim: int, block_size: int,
                   device: torch.device | str = "cpu", *, seed: int = 0, extra_blocks: int = 3) -> SimpleNamespace:
    """An UltraQuant paged cache ``(num_blocks, block_size, Hk, slot)`` for requests of lengths ``seq_lens``,
    encoded with the tree's own ``reference.ultraquant_encode`` (K Hadamard-rotated, V not) and laid out by its
    ``format.py``. Every slot of every block holds random K/V (other requests', spare blocks', the tail of a
    request's last block), so reading past a request's length reads valid but unrelated tokens. Block tables
    are scattered (shuffled blocks), 0 past a request's blocks. ``keys``/``values``: each request's K/V
    ``(L, Hk, D)`` float32 as dequantized from the cache, K turned back to the unrotated basis."""
    tree = Path(tree).resolve()
    fmt = vllm_tree.load_module(tree, UQ_FORMAT)
    ref = vllm_tree.load_module(tree, UQ_REFERENCE)
    gen = torch.Generator().manual_seed(seed)
    d, hk = head_dim, num_kv_heads
    per_req = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(per_req) + extra_blocks
    order = torch.randperm(num_blocks, generator=gen)
    block_table = torch.zeros(len(seq_lens), max(per_req + [1]), dtype=torch.int32)
    used = 0
    for b, nb in enumerate(per_req):
        block_table[b, :nb] = order[used: used + nb].to(torch.int32)
        used += nb
    raw_k = torch.randn(num_blocks * block_size, hk, d, generator=gen)
    raw_v = torch.randn(num_blocks * block_size, hk, d, generator=gen)
    k = ref.ultraquant_encode(raw_k, rotate=True)
    v = ref.ultraquant_encode(raw_v, rotate=False)
    slots = torch.zeros(num_blocks * block_size, hk, fmt.slot_size(d), dtype=torch.uint8)
    for offset, data in ((fmt.k_codes_offset(d), k.codes_packed), (fmt.k_scales_offset(d), k.scale_bytes),
                         (fmt.v_codes_offset(d), v.codes_packed), (fmt.v_scales_offset(d), v.scale_bytes)):
        slots[..., offset: offset + data.shape[-1]] = data
    kv_cache = slots.view(num_blocks, block_size, hk, -1).to(device)
    block_table = block_table.to(device)
    rot = ref.hadamard_matrix(d, torch.device(device))
    keys, values = [], []
    for b, n in enumerate(seq_lens):
        pos = torch.arange(n, device=device)
        kr, vr = uq_read(tree, kv_cache[block_table[b, pos // block_size].long(), pos % block_size], d)
        keys.append(kr @ rot)  # stored as K @ H^T, H orthonormal
        values.append(vr)
    return SimpleNamespace(kv_cache=kv_cache, block_table=block_table, keys=keys, values=values)


VERIFY_KERNEL = "vllm/v1/attention/ops/triton_turboquant_verify.py"


@contextlib.contextmanager
def gpu_of(tree: Path, backend: ModuleType, max_shared: int) -> Iterator[None]:
    """While the block runs, the backend ``backend`` (a ``load_backend`` module of ``tree``) decides its route on
    a CUDA device whose blocks get at most ``max_shared`` bytes of shared memory: on a GPU host the device
    itself, capped by the kernel module's own ``$VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY``; on a CPU host a stand-in
    CUDA device 0 (sm_90) with that limit, whose launches cannot run (the route must not probe one). Only the
    route's decision can be made under it: no kernel of the block may launch."""
    with pytest.MonkeyPatch.context() as mp:
        if torch.cuda.is_available():
            mp.setenv("VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY", str(max_shared))
        else:
            limits_cls = vllm_tree.load_module(tree, VERIFY_KERNEL).TQMQLimits

            def no_launch(*a, **k):
                raise AssertionError("the stand-in CUDA device cannot launch a kernel")

            mp.setattr(torch.cuda, "is_available", lambda: True)
            mp.setattr(torch.cuda, "current_device", lambda: 0)
            mp.setattr(backend, "tq_mq_device_limits", lambda device=None: limits_cls(max_shared, 90), raising=False)
            mp.setattr(backend, "tq_mq_verify_probe", no_launch, raising=False)
        yield


def vllm_config(num_spec: int | None, num_heads: int, max_num_seqs: int = 8, splits: int = 4,
                max_num_batched_tokens: int = 64, dtype: torch.dtype = torch.float16,
                cache_dtype: str = "turboquant_k8v4") -> SimpleNamespace:
    """The parts of a VllmConfig the TurboQuant builder and impl read; speculative decoding with ``num_spec``
    draft tokens (None: none), model runner V2. ``cache_dtype``: the preset, which 0.25's and 0.27's routes read from
    the cache config (its specs say only TURBOQUANT; 0.33's name the preset)."""
    spec = None if num_spec is None else SimpleNamespace(num_speculative_tokens=num_spec, parallel_drafting=False)
    return SimpleNamespace(
        speculative_config=spec, use_v2_model_runner=True,
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs, enable_chunked_prefill=False,
                                         max_num_batched_tokens=max_num_batched_tokens),
        model_config=SimpleNamespace(get_num_attention_heads=lambda _pc: num_heads, dtype=dtype,
                                     max_model_len=4096),
        attention_config=SimpleNamespace(tq_max_kv_splits_for_cuda_graph=splits),
        cache_config=SimpleNamespace(cache_dtype=cache_dtype, block_size=16),
        compilation_config=SimpleNamespace(cudagraph_capture_sizes=[max_num_seqs]))


@contextlib.contextmanager
def interpreted_loads(tensor: torch.Tensor) -> Iterator[list[int]]:
    """Counts, while the block runs, the bytes Triton's interpreter loads from ``tensor``'s storage
    (masked-off lanes excluded; an address loaded twice counts twice): yields a one-element list that
    holds the running total. Wraps ``InterpreterBuilder.create_masked_load``, which every ``tl.load``
    (block pointers included) goes through, and restores it on exit. Host tensors only: the interpreter
    copies a GPU tensor to the host first, so none of its loads would fall inside the GPU storage."""
    from triton.runtime import interpreter

    storage = tensor.untyped_storage()
    lo, hi = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    total = [0]
    original = interpreter.InterpreterBuilder.create_masked_load

    def counting(self, ptrs, mask, other, *args, **kwargs):
        addr = ptrs.data
        inside = (addr >= lo) & (addr < hi) & np.broadcast_to(mask.data, addr.shape)
        total[0] += int(inside.sum()) * max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        return original(self, ptrs, mask, other, *args, **kwargs)

    interpreter.InterpreterBuilder.create_masked_load = counting
    try:
        yield total
    finally:
        interpreter.InterpreterBuilder.create_masked_load = original


def _storage_span(t: torch.Tensor) -> tuple[torch.device, int, int]:
    storage = t.untyped_storage()
    return t.device, storage.data_ptr(), storage.data_ptr() + storage.nbytes()


@contextlib.contextmanager
def cache_launches(tensor: torch.Tensor) -> Iterator[list[tuple[str, Any]]]:
    """Records, while the block runs, every Triton kernel launch handed a tensor that lies in ``tensor``'s
    storage (a view of the cache included): yields the list of ``(kernel name, grid)`` it fills, in launch order
    (the grid as launched: a tuple, or a callable's repr). Compiled (``JITFunction.run``) and interpreted
    (``InterpretedFunction.run``) launches both; warm-up compiles are no launch. Restores both on exit."""
    from triton.runtime import interpreter, jit

    device, lo, hi = _storage_span(tensor)
    launches: list[tuple[str, Any]] = []

    def touches(arg: Any) -> bool:
        if not isinstance(arg, torch.Tensor) or arg.device != device:
            return False
        _, a_lo, a_hi = _storage_span(arg)
        return a_lo < hi and lo < a_hi

    classes = (jit.JITFunction, interpreter.InterpretedFunction)
    originals = {cls: cls.__dict__["run"] for cls in classes}

    def recording(original):
        def run(self, *args, grid, warmup, **kwargs):
            if not warmup and any(touches(a) for a in (*args, *kwargs.values())):
                name = getattr(getattr(self, "fn", None), "__name__", repr(self))
                launches.append((name, tuple(grid) if isinstance(grid, (tuple, list)) else repr(grid)))
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)

        return run

    for cls in classes:
        cls.run = recording(originals[cls])
    try:
        yield launches
    finally:
        for cls in classes:
            cls.run = originals[cls]


def bare_impl(cls, num_heads: int, num_kv_heads: int, head_size: int):
    """An impl without running __init__ (which wants a whole vLLM config); the fields the loop reads."""
    impl = object.__new__(cls)
    impl.num_heads, impl.num_kv_heads, impl.head_size = num_heads, num_kv_heads, head_size
    impl.num_kv_groups = num_heads // num_kv_heads
    impl.scale = 1.0 / math.sqrt(head_size)
    impl.kv_cache_dtype = "test"
    impl.tq_config = SimpleNamespace(key_mse_bits=4, key_packed_size=head_size, effective_value_quant_bits=4,
                                     key_fp8=False, norm_correction=False, value_packed_size=head_size)
    impl.fa_version = None
    impl.max_num_kv_splits = 4
    impl.sliding_window = None
    impl.sinks = None
    impl._max_model_len = 4096
    impl._use_flydsl = False
    impl._soa_store = False
    impl._use_ultraquant_flydsl = False
    impl._flydsl_decode_eligible = False
    impl._multi_query_k1s = (1, 2, 3, 4)  # __init__: every K+1 the builder can send (MTP K=3 here)
    impl._multi_query_warm = False
    return impl


def workspace_manager(tree: Path) -> Any:
    """The tree's own ``WorkspaceManager`` (vllm/v1/worker/workspace.py: one ubatch, one lane), on the host."""
    path = "vllm/v1/worker/workspace.py"
    scope = dict(torch=torch, envs=SimpleNamespace(VLLM_DEBUG_WORKSPACE=False), logger=logging.getLogger("ws"),
                 inspect=inspect, os=os, Callable=Callable, Hashable=Hashable, Iterator=Iterator,
                 AbstractContextManager=AbstractContextManager, nullcontext=contextlib.nullcontext,
                 accumulate=itertools.accumulate, prod=math.prod, cast=cast, T=TypeVar("T"), _MB=1 << 20,
                 _GiB=1 << 30, dbo_current_ubatch_id=lambda: 0, _workspace_lane=ContextVar("lane", default=0),
                 round_up=tree_class(tree, "vllm/utils/math_utils.py", "round_up"))
    scope["_compute_bytes"] = tree_class(tree, path, "_compute_bytes", **scope)
    return tree_class(tree, path, "WorkspaceManager", **scope)(torch.device("cpu"))
