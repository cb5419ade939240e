"""The drafter's decode steps over a TurboQuant cache share one metadata and one CUDA graph (the line's patch 0005).

On Model Runner V2 a speculator with K draft tokens runs K-1 draft decode steps of one token per request. When
every attention backend of the drafter can refresh its decode metadata in place
(``supports_draft_decode_metadata_update``, ``update_draft_decode_metadata``), the speculator builds the metadata
once, advances the device lengths, positions and slot mappings itself, and records all K-1 steps in one CUDA
graph. A backend that cannot makes it rebuild the metadata on the host before each step and replay one graph per
step ("cannot update draft decode metadata in place; falling back to rebuilding attention metadata eagerly").

These tests use only that interface and what any vLLM's TurboQuant backend offers (its builder and impl classes,
vLLM's ``CommonAttentionMetadata``), with the tree's real kernels (``tq_harness.load_backend``), so they are the
patch's ``Obsolete-If: test`` check on a newer unpatched tree too:

1. TurboQuant's builder supports the in-place update with K = 3, and the metadata of draft step 1, refreshed in
   place after the speculator's own advance (device ``seq_lens`` one longer, the new token stored), gives step 2
   the same output as metadata built afresh for step 2, bit for bit, and the causal attention of the new lengths.
   A builder that kept a copy of a device length (or read a host one) at build time fails it.

2. The claim follows the route: where the multi-query route steps aside (``VLLM_TURBOQUANT_ATTENTION_KERNEL=
   decode``, a GPU that takes no tiling of the kernel, FlyDSL's cache layout) decodes take the decode kernel,
   which reads the host ``max_seq_len`` an in-place refresh leaves stale, so the builder must not claim it; where
   the route runs, it does. Each case first checks that the route it sets up did step aside (the builder reports
   less than UNIFORM_BATCH: verify batches leave FULL graphs), so the claim is judged on the route it names.

UltraQuant's builder is TurboQuant's; with patch 0007 it claims the update too (test_uq_verify_graphs.py).

Before 0.32 no speculator updates the draft metadata in place, so there is nothing to claim (lines v0.25, v0.27
run this file too: both tests skip there).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import test_tq_verify_route as route
import torch
import tq_harness

import vllm_tree
from references import TQLayout, build_tq_cache, tq_verify_ref

pytestmark = [
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"),
    pytest.mark.patch("turboquant-draft-decode-metadata-in-place"),
]

# The verify route tests' backend and config (K = 3 draft tokens; Hk 2 x G 2 query heads of 64), and fixtures.
K, HK, HQ, D, BLOCK, SCALE, TOL = route.K, route.HK, route.HQ, route.D, route.BLOCK, route.SCALE, route.TOL
DEVICE, CENTROIDS, _spec = route.DEVICE, route.CENTROIDS, route._spec
tree, config, tq = route.tree, route.config, route.tq

# Context lengths at draft step 1 (the token being drafted from included); step 2 sees one more token each.
LENS = [37, 54, 23]


@dataclasses.dataclass
class DraftSteps:
    """Persistent device buffers as the speculator keeps them, over a cache holding every token of step 2."""

    keys: list[torch.Tensor]  # per request (L + 1, Hk, D), dequantized from the cache bytes
    values: list[torch.Tensor]
    storage: torch.Tensor  # 0.33's (blocks, Hk, block_size, slot)
    block_table: torch.Tensor
    seq_lens: torch.Tensor  # advanced in place between steps
    query_start_loc: torch.Tensor
    slot_mapping: torch.Tensor


def _steps(tree: Path, preset: str, seed: int = 0) -> DraftSteps:
    bits = TQLayout.from_preset(preset, D).centroid_bits
    centroids = vllm_tree.load_module(tree, CENTROIDS).get_centroids(D, bits)
    cache = build_tq_cache(preset, [n + 1 for n in LENS], HK, D, BLOCK, DEVICE, seed=seed, centroids=centroids)
    storage = cache.kv_cache.permute(0, 2, 1, 3).contiguous()
    b = len(LENS)
    return DraftSteps(cache.keys, cache.values, storage, cache.block_table,
                      torch.tensor(LENS, dtype=torch.int32, device=DEVICE),
                      torch.arange(b + 1, dtype=torch.int32, device=DEVICE),
                      torch.zeros(b, dtype=torch.int64, device=DEVICE))


def _advance(steps: DraftSteps) -> None:
    """The speculator's in-place advance: one more token per request, its slot the last position's."""
    steps.seq_lens += 1
    pos = (steps.seq_lens - 1).long()
    rows = torch.arange(len(LENS), device=DEVICE)
    steps.slot_mapping.copy_(steps.block_table[rows, pos // BLOCK].long() * BLOCK + pos % BLOCK)


def _common(tq, steps: DraftSteps):
    """vLLM's CommonAttentionMetadata of a draft decode step over the persistent buffers, its host-side lengths
    those of the step it is built for."""
    cam_cls = tq.CommonAttentionMetadata
    b = len(LENS)
    host = steps.seq_lens.cpu()
    kw = dict(query_start_loc=steps.query_start_loc, query_start_loc_cpu=steps.query_start_loc.cpu(),
              seq_lens=steps.seq_lens, num_reqs=b, num_actual_tokens=b, max_query_len=1,
              max_seq_len=int(host.max()), block_table_tensor=steps.block_table, slot_mapping=steps.slot_mapping)
    for field in dataclasses.fields(cam_cls):
        if re.match(r"_?seq_lens\w*cpu", field.name) and field.init:
            kw[field.name] = host.clone()
    return cam_cls(**kw)


def _forward(tq, preset: str, steps: DraftSteps, meta, query: torch.Tensor) -> torch.Tensor:
    impl = tq.TurboQuantAttentionBackend.get_impl_cls()(num_heads=HQ, head_size=D, scale=SCALE, num_kv_heads=HK,
                                                         alibi_slopes=None, sliding_window=None,
                                                         kv_cache_dtype=preset)
    n = query.shape[0]
    out = torch.full((n, HQ * D), float("nan"), dtype=torch.float16, device=DEVICE)
    kv = torch.zeros(n, HK, D, dtype=torch.float16, device=DEVICE)
    got = impl.forward(SimpleNamespace(), query, kv, kv, tq_harness.forward_cache(tq, steps.storage), meta,
                       output=out)
    return got.view(n, HQ, D)


def _query(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(len(LENS), HQ, D, generator=gen).to(torch.float16).to(DEVICE)


def _speculators_update_in_place(tree: Path) -> bool:
    """Whether this vLLM's speculators can run the draft steps on metadata refreshed in place (0.32 on)."""
    return "supports_draft_decode_metadata_update" in (tree / "vllm/v1/attention/backend.py").read_text()


