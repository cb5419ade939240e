"""Batches for ``GDNAttentionMetadataBuilder.build`` and what patches 0004/0005 make of them.

Shared by the CPU test (the module run with stand-ins) and the GPU-host test (the installed vLLM).
Each case takes the ``gdn_attn`` module, a ``make_builder(num_spec)`` callable and a device.

Rows are in the model runner's batch order. With speculative decoding the runner reorders the batch
with threshold K+1 into decodes (at most K+1 tokens, done prefilling), short extends, long extends and
new prefills. Decodes with drafts and decodes without drafts share the first region, in any order.
The non-spec rows of a mixed batch are therefore not a prefix of the batch: the builder selects them
with the spec mask, keeping their batch order.
"""

from __future__ import annotations

import torch

from gdn_builder_harness import Batch

K = 3  # draft tokens per step


def _ints(t: torch.Tensor | None) -> list[int] | None:
    return None if t is None else [int(v) for v in t.cpu().tolist()]


def _counts(values: list[int], device: str) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def _check_rows(md, batch: Batch, rows: list[int], counts: list[int]) -> None:
    """The recovery fields of the non-spec rows ``rows`` (batch indices, in order) with accepted ``counts``.

    The state slot is the row's block 0; the source is its block ``count - 1``. Sources and counts are
    aligned with the slots, row for row.
    """
    assert _ints(md.non_spec_state_indices_tensor) == [batch.block(r, 0) for r in rows]
    assert _ints(md.non_spec_state_src_indices) == [batch.block(r, c - 1) for r, c in zip(rows, counts, strict=True)]
    assert _ints(md.non_spec_num_accepted_tokens) == counts


def non_spec_step_after_acceptance(gdn_attn, make_builder, device: str) -> None:
    """No row has drafts (ngram found no match anywhere, or MTP gave zero drafts to all): the runner
    passes only the counts. Decodes come first; prefills get count 1 and read their own slot."""
    batch = Batch(query_lens=[1, 1, 1, 3, 9, 7], context_lens=[50, 40, 30, 20, 16, 0],
                  prefilling=[False, False, False, True, True, True], num_spec=K, device=device)
    # Row 3 is a chunked prefill whose sampled token was discarded: the runner counts 0 for it.
    md = make_builder(K).build(0, batch, num_accepted_tokens=_counts([3, 1, 4, 0, 1, 1], device))

    assert (md.num_decodes, md.num_prefills, md.num_spec_decodes) == (3, 3, 0)
    assert md.spec_sequence_masks is None and md.num_accepted_tokens is None
    assert _ints(md.non_spec_state_src_indices) == [batch.block(0, 2), batch.block(1, 0), batch.block(2, 3),
                                                    batch.block(3, 0), batch.block(4, 0), batch.block(5, 0)]
    assert _ints(md.non_spec_num_accepted_tokens) == [3, 1, 4, 1, 1, 1]
    _check_rows(md, batch, rows=list(range(6)), counts=[3, 1, 4, 1, 1, 1])


def non_spec_decode_only_after_acceptance(gdn_attn, make_builder, device: str) -> None:
    """Only 1-token decodes (the packed decode fast path): every row gets its source and count."""
    batch = Batch(query_lens=[1, 1, 1, 1], context_lens=[9, 8, 7, 6], prefilling=[False] * 4,
                  num_spec=K, device=device)
    md = make_builder(K).build(0, batch, num_accepted_tokens=_counts([2, 4, 1, 3], device))

    assert (md.num_decodes, md.num_prefills) == (4, 0)
    _check_rows(md, batch, rows=[0, 1, 2, 3], counts=[2, 4, 1, 3])


def non_spec_decode_padded_for_cuda_graphs(gdn_attn, make_builder, device: str) -> None:
    """With full CUDA graphs the builder copies the slots of a decode-only batch into its persistent
    buffer, padded with the null block to the runner's padded token count: sources and counts follow,
    null and 1 in the padding, so the kernels skip those rows."""
    batch = Batch(query_lens=[1, 1, 1], context_lens=[9, 8, 7], prefilling=[False] * 3,
                  num_spec=K, device=device)
    batch.num_actual_tokens = 5  # padded by the runner
    md = make_builder(K, full_cuda_graph=True).build(0, batch, num_accepted_tokens=_counts([3, 1, 2], device))

    null = gdn_attn.NULL_BLOCK_ID
    assert _ints(md.non_spec_state_indices_tensor) == [batch.block(r, 0) for r in range(3)] + [null] * 2
    assert _ints(md.non_spec_state_src_indices) == [batch.block(0, 2), batch.block(1, 0), batch.block(2, 1),
                                                    null, null]
    assert _ints(md.non_spec_num_accepted_tokens) == [3, 1, 2, 1, 1]


