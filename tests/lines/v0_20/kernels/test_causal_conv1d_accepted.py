"""``causal_conv1d_fn(..., num_accepted_tokens=...)``: the prefill conv kernel starting from the conv window
that a speculative step left for the last accepted token (patch 0004).

After a step that verified drafts, a sequence's conv state line holds ``[history..., drafts...]``; once
``a`` tokens are accepted, the window to continue from starts ``a - 1`` columns in. The patched kernel
reads it there and writes the final window at column 0, as usual. Checked against:

- an oracle built from the *pristine* kernel: shift ``state[:, a-1 : a-1+W-1]`` to ``state[:, 0 : W-1]``,
  then run the unpatched kernel without the argument. Outputs and states must match exactly;
- a plain PyTorch depthwise ``conv1d`` in float64, written here;
- a speculative step (``causal_conv1d_update``) followed by a non-spec step: the outputs must equal
  a convolution over the stream of accepted tokens.

These tests exercise the patched tree only. With ``VLLM_PATCH_PATCHED_TREE`` set to a pristine tree they
fail: ``causal_conv1d_fn`` has no ``num_accepted_tokens`` argument there.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_tree import GridOnLaunchArgs, interpreted, load_module

pytestmark = [pytest.mark.kernels, pytest.mark.patch("gdn-recover-conv-and-ssm-state-after-spec-decode")]

CONV = "vllm/model_executor/layers/mamba/ops/causal_conv1d.py"
TOL = dict(atol=1e-5, rtol=1e-5)  # float32 kernels vs a float64 reference


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bit-identical under the interpreter; on a GPU the two kernels are separate compilations of the same
    arithmetic, so allow for a different instruction schedule."""
    if interpreted():
        assert torch.equal(a, b)
    else:
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def _module(tree, monkeypatch):
    module = load_module(tree, CONV)
    if interpreted():
        monkeypatch.setattr(module, "_causal_conv1d_fwd_kernel", GridOnLaunchArgs(module._causal_conv1d_fwd_kernel))
    return module


@pytest.fixture
def patched(patched_tree, monkeypatch):
    return _module(patched_tree, monkeypatch)


@pytest.fixture
def pristine(pristine_tree, monkeypatch):
    return _module(pristine_tree, monkeypatch)


def make_states(lines: int, dim: int, state_len: int, layout: str, gen, device) -> torch.Tensor:
    """A (lines, dim, state_len) float32 conv state, stored (lines, state_len, dim) ("SD") or as is ("DS")."""
    if layout == "SD":
        return torch.randn(lines, state_len, dim, generator=gen).to(device).transpose(-1, -2)
    return torch.randn(lines, dim, state_len, generator=gen).to(device)


def conv_ref(x, weight, bias, states, qsl, cache_idx, has_init, accepted, activation):
    """float64 depthwise conv1d per sequence: (out (dim, tokens), new states).

    Sequence i starts from ``states[line, :, a-1 : a-1+W-1]`` (zeros without initial state) and leaves
    the last W-1 columns of [window, x_i] at ``states[line, :, 0 : W-1]``.
    """
    dim, width = weight.shape
    keep = width - 1
    out = torch.zeros(x.shape, dtype=torch.float64)
    new = states.detach().cpu().clone()
    w = weight.detach().cpu().double().unsqueeze(1)  # (dim, 1, width)
    b = bias.detach().cpu().double() if bias is not None else None
    for i, line in enumerate(cache_idx):
        s, e = int(qsl[i]), int(qsl[i + 1])
        if e == s:
            continue
        off = accepted[i] - 1
        prefix = (states[line, :, off:off + keep].detach().cpu().double() if has_init[i]
                  else torch.zeros(dim, keep, dtype=torch.float64))
        window = torch.cat([prefix, x[:, s:e].detach().cpu().double()], dim=1)
        y = F.conv1d(window.unsqueeze(0), w, b, groups=dim).squeeze(0)  # (dim, e - s)
        if activation == "silu":
            y = F.silu(y)
        out[:, s:e] = y
        new[line, :, :keep] = window[:, -keep:].float()
    return out, new


