"""The multi-query verify kernel (line v0.20's patch 0007, the current line's 0003) fits the GPU it runs on.

The route sizes its tiles from the device's shared memory per block (``tq_mq_device_limits``, capped by
``$VLLM_TURBOQUANT_MQ_MAX_SHARED_MEMORY`` to emulate another GPU on this one) and confirms each candidate by a
launch of the compiled kernel (``tq_mq_verify_probe``). On a GPU host, under the limits of the GPUs users own
(RTX 3090/4090/5090 and A5000/A6000: 101376 B; T4 and the ROCm parts: 65536 B):

1. the probe refuses a tiling whose compiled kernel needs more shared memory than the limit (the widest tile of
   Qwen3.6-27B with MTP K=3 and an MSE preset needs 131072 B);
2. the tiling the route selects was compiled within the limit, and the kernel run with it matches the float64
   reference, for the users' geometries;
3. float32 (``ieee``) scores, the ROCm route, match the float64 reference at least as well as tf32x3.

On CPU (interpreted) these tests skip: nothing is compiled there (tests/gpu_fit compiles every target ahead of
time, tests/lines/v0_33/test_tq_mq_fit.py runs the planner and the kernel at consumer tiles interpreted). The
kernel file is the same in both lines, which the first test checks.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from difflib import SequenceMatcher
from pathlib import Path

import pytest
import torch
from unidiff import PatchSet

from references import build_tq_cache, tq_verify_ref, tq_verify_rows
from vllm_tree import load_module

pytestmark = pytest.mark.patch("turboquant-multi-query-verify-kernel")

VERIFY = "vllm/v1/attention/ops/triton_turboquant_verify.py"
PROJECT = Path(__file__).resolve().parents[4]
CUDA = torch.cuda.is_available()
GPU_ONLY = "compiles for this GPU: runs on the GPU host (gpu/host.sh kernel-pack)"
MSE_BITS = {"k8v4": 0, "4bit_nc": 4, "k3v4_nc": 3, "3bit_nc": 3}
# (preset, head dim, G, K+1): Qwen3.6-27B (24/4 heads: G 6, at TP 1 and 2) and Qwen3-Next (16/2: G 8) at D 256
# with MTP K = 1, 3, 7; Llama-8B (32/8: G 4) and a G-8 model at D 128.
GEOMETRIES = [
    (preset, d, g, k1)
    for preset in MSE_BITS
    for d, g, k1 in [(256, 6, 1), (256, 6, 2), (256, 6, 4), (256, 6, 8), (256, 8, 4), (128, 4, 8), (128, 4, 16),
                     (128, 8, 16)]
]
LIMITS = [101376, 65536]


def _added_lines(patch: Path, path: str) -> list[str]:
    for pf in PatchSet(patch.read_text(encoding="utf-8")):
        if pf.path == path:
            return [line.value for hunk in pf for line in hunk if line.is_added]
    raise LookupError(f"{patch} does not create {path}")


def test_the_current_kernel_is_line_v020s_with_its_measured_and_runtime_variant_changes():
    """The kernel tests here run line v0.20's kernel file; the current line's is the same file with two changes
    measured on the H100 (patches/NOTES.md): the 4-bit values' loads (scale and zero in one 32-bit word, nibbles
    to float16 through the mantissa of 1024) and 32-token steps for 32-row tiles of 4-bit keys at D=256 on CUDA;
    and the changes that keep serving from compiling new variants, which tests/lines/v0_33/test_tq_mq_fit.py
    tests: the split count, the partials' strides and the block table's row stride as unspecialized arguments
    (``SPLIT`` the only constexpr left of them), a probe of every variant (K+1, splits and merge, norm
    correction, the layer's layout) and the layer's compile without a launch (``tq_mq_verify_warm``,
    ``compile_only``); and the MSE score path that tests/lines/v0_33/test_tq_mq_verify.py tests at every preset
    (scores of tens included): fp16x3 scores on CUDA (``SCORE_PRECISION``, the float16 split of both operands),
    3-bit fields cut from 24-bit words with their centroids gathered from registers instead of the select tree,
    the norm correction on the score column. Anything else that differs would go untested."""
    current = _added_lines(PROJECT / "patches" / "0003-turboquant-multi-query-verify-kernel.patch", VERIFY)
    v020 = _added_lines(PROJECT / "lines" / "v0.20" / "patches" / "0007-turboquant-multi-query-verify-kernel.patch",
                        VERIFY)
    ops = [(v020[i1:i2], current[j1:j2]) for tag, i1, i2, j1, j2 in
           SequenceMatcher(None, v020, current, autojunk=False).get_opcodes() if tag != "equal"]
    removed = "".join(line for old, _ in ops for line in old)
    added = "".join(line for _, new in ops for line in new)
    # What went: the byte-wise scale/zero loads, the integer-to-float nibbles and 3-bit values, the split count as a
    # constexpr, the probe's single launch; the tf32x3-only score flag, the 3-bit select tree and byte pairs.
    assert removed.count("tl.load(KV_ptr + sz") == 4 and removed.count(".to(tl.float16)") == 3
    assert removed.count("SCORE_IEEE") == 4 and "def _tq_mq_centroids(" in removed
    assert "mse_shift" in removed and "val_shift" in removed
    assert "NUM_SPLITS: tl.constexpr" in removed and "NUM_SPLITS" not in "".join(current)
    # 186 (and 370 added below): the changes above and the docstrings and comments that describe them.
    assert removed.count("\n") == 186, removed
    # What came: the one-word load (with the byte-wise one as its fallback), the mantissa trick (4-bit and 3-bit
    # values), the tile rule; the unspecialized split arguments, the probe of every variant, the compile without a
    # launch; the score split and the word fields.
    assert "tl.pointer_type(tl.uint32)" in added and added.count("0x6400") == 4 and "- 1024.0" in added
    assert "head_dim == 256" in added and "block_n //= 2" in added
    assert added.count("do_not_specialize") == 3 and "def tq_mq_verify_warm(" in added and "compile_only" in added
    assert '"stride_bt"]' in added
    assert "def _tq_mq_fields3(" in added and "def _tq_mq_score_dot(" in added and "def _tq_mq_score_operand(" in added
    assert added.count("SCORE_PRECISION") == 8 and 'return "fp16x3"' in added
    assert added.count("\n") == 370, added


@pytest.fixture
def mq_ops(patched_tree):
    return load_module(patched_tree, VERIFY)


def _limits(mq, limit: int | None):
    own = mq.tq_mq_device_limits(torch.cuda.current_device())
    return own if limit is None else dataclasses.replace(own, max_shared=min(own.max_shared, limit))


def _probe(mq, limits, preset, d, group, k1, block_size=16, dtype=torch.float16):
    from references import TQLayout

    lay = TQLayout.from_preset(preset, d)
    return functools.partial(
        mq.tq_mq_verify_probe, k1=k1, group=group, head_dim=d, mse_bits=lay.mse_bits, key_fp8=lay.key_fp8,
        key_packed_size=lay.key_packed_size, value_bits=lay.value_bits, block_size=block_size, query_dtype=dtype,
        device=torch.device("cuda", torch.cuda.current_device()), limits=limits)


def _run(mq, preset, d, group, k1, tiles, dtype=torch.float16, bs=16, seed=3):
    hk = 2
    lens = [1, k1, bs, 2 * bs + 3, 333, 1000, 0]
    cache = build_tq_cache(preset, lens, hk, d, bs, "cuda", dtype=dtype, seed=seed)
    n, hq = len(lens) * k1, hk * group
    query = torch.randn(n, hq, d, generator=torch.Generator().manual_seed(seed)).to("cuda", dtype)
    out = torch.full((n, hq, d), float("nan"), dtype=dtype, device="cuda")
    lse = torch.full((n, hq), float("nan"), device="cuda")
    mid = torch.empty(n, hq, 32, d + 1, device="cuda")
    q_rot = torch.empty(n, hq, d, device="cuda")
    lay = cache.layout
    mq.triton_turboquant_mq_verify_attention(
        query, cache.kv_cache, cache.block_table, cache.seq_lens, k1, cache.centroids, 1 / math.sqrt(d),
        lay.mse_bits, lay.key_packed_size, lay.value_bits, out, mid, q_rot, PiT=cache.pi, key_fp8=lay.key_fp8,
        norm_correction=lay.norm_correction, lse=lse, max_num_kv_splits=32, tiles=tiles, min_split_len=64)
    want, want_lse = tq_verify_ref(query, cache.keys, cache.values, lens, k1, 1 / math.sqrt(d))
    live = torch.tensor(tq_verify_rows(lens, k1)[0], device="cuda") > 0
    return out, lse, want.to("cuda"), want_lse.to("cuda"), live


@pytest.mark.skipif(not CUDA, reason=GPU_ONLY)
@pytest.mark.parametrize("limit", LIMITS)
def test_probe_refuses_a_kernel_over_the_limit(mq_ops, limit):
    limits = _limits(mq_ops, limit)
    widest = mq_ops.tq_mq_verify_candidates(4, 6, 256, 4, False, _limits(mq_ops, None))[0]
    why = _probe(mq_ops, limits, "4bit_nc", 256, 6, 4)(widest)
    # The first of its kernels over the limit: the query rotation at the widest tiles' 32 x 64 (98304 B) when
    # the limit is below that, else the verify kernel (131072 B).
    need = re.search(r"needs (\d+) B of shared memory", why or "")
    assert need and int(need.group(1)) > limit and int(need.group(1)) in (98304, 131072), why


@pytest.mark.skipif(not CUDA, reason=GPU_ONLY)
@pytest.mark.parametrize("limit", LIMITS)
@pytest.mark.parametrize(("preset", "d", "group", "k1"), GEOMETRIES,
                         ids=[f"{p}-d{d}-G{g}-K1={k}" for p, d, g, k in GEOMETRIES])
def test_selected_tiles_fit_and_match_reference(mq_ops, limit, preset, d, group, k1):
    limits = _limits(mq_ops, limit)
    mse_bits = MSE_BITS[preset]
    tiles, refused = mq_ops.tq_mq_verify_select(k1, group, d, mse_bits, mse_bits == 0, limits,
                                                _probe(mq_ops, limits, preset, d, group, k1))
    assert tiles is not None, refused
    staged = mq_ops.tq_mq_staged_bytes(tiles.block_m, tiles.block_n, d, mse_bits, mse_bits == 0, tiles.precision)
    assert staged <= limit
    out, lse, want, want_lse, live = _run(mq_ops, preset, d, group, k1, tiles)
    torch.testing.assert_close(out[live].float(), want[live].float(), atol=3e-3, rtol=1e-2)
    torch.testing.assert_close(lse[live], want_lse[live].float(), atol=2e-3, rtol=1e-4)
    assert not bool(out[~live].any())


@pytest.mark.skipif(not CUDA, reason=GPU_ONLY)
@pytest.mark.parametrize("preset", ["4bit_nc", "k3v4_nc", "3bit_nc"])
def test_float32_scores_match_reference(mq_ops, preset, capsys):
    """The ROCm route's precision (ieee) on this GPU: its largest error against the float64 reference, beside
    tf32x3's, printed; ieee is float32-exact, so it must be no worse than 1.5x tf32x3's (float16 output
    rounding bounds both)."""
    errors = {}
    for precision in ("tf32x3", "ieee"):
        tiles = dataclasses.replace(mq_ops.tq_mq_verify_candidates(4, 6, 256, MSE_BITS[preset], False, None)[0],
                                    precision=precision)
        out, lse, want, want_lse, live = _run(mq_ops, preset, 256, 6, 4, tiles)
        torch.testing.assert_close(out[live].float(), want[live].float(), atol=3e-3, rtol=1e-2)
        errors[precision] = ((out[live].float() - want[live].float()).abs().max().item(),
                             (lse[live] - want_lse[live].float()).abs().max().item())
    with capsys.disabled():
        print(f"\n{preset} D256 G6 K1=4 max |out - ref|, |lse - ref|: "
              + ", ".join(f"{p} {o:.2e} {s:.2e}" for p, (o, s) in errors.items()))
    assert errors["ieee"][1] <= 1.5 * errors["tf32x3"][1] + 1e-6
