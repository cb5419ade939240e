"""causal_conv1d_update's accepted-token offset in spec decoding (patch 0002), Triton under the interpreter on CPU.

The tree under test is ``v033_tree`` (see conftest.py). In spec decoding, _causal_conv1d_update_kernel
(vllm/model_executor/layers/mamba/ops/causal_conv1d.py; GDN and Mamba2 layers) starts each request from the
KERNEL_WIDTH - 1 token window at column num_accepted_tokens - 1 of the request's conv state line, which holds
width - 1 + num_spec tokens. A count outside [1, num_spec + 1] (0, a -1 placeholder, a stale count) puts the
window outside the line: the neighbouring lines' tokens (the previous line's last one for a count of 0 in the
default layout, the next line's first ones for a count too large).

An out-of-range count must not make a request read or write outside its own line, whatever the fix does with
it (clamp the offset, skip the load or the request, mask it): each request's output and own line must not
change when every other line does, and lines no request names must be left alone. The release reads the
neighbouring lines, so its output follows them. In-range counts must give the release's result exactly.

The kernel file replaces the Triton ``causal_conv1d_update`` by a CPU op on a CPU platform, so the release's
Triton function and kernel are compiled here on their own (``vllm_tree.load_function``).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from accepted_counts import assert_valid_counts_unchanged

import vllm_tree

pytestmark = pytest.mark.patch("gdn-bound-the-accepted-token-index")

CONV = "vllm/model_executor/layers/mamba/ops/causal_conv1d.py"
DEV = "cuda" if torch.cuda.is_available() else "cpu"

WIDTH, NUM_SPEC, DIM = 4, 2, 8
STATE_LEN = WIDTH - 1 + NUM_SPEC  # tokens per conv state line, as vLLM allocates it for spec decoding
T = NUM_SPEC + 1  # tokens per request
LINES = [2, 5]  # each request's conv state line; 0 is the null block, the others are neighbours
NUM_LINES = 8


class _Platform:
    """What ``causal_conv1d_update`` asks of ``current_platform``."""

    @staticmethod
    def is_arch_support_pdl() -> bool:
        return False


@functools.cache
def _update(tree: Path):
    """The tree's Triton ``causal_conv1d_update`` with its own kernel."""
    kernel = vllm_tree.load_function(tree, CONV, "_causal_conv1d_update_kernel", tl=tl, triton=triton)
    return vllm_tree.load_function(tree, CONV, "causal_conv1d_update", torch=torch, triton=triton,
                                   _causal_conv1d_update_kernel=kernel, current_platform=_Platform(),
                                   NULL_BLOCK_ID=0, PAD_SLOT_ID=-1)


def _states(seed: int, layout: str) -> torch.Tensor:
    """(lines, dim, state_len), stored (lines, state_len, dim) ("SD", vLLM's default) or as is ("DS")."""
    g = torch.Generator().manual_seed(seed)
    if layout == "SD":
        return torch.randn(NUM_LINES, STATE_LEN, DIM, generator=g).transpose(-1, -2)
    return torch.randn(NUM_LINES, DIM, STATE_LEN, generator=g)


def _run(tree: Path, counts: list[int], states: torch.Tensor):
    """(output (tokens, dim), states after) of one spec-decode call, as the GDN layer makes it."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(len(LINES) * T, DIM, generator=g).to(DEV)
    weight = torch.randn(DIM, WIDTH, generator=g).to(DEV)
    bias = torch.randn(DIM, generator=g).to(DEV)
    # gdn_attn's spec_state_indices_tensor[:, 0]: a strided view of the block table.
    block_table = torch.zeros(len(LINES), 8, dtype=torch.int32)
    block_table[:, 0] = torch.tensor(LINES)
    qsl = torch.arange(0, len(LINES) * T + 1, T, dtype=torch.int32, device=DEV)
    states = states.clone().to(DEV)  # clone() keeps the layout
    out = _update(tree)(x, states, weight, bias, "silu", conv_state_indices=block_table.to(DEV)[:, 0],
                        num_accepted_tokens=torch.tensor(counts, dtype=torch.int32, device=DEV),
                        query_start_loc=qsl, max_query_len=T)
    return out.cpu(), states.cpu()


LAYOUTS = ["SD", "DS"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("counts", [[0, 2], [2, NUM_SPEC + 2], [NUM_SPEC + 6, 1], [-1, 0]])
def test_out_of_range_count_stays_in_line(v033_tree, layout, counts):
    states = _states(1, layout)
    out, after = _run(v033_tree, counts, states)
    unnamed = sorted(set(range(NUM_LINES)) - set(LINES))
    assert torch.equal(after[unnamed], states[unnamed]), f"counts {counts} wrote outside the requests' lines"
    for r, line in enumerate(LINES):
        changed = _states(2, layout)
        changed[line] = states[line]
        out2, after2 = _run(v033_tree, counts, changed)
        torch.testing.assert_close(
            out2[r * T:(r + 1) * T], out[r * T:(r + 1) * T], rtol=0, atol=0, equal_nan=True,
            msg=lambda m, r=r: f"counts {counts}: request {r}'s output depends on lines other than its own: {m}")
        torch.testing.assert_close(
            after2[line], after[line], rtol=0, atol=0, equal_nan=True,
            msg=lambda m, r=r: f"counts {counts}: request {r}'s line depends on other lines: {m}")


VALID = [[1, NUM_SPEC + 1], [NUM_SPEC + 1, 2], [2, 1]]  # every offset 0..num_spec for each request


@pytest.mark.parametrize("layout", LAYOUTS)
def test_valid_counts_unchanged(v033_tree, v033_pristine_tree, layout):
    """In-range counts give the release's result, bit for bit (each offset gives another output)."""
    states = _states(1, layout)
    assert_valid_counts_unchanged(lambda c: _run(v033_tree, c, states), lambda c: _run(v033_pristine_tree, c, states),
                                  VALID, len(LINES), lambda out, r: out[r * T:(r + 1) * T])
