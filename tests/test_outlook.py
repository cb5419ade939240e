"""Renames, deletions, obsolete patches, checked resolutions, drops and the outlook, on
small synthetic trees (the real releases: tests/integration/test_outlook_real.py)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from helpers import build_series, edit, git, git_repo
from vllm_patch.engine.patchfile import parse_patch
from vllm_patch.engine.pin import Artifact, Pin
from vllm_patch.errors import CheckNotRun, InputError, UpstreamError
from vllm_patch.lifecycle import merge3, rebase
from vllm_patch.lifecycle.obsolete import Judge, conditions
from vllm_patch.lifecycle.outlook import build_outlook, carry
from vllm_patch.lifecycle.pycheck import check_files
from vllm_patch.lifecycle.rebase import Rebaser, Step, _build_tag, port, series_text
from vllm_patch.lifecycle.upstream_trees import Moves, UpstreamCache
from vllm_patch.report import glyph, outlook_dict, outlook_markdown, print_outlook
from vllm_patch.series import load_series

VERSION = b"__version__ = version = '%s'\n__commit_id__ = commit_id = 'g%s'\n"
BODY = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(30))
OLD = {
    "vllm/_version.py": VERSION % (b"0.20.0", b"b8160878f"),
    "vllm/layer.py": BODY.encode(),
    "vllm/keep.py": b"a = 1\nb = 2\nc = 3\nd = 4\ne = 5\n",
    "vllm/doomed.py": b"x = 1\ny = 2\nz = 3\n",
}


def new_release(version: bytes = b"0.21.0") -> dict[str, bytes | None]:
    """0.21.0: layer.py moved to layers/layer.py (a line 3 above the patch's changed), doomed.py deleted."""
    moved = BODY.replace("    return x + 9\n\n", "    return x + 9\n# upstream note\n").encode()
    return {"vllm/_version.py": VERSION % (version, b"9da56fd18"), "vllm/layer.py": None,
            "vllm/layers/layer.py": moved, "vllm/doomed.py": None}


def patched_layer(text: str = BODY) -> bytes:
    return text.replace("    return x + 10\n", "    return x + 10  # vp fix\n").encode()


@pytest.fixture
def upstream(tmp_path):
    """A git checkout with v0.20.0 and v0.21.0, and a cache repository of our own."""
    repo = git_repo(tmp_path / "vllm", OLD, tag="v0.20.0")
    for rel, data in new_release().items():
        path = repo / rel
        if data is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "0.21.0")
    git(repo, "tag", "v0.21.0")
    return repo, UpstreamCache(tmp_path / "cache.git")


def fake_pin(tag, tree, notes=None):
    return Pin(tree.version or tag[1:], tag, tree.upstream_commit or "0" * 40,
               Artifact(f"vllm-{tag[1:]}.tar.gz", "a" * 64), Artifact(f"vllm-{tag[1:]}-x.whl", "b" * 64))


def rebaser(root, cache, monkeypatch):
    monkeypatch.setattr(rebase, "new_pin", fake_pin)
    return Rebaser(root, load_series(root), cache)


def test_rename_detection_follows_moves_and_names_deletions(upstream):
    repo, cache = upstream
    old, new = cache.from_git(str(repo), "v0.20.0"), cache.from_git(str(repo), "v0.21.0")
    moves = cache.renames(old.commit, new.commit, ["vllm/layer.py", "vllm/doomed.py", "vllm/keep.py"])
    assert moves.moved == {"vllm/layer.py": "vllm/layers/layer.py"} and moves.similarity["vllm/layer.py"] >= 90
    assert moves.gone == ["vllm/doomed.py"]
    assert cache.renames(old.commit, old.commit, ["vllm/layer.py"]) == Moves()


def test_rebase_follows_a_rename_and_merges_there(upstream, tmp_path, monkeypatch):
    repo, cache = upstream
    root = build_series(tmp_path / "s", OLD, [("fix", {"vllm/layer.py": patched_layer()})])
    r = rebaser(root, cache, monkeypatch)
    result = r.start("v0.21.0", cache.from_git(str(repo), "v0.20.0"), cache.from_git(str(repo), "v0.21.0"))
    assert result.done and [o.step for o in result.outcomes] == [Step.MERGED]
    assert result.outcomes[0].moved == {"vllm/layer.py": "vllm/layers/layer.py"}
    text = next((root / "patches").glob("*.patch")).read_text()
    assert "+++ b/vllm/layers/layer.py" in text and "a/vllm/layer.py" not in text
    assert "+    return x + 10  # vp fix" in text and "\n # upstream note\n" in text