@pytest.mark.parametrize("preset", ["turboquant_k8v4", "turboquant_4bit_nc"])
def test_draft_steps_share_metadata_refreshed_in_place(tq, config, tree, preset):
    if not _speculators_update_in_place(tree):
        pytest.skip("this vLLM's speculators rebuild the draft metadata before every step, whatever the backend")
    builder = tq.TurboQuantAttentionBackend.get_builder_cls()(_spec(preset), ["model.layers.0.self_attn.attn"],
                                                              config, DEVICE)
    assert getattr(builder, "supports_draft_decode_metadata_update", False), (
        f"{preset}: the TurboQuant builder cannot update draft decode metadata in place, so on Model Runner V2 "
        f"each of the K-1={K - 1} draft decode steps rebuilds its attention metadata on the host and replays a "
        f"CUDA graph of its own")
    steps = _steps(tree, preset)
    meta = builder.build(0, _common(tq, steps))
    _forward(tq, preset, steps, meta, _query(1))  # draft step 1

    _advance(steps)
    builder.update_draft_decode_metadata(meta)
    query = _query(2)
    in_place = _forward(tq, preset, steps, meta, query)
    fresh = _forward(tq, preset, steps, builder.build(0, _common(tq, steps)), query)
    assert torch.equal(in_place, fresh), (
        f"{preset}: draft step 2 on step 1's metadata refreshed in place differs from metadata built for step 2 "
        f"(largest difference {(in_place.float() - fresh.float()).abs().nan_to_num(float('inf')).max().item():.3g})")
    want, _ = tq_verify_ref(query, steps.keys, steps.values, [n + 1 for n in LENS], 1, SCALE)
    torch.testing.assert_close(in_place.float(), want, **TOL)


# How each route the builder may be on is reached: the multi-query route runs on this host (interpreted on CPU);
# the others make it step aside as on a user's machine.
H100_SHARED = 232448
ROUTES = {
    "multi_query": None,
    "decode_kernel_by_environment": "VLLM_TURBOQUANT_ATTENTION_KERNEL=decode",
    "no_tiling_fits": "a GPU with 1 KiB of shared memory per block (no tiling's operands fit)",
    "flydsl": "FlyDSL available (its SoA cache layout, which the kernel does not read)",
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_in_place_update_claimed_only_where_the_multi_query_route_runs(tree, route, monkeypatch):
    if not _speculators_update_in_place(tree):
        pytest.skip("this vLLM's speculators rebuild the draft metadata before every step, whatever the backend")
    preset = "turboquant_k8v4"
    config = tq_harness.vllm_config(K, HQ, splits=2)  # a module of its own: the route's verdict is cached in it
    tq = tq_harness.load_backend(tree, config)
    max_shared = H100_SHARED
    if route == "decode_kernel_by_environment":
        monkeypatch.setenv("VLLM_TURBOQUANT_ATTENTION_KERNEL", "decode")
    elif route == "no_tiling_fits":
        max_shared = 1024
    elif route == "flydsl":
        monkeypatch.setattr(tq, "is_flydsl_available", lambda: True)
    builder_cls = tq.TurboQuantAttentionBackend.get_builder_cls()
    with contextlib.nullcontext() if route == "multi_query" else tq_harness.gpu_of(tree, tq, max_shared):
        support = builder_cls.get_cudagraph_support(config, _spec(preset))
        builder = builder_cls(_spec(preset), ["model.layers.0.self_attn.attn"], config, DEVICE)
    claims = bool(getattr(builder, "supports_draft_decode_metadata_update", False))
    uniform = type(support).UNIFORM_BATCH
    if route == "multi_query":
        assert support.value >= uniform.value, f"the multi-query route does not serve verify batches here: {support}"
        assert claims, "the builder on the multi-query route does not claim the in-place draft metadata update"
        return
    assert support.value < uniform.value, (
        f"{ROUTES[route]}: the multi-query route did not step aside (the builder reports {support.name})")
    assert not claims, (
        f"{ROUTES[route]}: the multi-query route steps aside (decodes take the decode kernel, which reads the host "
        f"max_seq_len), yet the builder claims the in-place draft metadata update: the speculator would run the "
        f"K-1={K - 1} draft steps on step 1's host lengths")
