"""selective_state_update's accepted-token index in spec decoding (patch 0002), Triton under the interpreter
on CPU.

The tree under test is ``v033_tree`` (see conftest.py). In spec decoding, _selective_scan_update_kernel
(vllm/model_executor/layers/mamba/ops/mamba_ssm.py; Mamba2 layers) starts each request from state slot
state_batch_indices[b, max(num_accepted_tokens[b] - 1, 0)]. The column has no upper bound: a stale count
above the row's width reads the slot index from the block table's other columns or the next request's row.

The indices here are a view of a wider block table, as the Mamba2 metadata builds them, and every entry
outside the viewed columns names a slot that is no request's. An out-of-range count must not make a request
read or write any slot outside its own row, whatever the fix does with it (clamp it, skip the load or the
request, mask it): each request's output and own slots must not change when every other slot does, and
slots outside every row must be left alone. The release reads the foreign slot, so its output follows it.
In-range counts must give the release's result exactly.

The kernel file replaces the Triton ``selective_state_update`` by a CPU op on a CPU platform, so the
release's Triton function and kernel are compiled here on their own (``vllm_tree.load_function``).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from accepted_counts import assert_stays_in_row, assert_valid_counts_unchanged

import vllm_tree

pytestmark = pytest.mark.patch("gdn-bound-the-accepted-token-index")

SSM = "vllm/model_executor/layers/mamba/ops/mamba_ssm.py"
HELPERS = "vllm/model_executor/layers/mamba/ops/triton_helpers.py"
DEV = "cuda" if torch.cuda.is_available() else "cpu"

NHEADS, HEADDIM, DSTATE = 2, 16, 16
NUM_SPEC = 2
T = NUM_SPEC + 1  # tokens per request, state-slot columns per row
ROWS = [[1, 2, 3], [4, 5, 6]]  # each request's state slots (its row of the indices)
FOREIGN = 7  # the slot every other block-table entry names
NUM_SLOTS = 9  # slots 0 (the null block) and 8 are named by nothing


@functools.cache
def _update(tree: Path):
    """The tree's Triton ``selective_state_update`` with its own kernel (launch config: one fixed block)."""
    helpers = vllm_tree.load_module(tree, HELPERS)
    kernel = vllm_tree.load_function(tree, SSM, "_selective_scan_update_kernel", tl=tl, triton=triton,
                                     fast_exp=helpers.fast_exp)
    return vllm_tree.load_function(tree, SSM, "selective_state_update", torch=torch, triton=triton,
                                   _selective_scan_update_kernel=kernel, NULL_BLOCK_ID=0,
                                   try_get_optimal_ssm_config=lambda *args, **kwargs: (16, 4))


def _state(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(NUM_SLOTS, NHEADS, HEADDIM, DSTATE, generator=g)


def _run(tree: Path, counts: list[int], state: torch.Tensor):
    """(output (tokens, nheads, headdim), state after) of one spec-decode call, as mamba_mixer2 makes it."""
    g = torch.Generator().manual_seed(0)
    n = len(ROWS) * T
    x = torch.randn(n, NHEADS, HEADDIM, generator=g).to(DEV)
    dt = torch.rand(n, NHEADS, HEADDIM, generator=g).to(DEV)
    A = -torch.rand(NHEADS, HEADDIM, DSTATE, generator=g).to(DEV)
    B = torch.randn(n, 1, DSTATE, generator=g).to(DEV)
    C = torch.randn(n, 1, DSTATE, generator=g).to(DEV)
    D = torch.randn(NHEADS, HEADDIM, generator=g).to(DEV)
    dt_bias = torch.randn(NHEADS, HEADDIM, generator=g).to(DEV)
    block_table = torch.full((len(ROWS) + 2, 8), FOREIGN, dtype=torch.int32)
    for r, slots in enumerate(ROWS):
        block_table[1 + r, :T] = torch.tensor(slots)
    indices = block_table.to(DEV)[1:1 + len(ROWS), :T]  # (n, T) view, row stride 8
    cu = torch.arange(0, n + 1, T, dtype=torch.int32, device=DEV)
    state = state.clone().to(DEV)
    out = torch.full_like(x, float("nan"))  # an output a fail-closed kernel leaves alone stays NaN
    _update(tree)(state, x, dt, A, B, C, D, dt_bias, dt_softplus=False, state_batch_indices=indices,
                  dst_state_batch_indices=indices, out=out,
                  num_accepted_tokens=torch.tensor(counts, dtype=torch.int32, device=DEV), cu_seqlens=cu)
    return out.cpu(), state.cpu()


@pytest.mark.parametrize("counts", [[0, T + 1], [T + 1, 2], [9, 2], [-1, T + 3]])
def test_out_of_range_count_stays_in_row(v033_tree, counts):
    """[9, 2]: column 8 of row 0 is column 0 of row 1 (another request's slot); the others name FOREIGN."""
    assert_stays_in_row(lambda state: _run(v033_tree, counts, state), _state(1), _state(2), ROWS,
                        lambda out, r: out[r * T:(r + 1) * T], f"counts {counts}")


VALID = [[1, T], [T, 2], [2, 1]]  # every column of each row


def test_valid_counts_unchanged(v033_tree, v033_pristine_tree):
    """In-range counts give the release's result, bit for bit (each column holds another state)."""
    state = _state(1)
    assert_valid_counts_unchanged(lambda c: _run(v033_tree, c, state), lambda c: _run(v033_pristine_tree, c, state),
                                  VALID, len(ROWS), lambda out, r: out[r * T:(r + 1) * T])