def test_port_of_a_deleted_file_is_a_conflict_that_never_resurrects_it(tmp_path):
    patched = {"vllm/doomed.py": b"x = 1\ny = 20\nz = 3\n", "vllm/keep.py": b"a = 1\nb = 2\nc = 30\nd = 4\ne = 5\n"}
    root = build_series(tmp_path / "s", OLD, [("p", patched)])
    patch = load_series(root).patches[0]
    new = {"vllm/doomed.py": None, "vllm/keep.py": OLD["vllm/keep.py"]}
    done = port(patch, OLD, {**OLD, **patched}, new, "v0.21.0", Moves(gone=["vllm/doomed.py"]))
    assert done.step is Step.CONFLICT and done.gone == ["vllm/doomed.py"] and done.conflicts == ["vllm/doomed.py"]
    assert done.result["vllm/doomed.py"] is None and done.result["vllm/keep.py"] == patched["vllm/keep.py"]


def test_resolution_checks_resurrection_undefined_names_markers_and_skip(upstream, tmp_path, monkeypatch):
    repo, cache = upstream
    clash = BODY.replace("    return x + 9\n", "    return x + 9  # ours\n")
    root = build_series(tmp_path / "s", OLD, [("clash", {"vllm/layer.py": clash.encode()}),
                                              ("later", {"vllm/keep.py": b"a = 1\nb = 2\nc = 3\nd = 40\ne = 5\n"})])
    r = rebaser(root, cache, monkeypatch)
    with pytest.raises(rebase.RebaseConflict) as stop:
        r.start("v0.21.0", cache.from_git(str(repo), "v0.20.0"), cache.from_git(str(repo), "v0.21.0"))
    assert "vllm/layers/layer.py" in stop.value.message and "1 region" in stop.value.message
    work = root / rebase.STATE_DIR / "resolve"
    assert merge3.has_markers((work / "vllm/layers/layer.py").read_bytes())
    with pytest.raises(InputError, match=r"conflict markers remain in vllm/layers/layer\.py:\d+"):
        r.resume()
    good = BODY.replace("    return x + 9\n", "    return x + 9  # upstream, ours\n")
    (work / "vllm/layers/layer.py").write_text(good)
    (work / "vllm/layer.py").write_text(clash)
    with pytest.raises(InputError, match=r"re-creates vllm/layer\.py \(v0\.21\.0 moved it to vllm/layers/layer\.py"):
        r.resume()
    (work / "vllm/layer.py").unlink()
    (work / "vllm/layers/layer.py").write_text(good.replace("return x + 3\n", "return y + 3\n"))
    with pytest.raises(InputError, match=r"vllm/layers/layer\.py:14: undefined name 'y'"):
        r.resume()
    (work / "vllm/layers/layer.py").write_text(good.replace("return x + 3\n", "return x +\n"))
    with pytest.raises(InputError, match=r"vllm/layers/layer\.py:14: does not compile"):
        r.resume()
    with pytest.raises(InputError, match="only the stopped patch"):
        r.resume(drop="0002-later.patch")
    result = r.resume(skip=True, reason="not needed any more")
    assert [o.step for o in result.outcomes] == [Step.DROPPED, Step.CLEAN]
    log = (root / rebase.DROPPED_FILE).read_text()
    assert "0001-clash.patch\n  Dropped-By-Hand: rebasing onto v0.21.0" in log and "not needed any more" in log
    assert load_series(root).names == ("0002-later.patch",)


def test_allow_new_file_and_continue_refreshes_the_patch(upstream, tmp_path, monkeypatch):
    repo, cache = upstream
    clash = BODY.replace("    return x + 9\n", "    return x + 9  # ours\n")
    root = build_series(tmp_path / "s", OLD, [("clash", {"vllm/layer.py": clash.encode()})])
    r = rebaser(root, cache, monkeypatch)
    with pytest.raises(rebase.RebaseConflict):
        r.start("v0.21.0", cache.from_git(str(repo), "v0.20.0"), cache.from_git(str(repo), "v0.21.0"))
    work = root / rebase.STATE_DIR / "resolve"
    (work / "vllm/layers/layer.py").write_text(BODY.replace("    return x + 9\n", "    return x + 9  # both\n"))
    (work / "vllm/extra.py").write_text("EXTRA = 1\n")
    with pytest.raises(InputError, match="re-creates vllm/extra.py"):
        r.resume()
    result = r.resume(allow_new=("vllm/extra.py",))
    assert [o.step for o in result.outcomes] == [Step.MERGED]
    text = (root / "patches/0001-clash.patch").read_text()
    assert "+    return x + 9  # both" in text and "+++ b/vllm/extra.py" in text


