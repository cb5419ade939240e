"""Patch 0006 on 0.27.1: with a drafter configured, a decode that got no drafts is a speculative row with zero
drafts, so the GDN layers continue its state from the slot of the last accepted token (see
tests/lines/zero_draft.py for how the tree's runner and builder are run).

On the release, Model Runner V1 (the hybrids' default) takes the speculative path only in steps where some request
has drafts (``gpu_model_runner.py`` ``use_spec_decode = len(scheduled_spec_decode_tokens) > 0``), marks decodes
without drafts -1 (plain rows), and the GDN builder runs a step whose rows drafted nothing as a plain batch; both
send such rows to ``block_table[:, 0]``, a stale state whenever the previous step accepted more than one token.
Ngram leaves rows and whole steps without drafts whenever the prompt has no match."""

from __future__ import annotations

import pytest
import zero_draft

pytestmark = pytest.mark.integration

K = 3


def test_runner_keeps_decodes_without_drafts_on_the_speculative_path(v027_tree):
    # A step in which no request got drafts (ngram found no match): three decodes.
    assert zero_draft.spec_rows(v027_tree, [1, 1, 1], {}, computed=[50, 60, 70], prompt=[40, 40, 40],
                                num_spec=K) == [0, 0, 0]
    # A mixed step: a verify row with 2 drafts, a decode without, a prompt chunk, a prompt's last token.
    assert zero_draft.spec_rows(v027_tree, [3, 1, 5, 1], {0: 2}, computed=[50, 60, 10, 39],
                                prompt=[40, 40, 40, 40], num_spec=K) == [2, 0, -1, -1]


def test_gdn_starts_decodes_without_drafts_from_the_accepted_state(v027_tree):
    rows = zero_draft.spec_rows(v027_tree, [1, 1, 1], {}, computed=[50, 60, 70], prompt=[40, 40, 40], num_spec=K)
    # The previous verify step accepted 3, 1 and 2 tokens: columns 2, 0 and 1 of rows 0, 1 and 2.
    assert zero_draft.start_slots(v027_tree, rows, accepted=[3, 1, 2], num_spec=K) == [2, 10, 21]


def test_gdn_runs_a_step_of_zero_draft_rows_on_the_speculative_path(v027_tree):
    # The builder's half alone: given zero-draft rows, a step in which no row drafted is still a speculative step.
    assert zero_draft.start_slots(v027_tree, [0, 0, 0], accepted=[3, 1, 2], num_spec=K) == [2, 10, 21]
