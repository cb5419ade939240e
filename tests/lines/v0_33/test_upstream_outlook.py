"""The current line's fates where upstream fixes its bugs its own way: ``outlook`` over a repository of 0.33.0
and one tag per stand-in of an open upstream PR (``upstream/<PR>.diff``, see ``upstream/README.md``), with the
line's behavioural ``Obsolete-If`` checks run on each tree. A fix written differently from the patch must read
as obsolete (or partly obsolete, naming the part), not as a conflict, and another fix must not read as ours.
``python -m pytest tests/lines/v0_33/test_upstream_outlook.py -s`` prints the outlook table."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from helpers import git
from vllm_patch.infrastructure.downloads import pinned_base_tree
from vllm_patch.lifecycle.outlook import build_outlook
from vllm_patch.lifecycle.upstream_trees import UpstreamCache
from vllm_patch.lines import line_for
from vllm_patch.report import outlook_markdown, short
from vllm_trees import PROJECT

UPSTREAM = Path(__file__).parent / "upstream"
# The stand-ins, tagged 0.33.1 .. 0.33.6 in this order, and the fate of each patch (stacked) there: the port's
# state, and the parts of it the stand-in makes unnecessary (its Obsolete-If parts that hold; empty: none).
PRS = ("53406", "43747", "53410", "50021", "48475", "47123")
UNTOUCHED = ("clean", ())
EXPECTED: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    # Verify batches out of FULL graphs (TurboQuant and UltraQuant share the builder): 0001's graph part is
    # upstream, its causal lengths are not; 0003 (which brings FULL graphs back) conflicts with the override, and
    # 0005-0008, which extend 0003's builder (0007 UltraQuant's subclass of it; 0008 its workspace), with it (wherever
    # 0003 conflicts). 0009 (the GDN layers' profile warm-up) and 0010 (V2's draft graphs) are untouched by every
    # stand-in.
    "53406": {"0001": ("merged", ("FULL graphs",)), "0002": UNTOUCHED, "0003": ("conflict", ()), "0004": UNTOUCHED,
              "0005": ("conflict", ()), "0006": ("conflict", ()), "0007": ("conflict", ()),
              "0008": ("conflict", ()), "0009": UNTOUCHED,
              "0010": UNTOUCHED},
    "43747": {"0001": ("conflict", ("FULL graphs",)), "0002": UNTOUCHED, "0003": ("conflict", ()),
              "0004": UNTOUCHED, "0005": ("conflict", ()), "0006": ("conflict", ()), "0007": ("conflict", ()),
              "0008": ("conflict", ()), "0009": UNTOUCHED,
              "0010": UNTOUCHED},
    # Verify rows expanded into single-token decodes in FULL graphs: 0003's graph safety is upstream, its
    # speed (the cache once per KV head, not once per query row) is not. 0001 is obsolete: its route checks see
    # TurboQuant's and UltraQuant's verify rows attended over the device lengths, around the per-request loop.
    "53410": {"0001": ("obsolete", ()), "0002": UNTOUCHED, "0003": ("conflict", ("graph safety",)),
              "0004": UNTOUCHED, "0005": ("conflict", ()), "0006": ("conflict", ()), "0007": ("conflict", ()),
              "0008": ("conflict", ()), "0009": UNTOUCHED,
              "0010": UNTOUCHED},
    # Bounds by the row stride (a stale count beyond the row's width still reads another column) and a clamp
    # below alone: neither keeps every count in the row, so no part of 0002 is upstream.
    "50021": {"0001": UNTOUCHED, "0002": ("clean", ()), "0003": UNTOUCHED, "0004": UNTOUCHED, "0005": UNTOUCHED,
              "0006": UNTOUCHED, "0007": UNTOUCHED, "0008": UNTOUCHED, "0009": UNTOUCHED,
              "0010": UNTOUCHED},
    "48475": {"0001": UNTOUCHED, "0002": ("conflict", ()), "0003": UNTOUCHED, "0004": UNTOUCHED, "0005": UNTOUCHED,
              "0006": UNTOUCHED, "0007": UNTOUCHED, "0008": UNTOUCHED, "0009": UNTOUCHED,
              "0010": UNTOUCHED},
    # V1's dispatch fixed in _is_uniform_decode, not where 0004 fixes it: the same decision, so 0004 is obsolete.
    "47123": {"0001": UNTOUCHED, "0002": UNTOUCHED, "0003": UNTOUCHED, "0004": ("obsolete", ()), "0005": UNTOUCHED,
              "0006": UNTOUCHED, "0007": UNTOUCHED, "0008": UNTOUCHED, "0009": UNTOUCHED,
              "0010": UNTOUCHED},
}


# Six outlook columns, each running the line's test checks on a tree of its own (cached verdicts: seconds).
pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def outlook(tmp_path_factory):
    """The outlook over 0.33.0 and one tag 0.33.N a stand-in (the current line only: the stand-ins are built on
    0.33.0)."""
    series = line_for(PROJECT, "0.33.0").load()
    if series.pin.version != "0.33.0":
        pytest.skip(f"the stand-ins of upstream PRs (upstream/*.diff) and the outlook's repository are built on "
                    f"0.33.0 (tag v0.33.0); this line is pinned to {series.pin.version}")
    repo = tmp_path_factory.mktemp("upstream") / "vllm"
    shutil.copytree(pinned_base_tree(series.pin, quiet=True), repo, ignore=shutil.ignore_patterns("__pycache__"))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "vLLM 0.33.0")
    git(repo, "tag", "v0.33.0")
    versions = []
    for n, pr in enumerate(PRS, start=1):
        git(repo, "checkout", "-q", "--detach", "v0.33.0")
        git(repo, "apply", str(UPSTREAM / f"{pr}.diff"))
        git(repo, "commit", "-q", "-am", f"stand-in for vllm#{pr}")
        git(repo, "tag", f"v0.33.{n}")
        versions.append(f"0.33.{n}")
    cache = UpstreamCache(tmp_path_factory.mktemp("cache") / "cache.git")
    return build_outlook(series, cache, versions, repo=str(repo), quiet=True, root=PROJECT)


def fates(result) -> dict[str, dict[str, tuple[str, tuple[str, ...]]]]:
    out = {}
    for pr, row in zip(PRS, result.rows, strict=True):
        cells = {}
        for name in result.names:
            cell = row.stacked[name]
            parts = ()
            if cell.partly:
                parts = tuple(cell.partly.removeprefix("partly obsolete: ").split(" (", 1)[0].split(", "))
            cells[short(name)] = (cell.state, parts)
        out[pr] = cells
    return out


def test_each_patch_reads_as_the_fate_upstream_gives_it(outlook):
    print("\n" + outlook_markdown(outlook))
    assert fates(outlook) == EXPECTED
