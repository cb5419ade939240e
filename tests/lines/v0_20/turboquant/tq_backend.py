"""Run vLLM's TurboQuant attention backend (``turboquant_attn.py``) of a source tree without importing vllm.

The backend module is executed from the tree's file with its own ``__import__``: the Triton kernel modules
and the TurboQuant config are the tree's real files (loaded through ``vllm_tree``); the modules it needs
from the rest of vLLM (config, the attention base classes, flash-attn helpers, batch splitting) are
small stand-ins written here from v0.20.0's behaviour. The impl's ``forward`` and the metadata builder
then run for real on CPU (kernels interpreted) or on a GPU.

``DeviceTensor`` marks the tensors vLLM keeps in GPU memory (``seq_lens``, ``query_start_loc``, the
block table): inside ``no_host_reads()`` any host read of them (``.tolist()``, ``.item()``, ``int()``,
``.cpu()``...), a GPU->CPU sync on a GPU, raises ``HostSync``. Kernel launches receive plain tensors.
"""

from __future__ import annotations

import builtins
import contextlib
import enum
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, ClassVar, Generic, TypeVar

import torch
import torch.nn.functional as F

from helpers import VllmLogger
from vllm_tree import load_module

BACKEND = "vllm/v1/attention/backends/turboquant_attn.py"
DECODE = "vllm/v1/attention/ops/triton_turboquant_decode.py"
STORE = "vllm/v1/attention/ops/triton_turboquant_store.py"
VERIFY = "vllm/v1/attention/ops/triton_turboquant_verify.py"
TQ_CONFIG = "vllm/model_executor/layers/quantization/turboquant/config.py"

_real_import = builtins.__import__


# ---------------------------------------------------------------------------
# Host-read detection
# ---------------------------------------------------------------------------


class HostSync(AssertionError):
    """A device tensor was read on the host (a GPU->CPU sync on a GPU)."""


_detect = [False]
_HOST_READS = {
    torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.__int__,
    torch.Tensor.__float__, torch.Tensor.__bool__, torch.Tensor.__index__,
}


def _to_cpu(args, kwargs) -> bool:
    targets = [*args[1:], kwargs.get("device")]
    return any(isinstance(t, (str, torch.device)) and torch.device(t).type == "cpu" for t in targets)


