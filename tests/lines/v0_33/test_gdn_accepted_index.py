"""GDN spec-decode accepted-token index (patch 0002), Triton kernels under the interpreter on CPU.

The tree under test is ``v033_tree`` (see conftest.py). The kernels of
vllm/third_party/flash_linear_attention/ops/{fused_recurrent,fused_sigmoid_gating}.py start each
spec-decode request from state slot ssm_state_indices[i_n, num_accepted_tokens[i_n] - 1]. A count
outside [1, number of state-slot columns] (0, a -1 placeholder, a stale count) indexes outside the
request's row: the previous row, the block table's other columns, or memory before the tensor.

The indices here are a view of a wider block table, as gdn_attn.py builds them
(block_table[:n, :num_spec + 1]), and every entry outside the viewed columns names a slot that is no
request's. An out-of-range count must not make a request read or write any slot outside its own row,
whatever the fix does with it (clamp it into the row as 0002 does, skip the load as vllm#50021 does,
mask it): each request's output and own slots must not change when every other slot does, and slots
outside every row must be left alone. The release reads the foreign slot, so its output follows it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from accepted_counts import assert_stays_in_row, assert_valid_counts_unchanged

import vllm_tree

pytestmark = pytest.mark.patch("gdn-bound-the-accepted-token-index")

OPS = "vllm/third_party/flash_linear_attention/ops/"
OPS_BEFORE_0_26 = "vllm/model_executor/layers/fla/ops/"  # 0.25.1 (line v0.25)
DEV = "cuda" if torch.cuda.is_available() else "cpu"

H, HV, K, V = 1, 2, 16, 16
NUM_SPEC = 2  # 3 state-slot columns per request
T = NUM_SPEC + 1
ROWS = [[1, 2, 3], [4, 5, 6]]  # each request's state slots (its row of the indices)
FOREIGN = 7  # the slot every other block-table entry names
NUM_SLOTS = 9  # slots 0 and 8 are named by nothing
KERNELS = ["fused_recurrent", "fused_sigmoid_gating"]


@pytest.fixture
def empty_is_nan():
    """``torch.empty`` (the kernels' ``new_empty`` output) filled with NaN: an output row that a fail-closed
    kernel leaves unwritten then reads the same in every run instead of whatever memory held."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    torch.utils.deterministic.fill_uninitialized_memory = fill


def _state(seed: int) -> torch.Tensor:
    return torch.randn(NUM_SLOTS, HV, V, K, generator=torch.Generator().manual_seed(seed)) * 0.1


def _inputs():
    g = torch.Generator().manual_seed(0)
    n = len(ROWS)
    cu = torch.tensor([0, T, 2 * T], dtype=torch.int32, device=DEV)
    bt = torch.full((4, 8), FOREIGN, dtype=torch.int32)
    for r, slots in enumerate(ROWS):
        bt[1 + r, :T] = torch.tensor(slots)
    bt = bt.to(DEV)
    indices = bt[1:1 + n, :T]  # (n, T) view, row stride 8, between rows that name only FOREIGN
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
    return cu, indices, {k: v.to(DEV) for k, v in tensors.items()}


def _ops(tree: Path) -> str:
    return OPS if (tree / OPS).is_dir() else OPS_BEFORE_0_26


def _run(tree: Path, kernel: str, num_accepted: list[int], state: torch.Tensor | None = None):
    """(output, state after) of one spec-decode call; the state is updated in place, as in vLLM."""
    cu, indices, t = _inputs()
    state = (_state(1) if state is None else state.clone()).to(DEV)
    acc = torch.tensor(num_accepted, dtype=torch.int32, device=DEV)
    if kernel == "fused_recurrent":
        mod = vllm_tree.load_module(tree, _ops(tree) + "fused_recurrent.py")
        o, final = mod.fused_recurrent_gated_delta_rule_fwd(
            q=t["q"], k=t["k"], v=t["v"], g=t["g"], beta=t["beta"], scale=K**-0.5,
            initial_state=state, inplace_final_state=True, cu_seqlens=cu,
            ssm_state_indices=indices, num_accepted_tokens=acc, use_qk_l2norm_in_kernel=True)
    else:
        mod = vllm_tree.load_module(tree, _ops(tree) + "fused_sigmoid_gating.py")
        o, final = mod.fused_sigmoid_gating_delta_rule_update(
            A_log=t["A_log"], a=t["a"], b=t["b"], dt_bias=t["dt_bias"], q=t["q"], k=t["k"], v=t["v"],
            initial_state=state, inplace_final_state=True, cu_seqlens=cu,
            ssm_state_indices=indices, num_accepted_tokens=acc, use_qk_l2norm_in_kernel=True)
    return o.cpu(), final.cpu()


def _tokens(o: torch.Tensor, r: int) -> torch.Tensor:
    return o.narrow(-3, r * T, T)  # o is (..., tokens, HV, V)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("counts", [[0, 2], [2, NUM_SPEC + 3], [-1, 0], [9, 2]])
def test_out_of_range_count_stays_in_row(v033_tree, kernel, counts, empty_is_nan):
    """[9, 2]: column 8 of row 0 is column 0 of row 1 (another request's slot); the others name FOREIGN."""
    assert_stays_in_row(lambda state: _run(v033_tree, kernel, counts, state), _state(1), _state(2), ROWS, _tokens,
                        f"{kernel}: counts {counts}")


VALID = [[1, 3], [2, 1], [3, 2]]  # every column of each row


@pytest.mark.parametrize("kernel", KERNELS)
def test_valid_counts_unchanged(v033_tree, v033_pristine_tree, kernel):
    """In-range counts give the release's result, bit for bit (every column holds a different state)."""
    assert_valid_counts_unchanged(lambda c: _run(v033_tree, kernel, c), lambda c: _run(v033_pristine_tree, kernel, c),
                                  VALID, len(ROWS), _tokens, f"{kernel}: ")
