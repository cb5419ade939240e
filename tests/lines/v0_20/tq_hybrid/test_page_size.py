"""KV cache pages of a hybrid GDN + attention model with a TurboQuant cache.

vLLM gives every KV cache group of a hybrid model one page size: the mamba (GDN) state page is padded
to the attention page, and ``unify_kv_cache_spec_page_size`` may scale a group's block size by a whole
factor. With TurboQuant, quantized layers store ``slot_size_aligned`` bytes per KV head and token, the
boundary layers it skips store K and V in the model dtype, and the release sizes the attention page
with neither (the FullAttentionSpec formula fed the uint8 dtype, 2 * head_size bytes per head). The
engine then fails to unify the pages (NotImplementedError). The patched planner aligns with the lcm
of the real per-token sizes, so every layer's page is exactly the common page.

Each plan runs the tree's own ``_align_hybrid_block_size``, ``Attention.get_kv_cache_spec``,
``get_kv_cache_groups`` and backend ``get_kv_cache_shape`` (see ``hybrid_plan``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import transformers
from hybrid_plan import Model, check_layout, plan

from harness.models import QWEN3_NEXT12  # the model of GPU scenario b-tq-hybrid-gdn

pytestmark = pytest.mark.patch("turboquant-on-hybrid-attention-gdn-models")

QWEN3_NEXT = Model.from_hf(transformers.Qwen3NextConfig(**QWEN3_NEXT12.config))
BOUNDARY = ["1", "3", "9", "11"]  # the skip list create_engine_config makes for it (test_engine_args)


def test_qwen3_next_12_turboquant_k8v4(patched_tree: Path) -> None:
    """The GPU scenario's model: every layer fits the common page, attention pages unpadded."""
    p = plan(patched_tree, QWEN3_NEXT, "turboquant_k8v4", BOUNDARY)
    layout = check_layout(p)
    tq_layers = {n for n, layer in p.layers.items() if layer.backend.name == "TURBOQUANT"}
    fa_layers = {n for n, layer in p.layers.items() if layer.backend.name == "FLASH_ATTN"}
    assert tq_layers == {f"model.layers.{i}.self_attn.attn" for i in (5, 7)}
    assert fa_layers == {f"model.layers.{i}.self_attn.attn" for i in (1, 3, 9, 11)}
    # k8v4 at head_dim 128: 128 B fp8 key + 64 B of 4-bit values + 4 B scale/zero = 196 B per KV head;
    # bf16 K and V: 512 B per KV head.
    heads, dim = QWEN3_NEXT.num_kv_heads, QWEN3_NEXT.head_dim
    tq_bytes = heads * (dim + dim // 2 + 4)
    fa_bytes = heads * 2 * dim * 2
    assert {layout[n]["bytes_per_token"] for n in tq_layers} == {tq_bytes}
    assert {layout[n]["bytes_per_token"] for n in fa_layers} == {fa_bytes}
    page = p.kvu.get_uniform_page_size([g.kv_cache_spec for g in p.groups])
    assert page == p.vllm_config.cache_config.mamba_page_size_padded
    assert page % math.lcm(tq_bytes, fa_bytes) == 0
    # Each layer kind sits in its own KV cache groups.
    kinds = [{p.layers[n].backend.name for n in g.layer_names} for g in p.groups]
    assert all(len(k) == 1 for k in kinds)


PRESETS = ["turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize(("head_dim", "kv_heads"), [(128, 2), (256, 2), (64, 4), (256, 1)])
@pytest.mark.parametrize("num_spec", [0, 3])
def test_presets_and_geometries_fit(patched_tree: Path, preset: str, head_dim: int, kv_heads: int,
                                    num_spec: int) -> None:
    model = Model(layer_types=QWEN3_NEXT.layer_types, head_dim=head_dim, num_kv_heads=kv_heads)
    check_layout(plan(patched_tree, model, preset, BOUNDARY, num_spec=num_spec))


@pytest.mark.parametrize("preset", ["turboquant_k8v4", "turboquant_3bit_nc"])
def test_float32_ssm_state_fits(patched_tree: Path, preset: str) -> None:
    """A float32 SSM state (``--mamba-ssm-cache-dtype float32``): FlashAttention then only takes 16/32/64."""
    check_layout(plan(patched_tree, QWEN3_NEXT, preset, BOUNDARY, ssm_dtype=torch.float32))


def test_all_attention_layers_quantized(patched_tree: Path) -> None:
    """Empty skip list (a hybrid with a single attention layer): one attention size, block size unscaled."""
    p = plan(patched_tree, QWEN3_NEXT, "turboquant_k8v4", [])
    layout = check_layout(p)
    attn = [info for name, info in layout.items() if "self_attn" in name]
    assert {info["bytes_per_token"] for info in attn} == {QWEN3_NEXT.num_kv_heads * (3 * QWEN3_NEXT.head_dim // 2 + 4)}
    assert {info["block_size"] for info in attn} == {p.vllm_config.cache_config.block_size}


def test_skip_list_naming_only_gdn_layers(patched_tree: Path) -> None:
    """A skip list without attention layers (user-given GDN indices) still fits: the planner cannot tell
    which layers (an MTP drafter's included) will keep the model dtype, so it allows for both sizes."""
    check_layout(plan(patched_tree, QWEN3_NEXT, "turboquant_k8v4", ["0", "2"]))


@pytest.mark.parametrize("preset", ["turboquant_k8v4", "turboquant_3bit_nc"])
def test_pipeline_stages_align_alike(patched_tree: Path, preset: str) -> None:
    """The engine groups the KV cache specs of all pipeline stages together, so every stage must pick the
    same block size and mamba padding, whichever attention layers (skipped or quantized) it holds."""
    whole = plan(patched_tree, QWEN3_NEXT, preset, BOUNDARY)
    for stage in (range(0, 4), range(4, 8), range(8, 12)):  # FA only, TQ only, FA only
        part = plan(patched_tree, QWEN3_NEXT, preset, BOUNDARY, stage=stage)
        for attr in ("block_size", "mamba_page_size_padded"):
            assert getattr(part.vllm_config.cache_config, attr) == getattr(whole.vllm_config.cache_config, attr)
        assert {s.page_size_bytes for s in part.specs.values() if not hasattr(s, "shapes")} <= \
            {s.page_size_bytes for s in whole.specs.values() if not hasattr(s, "shapes")}
    check_layout(whole)


def test_qwen3_5_like_layout(patched_tree: Path) -> None:
    """Attention every 4th layer (Qwen3.5/3.6 and Qwen3-Next default), head_dim 256, 4 KV heads."""
    hf = transformers.Qwen3NextConfig(num_hidden_layers=16, head_dim=256, num_key_value_heads=4)
    model = Model.from_hf(hf)
    attn = [i for i, t in enumerate(model.layer_types) if t == "full_attention"]
    skip = [str(i) for i in attn[:2] + attn[-2:]]
    assert skip == ["3", "7", "11", "15"]
    check_layout(plan(patched_tree, model, "turboquant_4bit_nc", skip))


def test_non_turboquant_hybrid_unchanged(pristine_tree: Path, patched_tree: Path) -> None:
    """Without TurboQuant the alignment is the release's (same block size, same mamba padding)."""
    for dtype in ("auto", "fp8"):
        old = plan(pristine_tree, QWEN3_NEXT, dtype, [])
        new = plan(patched_tree, QWEN3_NEXT, dtype, [])
        for attr in ("block_size", "mamba_page_size_padded", "mamba_block_size"):
            assert getattr(new.vllm_config.cache_config, attr) == getattr(old.vllm_config.cache_config, attr)
        assert check_layout(new) == check_layout(old)


def test_release_cannot_unify_turboquant_pages(pristine_tree: Path) -> None:
    """What the patch fixes, on the release: past the arg_utils refusal, the page sizes do not unify.

    The release sizes attention at 2 * 128 B per KV head and token, so the mamba page is padded to
    144 tokens * 512 B; the model-dtype layers need 1024 B per token, and unify_kv_cache_spec_page_size
    trips over the (unscalable) padded mamba page, or, for other sizes, the TurboQuant page.
    """
    with pytest.raises((AssertionError, NotImplementedError)):
        plan(pristine_tree, QWEN3_NEXT, "turboquant_k8v4", BOUNDARY)
    with pytest.raises((AssertionError, NotImplementedError)):
        plan(pristine_tree, QWEN3_NEXT, "turboquant_k8v4", ["0", "2"])  # all attention layers quantized