# A varlen batch: lengths around the state length (width - 1) and the kernel's 8-token chunks, one empty
# sequence; with and without initial state; every offset 0..K, several times.
K = 3
LENS = [1, 2, 3, 5, 8, 9, 17, 0, 4, 1, 2, 1]
INIT = [True, True, True, True, True, True, True, True, False, False, True, True]
ACCEPTED = [1, 2, 3, 4, 4, 3, 2, 3, 4, 2, 1, 4]  # offset = accepted - 1 in 0..K
CACHE_IDX = [7, 3, 11, 1, 9, 2, 5, 10, 4, 12, 6, 8]  # never 0 (the null block), never shared
LINES = 14


def batch(width, layout, has_bias, device, seed):
    gen = torch.Generator().manual_seed(seed)
    dim = 40 if device == "cpu" else 300
    qsl = torch.tensor([0, *torch.tensor(LENS).cumsum(0).tolist()], dtype=torch.int32, device=device)
    x = torch.randn(int(qsl[-1]), dim, generator=gen).to(device).T  # channel-last (dim, tokens)
    weight = torch.randn(dim, width, generator=gen).to(device)
    bias = torch.randn(dim, generator=gen).to(device) if has_bias else None
    states = make_states(LINES, dim, width - 1 + K, layout, gen, device)
    ci = torch.tensor(CACHE_IDX, dtype=torch.int32, device=device)
    his = torch.tensor(INIT, dtype=torch.bool, device=device)
    nat = torch.tensor(ACCEPTED, dtype=torch.int32, device=device)
    return x, weight, bias, states, qsl, ci, his, nat


CASES = [
    # width, layout, bias, activation
    pytest.param(4, "SD", True, "silu", id="w4-SD-bias-silu"),
    pytest.param(4, "DS", False, None, id="w4-DS"),
    pytest.param(3, "SD", True, None, id="w3-SD-bias"),
    pytest.param(2, "DS", True, "silu", id="w2-DS-bias-silu"),
]


@pytest.mark.parametrize(("width", "layout", "has_bias", "activation"), CASES)
def test_accepted_offset_matches_preshifted_pristine_kernel(patched, pristine, device, width, layout, has_bias,
                                                            activation):
    """Patched kernel with counts == pristine kernel on a state pre-shifted by each row's offset (exact)."""
    x, weight, bias, states, qsl, ci, his, nat = batch(width, layout, has_bias, device, 100 + width)
    oracle_states = states.clone()
    for i, line in enumerate(CACHE_IDX):
        if LENS[i]:  # the kernel leaves the line of an empty sequence alone
            off = ACCEPTED[i] - 1
            oracle_states[line, :, : width - 1] = states[line, :, off:off + width - 1].clone()

    out = patched.causal_conv1d_fn(x, weight, bias, states, qsl, cache_indices=ci, has_initial_state=his,
                                   activation=activation, num_accepted_tokens=nat)
    want = pristine.causal_conv1d_fn(x, weight, bias, oracle_states, qsl, cache_indices=ci,
                                     has_initial_state=his, activation=activation)

    _same(out, want)
    # Column 0..W-2 of every used line is the new window; the columns after it are left alone.
    _same(states, oracle_states)


@pytest.mark.parametrize(("width", "layout", "has_bias", "activation"), CASES)
def test_accepted_offset_matches_torch_conv(patched, device, width, layout, has_bias, activation):
    x, weight, bias, states, qsl, ci, his, nat = batch(width, layout, has_bias, device, 200 + width)
    before = states.clone()
    want_out, want_states = conv_ref(x, weight, bias, before, qsl, CACHE_IDX, INIT, ACCEPTED, activation)

    out = patched.causal_conv1d_fn(x, weight, bias, states, qsl, cache_indices=ci, has_initial_state=his,
                                   activation=activation, num_accepted_tokens=nat)

    torch.testing.assert_close(out.cpu().double(), want_out, **TOL)
    torch.testing.assert_close(states.cpu(), want_states, **TOL)
    assert torch.equal(states[..., width - 1:], before[..., width - 1:])
    untouched = sorted(set(range(LINES)) - set(CACHE_IDX))
    assert torch.equal(states[untouched], before[untouched])


