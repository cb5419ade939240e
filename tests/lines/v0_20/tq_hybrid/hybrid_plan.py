"""Plan the KV cache of a hybrid GDN + attention model the way vLLM 0.20 does, with a tree's own code.

The steps, each taken from the tree (``tree_exec``), with stand-ins only for what the model and the
GPU would provide:

1. ``Platform._align_hybrid_block_size`` (plus ``Platform._turboquant_attn_page_size_1_token`` where the
   tree has it): picks the attention block size and pads the mamba page (``update_block_size_for_backend``
   runs it after the model is built). The model's layers are stand-ins whose ``get_kv_cache_spec`` is the
   tree's ``Attention.get_kv_cache_spec``; each layer's cache dtype follows ``Attention.__init__``: a layer
   whose index is in ``kv_cache_dtype_skip_layers`` keeps the model dtype ("auto").
2. The KV cache specs: the attention layers' own, and the ``MambaSpec`` that ``MambaBase.get_kv_cache_spec``
   builds from the GDN state shapes (``MambaStateShapeCalculator.gated_delta_net_state_shape``).
3. ``kv_cache_utils.get_kv_cache_groups``: the grouping and page-size unification the engine runs.

``check_layout`` then does the model runner's arithmetic (``_reshape_kv_cache_tensors``): each layer's
view of a shared KV cache tensor, with the kernel block size ``select_common_block_size`` picks and the
backends' own ``get_kv_cache_shape``.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
from tree_exec import Placeholder, exec_function, exec_module, has_function

from vllm_tree import load_module

INTERFACE = "vllm/platforms/interface.py"
ATTENTION = "vllm/model_executor/layers/attention/attention.py"
KV_CACHE_UTILS = "vllm/v1/core/kv_cache_utils.py"
WORKER_UTILS = "vllm/v1/worker/utils.py"
FLASH_ATTN = "vllm/v1/attention/backends/flash_attn.py"
TURBOQUANT_ATTN = "vllm/v1/attention/backends/turboquant_attn.py"
KV_CACHE_INTERFACE = "vllm/v1/kv_cache_interface.py"

log = logging.getLogger("test.tq_hybrid")


class MultipleOf:
    """Stands in for ``vllm.v1.attention.backend.MultipleOf``."""

    def __init__(self, base: int) -> None:
        self.base = base


@dataclass(frozen=True)
class Model:
    """A hybrid model: layer pattern, attention geometry, GDN geometry (the fields Qwen3-Next reads)."""

    layer_types: tuple[str, ...]
    num_kv_heads: int = 2
    head_dim: int = 128
    dtype: torch.dtype = torch.bfloat16
    linear_num_key_heads: int = 4
    linear_num_value_heads: int = 8
    linear_key_head_dim: int = 64
    linear_value_head_dim: int = 64
    linear_conv_kernel_dim: int = 4
    max_model_len: int = 4096

    @classmethod
    def from_hf(cls, hf, **kw) -> Model:
        return cls(layer_types=tuple(hf.layer_types), num_kv_heads=hf.num_key_value_heads, head_dim=hf.head_dim,
                   linear_num_key_heads=hf.linear_num_key_heads, linear_num_value_heads=hf.linear_num_value_heads,
                   linear_key_head_dim=hf.linear_key_head_dim, linear_value_head_dim=hf.linear_value_head_dim,
                   linear_conv_kernel_dim=hf.linear_conv_kernel_dim, **kw)

    def gdn_state(self, num_spec: int, ssm_dtype: torch.dtype | None) -> tuple[tuple[tuple[int, ...], ...], tuple]:
        conv_dim = self.linear_key_head_dim * self.linear_num_key_heads * 2 + \
            self.linear_value_head_dim * self.linear_num_value_heads
        shapes = ((self.linear_conv_kernel_dim - 1 + num_spec, conv_dim),
                  (self.linear_num_value_heads, self.linear_value_head_dim, self.linear_key_head_dim))
        return shapes, (self.dtype, ssm_dtype or self.dtype)


@dataclass
class Backend:
    name: str
    ssm: bool = False
    sizes: list = field(default_factory=list)

    def is_ssm(self) -> bool:
        return self.ssm

    def get_supported_kernel_block_sizes(self) -> list:
        return list(self.sizes)


class Layer:
    """An attention or GDN layer as ``static_forward_context`` holds it."""

    def __init__(self, prefix: str, backend: Backend, get_kv_cache_spec=None, **attrs: Any) -> None:
        self.layer_name = prefix
        self.backend = backend
        self._get_kv_cache_spec = get_kv_cache_spec
        self.__dict__.update(attrs)

    def get_attn_backend(self) -> Backend:
        return self.backend

    def get_kv_cache_spec(self, vllm_config):
        return self._get_kv_cache_spec(self, vllm_config)


@dataclass
class Plan:
    vllm_config: Any
    layers: dict[str, Layer]
    specs: dict[str, Any]
    groups: list
    kv: ModuleType
    kvu: ModuleType
    select_common_block_size: Any
    shapes: dict[str, Any]


def _fakes(model: Model, vllm_config, num_spec: int, ssm_dtype) -> dict[str, ModuleType]:
    def mod(name: str, **attrs: Any) -> ModuleType:
        m = Placeholder(name)  # other names a file imports from it: empty classes
        m.__dict__.update(attrs)
        return m

    class GDNModel:
        @staticmethod
        def get_mamba_state_shape_from_config(cfg):
            return model.gdn_state(num_spec, ssm_dtype)[0]

        @staticmethod
        def get_mamba_state_dtype_from_config(cfg):
            return model.gdn_state(num_spec, ssm_dtype)[1]

    registry = SimpleNamespace(resolve_model_cls=lambda arch, model_config=None: (GDNModel, arch))
    return {
        "vllm.config.vllm": mod(
            "vllm.config.vllm",
            set_current_vllm_config=lambda cfg, *a, **k: contextlib.nullcontext(),
            get_layers_from_vllm_config=lambda cfg, layer_type, layer_names=None: dict(
                cfg.compilation_config.static_forward_context),
        ),
        "vllm.model_executor.models": mod("vllm.model_executor.models", ModelRegistry=registry),
        "vllm.v1.attention.backend": mod("vllm.v1.attention.backend", MultipleOf=MultipleOf,
                                         AttentionType=SimpleNamespace(DECODER="decoder")),
        "vllm.model_executor.layers.attention_layer_base": mod("vllm.model_executor.layers.attention_layer_base",
                                                               AttentionLayerBase=Layer),
    }


def plan(tree: Path, model: Model, cache_dtype: str, skip_layers: list[str], *, num_spec: int = 0,
         ssm_dtype: torch.dtype | None = None, block_size: int = 16, stage: range | None = None) -> Plan:
    """The KV cache groups the tree's engine would make for ``model`` (raises what the tree raises).

    ``stage``: the layer indices this worker holds (a pipeline-parallel stage), default all.
    """
    kv = load_module(tree, KV_CACHE_INTERFACE)
    torch_utils = load_module(tree, "vllm/utils/torch_utils.py")

    model_config = SimpleNamespace(
        use_mla=False, dtype=model.dtype, architecture="Qwen3NextForCausalLM", max_model_len=model.max_model_len,
        is_hybrid=True, get_num_kv_heads=lambda pc: model.num_kv_heads, get_head_size=lambda: model.head_dim,
        get_mamba_chunk_size=lambda: None,
    )
    cache_config = SimpleNamespace(
        cache_dtype=cache_dtype, block_size=block_size, user_specified_block_size=False,
        # mamba_cache_mode "none" (no prefix caching, the default for hybrids): MambaModelConfig sets
        # mamba_block_size to max_model_len.
        mamba_cache_mode="none", mamba_block_size=model.max_model_len, user_specified_mamba_block_size=False,
        mamba_page_size_padded=None, kv_cache_dtype_skip_layers=list(skip_layers),
        mamba_cache_dtype="auto", mamba_ssm_cache_dtype="float32" if ssm_dtype == torch.float32 else "auto",
    )
    layers: dict[str, Layer] = {}
    vllm_config = SimpleNamespace(
        model_config=model_config, cache_config=cache_config, parallel_config=SimpleNamespace(tensor_parallel_size=1),
        compilation_config=SimpleNamespace(static_forward_context=layers),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        speculative_config=SimpleNamespace(num_speculative_tokens=num_spec) if num_spec else None,
    )
    fakes = _fakes(model, vllm_config, num_spec, ssm_dtype)

    # Attention.get_kv_cache_spec as the tree has it.
    attn_ns = exec_function(tree, ATTENTION, ["Attention.get_kv_cache_spec"], fakes, extra={
        "AttentionType": SimpleNamespace(DECODER="decoder"), "VllmConfig": object, "KVCacheSpec": kv.KVCacheSpec,
        "FullAttentionSpec": kv.FullAttentionSpec, "SlidingWindowSpec": kv.SlidingWindowSpec,
        "get_kv_quant_mode": kv.get_kv_quant_mode,
    })
    get_spec = attn_ns["get_kv_cache_spec"]

    # FlashAttention (model-dtype layers) and TurboQuant backends; FA's sizes as FlashAttentionBackend gives
    # them for a hybrid model (fixed sizes when a mamba state is float32).
    fp32_state = ssm_dtype == torch.float32
    fa = Backend("FLASH_ATTN", sizes=[16, 32, 64] if fp32_state else [MultipleOf(16)])
    tq = Backend("TURBOQUANT", sizes=[16, 32, 64, 128])
    gdn = Backend("GDN_ATTN", ssm=True)
    shape_ns = exec_function(tree, FLASH_ATTN, ["FlashAttentionBackend.get_kv_cache_shape"])
    fa.get_kv_cache_shape = shape_ns["get_kv_cache_shape"]
    tq.get_kv_cache_shape = exec_function(tree, TURBOQUANT_ATTN, ["TurboQuantAttentionBackend.get_kv_cache_shape"],
                                          fakes)["get_kv_cache_shape"]

    for i, layer_type in enumerate(model.layer_types):
        if stage is not None and i not in stage:
            continue
        if layer_type == "linear_attention":
            layers[f"model.layers.{i}.linear_attn"] = Layer(f"model.layers.{i}.linear_attn", gdn)
            continue
        # Attention.__init__: a skipped layer keeps the model dtype.
        layer_dtype = "auto" if str(i) in cache_config.kv_cache_dtype_skip_layers else cache_dtype
        prefix = f"model.layers.{i}.self_attn.attn"
        layers[prefix] = Layer(
            prefix, tq if layer_dtype.startswith("turboquant_") else fa, get_spec,
            attn_type="decoder", kv_cache_dtype=layer_dtype, sliding_window=None, num_kv_heads=model.num_kv_heads,
            head_size=model.head_dim, head_size_v=model.head_dim,
            kv_cache_torch_dtype=torch_utils.kv_cache_dtype_str_to_dtype(layer_dtype, model_config),
        )

    # Platform.update_block_size_for_backend, phase 2 (phase 1 keeps 16 for FlashAttention and TurboQuant).
    names = ["Platform._align_hybrid_block_size"]
    if has_function(tree, INTERFACE, "Platform._turboquant_attn_page_size_1_token"):
        names.append("Platform._turboquant_attn_page_size_1_token")
    platform_ns = exec_function(tree, INTERFACE, names, fakes, extra={"logger": log})
    platform = type("Platform", (), {n.split(".")[-1]: classmethod(platform_ns[n.split(".")[-1]]) for n in names})
    backend_cls = next(layer.backend for layer in layers.values() if not layer.backend.is_ssm())
    platform._align_hybrid_block_size(vllm_config, backend_cls)

    # The specs the model runner collects (get_kv_cache_spec), the mamba one as MambaBase builds it.
    shapes, dtypes = model.gdn_state(num_spec, ssm_dtype)
    specs: dict[str, Any] = {}
    for name, layer in layers.items():
        if layer.backend.is_ssm():
            specs[name] = kv.MambaSpec(shapes=shapes, dtypes=dtypes, block_size=cache_config.mamba_block_size,
                                       page_size_padded=cache_config.mamba_page_size_padded, mamba_type="gdn_attention",
                                       mamba_cache_mode=cache_config.mamba_cache_mode, num_speculative_blocks=num_spec)
        else:
            specs[name] = layer.get_kv_cache_spec(vllm_config)

    kvu = exec_module(tree, KV_CACHE_UTILS)
    assert kvu.FullAttentionSpec is kv.FullAttentionSpec  # one kv_cache_interface for specs and planner
    groups = kvu.get_kv_cache_groups(vllm_config, dict(specs))
    select = exec_function(tree, WORKER_UTILS, ["select_common_block_size"],
                           extra={"MultipleOf": MultipleOf, "AttentionBackend": object})["select_common_block_size"]
    return Plan(vllm_config, layers, specs, groups, kv, kvu, select, {"FLASH_ATTN": fa, "TURBOQUANT": tq})


def check_layout(p: Plan, num_blocks: int = 3) -> dict[str, dict[str, int]]:
    """The model runner's view of each layer on a shared tensor of ``num_blocks`` pages; asserts it fits.

    Returns, per layer, the group block size, the kernel block size and the bytes per token.
    """
    kv = p.kv
    page = p.kvu.get_uniform_page_size([g.kv_cache_spec for g in p.groups])
    sizes = {len(g.layer_names) for g in p.groups}
    assert len(sizes) == 1, f"groups of different sizes {sizes}: one tensor per position would not work"
    tensor_bytes = page * num_blocks
    out: dict[str, dict[str, int]] = {}
    for group in p.groups:
        spec = group.kv_cache_spec
        for name in group.layer_names:
            layer = p.layers[name]
            assert tensor_bytes % spec.page_size_bytes == 0
            if isinstance(spec, kv.AttentionSpec):
                assert spec.page_size_padded is None, f"{name}: attention page padded"
                kernel_bs = p.select_common_block_size(spec.block_size, [layer.backend])
                assert spec.block_size % kernel_bs == 0
                kernel_blocks = num_blocks * (spec.block_size // kernel_bs)
                shape = layer.backend.get_kv_cache_shape(kernel_blocks, kernel_bs, spec.num_kv_heads, spec.head_size,
                                                         cache_dtype_str=p.vllm_config.cache_config.cache_dtype)
                view_bytes = math.prod(shape) * spec.dtype.itemsize
                assert view_bytes == tensor_bytes, f"{name}: view {shape} of {spec.dtype} != {tensor_bytes} bytes"
                out[name] = {"block_size": spec.block_size, "kernel_block_size": kernel_bs,
                             "bytes_per_token": spec.page_size_bytes // spec.block_size}
            else:
                assert isinstance(spec, kv.MambaSpec)
                offset = 0
                for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True):
                    assert page % dtype.itemsize == 0
                    assert offset % dtype.itemsize == 0
                    offset += math.prod(shape) * dtype.itemsize
                assert offset <= page, f"{name}: mamba state {offset} > page {page}"
                out[name] = {"block_size": spec.block_size, "state_bytes": offset}
    return out