class DeviceTensor(torch.Tensor):
    """A tensor standing for GPU memory: results computed from it are DeviceTensors too."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _detect[0] and (func in _HOST_READS or (func is torch.Tensor.to and _to_cpu(args, kwargs))):
            name = getattr(func, "__name__", str(func))
            raise HostSync(f"host read of a device tensor: Tensor.{name} (a GPU->CPU sync)")
        return super().__torch_function__(func, types, args, kwargs)


def on_device(t: torch.Tensor) -> DeviceTensor:
    return t.as_subclass(DeviceTensor)


def plain(x: Any) -> Any:
    return x.as_subclass(torch.Tensor) if isinstance(x, DeviceTensor) else x


@contextlib.contextmanager
def _detecting(on: bool):
    prev, _detect[0] = _detect[0], on
    try:
        yield
    finally:
        _detect[0] = prev


def no_host_reads():
    """Within it, a host read of a device tensor raises HostSync."""
    return _detecting(True)


def _kernel_side():
    """Within it (the kernels' stand-ins), host reads are allowed again."""
    return _detecting(False)


# ---------------------------------------------------------------------------
# Stand-ins for the parts of vLLM the backend imports
# ---------------------------------------------------------------------------


class AttentionCGSupport(enum.Enum):
    ALWAYS = 3
    UNIFORM_BATCH = 2
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    NEVER = 0


class CUDAGraphMode(enum.Enum):
    """The two facts the backend may ask about the resolved mode."""

    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_AND_PIECEWISE = 3

    def has_full_cudagraphs(self) -> bool:
        return self in (CUDAGraphMode.FULL, CUDAGraphMode.FULL_AND_PIECEWISE)


M = TypeVar("M")


class AttentionMetadataBuilder(Generic[M]):
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER
    reorder_batch_threshold: int | None = None
    supports_update_block_table: bool = False

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        self.kv_cache_spec, self.layer_names, self.vllm_config, self.device = (
            kv_cache_spec, layer_names, vllm_config, device)

    @classmethod
    def get_cudagraph_support(cls, vllm_config, kv_cache_spec) -> AttentionCGSupport:
        return cls._cudagraph_support

    def _init_reorder_batch_threshold(self, reorder_batch_threshold=1, supports_spec_as_decode=False,
                                      supports_dcp_with_varlen=False) -> None:
        self.reorder_batch_threshold = reorder_batch_threshold


class AttentionImpl(Generic[M]):
    pass


@dataclass
class CommonAttentionMetadata:
    """v0.20's fields that the TurboQuant builder reads."""

    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_table_tensor: torch.Tensor
    slot_mapping: torch.Tensor
    causal: bool = True
    seq_lens_cpu_upper_bound: torch.Tensor | None = None
    _seq_lens_cpu: torch.Tensor | None = None


def split_decodes_and_prefills(cam: CommonAttentionMetadata, decode_threshold: int = 1) -> tuple[int, int, int, int]:
    """v0.20's split for a reordered batch (decodes first), from the CPU query_start_loc."""
    if cam.max_query_len <= decode_threshold:
        return cam.num_reqs, 0, cam.num_actual_tokens, 0
    qsl = cam.query_start_loc_cpu
    query_lens = qsl[1:] - qsl[:-1]
    is_prefill = query_lens > decode_threshold
    if not bool(is_prefill.any()):
        return cam.num_reqs, 0, cam.num_actual_tokens, 0
    first = int(is_prefill.int().argmax())
    return first, cam.num_reqs - first, int(qsl[first]), cam.num_actual_tokens - int(qsl[first])


def flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                      fa_version=None):
    """flash_attn_varlen_func's result: per sequence, causal attention aligned at the bottom right."""
    assert causal
    cq, ck = plain(cu_seqlens_q).tolist(), plain(cu_seqlens_k).tolist()
    out = torch.zeros_like(q)
    for i in range(len(cq) - 1):
        qs, qe, ks, ke = cq[i], cq[i + 1], ck[i], ck[i + 1]
        if qe == qs:
            continue
        lq, lk = qe - qs, ke - ks
        mask = torch.arange(lk, device=q.device)[None, :] <= (lk - lq + torch.arange(lq, device=q.device))[:, None]
        o = F.scaled_dot_product_attention(
            q[qs:qe].transpose(0, 1).float(), k[ks:ke].transpose(0, 1).float(), v[ks:ke].transpose(0, 1).float(),
            attn_mask=mask, scale=softmax_scale, enable_gqa=True)
        out[qs:qe] = o.transpose(0, 1).to(q.dtype)
    return out


def _stub(name: str, **attrs) -> ModuleType:
    module = ModuleType(name)
    module.__dict__.update(attrs)
    return module


class _Settings:
    """What the stand-in ``get_current_vllm_config()`` returns; tests adjust it before creating an impl."""

    def __init__(self) -> None:
        self.kv_splits = 32
        self.cudagraph_mode: CUDAGraphMode | None = None
        self.num_speculative_tokens: int | None = None
        self.attention_kernel = "multi_query"  # $VLLM_TURBOQUANT_ATTENTION_KERNEL (patch 0007; its default)

    def vllm_config(self) -> SimpleNamespace:
        spec = None if self.num_speculative_tokens is None else \
            SimpleNamespace(num_speculative_tokens=self.num_speculative_tokens)
        return SimpleNamespace(
            attention_config=SimpleNamespace(tq_max_kv_splits_for_cuda_graph=self.kv_splits),
            compilation_config=SimpleNamespace(cudagraph_mode=self.cudagraph_mode),
            cache_config=SimpleNamespace(block_size=16),
            model_config=SimpleNamespace(dtype=torch.bfloat16),
            speculative_config=spec)


SETTINGS = _Settings()


class _Envs(ModuleType):
    """``vllm.envs``: the variables the backend reads, from SETTINGS when an impl is created."""

    @property
    def VLLM_TURBOQUANT_ATTENTION_KERNEL(self) -> str:  # noqa: N802 (vLLM's name)
        return SETTINGS.attention_kernel


