"""A line that carries another line's patch refers to it (``NAME from LINE[/NAME]`` in its series) instead of
holding a copy: one file, read by every line that lists it, so a fix made there reaches them all; a copy kept by
hand is told apart; ``export`` writes any line out as a plain series (tool/vllm_patch/series.py,
tool/vllm_patch/artifacts/export.py)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from helpers import git, git_repo, run_cli, snapshot
from vllm_patch.errors import InputError
from vllm_patch.lines import line_named, lines_of
from vllm_patch.series import load_series, parse_series_entries, render_series

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path, two_patch_series) -> Path:
    """The current line (two patches) and lines/v1, which carries the first by reference and keeps its own
    second patch, under another name."""
    root = tmp_path / "project"
    shutil.copytree(two_patch_series, root)
    first, second = load_series(root).names
    line = root / "lines" / "v1"
    (line / "patches").mkdir(parents=True)
    shutil.copyfile(root / "patches" / second, line / "patches" / "0002-own.patch")
    text = (root / "series").read_text().replace(f"{first}\n", f"{first} from current\n")
    (line / "series").write_text(text.replace(f"{second}\n", "0002-own.patch\n"))
    return root


def test_entries_name_the_line_and_patch_they_carry():
    _, names, sources = parse_series_entries("a.patch from current\nb.patch\nc.patch from v0.25/a.patch\n")
    assert names == ["a.patch", "b.patch", "c.patch"]
    assert sources == {"a.patch": "current/a.patch", "c.patch": "v0.25/a.patch"}


@pytest.mark.parametrize("entry", ["a.patch from", "a.patch to current", "a.patch from ../x",
                                   "a.patch from v1/b/c.patch", "a.patch from current extra"])
def test_a_malformed_entry_is_refused_in_one_line(entry):
    with pytest.raises(InputError) as caught:
        parse_series_entries(f"{entry}\n", "series")
    assert caught.value.message.startswith("series line 1: ") and "\n" not in caught.value.message


def test_a_carried_patch_is_the_other_lines_file(project):
    carried = line_named(project, "v1").load()
    current = load_series(project)
    assert carried.patches[0].raw == current.patches[0].raw
    assert carried.source_of(carried.names[0]) == f"current/{current.names[0]}"
    assert carried.source_of("0002-own.patch") is None


def test_a_fix_made_once_reaches_the_line_that_carries_it(project):
    first = load_series(project).names[0]
    path = project / "patches" / first
    path.write_bytes(path.read_bytes().replace(b"Why this change.", b"Why this change, said better."))
    assert b"said better" in line_named(project, "v1").load().patches[0].raw


@pytest.mark.parametrize(("change", "words"), [
    (lambda p, first: (p / "series").write_text((p / "series").read_text().replace(f"{first}\n", "")),
     "line current does not list"),
    (lambda p, first: (p / "patches" / first).unlink(), "does not exist"),
    (lambda p, first: shutil.rmtree(p / "lines" / "v1"), None),
])
def test_a_reference_to_nothing_is_refused(project, change, words):
    first = load_series(project).names[0]
    other = project / "lines" / "v2"
    shutil.copytree(project / "lines" / "v1", other)
    (other / "series").write_text((other / "series").read_text().replace(" from current", " from v1"))
    change(project, first)
    if words is None:  # v1 itself is gone: v2's reference names no line
        words = "no readable line 'v1'"
    else:  # v1 now carries nothing that exists: load it, not v2 (which would refuse the chain first)
        other = project / "lines" / "v1"
    with pytest.raises(InputError, match=re.escape(words)):
        load_series(other)


def test_a_reference_to_a_reference_is_refused(project):
    other = project / "lines" / "v2"
    shutil.copytree(project / "lines" / "v1", other)
    (other / "series").write_text((other / "series").read_text().replace(" from current", " from v1"))
    with pytest.raises(InputError, match="refer to the line that holds the file"):
        load_series(other)


def test_export_writes_a_plain_series_that_git_am_applies(project, tmp_path, base_files):
    dest = tmp_path / "out"
    done = run_cli("--series", str(project / "lines" / "v1"), "export", str(dest))
    assert done.returncode == 0, done.stderr
    series = load_series(dest)
    assert series.sources == () and series.names == line_named(project, "v1").load().names
    assert " from " not in (dest / "series").read_text()
    repo = git_repo(tmp_path / "repo", base_files)
    for name in series.names:
        git(repo, "am", "-q", str(dest / "patches" / name))
    assert (repo / "vllm" / "new_kernel.py").read_bytes() == b"KERNEL = 1\n"


def test_export_into_a_folder_in_use_changes_nothing(project, tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "keep").write_text("mine")
    before = snapshot(dest)
    done = run_cli("--series", str(project / "lines" / "v1"), "export", str(dest))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "nothing was written" in done.stderr
    assert snapshot(dest) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")] == []


def test_a_carried_patch_is_refreshed_in_the_line_that_holds_it(project, tmp_path):
    first = load_series(project).names[0]
    done = run_cli("--series", str(project / "lines" / "v1"), "refresh", first, "--from", str(tmp_path))
    assert done.returncode == 2 and "refresh it in that line" in done.stderr


def _body(raw: bytes) -> list[str]:
    """A patch's diff without what differs between releases of the same change: positions and blob ids."""
    text = raw.decode("utf-8")
    diff = text[text.index("\ndiff --git"):]
    return [line for line in diff.splitlines() if not line.startswith(("@@", "index ", "-- ", "2."))]


