"""vLLM's causal conv1d Triton kernels (Mamba/GDN) against ``references``: outputs and conv states.

Layouts as the GDN layer uses them: ``x`` channel-last, i.e. a (tokens, dim) tensor seen as (dim, tokens);
the conv state a (lines, dim, state_len) view either of (lines, state_len, dim) storage (the default "SD"
layout) or of contiguous (lines, dim, state_len) storage ("DS"). Line 0 is the null block: rows pointing
there are skipped by the kernels.
"""

from __future__ import annotations

import pytest
import torch

from references import causal_conv1d_update_ref, causal_conv1d_varlen_ref
from vllm_tree import GridOnLaunchArgs, interpreted, load_module

pytestmark = pytest.mark.kernels

CONV = "vllm/model_executor/layers/mamba/ops/causal_conv1d.py"

# Float32: the kernel accumulates in float32 like the float64 reference, so only summation order differs.
# Half types: each product and the output are rounded to 11 (float16) or 8 (bfloat16) mantissa bits.
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=1e-2, rtol=1e-2),
       torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}
# Triton's interpreter computes with bfloat16 tensors' raw bits (as if they were another type).
NO_BF16 = pytest.mark.skipif(interpreted(), reason="the Triton interpreter returns NaN for this bfloat16 conv "
                             "(NumPy has no bfloat16); it runs on the GPU host (gpu/host.sh kernels)")


@pytest.fixture(params=["pristine", "patched"])
def conv(request, pristine_tree, patched_tree, monkeypatch):
    """The kernel module of each tree: the patched kernels must keep the unpatched behaviour."""
    module = load_module(pristine_tree if request.param == "pristine" else patched_tree, CONV)
    if interpreted():
        monkeypatch.setattr(module, "_causal_conv1d_fwd_kernel", GridOnLaunchArgs(module._causal_conv1d_fwd_kernel))
    return module


def conv_states(lines: int, dim: int, state_len: int, layout: str, dtype, device, gen) -> torch.Tensor:
    """A (lines, dim, state_len) conv state with random content, stored "SD" or "DS"."""
    if layout == "SD":
        return torch.randn(lines, state_len, dim, generator=gen).to(device=device, dtype=dtype).transpose(-1, -2)
    return torch.randn(lines, dim, state_len, generator=gen).to(device=device, dtype=dtype)


def assert_states(got: torch.Tensor, want: torch.Tensor, dtype) -> None:
    """States the kernel wrote match the reference; lines and columns nobody writes are bit-identical."""
    assert got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


VARLEN_CASES = [
    # width, layout, bias, activation, dtype, extra state columns (the spec-decode sized state)
    pytest.param(4, "SD", True, "silu", torch.float32, 0, id="w4-SD-bias-silu"),
    pytest.param(4, "DS", False, None, torch.float32, 3, id="w4-DS-spec_state"),
    pytest.param(3, "SD", True, None, torch.float32, 0, id="w3-SD-bias"),
    pytest.param(2, "DS", True, "silu", torch.float32, 1, id="w2-DS-bias-silu"),
    pytest.param(4, "SD", True, "silu", torch.float16, 2, id="w4-SD-fp16"),
    pytest.param(4, "SD", True, "silu", torch.bfloat16, 2, id="w4-SD-bf16", marks=NO_BF16),
]


