"""The 0.33.0 line's (the current line's) machine-checkable drop conditions can judge: on 0.33.0 they say the
fix is still needed, on a tree that has it (the patched one) they say it is obsolete."""

from __future__ import annotations

from pathlib import Path

from vllm_patch.lifecycle.obsolete import Judge, conditions


def _reader(root: Path):
    return lambda paths: {p: (root / p).read_bytes() if (root / p).is_file() else None for p in paths}


def test_gdn_index_bound_is_obsolete_only_where_the_bound_is(v033_series, v033_pristine_tree, v033_tree):
    patch = next(p for p in v033_series.patches if "accepted-token-index" in p.name)
    assert len(conditions(patch)) == 2
    assert Judge(_reader(v033_pristine_tree)).obsolete(patch) is None
    assert Judge(_reader(v033_tree)).obsolete(patch)


def test_tq_multi_query_route_is_obsolete_only_where_verify_is_spec_as_decode(v033_series, v033_pristine_tree,
                                                                              v033_tree):
    patch = next(p for p in v033_series.patches if "multi-query-verify" in p.name)
    assert len(conditions(patch)) == 2
    assert Judge(_reader(v033_pristine_tree)).obsolete(patch) is None
    assert Judge(_reader(v033_tree)).obsolete(patch)
