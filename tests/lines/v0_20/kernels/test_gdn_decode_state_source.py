"""GDN non-spec decode reading the SSM state from the block of the last accepted token (patch 0004).

After a step that verified drafts, the state a sequence continues from is in block ``a - 1`` of its
state blocks, while the non-spec decode kernels read and write its slot (block 0). The patched
packed decode kernel takes ``ssm_state_src_indices``: it reads there and writes the new state to the
slot, with no copy. The layer's other decode path (``fused_sigmoid_gating_delta_rule_update``, used when
the packed path is disabled) gets rows ``(slot, source)`` with a count of 2, which the unpatched kernel's
spec-decoding indexing reads at column 1 and writes at column 0. Checked against:

- an oracle built from the *pristine* packed kernel: copy the state from the source block into the slot,
  then run it without the argument. Outputs and states must match exactly under the interpreter;
- a PyTorch gated delta rule step in float64, written here.

With ``VLLM_PATCH_PATCHED_TREE`` set to a pristine tree these tests fail: the packed decode has no
``ssm_state_src_indices`` argument there.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from vllm_tree import interpreted, load_module

pytestmark = pytest.mark.patch("gdn-recover-conv-and-ssm-state-after-spec-decode")

RECURRENT = "vllm/model_executor/layers/fla/ops/fused_recurrent.py"
SIGMOID_GATING = "vllm/model_executor/layers/fla/ops/fused_sigmoid_gating.py"
H, HV, K, V = 2, 4, 16, 16  # k-heads, v-heads, head sizes
NUM_SPEC = 3


@pytest.fixture
def patched(patched_tree):
    return load_module(patched_tree, RECURRENT)


@pytest.fixture
def pristine(pristine_tree):
    return load_module(pristine_tree, RECURRENT)


@dataclass
class Step:
    """A decode step of ``batch`` sequences: inputs, state lines, slots and sources.

    Sequence i owns lines ``1 + i*(1+K) ...`` (line 0 is the null block); its slot is the first, its
    source the ``accepted[i]``-th. ``null_rows`` get the null block as slot (CUDA-graph padding).
    """

    mixed_qkv: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    state: torch.Tensor
    slots: torch.Tensor
    sources: torch.Tensor

    @classmethod
    def make(cls, accepted: list[int], device: str, null_rows: tuple[int, ...] = (), seed: int = 0) -> Step:
        gen = torch.Generator().manual_seed(seed)
        batch = len(accepted)
        lines = 1 + batch * (1 + NUM_SPEC)

        def randn(*size: int) -> torch.Tensor:
            return torch.randn(*size, generator=gen).to(device)

        first = 1 + torch.arange(batch) * (1 + NUM_SPEC)
        slots = first.clone()
        sources = first + torch.tensor(accepted) - 1
        for row in null_rows:
            slots[row] = sources[row] = 0
        return cls(
            mixed_qkv=randn(batch, 2 * H * K + HV * V).to(torch.bfloat16),
            a=randn(batch, HV).to(torch.bfloat16),
            b=randn(batch, HV).to(torch.bfloat16),
            A_log=torch.log(torch.rand(HV, generator=gen) * 15 + 1).to(device),
            dt_bias=randn(HV),
            state=randn(lines, HV, V, K),
            slots=slots.to(device=device, dtype=torch.int32),
            sources=sources.to(device=device, dtype=torch.int32),
        )

    def out(self) -> torch.Tensor:
        return torch.zeros(self.mixed_qkv.shape[0], 1, HV, V, dtype=torch.bfloat16, device=self.state.device)


def packed(module, step: Step, state: torch.Tensor, **src) -> torch.Tensor:
    out = step.out()
    module.fused_recurrent_gated_delta_rule_packed_decode(
        mixed_qkv=step.mixed_qkv, a=step.a, b=step.b, A_log=step.A_log, dt_bias=step.dt_bias,
        scale=K**-0.5, initial_state=state, out=out, ssm_state_indices=step.slots,
        use_qk_l2norm_in_kernel=True, **src,
    )
    return out


def copied_then_pristine(pristine, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
    """What a copy-based recovery computes: state[slot] = state[source], then the unpatched kernel."""
    state = step.state.clone()
    live = step.slots > 0
    state[step.slots[live].long()] = state[step.sources[live].long()]
    out = packed(pristine, step, state)
    return out, state


def delta_rule_ref(step: Step) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 gated delta rule, one token per sequence, from its source block: (out, new slot states)."""
    qkv = step.mixed_qkv.double().cpu()
    q = qkv[:, : H * K].view(-1, H, K)
    k = qkv[:, H * K : 2 * H * K].view(-1, H, K)
    v = qkv[:, 2 * H * K :].view(-1, HV, V)
    rep = HV // H
    q = F.normalize(q, dim=-1, eps=1e-6).repeat_interleave(rep, dim=1) * K**-0.5
    k = F.normalize(k, dim=-1, eps=1e-6).repeat_interleave(rep, dim=1)
    g = -step.A_log.double().cpu().exp() * F.softplus(step.a.double().cpu() + step.dt_bias.double().cpu())
    # The kernels round beta to the dtype of b before using it (a sigmoid computed a little differently
    # can round to the neighbouring bfloat16: the tolerances allow for one such step).
    beta = torch.sigmoid(step.b.float().cpu()).to(step.b.dtype).double()
    h = step.state.double().cpu()[step.sources.long().cpu()] * g.exp()[..., None, None]  # (B, HV, V, K)
    delta = (v - torch.einsum("bhvk,bhk->bhv", h, k)) * beta[..., None]
    h = h + delta[..., None] * k[:, :, None, :]
    out = torch.einsum("bhvk,bhk->bhv", h, q)
    return out.unsqueeze(1), h


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bit-identical under the interpreter; on a GPU two compilations of the same arithmetic may round
    differently."""
    if interpreted():
        assert torch.equal(a, b)
    else:
        torch.testing.assert_close(a, b, atol=2e-2 if a.dtype == torch.bfloat16 else 1e-5, rtol=1e-3)


@pytest.mark.parametrize("accepted", [[1], [4], [2, 1, 4, 3], [3, 3, 1, 2, 4, 1, 2]])
def test_packed_decode_reads_source_block(patched, pristine, accepted, device):
    step = Step.make(accepted, device)
    state = step.state.clone()
    out = packed(patched, step, state, ssm_state_src_indices=step.sources)
    want_out, want_state = copied_then_pristine(pristine, step)

    _same(out, want_out)
    slots = step.slots.long()
    _same(state[slots], want_state[slots])
    # Nothing else changes: the source blocks keep the state they had (no copy was made).
    assert torch.equal(torch.where(_rows(step.slots, state), step.state, state), step.state)

    ref_out, ref_state = delta_rule_ref(step)
    torch.testing.assert_close(out.double().cpu(), ref_out, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(state[slots].double().cpu(), ref_state, atol=1e-2, rtol=1e-2)


def test_packed_decode_without_sources_is_unchanged(patched, pristine, device):
    """Every step without speculative decoding, or not after an accepted draft: the release's kernel."""
    step = Step.make([2, 4, 1], device)
    state, want_state = step.state.clone(), step.state.clone()
    out = packed(patched, step, state)
    want_out = packed(pristine, step, want_state)
    _same(out, want_out)
    _same(state, want_state)