def test_all_ones_equals_no_counts_and_pristine(patched, pristine, device):
    """Counts of 1 (what prefills get) are no offset: same as omitting them, and as the pristine kernel."""
    x, weight, bias, states, qsl, ci, his, _ = batch(4, "SD", True, device, 300)
    ones = torch.ones(len(LENS), dtype=torch.int32, device=device)
    s1, s2, s3 = states.clone(), states.clone(), states.clone()

    o1 = patched.causal_conv1d_fn(x, weight, bias, s1, qsl, cache_indices=ci, has_initial_state=his,
                                  activation="silu", num_accepted_tokens=ones)
    o2 = patched.causal_conv1d_fn(x, weight, bias, s2, qsl, cache_indices=ci, has_initial_state=his,
                                  activation="silu")
    o3 = pristine.causal_conv1d_fn(x, weight, bias, s3, qsl, cache_indices=ci, has_initial_state=his,
                                   activation="silu")

    for got in (o1, o2):
        _same(got, o3)
    for got in (s1, s2):
        _same(got, s3)


def test_null_block_row_skipped_with_counts(patched, device):
    """A padded row (cache line 0, the null block) is skipped before its count matters."""
    x, weight, bias, states, qsl, ci, his, nat = batch(4, "DS", True, device, 400)
    ci[2] = 0
    before = states.clone()
    patched.causal_conv1d_fn(x, weight, bias, states, qsl, cache_indices=ci, has_initial_state=his,
                             activation="silu", num_accepted_tokens=nat)
    assert torch.equal(states[0], before[0])