class _Launch:
    """Wraps a kernel launcher or ``kernel[grid]``: counts launches, hands the kernel plain tensors."""

    def __init__(self, fn, calls: list, kv_splits: int | None = None) -> None:
        self.fn, self.calls, self.kv_splits = fn, calls, kv_splits

    def __call__(self, *args, **kwargs):
        args = tuple(plain(a) for a in args)
        kwargs = {k: plain(v) for k, v in kwargs.items()}
        if self.kv_splits is not None:
            kwargs["max_num_kv_splits"] = self.kv_splits
        self.calls.append(kwargs)
        with _kernel_side():
            return self.fn(*args, **kwargs)

    def __getitem__(self, grid):
        return _Launch(self.fn[grid], self.calls)


def load_backend(tree: Path, *, flash: bool) -> ModuleType:
    """The tree's ``turboquant_attn`` module, flash-attn present (the stand-in above) or not.

    Every call gives a fresh module (``_HAS_FLASH_ATTN`` is fixed when it runs); kernel modules are shared.
    """
    tree = Path(tree).resolve()
    stubs = {
        "vllm.config": _stub("vllm.config", get_current_vllm_config=SETTINGS.vllm_config),
        "vllm.config.cache": _stub("vllm.config.cache", CacheDType=str),
        "vllm.triton_utils": _stub("vllm.triton_utils", triton=__import__("triton"),
                                   tl=__import__("triton.language").language),
        "vllm.v1.attention.backend": _stub(
            "vllm.v1.attention.backend", AttentionBackend=type("AttentionBackend", (), {}),
            AttentionCGSupport=AttentionCGSupport, AttentionImpl=AttentionImpl,
            AttentionLayer=torch.nn.Module, AttentionMetadata=type("AttentionMetadata", (), {}),
            AttentionMetadataBuilder=AttentionMetadataBuilder,
            AttentionType=SimpleNamespace(DECODER="decoder"), CommonAttentionMetadata=CommonAttentionMetadata,
            MultipleOf=type("MultipleOf", (), {})),
        "vllm.v1.attention.backends.fa_utils": _stub(
            "vllm.v1.attention.backends.fa_utils", get_flash_attn_version=lambda head_size=None: None,
            is_flash_attn_varlen_func_available=lambda: flash, flash_attn_varlen_func=flash_attn_varlen),
        "vllm.v1.attention.backends.utils": _stub(
            "vllm.v1.attention.backends.utils", split_decodes_and_prefills=split_decodes_and_prefills),
        "vllm.v1.attention.ops.triton_turboquant_decode": load_module(tree, DECODE),
        "vllm.v1.attention.ops.triton_turboquant_store": load_module(tree, STORE),
        "vllm.model_executor.layers.quantization.turboquant.config": load_module(tree, TQ_CONFIG),
        "vllm.envs": _Envs("vllm.envs"),
        "vllm.logger": _stub("vllm.logger", init_logger=VllmLogger.named),
    }
    if (tree / VERIFY).is_file():
        stubs["vllm.v1.attention.ops.triton_turboquant_verify"] = load_module(tree, VERIFY)

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and (name == "vllm" or name.startswith("vllm.")):
            if name not in stubs:
                raise ImportError(f"the TurboQuant test harness provides no {name}")
            if not fromlist and name == "vllm.envs":  # import vllm.envs as envs: the package, then .envs
                return _stub("vllm", envs=stubs[name])
            return stubs[name]
        return _real_import(name, globals, locals, fromlist, level)

    path = tree / BACKEND
    digest = hashlib.sha1(f"{path}:{flash}".encode()).hexdigest()[:12]
    module = ModuleType(f"_tq_backend_{digest}")
    module.__file__ = str(path)
    module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": _import}
    sys.modules[module.__name__] = module  # dataclasses look the module up
    exec(compile(path.read_bytes(), str(path), "exec", dont_inherit=True), module.__dict__)
    return module


def instrument(module: ModuleType, kv_splits: int | None = None) -> list:
    """Count the backend's decode launches (forcing ``kv_splits`` splits when given); returns the call log.

    The multi-query verify launches (patch 0007) are logged in ``module.mq_calls``."""
    calls: list = []
    module.triton_turboquant_decode_attention = _Launch(module.triton_turboquant_decode_attention, calls, kv_splits)
    module._tq_full_dequant_kv = _Launch(module._tq_full_dequant_kv, [])
    module.mq_calls = []
    if hasattr(module, "triton_turboquant_mq_verify_attention"):
        module.triton_turboquant_mq_verify_attention = _Launch(module.triton_turboquant_mq_verify_attention,
                                                               module.mq_calls)
    return calls