def test_obsolete_trailer_drops_the_patch(upstream, tmp_path, monkeypatch):
    repo, cache = upstream
    trailers = 'Origin: vendor\nObsolete-If: vllm/layers/layer.py contains "# upstream note"\n'
    root = build_series(tmp_path / "s", OLD, [("fix", {"vllm/layer.py": patched_layer()})], trailers=trailers)
    r = rebaser(root, cache, monkeypatch)
    result = r.start("v0.21.0", cache.from_git(str(repo), "v0.20.0"), cache.from_git(str(repo), "v0.21.0"))
    assert [o.step for o in result.outcomes] == [Step.OBSOLETE]
    assert "Obsolete-In: v0.21.0" in (root / rebase.DROPPED_FILE).read_text()
    assert load_series(root).names == ()


def test_drop_when_starting(upstream, tmp_path, monkeypatch):
    repo, cache = upstream
    root = build_series(tmp_path / "s", OLD, [("fix", {"vllm/layer.py": patched_layer()})])
    r = rebaser(root, cache, monkeypatch)
    with pytest.raises(InputError, match="no such patch"):
        r.start("v0.21.0", cache.from_git(str(repo), "v0.20.0"), cache.from_git(str(repo), "v0.21.0"), {"x": "y"})
    result = r.start("v0.21.0", cache.from_git(str(repo), "v0.20.0"), cache.from_git(str(repo), "v0.21.0"),
                     {"0001-fix.patch": "superseded"})
    assert [(o.step, o.note) for o in result.outcomes] == [(Step.DROPPED, "superseded")]


def test_outlook_cells_on_synthetic_releases(upstream, tmp_path):
    repo, cache = upstream
    patched = {"vllm/keep.py": b"a = 1\nb = 2\nc = 30\nd = 4\ne = 5\n"}
    root = build_series(tmp_path / "s", OLD, [
        ("moves", {"vllm/layer.py": patched_layer()}),
        ("gone", {"vllm/doomed.py": b"x = 1\ny = 20\nz = 3\n"}),
        ("clean", patched),
    ])
    series = load_series(root)
    before = {p.name: p.read_bytes() for p in (root / "patches").iterdir()}
    result = build_outlook(series, cache, ["0.20.0", "0.21.0"], repo=str(repo))
    data = outlook_dict(result)
    row = {n[:4]: c for n, c in data["releases"][1]["patches"].items()}
    assert row["0001"]["stacked"] == {"state": "moved", "via": "merged", "moved": {"vllm/layer.py":
                                                                                  "vllm/layers/layer.py"}}
    assert row["0002"]["stacked"]["state"] == "gone" and row["0002"]["stacked"]["gone"] == ["vllm/doomed.py"]
    assert row["0003"]["stacked"]["state"] == "clean"
    assert {c["stacked"]["state"] for c in data["releases"][0]["patches"].values()} == {"clean"}
    md = outlook_markdown(result)
    assert "| 0.21.0 | → | † | ✓ |" in md and "vllm/layer.py -> vllm/layers/layer.py" in md
    from rich.console import Console
    console = Console(record=True, width=200)
    print_outlook(result, console)
    assert "deleted upstream: vllm/doomed.py" in console.export_text()
    assert {p.name: p.read_bytes() for p in (root / "patches").iterdir()} == before
    json.dumps(data)


def test_stacked_and_alone_differ_when_a_patch_builds_on_an_earlier_one(tmp_path):
    a1 = edit(OLD["vllm/keep.py"], b"c = 3\n", b"c = 30\n")
    a2 = edit(a1, b"d = 4\n", b"d = 40\n")
    root = build_series(tmp_path / "s", OLD, [("one", {"vllm/keep.py": a1}), ("two", {"vllm/keep.py": a2})])
    series = load_series(root)
    stages = [{**OLD, "vllm/keep.py": a1}, {**OLD, "vllm/keep.py": a2}]
    stacked, alone = carry(series, OLD, stages, dict(OLD), "v1", Moves(), Judge(lambda paths: {}))
    assert stacked["0002-two.patch"].state == "clean" and alone["0002-two.patch"].state == "conflict"