def test_packed_decode_skips_null_slots(patched, device):
    """Padded rows (null slot) produce zeros and touch no state, with sources given as well."""
    step = Step.make([2, 3, 4], device, null_rows=(1,))
    state = step.state.clone()
    out = packed(patched, step, state, ssm_state_src_indices=step.sources)
    assert torch.count_nonzero(out[1]) == 0
    assert torch.equal(state[0], step.state[0])


def test_packed_decode_rejects_misshapen_sources(patched, device):
    step = Step.make([2, 3], device)
    state = step.state.clone()
    with pytest.raises(ValueError, match="ssm_state_src_indices"):
        packed(patched, step, state, ssm_state_src_indices=step.sources[:1])
    assert torch.equal(state, step.state)


def test_sigmoid_gating_decode_with_slot_source_rows(pristine_tree, device):
    """The layer's non-packed decode path: rows (slot, source) and count 2 through the release's
    ``fused_sigmoid_gating_delta_rule_update`` give what the same kernel gives on 1-D slots after the
    state was copied from the source block."""
    gating = load_module(pristine_tree, SIGMOID_GATING)
    step = Step.make([2, 1, 4, 3], device)
    batch = step.mixed_qkv.shape[0]
    q, k, v = torch.split(step.mixed_qkv, [H * K, H * K, HV * V], dim=-1)

    def decode(state: torch.Tensor, **indices) -> torch.Tensor:
        out, _ = gating.fused_sigmoid_gating_delta_rule_update(
            A_log=step.A_log, a=step.a, b=step.b, dt_bias=step.dt_bias,
            q=q.reshape(1, batch, H, K), k=k.reshape(1, batch, H, K), v=v.reshape(1, batch, HV, V),
            initial_state=state, inplace_final_state=True,
            cu_seqlens=torch.arange(batch + 1, dtype=torch.int32, device=device),
            use_qk_l2norm_in_kernel=True, **indices,
        )
        return out

    state = step.state.clone()
    out = decode(state, ssm_state_indices=torch.stack((step.slots, step.sources), dim=1),
                 num_accepted_tokens=torch.full_like(step.sources, 2))
    want_state = step.state.clone()
    want_state[step.slots.long()] = want_state[step.sources.long()]
    want_out = decode(want_state, ssm_state_indices=step.slots)

    _same(out, want_out)
    _same(state, torch.where(_rows(step.slots, state), want_state, step.state))


def _rows(slots: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """A mask over ``state``'s lines, true at ``slots``, broadcastable to ``state``."""
    mask = torch.zeros(state.shape[0], dtype=torch.bool, device=state.device)
    mask[slots.long()] = True
    return mask.view(-1, *([1] * (state.dim() - 1)))
