"""Which batches Model Runner V1 replays in the FULL graphs of verify batches (the line's patch 0004), decided by
the tree's own runner code (``runner_dispatch``), on the cases of the 0.20 line's patch 0008
(``verify_dispatch``). On the release a prompt chunk of the verify shape replays the verify graph (the
preemption scenario with MTP diverges on V1, ``tests/gpu/reports/v0.33.0-h100.md``). These tests judge the
decision, not where a tree makes it: they are 0004's ``Obsolete-If: test`` check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import runner_dispatch
from verify_dispatch import OTHER_SHAPES, PROMPT_CHUNK_BATCHES, VERIFY_BATCHES

pytestmark = pytest.mark.patch("spec-decode-v1-full-graphs-only-for-verify-batches")


@pytest.fixture(scope="module")
def uniform(v033_tree: Path):
    return runner_dispatch.uniform_decode(v033_tree)


def test_verify_batches_replay_the_uniform_decode_graph(uniform):
    """Every request verifying K drafts, including a one-token remote prompt tail that 0.33's scheduler pads
    with K placeholder drafts (its drafts are scheduled, and the Mamba/GDN builder runs it as a speculative
    step)."""
    for scheduled, drafts, k in VERIFY_BATCHES:
        assert uniform(scheduled, drafts, k), (scheduled, drafts)


def test_a_prompt_chunk_of_the_verify_shape_is_a_mixed_batch(uniform):
    for scheduled, drafts, k in PROMPT_CHUNK_BATCHES:
        assert not uniform(scheduled, drafts, k), f"{scheduled} with drafts {drafts} replays the verify graph"


def test_batches_of_other_shapes_are_left_to_the_release(uniform):
    for scheduled, drafts, k in OTHER_SHAPES:
        assert not uniform(scheduled, drafts, k), (scheduled, drafts)
    assert uniform([1, 1, 1], {}, 0), "one-token decodes without speculation lost their FULL graphs"