def test_obsolete_conditions_parse_and_judge():
    header = ("From: a <a@b>\nSubject: [PATCH] x\n\nWhy.\n\nOrigin: vendor\n"
              'Obsolete-If: vllm/a.py contains "x = \\"1\\""\nObsolete-If: vllm/b.py matches "^y\\s*=\\s*2$"\n'
              "\n---\n")
    diff = "diff --git a/f b/f\nindex 1..2 100644\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n"
    patch = parse_patch("p.patch", (header + diff).encode())
    conds = conditions(patch)
    assert [(c.op, c.path, c.text) for c in conds] == [("contains", "vllm/a.py", 'x = "1"'),
                                                        ("matches", "vllm/b.py", r"^y\s*=\s*2$")]
    files = {"vllm/a.py": b'x = "1"\n', "vllm/b.py": b"q = 1\ny = 2\n"}
    judge = Judge(lambda paths: {p: files.get(p) for p in paths})
    assert "Obsolete-If: vllm/a.py contains" in (judge.obsolete(patch) or "")
    files["vllm/b.py"] = b"y = 3\n"
    assert Judge(lambda paths: {p: files.get(p) for p in paths}).obsolete(patch) is None
    bad = parse_patch("q.patch", (header.replace('Obsolete-If: vllm/a.py contains "x = \\"1\\""',
                                                 "Obsolete-If: whenever") + diff).encode())
    with pytest.raises(InputError, match="q.patch: malformed 'Obsolete-If: whenever'"):
        conditions(bad)
    tested = parse_patch("t.patch", (header.replace('vllm/a.py contains "x = \\"1\\""', 'test "tests/x.py::t"')
                                     + diff).encode())
    assert conditions(tested)[0].op == "test"
    with pytest.raises(CheckNotRun, match="cannot run"):  # no runner: no verdict (tests/test_obsolete.py)
        Judge(lambda paths: {p: files.get(p) for p in paths}).obsolete(tested)


def test_pycheck_flags_only_what_the_resolution_adds():
    base = {"m.py": b"import os\n\nprint(undefined_upstream)\n"}
    assert check_files({"m.py": b"import os\n\nprint(undefined_upstream)\nprint(os)\n"}, base) == []
    assert check_files({"m.py": b"import os\n\nprint(undefined_upstream)\nprint(nope)\n"}, base) == \
        ["m.py:4: undefined name 'nope'"]
    assert check_files({"m.py": b"def f():\n    pass\n\n\ndef f():\n    pass\n"}, {}) == \
        ["m.py:5: redefinition of unused 'f' from line 1"]
    assert check_files({"m.py": b"x = (\n"}, base)[0].startswith("m.py:1: does not compile")
    assert check_files({"r.txt": b"a\n<<<<<<< ours\nb\n=======\nc\n>>>>>>> theirs\n"}, {}) == \
        ["r.txt:2: conflict marker left", "r.txt:4: conflict marker left", "r.txt:6: conflict marker left"]
    assert check_files({"gone.py": None}, base) == []


def test_merged_result_that_does_not_check_is_a_conflict(tmp_path):
    old = {"m.py": b"def f(a):\n    b = a\n    return b\n\n\nx = 1\ny = 2\nz = 3\n"}
    patched = {"m.py": old["m.py"].replace(b"    return b\n", b"    return b + c\n")}
    root = build_series(tmp_path / "s", old, [("p", patched)])
    patch = load_series(root).patches[0]
    new = {"m.py": old["m.py"].replace(b"    b = a\n", b"    bb = a\n").replace(b"    return b\n", b"    return bb\n")
           .replace(b"z = 3\n", b"z = 4\n")}
    done = port(patch, old, patched, new, "v2")
    assert done.step is Step.CONFLICT  # overlapping: a real conflict
    new2 = {"m.py": old["m.py"].replace(b"z = 3\n", b"z = 4\n")}
    assert port(patch, old, patched, new2, "v2").step is Step.CLEAN
    new3 = {"m.py": old["m.py"].replace(b"def f(a):\n", b"def f(a):  # c is gone\n", 1)
            .replace(b"x = 1\n", b"x = 10\n")}
    p3 = dataclasses.replace(patch)
    done = port(p3, old, patched, new3, "v2")
    assert done.step is Step.CONFLICT and done.problems == ["m.py:3: undefined name 'c'"]


OLD_PIN = ("#: version = 0.20.0\n#: tag = v0.20.0\n#: commit = b8160878f07fe6aff02deb12bc842df3fa4a9237\n"
           "#: sdist = x.tar.gz sha256:" + "a" * 64 + "\n#: wheel = x.whl sha256:" + "b" * 64 + "\na.patch\n")


