"""Which batches Model Runner V1 replays in the FULL graphs of verify batches (the line's patch 0004), on CPU,
with the runner's pieces cut out of the tree and the cases of the 0.20 line's patch 0008
(``verify_dispatch``). On the release every test errors: its ``execute_model`` sets no
``force_uniform_decode``, so a prompt chunk of the verify shape replays the verify graph (the preemption
scenario with MTP diverges on V1, ``tests/gpu/reports/v0.33.0-h100.md``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import verify_dispatch


@pytest.fixture(scope="module")
def uniform_dispatch(v033_tree: Path):
    return verify_dispatch.uniform_dispatch(verify_dispatch.runner_source(v033_tree))


def test_verify_batches_replay_the_uniform_decode_graph(uniform_dispatch):
    """A one-token remote prompt tail that 0.33's scheduler pads with K placeholder drafts is a verify row
    too: its drafts are scheduled, and the Mamba/GDN builder runs it as a speculative step."""
    verify_dispatch.assert_verify_batches_replay(uniform_dispatch)


def test_a_prompt_chunk_of_the_verify_shape_is_a_mixed_batch(uniform_dispatch):
    verify_dispatch.assert_prompt_chunks_are_mixed(uniform_dispatch)


def test_batches_of_other_shapes_are_left_to_the_release(uniform_dispatch):
    verify_dispatch.assert_other_shapes_left_alone(uniform_dispatch)
