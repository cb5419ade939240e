"""TurboQuant / UltraQuant with speculative decoding (patch 0001), on CPU without importing vLLM.

The tree under test is ``v033_tree`` (see conftest.py). On the pristine 0.33.0 tree both tests fail; on the
patched tree they pass. They check 0001's fix where 0001 makes it, in the per-request loop (its stand-in kernels
record the lengths the loop hands them), so they are not 0001's ``Obsolete-If`` checks: an upstream fix may route
verify rows around the loop and leave it as it is (the #53410 stand-in, upstream/README.md). Those checks judge the
route by behaviour instead, for TurboQuant and UltraQuant alike (test_tq_verify_route.py).

1. FULL CUDA graphs: 0.33's resolve_cudagraph_mode_and_sizes (config/compilation.py:1448-1465) keeps
   FULL decode graphs for a uniform decode length K+1 > 1 iff every attention builder reports at least
   UNIFORM_BATCH. The UltraQuant builder serves K+1 batches with a host-driven per-request loop, so it
   must report less whenever K+1 > 1, and keep FULL graphs for q_len=1 decodes. (TurboQuant did the same
   until the line's patch 0003 gave its verify batches a graph-safe kernel: test_tq_mq_verify.py.)
2. Causal lengths: a verify batch under async scheduling whose CPU seq_lens are the optimistic upper
   bound (two drafts of the previous step rejected) must attend over exactly the cached tokens plus
   the causal prefix of the new ones, as the exact device seq_lens say.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import tq_harness

pytestmark = pytest.mark.patch("turboquant-full-cudagraphs-with-speculative-decoding")


@pytest.fixture(scope="module")
def mods(v033_tree):
    return tq_harness.load(v033_tree)


def _full_decode_graphs_kept(support, cg, uniform_decode_query_len: int) -> bool:
    """The two checks of 0.33 compilation.py:1421-1465 for a FULL decode mode."""
    if support == cg.NEVER:
        return False
    return not (uniform_decode_query_len > 1 and support.value < cg.UNIFORM_BATCH.value)


# TurboQuant's verify batches run a graph-safe kernel since the line's patch 0003, which gives them FULL graphs
# back (test_tq_mq_verify.py), and UltraQuant's its own since 0007 (test_uq_verify_graphs.py); with that route
# turned off (VLLM_TURBOQUANT_ATTENTION_KERNEL=decode) UltraQuant's verify batches take the per-request loop.
@pytest.mark.parametrize("backend", ["UltraQuantAttentionBackend"])
def test_no_full_graphs_for_host_driven_verify_batches(mods, backend, v033_tree, monkeypatch):
    tq_harness.skip_without_ultraquant(v033_tree)
    tq, uq, _ = mods
    monkeypatch.setattr(getattr(uq, "envs", SimpleNamespace()), "VLLM_TURBOQUANT_ATTENTION_KERNEL", "decode",
                        raising=False)
    cls = getattr(tq if backend.startswith("Turbo") else uq, backend)
    builder = cls.get_builder_cls()
    cg = tq.AttentionCGSupport
    for num_spec in (0, 1, 3):
        cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=num_spec)
                              if num_spec else None)
        support = builder.get_cudagraph_support(cfg, None)
        kept = _full_decode_graphs_kept(support, cg, 1 + num_spec)
        if num_spec == 0:
            assert kept, f"{backend}: q_len=1 decodes must keep FULL graphs (support {support})"
        else:
            assert not kept, (
                f"{backend}: support {support} lets vLLM capture K+1={1 + num_spec} verify batches in FULL "
                "graphs, but _prefill_attention's per-request loop is host-driven")


def _verify_case(Hq=2, Hk=1, D=8, block_size=4, q_len=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    real_ctx = [9, 6]  # cached tokens per request (device truth)
    optimistic_ctx = [11, 6]  # request 0: the CPU mirror assumed 2 more drafts accepted
    num_blocks = 16
    kv_cache = torch.randn(num_blocks, block_size, Hk, 2 * D, generator=g)
    block_table = torch.tensor([[3, 7, 1, 9, 12, 0], [5, 2, 8, 11, 0, 0]], dtype=torch.int32)
    seq_lens = torch.tensor([c + q_len for c in real_ctx], dtype=torch.int32)
    seq_lens_cpu = torch.tensor([c + q_len for c in optimistic_ctx], dtype=torch.int32)
    qsl = torch.tensor([0, q_len, 2 * q_len], dtype=torch.int32)
    N = 2 * q_len
    query = torch.randn(N, Hq, D, generator=g)
    key = torch.randn(N, Hk, D, generator=g)
    value = torch.randn(N, Hk, D, generator=g)
    # Exact causal reference from the cache (the new tokens are already stored there).
    scale = 1.0 / D**0.5
    ref = torch.zeros(N, Hq, D)
    want_lens = []
    for r in range(2):
        lens = []
        for j in range(q_len):
            L = real_ctx[r] + j + 1
            lens.append(L)
            pos = torch.arange(L)
            kv = kv_cache[block_table[r, pos // block_size].long(), pos % block_size]
            for h in range(Hq):
                kh = h // (Hq // Hk)
                w = torch.softmax((kv[:, kh, :D] @ query[r * q_len + j, h]) * scale, dim=0)
                ref[r * q_len + j, h] = w @ kv[:, kh, D:]
        want_lens.append(lens)
    meta_kwargs = dict(
        seq_lens=seq_lens, slot_mapping=torch.zeros(N, dtype=torch.int64), block_table=block_table,
        query_start_loc=qsl, num_actual_tokens=N, max_query_len=q_len, max_seq_len=int(seq_lens_cpu.max()),
        is_prefill=True, num_decodes=0, num_decode_tokens=0, query_start_loc_cpu=qsl.clone(),
        seq_lens_cpu=seq_lens_cpu)
    return query, key, value, kv_cache, meta_kwargs, ref, want_lens, (Hq, Hk, D)


@pytest.mark.parametrize("impl_name", ["TurboQuantAttentionImpl", "UltraQuantAttentionImpl"])
def test_verify_rows_use_exact_causal_lengths(mods, impl_name, v033_tree):
    if impl_name.startswith("Ultra"):
        tq_harness.skip_without_ultraquant(v033_tree)
    tq, uq, rec = mods
    cls = getattr(tq if impl_name.startswith("Turbo") else uq, impl_name)
    query, key, value, kv_cache, meta_kwargs, ref, want_lens, (Hq, Hk, D) = _verify_case()
    impl = tq_harness.bare_impl(cls, Hq, Hk, D)
    meta = tq.TurboQuantMetadata(**meta_kwargs)
    rec.seq_lens.clear()
    eye = torch.eye(D)
    out = impl._prefill_attention(query, key, value, kv_cache, meta, eye, torch.empty(0), eye,
                                  layer=SimpleNamespace())
    assert rec.seq_lens == want_lens, (
        f"{impl_name}: causal lengths given to the kernel {rec.seq_lens}, exact ones {want_lens} "
        "(the host seq_lens are an optimistic upper bound on async spec-decode rows)")
    torch.testing.assert_close(out.float(), ref, rtol=1e-4, atol=1e-5)