def non_spec_step_without_counts(gdn_attn, make_builder, device: str) -> None:
    """Nothing to recover (the runner passes no counts): no new fields, as before the patch."""
    batch = Batch(query_lens=[1, 1, 5], context_lens=[9, 8, 0], prefilling=[False, False, True],
                  num_spec=K, device=device)
    md = make_builder(K).build(0, batch)
    assert md.non_spec_state_src_indices is None and md.non_spec_num_accepted_tokens is None
    assert md.num_accepted_tokens is None


def no_spec_config_ignores_counts(gdn_attn, make_builder, device: str) -> None:
    """Without speculative decoding the builder never recovers anything."""
    batch = Batch(query_lens=[1, 1], context_lens=[9, 8], prefilling=[False, False], num_spec=0, device=device)
    md = make_builder(0).build(0, batch, num_accepted_tokens=_counts([1, 1], device))
    assert md.non_spec_state_src_indices is None and md.non_spec_num_accepted_tokens is None


def drafts_only_for_prefilling_rows(gdn_attn, make_builder, device: str) -> None:
    """A step with drafts where no decode verifies any (num_decode_draft_tokens all -1): the builder's
    non-spec branch, with the counts the spec wiring passes; decodes recover as in a step without drafts."""
    batch = Batch(query_lens=[1, 1, 6], context_lens=[30, 20, 10], prefilling=[False, False, True],
                  num_spec=K, device=device)
    md = make_builder(K).build(0, batch, num_accepted_tokens=_counts([4, 2, 1], device),
                               num_decode_draft_tokens_cpu=torch.tensor([-1, -1, -1], dtype=torch.int32))
    assert md.spec_sequence_masks is None and (md.num_decodes, md.num_prefills) == (2, 1)
    _check_rows(md, batch, rows=[0, 1, 2], counts=[4, 2, 1])


def pure_spec_batch(gdn_attn, make_builder, device: str) -> None:
    """Every row verifies drafts: the spec kernels recover by themselves; the new fields stay unset and
    num_accepted_tokens keeps the spec rows' counts."""
    batch = Batch(query_lens=[4, 4, 2], context_lens=[30, 20, 10], prefilling=[False] * 3, num_spec=K,
                  device=device)
    md = make_builder(K).build(0, batch, num_accepted_tokens=_counts([2, 1, 4], device),
                               num_decode_draft_tokens_cpu=torch.tensor([3, 3, 1], dtype=torch.int32))
    assert (md.num_spec_decodes, md.num_decodes, md.num_prefills) == (3, 0, 0)
    assert md.non_spec_state_src_indices is None and md.non_spec_num_accepted_tokens is None
    assert _ints(md.num_accepted_tokens) == [2, 1, 4]


# A mixed batch in runner order: decodes with and without drafts interleaved, then a chunked prefill
# and a new prefill. Rows 1 and 3 got zero drafts this step (-1): row 1 had accepted 3 tokens last step
# (an MTP request whose drafts the token budget cut, or an ngram request without a match), row 3 one.
MIXED_QUERY_LENS = [4, 1, 3, 1, 4, 2, 6]
MIXED_CONTEXT = [40, 35, 30, 25, 20, 10, 0]
MIXED_PREFILLING = [False, False, False, False, False, True, True]
MIXED_DRAFTS = [3, -1, 2, -1, 3, -1, -1]
MIXED_ACCEPTED = [2, 3, 4, 1, 1, 0, 1]
MIXED_NON_SPEC_ROWS = [1, 3, 5, 6]


def _mixed(make_builder, device, accepted=MIXED_ACCEPTED, **kwargs):
    batch = Batch(query_lens=MIXED_QUERY_LENS, context_lens=MIXED_CONTEXT, prefilling=MIXED_PREFILLING,
                  num_spec=K, device=device)
    md = make_builder(K).build(0, batch, num_accepted_tokens=_counts(accepted, device),
                               num_decode_draft_tokens_cpu=torch.tensor(MIXED_DRAFTS, dtype=torch.int32),
                               **kwargs)
    return batch, md


