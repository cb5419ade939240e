"""How outcomes are shown: JSON that says what the table says, and names never cut."""

from __future__ import annotations

import io
import json

from rich.console import Console

from vllm_patch.engine.analysis import analyze, touched
from vllm_patch.operations import Outcome
from vllm_patch.report import outcome_dict, print_outcome, print_series, series_dict, verdict_line
from vllm_patch.series import load_series


def _outcome(series, files, **kw) -> Outcome:
    patches = list(series.patches)
    analysis = analyze(patches, {p: files.get(p) for p in touched(patches)})
    return Outcome(kw.pop("action", "check"), "/srv/vllm", analysis, patches, **kw)


def _printed(show, *args) -> str:
    out = io.StringIO()
    show(*args, Console(file=out, width=80, force_terminal=False, color_system=None))
    return out.getvalue()


def test_json_lists_every_patch_with_its_state_and_hunks(base_files, two_patch_series):
    series = load_series(two_patch_series)
    data = json.loads(json.dumps(outcome_dict(_outcome(series, base_files))))
    assert data["verdict"] == "applies" and data["ok"] is True
    assert [p["name"] for p in data["patches"]] == list(series.names)
    assert [p["state"] for p in data["patches"]] == ["applies", "applies"]
    assert [p["sha256"] for p in data["patches"]] == [p.sha256 for p in series.patches]
    assert data["patches"][0]["files"] == ["vllm/a.py", "vllm/b.py", "vllm/new_kernel.py"]
    hunks = [h for p in data["patches"] for h in p["hunks"]]
    assert hunks and all(h["state"] == "pending" for h in hunks)
    # Each hunk on an existing file has one anchor (unique); the new file's has none to find.
    assert [len(h["anchor_at"]) for h in hunks] == [0 if h["path"] == "vllm/new_kernel.py" else 1 for h in hunks]


def test_a_broken_base_is_reported_as_such(base_files, two_patch_series):
    series = load_series(two_patch_series)
    broken = {**base_files, "vllm/b.py": b"def f():\n    return 7\n"}
    outcome = _outcome(series, broken, action="apply", ok=False)
    data = outcome_dict(outcome)
    assert data["patches"][0]["state"] == "conflict" and data["patches"][0]["problems"]
    assert verdict_line(outcome).endswith("apply on /srv/vllm; nothing was changed")


def test_verdicts_of_a_dry_run_and_a_write(base_files, two_patch_series):
    series = load_series(two_patch_series)
    dry = _outcome(series, base_files, action="apply", dry_run=True, changed=["vllm/a.py", "vllm/b.py"])
    assert "would apply 2 patches on /srv/vllm (would change 2 files)" in verdict_line(dry)
    done = _outcome(series, base_files, action="apply", changed=["vllm/a.py"])
    assert "applied 2 patches on /srv/vllm (changed 1 files)" in verdict_line(done)


def test_long_names_are_printed_whole_outside_a_terminal(base_files, two_patch_series):
    long_name = "0001-" + "a-very-long-patch-name-" * 5 + "first-fix.patch"
    patch_dir = two_patch_series / "patches"
    first = next(patch_dir.glob("0001-*.patch"))
    first.rename(patch_dir / long_name)
    (two_patch_series / "series").write_text((two_patch_series / "series").read_text().replace(first.name, long_name))
    series = load_series(two_patch_series)
    assert len(long_name) > 80
    assert long_name in _printed(print_outcome, _outcome(series, base_files))
    assert long_name in _printed(print_series, series)
    assert series_dict(series)["patches"][0]["name"] == long_name
