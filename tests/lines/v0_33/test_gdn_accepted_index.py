"""GDN spec-decode accepted-token index (patch 0002), Triton kernels under the interpreter on CPU.

The tree under test is ``v033_tree`` (see conftest.py). The kernels of
vllm/third_party/flash_linear_attention/ops/{fused_recurrent,fused_sigmoid_gating}.py start each
spec-decode request from state slot ssm_state_indices[i_n, num_accepted_tokens[i_n] - 1]. A count
outside [1, number of state-slot columns] (0, a -1 placeholder, a stale count) indexes outside the
request's row: the previous row, the block table's other columns, or memory before the tensor.

The indices here are a view of a wider block table, as gdn_attn.py builds them
(block_table[:n, :num_spec + 1]), and every entry outside the viewed columns names a sentinel slot.
A bounded kernel must behave as if the count were clamped to the row; the release reads the sentinel.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import vllm_tree

# 0.33 moved fla's op.py; the interpreter needs its late-bound tl aliases there too.
vllm_tree.AFTER_EXEC["vllm.third_party.flash_linear_attention.ops.op"] = vllm_tree._late_bound_tl_aliases

OPS = "vllm/third_party/flash_linear_attention/ops/"
DEV = "cuda" if torch.cuda.is_available() else "cpu"

H, HV, K, V = 1, 2, 16, 16
NUM_SPEC = 2  # 3 state-slot columns per request
SENTINEL = 7


def _case(seed=0):
    g = torch.Generator().manual_seed(seed)
    T = NUM_SPEC + 1
    n = 2
    cu = torch.tensor([0, T, 2 * T], dtype=torch.int32, device=DEV)
    bt = torch.full((3, 8), SENTINEL, dtype=torch.int32)
    bt[1, :T] = torch.tensor([1, 2, 3])
    bt[2, :T] = torch.tensor([4, 5, 6])
    bt = bt.to(DEV)
    indices = bt[1:, :T]  # (n, T) view, row stride 8, preceded by bt[0] (all SENTINEL)
    state = torch.randn(9, HV, V, K, generator=g) * 0.1
    state[SENTINEL] = 50.0
    tensors = dict(
        q=torch.randn(1, n * T, H, K, generator=g),
        k=torch.randn(1, n * T, H, K, generator=g),
        v=torch.randn(1, n * T, HV, V, generator=g),
        g=torch.nn.functional.logsigmoid(torch.randn(1, n * T, HV, generator=g)),
        beta=torch.rand(1, n * T, HV, generator=g),
        a=torch.randn(1, n * T, HV, generator=g),
        b=torch.randn(1, n * T, HV, generator=g),
        A_log=torch.randn(HV, generator=g),
        dt_bias=torch.randn(HV, generator=g),
    )
    tensors = {k: v.to(DEV) for k, v in tensors.items()}
    return cu, indices, state.to(DEV), tensors


def _run(tree: Path, kernel: str, num_accepted: list[int]):
    cu, indices, state, t = _case()
    acc = torch.tensor(num_accepted, dtype=torch.int32, device=DEV)
    if kernel == "fused_recurrent":
        mod = vllm_tree.load_module(tree, OPS + "fused_recurrent.py")
        o, final = mod.fused_recurrent_gated_delta_rule_fwd(
            q=t["q"], k=t["k"], v=t["v"], g=t["g"], beta=t["beta"], scale=K**-0.5,
            initial_state=state, inplace_final_state=True, cu_seqlens=cu,
            ssm_state_indices=indices, num_accepted_tokens=acc, use_qk_l2norm_in_kernel=True)
    else:
        mod = vllm_tree.load_module(tree, OPS + "fused_sigmoid_gating.py")
        o, final = mod.fused_sigmoid_gating_delta_rule_update(
            A_log=t["A_log"], a=t["a"], b=t["b"], dt_bias=t["dt_bias"], q=t["q"], k=t["k"], v=t["v"],
            initial_state=state, inplace_final_state=True, cu_seqlens=cu,
            ssm_state_indices=indices, num_accepted_tokens=acc, use_qk_l2norm_in_kernel=True)
    return o.cpu(), final.cpu()


KERNELS = ["fused_recurrent", "fused_sigmoid_gating"]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("counts", [[0, 2], [2, NUM_SPEC + 3], [-1, 0]])
def test_out_of_range_count_stays_in_row(v033_tree, kernel, counts):
    clamped = [min(max(c, 1), NUM_SPEC + 1) for c in counts]
    o_bad, s_bad = _run(v033_tree, kernel, counts)
    o_ref, s_ref = _run(v033_tree, kernel, clamped)
    assert torch.isfinite(o_bad).all()
    torch.testing.assert_close(o_bad, o_ref, rtol=0, atol=0,
                               msg=lambda m: f"{kernel}: counts {counts} did not act as {clamped}: {m}")
    torch.testing.assert_close(s_bad, s_ref, rtol=0, atol=0)


@pytest.mark.parametrize("kernel", KERNELS)
def test_valid_counts_unchanged(v033_tree, v033_pristine_tree, kernel):
    for counts in ([1, 3], [2, 1], [3, 2]):
        o, s = _run(v033_tree, kernel, counts)
        o0, s0 = _run(v033_pristine_tree, kernel, counts)
        torch.testing.assert_close(o, o0, rtol=0, atol=0)
        torch.testing.assert_close(s, s0, rtol=0, atol=0)
