"""The GDN layers' chunked prefill is inside vLLM's memory profile.

vLLM's profile run passes no attention metadata, so each GDN layer returns before its chunked prefill and only
warms its kernels up (``_warmup_prefill_kernels``). The release warms them up on one chunk of 64 tokens: the
scratch a real prefill step of ``max_num_batched_tokens`` allocates (above all the per-chunk states, about
24 KiB a token for Qwen3.6's 48 value heads of 128: 192 MiB at 8,192 tokens, and as much again in the chunk
kernels' other temporaries) is never in the peak the profile measures, and comes out of the KV cache's headroom
at the first long prompt (on a 24 GB card at 0.97, a 32k prompt runs out of memory in ``chunk_delta_h``). The
line runs the warm-up at the profile's own token count.

The check: every allocation the warm-up makes when the profile hands it N tokens, against those a real prefill
step of N tokens makes through the same kernels (the tree's ``fused_post_conv_prep`` and FLA's
``chunk_gated_delta_rule``, the layer's native prefill), counted by a dispatch mode on CPU. The kernels themselves
are not launched: what they compute is not under test, and every buffer is allocated by their Python wrappers.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime.jit import KernelInterface

import vllm_tree

pytestmark = pytest.mark.patch("gdn-count-the-chunked-prefill-in-the-memory-profile")

GDN = "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py"
FLA_OPS = ("vllm/third_party/flash_linear_attention/ops/", "vllm/model_executor/layers/fla/ops/")  # 0.26+, 0.25
HK, HV, DK, DV = 1, 2, 16, 16  # the GDN geometry, small for the interpreter
TOKENS = 256  # the profile run's token count: four chunks


def _ops(tree: Path, name: str):
    rel = next(d for d in FLA_OPS if (tree / d).is_dir()) + name
    return vllm_tree.load_module(tree, rel)


class _Allocations(TorchDispatchMode):
    """The bytes of every tensor an aten op returns on storage none of its inputs holds: a new allocation."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in (*args, *(kwargs or {}).values())
                  if isinstance(a, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.sizes.append(t.untyped_storage().nbytes())
        return out


def _layer(tree: Path):
    """The attributes ``_warmup_prefill_kernels`` reads, its chunked prefill FLA's native one (what the layer's
    ChunkGatedDeltaRule runs on the Triton backend)."""
    chunk = _ops(tree, "chunk.py").chunk_gated_delta_rule

    def native(aiter_prefill_metadata=None, **kwargs):
        return chunk(**kwargs)

    g = torch.Generator().manual_seed(0)
    return SimpleNamespace(
        _prefill_kernels_warmed_up=False, _exports_checkpoints=False, num_k_heads=HK, num_v_heads=HV, tp_size=1,
        head_k_dim=DK, head_v_dim=DV, A_log=torch.randn(HV, generator=g), dt_bias=torch.randn(HV, generator=g),
        get_state_dtype=lambda: (torch.float32, torch.float32), gdn_prefill_backend="triton",
        chunk_gated_delta_rule=native, prefix="model.layers.0.linear_attn")


def _warmup(tree: Path):
    fla = _ops(tree, "utils.py")
    return vllm_tree.load_function(
        tree, GDN, "QwenGatedDeltaNetAttention._warmup_prefill_kernels", torch=torch, FLA_CHUNK_SIZE=fla.FLA_CHUNK_SIZE,
        fused_post_conv_prep=_ops(tree, "fused_gdn_prefill_post_conv.py").fused_post_conv_prep,
        logger=logging.getLogger("gdn-test"), rocm_aiter_ops=None, current_workspace_manager=None)


def _prefill_step(tree: Path, layer, conv_output: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """What the layer's prefill does with one request's tokens after the convolution."""
    prep = _ops(tree, "fused_gdn_prefill_post_conv.py").fused_post_conv_prep
    q, k, v, g, beta = prep(conv_output=conv_output, a=a, b=b, A_log=layer.A_log, dt_bias=layer.dt_bias,
                            num_k_heads=HK, head_k_dim=DK, head_v_dim=DV, apply_l2norm=True, output_g_exp=False)
    state = torch.zeros(1, HV, DV, DK)
    layer.chunk_gated_delta_rule(q=q.unsqueeze(0), k=k.unsqueeze(0), v=v.unsqueeze(0), g=g.unsqueeze(0),
                                 beta=beta.unsqueeze(0), initial_state=state, output_final_state=True,
                                 cu_seqlens=torch.tensor([0, conv_output.shape[0]], dtype=torch.int32),
                                 use_qk_l2norm_in_kernel=False)


def test_the_profile_warm_up_allocates_what_a_prefill_step_of_its_tokens_does(v033_tree, monkeypatch):
    if not torch.accelerator.is_available():
        monkeypatch.setattr(torch.accelerator, "empty_cache", lambda: None)  # no device cache to release
    # Only the allocations are under test, and the wrappers around the kernels make them all: each kernel launch is
    # skipped (chunk_delta_h's loop index is a Python int under the interpreter, which the kernel cannot run on).
    monkeypatch.setattr(KernelInterface, "__getitem__", lambda self, grid: lambda *args, **kwargs: None)
    width = 2 * HK * DK + HV * DV
    projections = torch.randn(TOKENS, width, dtype=torch.bfloat16)  # the profile run's mixed_qkv
    layer = _layer(v033_tree)
    warmup = _warmup(v033_tree)
    with _Allocations() as profiled:
        warmup(layer, projections, 0)
    assert layer._prefill_kernels_warmed_up

    g = torch.Generator().manual_seed(1)
    conv_output = torch.randn(TOKENS, width, generator=g).to(torch.bfloat16)
    a, b = (torch.randn(TOKENS, HV, generator=g).to(torch.bfloat16) for _ in range(2))
    with _Allocations() as served:
        _prefill_step(v033_tree, _layer(v033_tree), conv_output, a, b)

    assert max(profiled.sizes) >= max(served.sizes), (
        f"the profile's GDN warm-up allocates at most {max(profiled.sizes):,} B at once, a prefill step of the "
        f"profile's {TOKENS} tokens {max(served.sizes):,} B: the memory profile does not see the prefill's scratch")
    assert sum(profiled.sizes) >= sum(served.sizes), (
        f"the profile's GDN warm-up allocates {sum(profiled.sizes):,} B in all, a prefill step of the profile's "
        f"{TOKENS} tokens {sum(served.sizes):,} B: the memory profile does not see the prefill's scratch")