def hand_kept_copies(project: Path) -> list[str]:
    """A line's own patch file whose diff is the same change as a newer line's own patch of the same name after its
    number: the older line should list it ``from`` the newer one."""
    loaded = [(line.name, line.load()) for line in lines_of(project)]
    # Newest first: the current line, then the others by their pinned release.
    loaded.sort(key=lambda item: (item[0] != "current", tuple(-int(x) for x in item[1].pin.version.split("."))))
    own = [(name, p) for name, series in loaded for p in series.patches if not series.source_of(p.name)]
    found = []
    for i, (name, patch) in enumerate(own):
        slug = patch.name.split("-", 1)[1]
        source = next(((other, q) for other, q in own[:i] if other != name and q.name.split("-", 1)[1] == slug
                       and _body(q.raw) == _body(patch.raw)), None)
        if source:
            found.append(f"lines/{name}/patches/{patch.name} is line {source[0]}'s {source[1].name}")
    return found


def _copy_lines(project: Path) -> None:
    """The repository's series, patches and lines, into `project`."""
    project.mkdir()
    shutil.copyfile(ROOT / "series", project / "series")
    for part in ("patches", "lines"):
        shutil.copytree(ROOT / part, project / part)


def test_no_line_keeps_a_copy_of_another_lines_patch():
    assert hand_kept_copies(ROOT) == [], "list these 'NAME from LINE[/NAME]' in the line's series instead"


def test_a_hand_kept_copy_is_told_apart(tmp_path):
    project = tmp_path / "project"
    _copy_lines(project)
    series = project / "lines" / "v0.25" / "series"
    name = "0009-gdn-count-the-chunked-prefill-in-the-memory-profile.patch"
    assert f"{name} from current\n" in series.read_text()
    series.write_text(series.read_text().replace(f"{name} from current\n", f"{name}\n"))
    shutil.copyfile(project / "patches" / name, project / "lines" / "v0.25" / "patches" / name)
    assert hand_kept_copies(project) == [f"lines/v0.25/patches/{name} is line current's {name}"]


def test_a_change_to_the_current_lines_patch_reaches_every_line_that_carries_it(tmp_path):
    project = tmp_path / "project"
    _copy_lines(project)
    name = "0009-gdn-count-the-chunked-prefill-in-the-memory-profile.patch"
    path = project / "patches" / name
    path.write_bytes(path.read_bytes().replace(b"lands\n+        # in the peak", b"is\n+        # in the peak"))
    changed = path.read_bytes()
    carriers = {line.name: line.load() for line in lines_of(project)
                if any(src == f"current/{name}" for _, src in line.load().sources)}
    assert set(carriers) >= {"v0.32", "v0.27", "v0.25"}
    for line, series in carriers.items():
        assert changed in {p.raw for p in series.patches}, line


def test_the_series_writer_writes_references_back_as_they_are_read(project):
    series = line_named(project, "v1").load()
    text = render_series(["# a line"], series.pin, [*series.names, "0003-x.patch"],
                         {**dict(series.sources), "0003-x.patch": "v0.27/0009-y.patch"})
    fields, names, sources = parse_series_entries(text)
    assert names == [*series.names, "0003-x.patch"]
    assert sources == {**dict(series.sources), "0003-x.patch": "v0.27/0009-y.patch"}
    assert f"{series.names[0]} from current\n" in text and fields["version"] == series.pin.version


@pytest.fixture
def kernel_project(tmp_path, base_files, two_patch_series, monkeypatch) -> tuple[Path, Path]:
    """The current line (its first patch adds vllm/new_kernel.py) and lines/v1, whose first patch of the same
    name adds another text of that file beside an edit of its own; the pinned base as a tagged git repository."""
    from helpers import build_series, edit

    monkeypatch.setenv("VLLM_PATCH_CACHE", str(tmp_path / "cache"))
    upstream = git_repo(tmp_path / "upstream", base_files, tag="v0.20.0")
    root = tmp_path / "project"
    shutil.copytree(two_patch_series, root)
    first = load_series(root).names[0]
    line = build_series(root / "lines" / "v1", base_files, [
        ("first fix", {"vllm/b.py": edit(base_files["vllm/b.py"], b"return 1\n", b"return 12\n"),
                       "vllm/new_kernel.py": b"KERNEL = 0\n"})])
    assert load_series(line).names == (first,)
    return root, upstream


def test_a_file_a_newer_line_adds_whole_is_carried_with_its_text(kernel_project):
    root, upstream = kernel_project
    line = root / "lines" / "v1"
    before = (line / "patches").iterdir().__next__().read_text()
    told = run_cli("--series", str(line), "carry", "--check")
    assert told.returncode == 1 and "vllm/new_kernel.py: differs as current/0001-first-fix.patch" in told.stdout
    assert (line / "patches").iterdir().__next__().read_text() == before  # --check writes nothing
    done = run_cli("--series", str(line), "carry", "--upstream", str(upstream))
    assert done.returncode == 0, done.stderr
    patch = load_series(line).patches[0]
    assert {f.path for f in patch.files} == {"vllm/b.py", "vllm/new_kernel.py"}
    assert "+KERNEL = 1\n" in patch.raw.decode() and "+    return 12\n" in patch.raw.decode()
    assert patch.subject == load_series(root).patches[0].subject
    assert run_cli("--series", str(line), "carry", "--check").returncode == 0


def test_every_line_adds_the_files_it_shares_with_a_newer_line_with_that_lines_text():
    """The multi-query kernel above all: lines v0.27 and v0.25 add it in their own 0003, as the current line."""
    for line in lines_of(ROOT):
        done = run_cli("--line", line.name, "carry", "--check", cwd=ROOT)
        assert done.returncode == 0, f"line {line.name}: {done.stdout}{done.stderr} (run 'vllm-patch carry')"
    told = run_cli("--line", "v0.25", "carry", "--check", cwd=ROOT).stdout
    assert "vllm/v1/attention/ops/triton_turboquant_verify.py: same as current/0003" in told