def mixed_batch(gdn_attn, make_builder, device: str) -> None:
    """Spec rows keep their counts; the non-spec rows (1, 3, 5, 6, in batch order) get sources and
    counts taken before the spec-only filter, aligned with their state slots, initial-state flags and
    query offsets."""
    batch, md = _mixed(make_builder, device)

    assert (md.num_spec_decodes, md.num_decodes, md.num_prefills) == (3, 0, 4)
    assert _ints(md.num_accepted_tokens) == [2, 4, 1]  # spec rows 0, 2, 4
    assert _ints(md.non_spec_state_indices_tensor) == [batch.block(r, 0) for r in MIXED_NON_SPEC_ROWS]
    assert _ints(md.non_spec_state_src_indices) == [batch.block(1, 2), batch.block(3, 0), batch.block(5, 0),
                                                 batch.block(6, 0)]
    assert _ints(md.non_spec_num_accepted_tokens) == [3, 1, 1, 1]
    # The same rows, in the same order, as the rest of the non-spec metadata.
    assert _ints(md.non_spec_query_start_loc) == [0, 1, 2, 4, 10]
    assert [bool(v) for v in md.has_initial_state.cpu()] == [True, True, True, False]


def mixed_batch_cpu_counts_skip(gdn_attn, make_builder, device: str) -> None:
    """With the CPU copy of the counts: nothing to do when no non-spec row accepted more than one token
    (spec rows may have), the same result as without it otherwise."""
    accepted = [2, 1, 4, 1, 3, 0, 1]  # row 4 (spec) accepted 3; every non-spec row at most 1
    _, md = _mixed(make_builder, device, accepted=accepted,
                   num_accepted_tokens_cpu=torch.tensor(accepted, dtype=torch.int32))
    assert md.non_spec_state_src_indices is None and md.non_spec_num_accepted_tokens is None
    assert _ints(md.num_accepted_tokens) == [2, 4, 3]

    batch, md = _mixed(make_builder, device,
                       num_accepted_tokens_cpu=torch.tensor(MIXED_ACCEPTED, dtype=torch.int32))
    assert _ints(md.non_spec_state_src_indices) == [batch.block(1, 2), batch.block(3, 0), batch.block(5, 0),
                                                 batch.block(6, 0)]
    assert _ints(md.non_spec_num_accepted_tokens) == [3, 1, 1, 1]


def zero_draft_decodes_as_spec_rows(gdn_attn, make_builder, device: str) -> None:
    """What the runner hands the builder with patch 0006: decodes without drafts count 0, not -1. They
    are spec rows with a 1-token query, read by the spec kernels at their accepted counts; only the
    prefills stay non-spec, and no decode is reclassified as a prefill."""
    drafts = [3, 0, 2, 0, 3, -1, -1]
    batch = Batch(query_lens=MIXED_QUERY_LENS, context_lens=MIXED_CONTEXT, prefilling=MIXED_PREFILLING,
                  num_spec=K, device=device)
    md = make_builder(K).build(0, batch, num_accepted_tokens=_counts(MIXED_ACCEPTED, device),
                               num_decode_draft_tokens_cpu=torch.tensor(drafts, dtype=torch.int32))

    assert (md.num_spec_decodes, md.num_decodes, md.num_prefills) == (5, 0, 2)
    assert _ints(md.num_accepted_tokens) == [2, 3, 4, 1, 1]  # rows 0-4
    assert _ints(md.spec_state_indices_tensor[:, 0]) == [batch.block(r, 0) for r in range(5)]
    assert _ints(md.spec_query_start_loc) == [0, 4, 5, 8, 9, 13]
    assert _ints(md.non_spec_state_indices_tensor) == [batch.block(5, 0), batch.block(6, 0)]


CASES = [
    non_spec_step_after_acceptance,
    non_spec_decode_only_after_acceptance,
    non_spec_decode_padded_for_cuda_graphs,
    non_spec_step_without_counts,
    no_spec_config_ignores_counts,
    drafts_only_for_prefilling_rows,
    pure_spec_batch,
    mixed_batch,
    mixed_batch_cpu_counts_skip,
    zero_draft_decodes_as_spec_rows,
]