@pytest.mark.parametrize("layout", ["SD", "DS"])
def test_spec_step_then_non_spec_step_follows_accepted_stream(patched, device, layout):
    """What the GDN layer does across two steps.

    Step 1 verifies K drafts (``causal_conv1d_update``, spec mode) and ``a`` tokens are accepted. Step 2
    processes new tokens without drafts (``causal_conv1d_fn`` with the counts, as a prefill, or
    ``causal_conv1d_update`` without varlen, as a 1-token decode). Step 2's outputs and final state must
    equal a plain convolution over history + accepted tokens + new tokens.
    """
    gen = torch.Generator().manual_seed(500)
    width, dim = 4, (40 if device == "cpu" else 300)
    keep = width - 1
    accepted = [1, 2, 3, 4, 4, 2]
    new_lens = [1, 5, 2, 9, 1, 3]
    cache_idx = [3, 5, 1, 6, 2, 4]
    n = len(accepted)
    weight = torch.randn(dim, width, generator=gen).to(device)
    bias = torch.randn(dim, generator=gen).to(device)
    states = make_states(7, dim, keep + K, layout, gen, device)
    history = {line: states[line, :, :keep].cpu().double().clone() for line in cache_idx}
    ci = torch.tensor(cache_idx, dtype=torch.int32, device=device)

    # Step 1: every row verifies K drafts (K + 1 tokens); the previous step accepted 1 (offset 0).
    x1 = torch.randn(n * (K + 1), dim, generator=gen).to(device)
    qsl1 = torch.arange(0, n * (K + 1) + 1, K + 1, dtype=torch.int32, device=device)
    patched.causal_conv1d_update(x1.clone(), states, weight, bias, "silu", conv_state_indices=ci,
                                 num_accepted_tokens=torch.ones(n, dtype=torch.int32, device=device),
                                 query_start_loc=qsl1, max_query_len=K + 1)
    nat = torch.tensor(accepted, dtype=torch.int32, device=device)

    # Step 2 as a prefill (mixed batch, or a batch with prefills).
    decode_states = states.clone()
    qsl2 = torch.tensor([0, *torch.tensor(new_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    x2 = torch.randn(int(qsl2[-1]), dim, generator=gen).to(device).T
    his = torch.ones(n, dtype=torch.bool, device=device)
    out = patched.causal_conv1d_fn(x2, weight, bias, states, qsl2, cache_indices=ci, has_initial_state=his,
                                   activation="silu", num_accepted_tokens=nat)

    w = weight.cpu().double().unsqueeze(1)
    for i, line in enumerate(cache_idx):
        a = accepted[i]
        s, e = int(qsl2[i]), int(qsl2[i + 1])
        stream = torch.cat([history[line], x1[i * (K + 1): i * (K + 1) + a].T.cpu().double(),
                            x2[:, s:e].cpu().double()], dim=1)
        y = F.silu(F.conv1d(stream.unsqueeze(0), w, bias.cpu().double(), groups=dim).squeeze(0))
        torch.testing.assert_close(out[:, s:e].cpu().double(), y[:, -(e - s):], **TOL)
        torch.testing.assert_close(states[line, :, :keep].cpu().double(), stream[:, -keep:], **TOL)

    # Step 2 as a decode (every row one token): the decode kernel with the same counts.
    x3 = torch.randn(n, dim, generator=gen).to(device)
    out3 = patched.causal_conv1d_update(x3.clone(), decode_states, weight, bias, "silu", conv_state_indices=ci,
                                        num_accepted_tokens=nat)
    for i, line in enumerate(cache_idx):
        a = accepted[i]
        stream = torch.cat([history[line], x1[i * (K + 1): i * (K + 1) + a].T.cpu().double(),
                            x3[i].cpu().double().unsqueeze(1)], dim=1)
        y = F.silu(F.conv1d(stream.unsqueeze(0), w, bias.cpu().double(), groups=dim).squeeze(0))
        torch.testing.assert_close(out3[i].cpu().double(), y[:, -1], **TOL)
        torch.testing.assert_close(decode_states[line, :, :keep].cpu().double(), stream[:, -keep:], **TOL)


def test_without_counts_the_non_spec_step_diverges(pristine, device):
    """The bug itself, as a control that the oracle above is sensitive: the pristine kernel (no counts)
    continues rows that accepted more than one token from the wrong window, rows that accepted one
    token correctly."""
    gen = torch.Generator().manual_seed(600)
    width, dim = 4, (40 if device == "cpu" else 300)
    keep = width - 1
    accepted = [1, 3, 4]
    cache_idx = [1, 2, 3]
    n = len(accepted)
    weight = torch.randn(dim, width, generator=gen).to(device)
    states = make_states(4, dim, keep + K, "SD", gen, device)
    history = {line: states[line, :, :keep].cpu().double().clone() for line in cache_idx}
    ci = torch.tensor(cache_idx, dtype=torch.int32, device=device)
    x1 = torch.randn(n * (K + 1), dim, generator=gen).to(device)
    qsl1 = torch.arange(0, n * (K + 1) + 1, K + 1, dtype=torch.int32, device=device)
    pristine.causal_conv1d_update(x1.clone(), states, weight, None, None, conv_state_indices=ci,
                                  num_accepted_tokens=torch.ones(n, dtype=torch.int32, device=device),
                                  query_start_loc=qsl1, max_query_len=K + 1)
    qsl2 = torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=device)
    x2 = torch.randn(6, dim, generator=gen).to(device).T
    out = pristine.causal_conv1d_fn(x2, weight, None, states, qsl2, cache_indices=ci,
                                    has_initial_state=torch.ones(n, dtype=torch.bool, device=device), activation=None)
    w = weight.cpu().double().unsqueeze(1)
    for i, line in enumerate(cache_idx):
        a = accepted[i]
        stream = torch.cat([history[line], x1[i * (K + 1): i * (K + 1) + a].T.cpu().double(),
                            x2[:, 2 * i: 2 * i + 2].cpu().double()], dim=1)
        y = F.conv1d(stream.unsqueeze(0), w, None, groups=dim).squeeze(0)[:, -2:]
        close = torch.allclose(out[:, 2 * i: 2 * i + 2].cpu().double(), y, **TOL)
        assert close == (a == 1), f"row {i} (accepted {a})"