def _rewritten(series_dir, comment: str, version: str, new_comment: list[str]) -> str:
    """series_text of a series pinned to 0.20.0 whose header comment is `comment`, rebased onto `version`."""
    new = dataclasses.replace(load_series(series_dir).pin, version=version, tag=f"v{version}", commit="9da56fd18")
    return series_text(comment + OLD_PIN, new, ["a.patch"], new_comment)


def test_series_header_rewritten_for_the_new_release(two_patch_series):
    text = _rewritten(two_patch_series, "# vllm-patch series\n#\n# The pin: what every patch applies to.\n"
                      "# The commit id is the one the sdist names (vllm/_version.py: gb8160878f),\n"
                      "# completed from the v0.20.0 tag.\n", "0.21.0", ["Rebased onto 0.21.0.", "Commit: short id."])
    assert text.startswith("# vllm-patch series\n#\n# The pin: what every patch applies to.\n#\n"
                           "# Rebased onto 0.21.0.\n# Commit: short id.\n#: version = 0.21.0\n")
    assert "b8160878f" not in text and "v0.20.0" not in text


def test_series_header_keeps_no_half_sentence_of_the_old_pin(two_patch_series):
    """A sentence naming the old commit that began a line above, after another sentence, goes whole."""
    text = _rewritten(two_patch_series, "# vllm-patch series\n#\n# The pin: what every patch applies to. The "
                      "commit id is the\n# abbreviated one the sdist names (vllm/_version.py: gb8160878f).\n",
                      "0.32.0", ["Rebased onto 0.32.0."])
    assert text.startswith("# vllm-patch series\n#\n# The pin: what every patch applies to.\n#\n"
                           "# Rebased onto 0.32.0.\n#: version = 0.32.0\n")


def test_wheel_build_tags():
    assert _build_tag("vllm-0.20.1-1-cp38-abi3-manylinux_2_35_x86_64.whl") == (1, "")
    assert _build_tag("vllm-0.20.1-cp38-abi3-manylinux_2_35_x86_64.whl") == (-1, "")


def test_git_failures_are_one_line_errors(tmp_path, monkeypatch):
    cache = UpstreamCache(tmp_path / "cache.git")
    with pytest.raises(UpstreamError, match=r"^git rev-parse failed on .*cache\.git: fatal"):
        cache.git("rev-parse", "--verify", "nosuchref")
    with pytest.raises(UpstreamError, match="is not in the cache repository"):
        cache.read("0" * 40, ["x"])
    broken = tmp_path / "broken.git"
    broken.mkdir()
    (broken / "HEAD").write_text("garbage\n")
    with pytest.raises(UpstreamError, match="unusable"):
        UpstreamCache(broken)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(UpstreamError, match="cannot run git merge-file"):
        merge3.merge_file(b"a\n", b"b\n", b"c\n", ("x", "y", "z"))
    shutil.rmtree(tmp_path / "cache.git")


def test_a_partly_obsolete_patch_is_carried_and_its_parts_named(upstream, tmp_path, monkeypatch):
    repo, cache = upstream
    trailers = ('Origin: vendor\nObsolete-If: [note] vllm/layers/layer.py contains "# upstream note"\n'
                'Obsolete-If: [fix] vllm/layers/layer.py contains "return x + 10  # vp fix"\n')
    root = build_series(tmp_path / "s", OLD, [("fix", {"vllm/layer.py": patched_layer()})], trailers=trailers)
    result = build_outlook(load_series(root), cache, ["0.21.0"], repo=str(repo))
    cell = result.rows[0].stacked["0001-fix.patch"]
    assert cell.state == "moved" and glyph(cell) == "→◐"
    assert "partly obsolete: note (" in cell.partly and cell.partly.endswith("still needed: fix")
    assert "| 0.21.0 | →◐ |" in outlook_markdown(result) and outlook_dict(result)["releases"][0]["patches"][
        "0001-fix.patch"]["stacked"]["partly"] == cell.partly
    done = rebaser(root, cache, monkeypatch).start("v0.21.0", cache.from_git(str(repo), "v0.20.0"),
                                                   cache.from_git(str(repo), "v0.21.0"))
    assert [o.step for o in done.outcomes] == [Step.MERGED] and "still needed: fix" in done.outcomes[0].note
    assert load_series(root).names == ("0001-fix.patch",)