@pytest.mark.parametrize(("width", "layout", "has_bias", "activation", "dtype", "extra"), VARLEN_CASES)
def test_causal_conv1d_fn_varlen(conv, device, width, layout, has_bias, activation, dtype, extra):
    gen = torch.Generator().manual_seed(1000 + width)
    dim = 300  # two 256-channel kernel blocks, the second one partial
    # Lengths around the state length (width - 1) and the kernel's 8-token chunks; one empty sequence.
    lens = [1, 2, 3, 5, 8, 9, 17, 0, 4]
    init = [True, False, True, True, False, True, True, True, False]
    lines = 12
    cache_idx = [7, 3, 11, 1, 9, 2, 5, 10, 4]  # never 0 (the null block), never shared
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    total = int(qsl[-1])
    x = torch.randn(total, dim, generator=gen).to(device=device, dtype=dtype).T  # channel-last (dim, tokens)
    weight = torch.randn(dim, width, generator=gen).to(device=device, dtype=dtype)
    bias = torch.randn(dim, generator=gen).to(device=device, dtype=dtype) if has_bias else None
    states = conv_states(lines, dim, width - 1 + extra, layout, dtype, device, gen)
    ci = torch.tensor(cache_idx, dtype=torch.int32, device=device)
    his = torch.tensor(init, dtype=torch.bool, device=device)

    want_out, want_states, _ = causal_conv1d_varlen_ref(x, weight, bias, states, qsl, ci, his, activation)
    out = conv.causal_conv1d_fn(x, weight, bias, states, qsl, cache_indices=ci, has_initial_state=his,
                                activation=activation)

    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out.double(), want_out, **TOL[dtype])
    assert_states(states, want_states, dtype)
    untouched = sorted(set(range(lines)) - set(cache_idx))
    assert torch.equal(states[untouched], want_states[untouched])
    if extra:
        assert torch.equal(states[..., width - 1:], want_states[..., width - 1:])


def test_causal_conv1d_fn_skips_null_block_rows(conv, device):
    """A row whose cache line is the null block (0) leaves every state alone; the other rows are exact."""
    gen = torch.Generator().manual_seed(7)
    dim, width = 24, 4
    lens = [3, 10, 2]
    cache_idx = [2, 0, 1]
    qsl = torch.tensor([0, 3, 13, 15], dtype=torch.int32, device=device)
    x = torch.randn(15, dim, generator=gen).to(device).T
    weight = torch.randn(dim, width, generator=gen).to(device)
    states = conv_states(3, dim, width - 1, "SD", torch.float32, device, gen)
    before = states.clone()
    ci = torch.tensor(cache_idx, dtype=torch.int32, device=device)
    his = torch.ones(len(lens), dtype=torch.bool, device=device)

    want_out, want_states, done = causal_conv1d_varlen_ref(x, weight, None, states, qsl, ci, his, "silu")
    out = conv.causal_conv1d_fn(x, weight, None, states, qsl, cache_indices=ci, has_initial_state=his,
                                activation="silu")

    assert done == [True, False, True]
    assert torch.equal(states[0], before[0])
    for i in (0, 2):
        s, e = int(qsl[i]), int(qsl[i + 1])
        torch.testing.assert_close(out[:, s:e].double(), want_out[:, s:e], **TOL[torch.float32])
    assert_states(states, want_states, torch.float32)


UPDATE_CASES = [
    # width, layout, bias, activation, extra state columns
    pytest.param(4, "SD", True, "silu", 0, id="w4-SD-bias-silu"),
    pytest.param(4, "DS", False, None, 2, id="w4-DS-spec_state"),
    pytest.param(3, "SD", True, "silu", 1, id="w3-SD"),
]


@pytest.mark.parametrize(("width", "layout", "has_bias", "activation", "extra"), UPDATE_CASES)
@pytest.mark.parametrize("seqlen", [1, 2])
def test_causal_conv1d_update_decode(conv, device, width, layout, has_bias, activation, extra, seqlen):
    """Plain decode (no speculation): x (batch, dim) for one token, (batch, dim, seqlen) for more."""
    gen = torch.Generator().manual_seed(2000 + width * 10 + seqlen)
    dim = 300  # two 256-channel kernel blocks, the second one partial
    lines = 9
    cache_idx = [4, 0, 7, 1, 8, 3]  # row 1 is padding (the null block)
    batch = len(cache_idx)
    shape = (batch, dim) if seqlen == 1 else (batch, dim, seqlen)
    x = torch.randn(*shape, generator=gen).to(device)
    weight = torch.randn(dim, width, generator=gen).to(device)
    bias = torch.randn(dim, generator=gen).to(device) if has_bias else None
    states = conv_states(lines, dim, width - 1 + extra, layout, torch.float32, device, gen)
    before = states.clone()
    ci = torch.tensor(cache_idx, dtype=torch.int32, device=device)

    x3 = x if seqlen > 1 else x.unsqueeze(-1)
    want_out, want_states, done = causal_conv1d_update_ref(x3, states, weight, bias, activation, ci)
    out = conv.causal_conv1d_update(x.clone(), states, weight, bias, activation, conv_state_indices=ci)

    assert out.shape == x.shape
    got = out if seqlen > 1 else out.unsqueeze(-1)
    rows = [i for i, ok in enumerate(done) if ok]
    assert rows == [0, 2, 3, 4, 5]
    torch.testing.assert_close(got[rows].double(), want_out[rows], **TOL[torch.float32])
    assert_states(states, want_states, torch.float32)
    assert torch.equal(states[0], before[0])
    assert torch.equal(states[..., width - 1:], before[..., width - 1:])


