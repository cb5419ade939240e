"""UltraQuant's kernels as patch 0007's route launches them, compiled ahead of time for foreign CUDA targets.

Runs in an interpreter that has ``triton`` and ``packaging`` only (no torch, no vLLM, no GPU): the tree's
``ultraquant/triton_unified_attention.py`` and the modules it imports from ``vllm/v1/attention/ops`` are loaded
from the tree, everything else (torch, vllm.envs, the platform) from permissive stand-ins. For head dims 128 and
256 and 4, 6 and 8 query heads per KV head it compiles the route's launches (16-row decode tiles: the 2D kernel;
the split-KV kernel and vLLM's ``reduce_segments`` at 16 and 32 segments) for each target and prints one line
per compile: head dim, group, target, kernel, ok or FAIL, shared memory (LDS on ROCm) in bytes. ROCm targets
(gfx names) compile with the launcher's HIP stages (2D 1, split-KV 3), wave64.

    python uq_route_aot.py TREE 89,90,120,gfx942    # TRITON_PTXAS_BLACKWELL_PATH: a ptxas with sm_120
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

OPS = "vllm.v1.attention.ops"
# Argument types of the kernels' non-constexpr parameters (the rest are int32).
TYPES = {"output_ptr": "*bf16", "query_ptr": "*fp8e4nv", "KV_cache_ptr": "*u8", "block_tables_ptr": "*i32",
         "seq_lens_ptr": "*i32", "query_start_len_ptr": "*i32", "sinks_ptr": "*fp32", "scale": "fp32",
         "segm_output_ptr": "*fp32", "segm_max_ptr": "*fp32", "segm_expsum_ptr": "*fp32", "out_scale_inv": "fp32",
         "block_table_stride": "i64", "query_stride_0": "i64", "query_stride_1": "i64", "output_stride_0": "i64",
         "output_stride_1": "i64", "stride_cache_block": "i64", "stride_cache_pos": "i64",
         "stride_cache_head": "i64"}


class _Anything:
    """Whatever a stand-in is asked for at import time."""

    def __call__(self, *a, **k):
        return _Anything()

    def __getattr__(self, name):
        return _Anything()

    def __getitem__(self, key):
        return _Anything()

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __bool__(self):
        return False

    def __mro_entries__(self, bases):
        return (object,)


class _StandIn(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


def _stand_in(name: str, **attrs) -> None:
    module = _StandIn(name)
    module.__path__ = []
    module.__dict__.update(attrs)
    sys.modules[name] = module


class _TreeOps(importlib.abc.MetaPathFinder):
    """``vllm.v1.attention.ops.*`` from the tree."""

    def __init__(self, tree: Path):
        self.tree = tree

    def find_spec(self, name, path, target=None):
        if not name.startswith(OPS):
            return None
        where = self.tree / Path(*name.split("."))
        if where.with_suffix(".py").is_file():
            return importlib.util.spec_from_file_location(name, where.with_suffix(".py"))
        if where.is_dir():
            init = where / "__init__.py"
            if init.is_file():
                return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(where)])
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [str(where)]
            return spec
        return None


def load(tree: Path) -> tuple[types.ModuleType, types.ModuleType, types.ModuleType]:
    platform = types.SimpleNamespace(is_rocm=lambda: False, is_cuda=lambda: True, fp8_dtype=_Anything(),
                                     has_device_capability=lambda *a: True, is_device_capability=lambda *a: False)
    for name in ("vllm", "vllm.envs", "vllm.v1", "vllm.v1.attention", "vllm.v1.kv_cache_interface"):
        _stand_in(name)
    # reduce_segments' FP8 bounds are constexpr defaults (float8_info.min/max): FP8 E4M3's.
    _stand_in("torch", finfo=lambda dtype: types.SimpleNamespace(min=-448.0, max=448.0))
    _stand_in("vllm.logger", init_logger=lambda *a: _Anything())
    _stand_in("vllm.platforms", current_platform=platform)
    _stand_in("vllm.triton_utils", tl=tl, triton=triton)
    sys.meta_path.insert(0, _TreeOps(tree))
    return (importlib.import_module(f"{OPS}.ultraquant.triton_unified_attention"),
            importlib.import_module(f"{OPS}.ultraquant.format"),
            importlib.import_module(f"{OPS}.triton_unified_attention"))


def gpu_target(name: str) -> GPUTarget:
    return GPUTarget("hip", name, 64) if name.startswith("gfx") else GPUTarget("cuda", int(name), 32)


def compile_one(fn, constants: dict, target: GPUTarget, **options) -> str:
    constants = {k: v for k, v in constants.items() if k in fn.arg_names}
    signature = {p: "constexpr" if p in constants else TYPES.get(p, "i32") for p in fn.arg_names}
    source = ASTSource(fn, signature, constexprs={(fn.arg_names.index(k),): v for k, v in constants.items()})
    try:
        kernel = triton.compile(source, target=target, options=options)
    except Exception as e:  # noqa: BLE001 - a compile failure is a result here
        lines = [line for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        return f"FAIL {next((line for line in lines if 'not supported' in line), lines[-1]).strip()[:120]}"
    return f"ok {kernel.metadata.shared}"


def main() -> int:
    tree, targets = Path(sys.argv[1]), sys.argv[2].split(",")
    uq, fmt, unified = load(tree)
    gs = fmt.get_group_size()
    for head_dim in (128, 256):
        for group in (4, 6, 8):
            block_m = 16 if group <= 16 else triton.next_power_of_2(group)
            tiles = dict(num_query_heads=4 * group, num_queries_per_kv=group, BLOCK_SIZE=64, TILE_SIZE=16,
                         HEAD_SIZE=head_dim, HEAD_SIZE_PADDED=triton.next_power_of_2(head_dim),
                         BLOCK_Q=block_m // group, BLOCK_M=block_m, GROUP_SIZE_C=gs,
                         K_SCALES_OFFSET=fmt.k_scales_offset(head_dim, gs),
                         V_CODES_OFFSET=fmt.v_codes_offset(head_dim, gs),
                         V_SCALES_OFFSET=fmt.v_scales_offset(head_dim, gs), N_GROUPS_C=fmt.n_groups(head_dim, gs),
                         UE8M0_BIAS_C=fmt.UE8M0_BIAS, USE_SINKS=0, SLIDING_WINDOW=0, USE_FP8=False)
            for name in targets:
                target = gpu_target(name)
                hip = target.backend == "hip"
                runs = [("2d", uq.kernel_ultraquant_unified_attention_2d, {},
                         dict(num_warps=4, num_stages=1 if hip else 2))]
                for segments in (16, 32):
                    runs += [(f"3d-{segments}", uq.kernel_ultraquant_unified_attention_3d,
                              {"NUM_SEGMENTS_PER_SEQ": segments}, dict(num_warps=2, num_stages=3 if hip else 2)),
                             (f"reduce-{segments}", unified.reduce_segments, {"NUM_SEGMENTS_PER_SEQ": segments}, {})]
                label = name if hip else f"sm_{name}"
                for kernel, fn, extra, options in runs:
                    print(head_dim, group, label, kernel, compile_one(fn, {**tiles, **extra}, target, **options))
    return 0


if __name__ == "__main__":
    sys.exit(main())
