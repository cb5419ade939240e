"""The guard sees the files a line touched, not only the record: a patched file put back (or edited)
by hand behind the tool's back is said, as ``vllm-patch status`` says it."""

from __future__ import annotations

import json
from importlib.metadata import PathDistribution

import pytest

from helpers import make_site_packages
from vllm_patch import operations
from vllm_patch.series import load_series
from vllm_patch.targets import SitePackagesTarget

PY = "/opt/venv/bin/python"


@pytest.fixture(scope="module")
def guard(setup_module):
    import vllm_patch_guard

    return vllm_patch_guard


@pytest.fixture
def applied(tmp_path, base_files, two_patch_series, setup_module):
    """A site-packages with vLLM 0.20.0 and the two-patch series applied by the tool; the guard's data for
    that series; and the dist-info."""
    root = make_site_packages(tmp_path / "site", base_files)
    target = SitePackagesTarget(root)
    outcome = operations.apply(target, load_series(two_patch_series))
    assert outcome.ok and outcome.changed
    data = [setup_module.read_line("current", two_patch_series)]
    return root, data, PathDistribution(target.dist_info)


def test_the_applied_line_passes(guard, applied):
    root, data, dist = applied
    assert guard.diagnose(dist, data, PY) is None


def test_a_patched_file_put_back_by_hand_is_said(guard, applied, base_files, two_patch_series):
    root, data, dist = applied
    (root / "vllm/b.py").write_bytes(base_files["vllm/b.py"])  # upstream's bytes again
    status = operations.status(SitePackagesTarget(root), load_series(two_patch_series))
    assert "vllm/b.py: hash differs from RECORD" in status.integrity
    found = guard.diagnose(dist, data, PY)
    assert found is not None and "vllm/b.py" in found and "vllm-patch status --python" in found, found


def test_a_file_the_line_created_then_deleted_is_said(guard, applied):
    root, data, dist = applied
    (root / "vllm/new_kernel.py").unlink()
    found = guard.diagnose(dist, data, PY)
    assert found is not None and "vllm/new_kernel.py" in found, found


def test_strict_refuses_a_file_changed_behind_its_back(guard, applied, monkeypatch):
    import importlib.metadata

    root, data, dist = applied
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: dist)
    monkeypatch.setattr(guard, "load_lines", lambda path=None: data)
    monkeypatch.setenv(guard.ENV, "strict")
    guard.check()  # as applied: starts
    (root / "vllm/a.py").write_bytes((root / "vllm/a.py").read_bytes() + b"# edited\n")
    with pytest.raises(SystemExit) as exc:
        guard.check()
    assert "vllm/a.py" in str(exc.value) and "refusing to start" in str(exc.value)


def test_a_record_without_hashes_is_checked_against_record(guard, applied, base_files):
    """A record an older vllm-patch wrote has no ``written`` hashes: the files are checked against RECORD."""
    root, data, dist = applied
    state_file = next(root.glob("vllm-*.dist-info")) / "vllm_patch.json"
    state = json.loads(state_file.read_text())
    assert set(state.pop("written")) == {"vllm/a.py", "vllm/b.py", "vllm/new_kernel.py"}
    state_file.write_text(json.dumps(state))
    assert guard.diagnose(dist, data, PY) is None
    (root / "vllm/b.py").write_bytes(base_files["vllm/b.py"])
    found = guard.diagnose(dist, data, PY)
    assert found is not None and "vllm/b.py" in found, found


def test_a_patched_wheel_unpacked_passes_and_is_checked(guard, tmp_path, base_files, two_patch_series,
                                                        setup_module):
    """build-wheel records the hashes too: its wheel, unpacked as pip would, passes until a file changes."""
    from test_wheel import make_wheel, unpack
    from vllm_patch.artifacts.wheel import build_wheel

    built = build_wheel(load_series(two_patch_series), make_wheel(tmp_path / "in", base_files), tmp_path / "dist")
    root = unpack(built.path, tmp_path / "site")
    dist = PathDistribution(next(root.glob("vllm-*.dist-info")))
    data = [setup_module.read_line("current", two_patch_series)]
    assert guard.diagnose(dist, data, PY) is None
    (root / "vllm/new_kernel.py").write_bytes(b"KERNEL = 2\n")
    found = guard.diagnose(dist, data, PY)
    assert found is not None and "vllm/new_kernel.py" in found, found