@pytest.mark.parametrize(("width", "layout"), [(4, "SD"), (4, "DS"), (3, "SD")])
def test_causal_conv1d_update_spec_varlen(conv, device, width, layout):
    """Speculative decoding, varlen: each row's window starts at its accepted-token offset in the state,
    and the state ends as the window's tail plus the new tokens (width - 2 + seqlen columns)."""
    gen = torch.Generator().manual_seed(3000 + width)
    dim = 300  # two 256-channel kernel blocks, the second one partial
    k = 3  # draft tokens: rows have up to k + 1 tokens, the state k extra columns
    lens = [4, 4, 1, 3, 0, 4, 2]
    accepted = [1, 4, 2, 3, 1, 2, 4]
    cache_idx = [5, 2, 8, 1, 6, 3, 7]
    lines = 9
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    x = torch.randn(int(qsl[-1]), dim, generator=gen).to(device)  # (tokens, dim)
    weight = torch.randn(dim, width, generator=gen).to(device)
    bias = torch.randn(dim, generator=gen).to(device)
    states = conv_states(lines, dim, width - 1 + k, layout, torch.float32, device, gen)
    before = states.clone()
    ci = torch.tensor(cache_idx, dtype=torch.int32, device=device)
    nat = torch.tensor(accepted, dtype=torch.int32, device=device)

    want_out, want_states, done = causal_conv1d_update_ref(x, states, weight, bias, "silu", ci,
                                                           num_accepted_tokens=nat, query_start_loc=qsl)
    out = conv.causal_conv1d_update(x.clone(), states, weight, bias, "silu", conv_state_indices=ci,
                                    num_accepted_tokens=nat, query_start_loc=qsl, max_query_len=k + 1)

    assert done == [n > 0 for n in lens]
    torch.testing.assert_close(out.double(), want_out, **TOL[torch.float32])
    assert_states(states, want_states, torch.float32)
    assert torch.equal(states[6], before[6])  # the empty row's line
    assert torch.equal(states[0], before[0])


def test_causal_conv1d_update_spec_batched(conv, device):
    """Speculative decoding with x (batch, dim, k + 1): every row has k + 1 tokens."""
    gen = torch.Generator().manual_seed(4000)
    dim, width, k = 40, 4, 2
    accepted = [1, 3, 2]
    cache_idx = [3, 1, 2]
    x = torch.randn(3, dim, k + 1, generator=gen).to(device)
    weight = torch.randn(dim, width, generator=gen).to(device)
    states = conv_states(4, dim, width - 1 + k, "SD", torch.float32, device, gen)
    ci = torch.tensor(cache_idx, dtype=torch.int32, device=device)
    nat = torch.tensor(accepted, dtype=torch.int32, device=device)

    want_out, want_states, _ = causal_conv1d_update_ref(x, states, weight, None, None, ci, num_accepted_tokens=nat)
    out = conv.causal_conv1d_update(x.clone(), states, weight, None, None, conv_state_indices=ci,
                                    num_accepted_tokens=nat)

    torch.testing.assert_close(out.double(), want_out, **TOL[torch.float32])
    assert_states(states, want_states, torch.float32)
