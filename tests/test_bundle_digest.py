"""A zipped install copies its bundled lines out once per bundle, keyed on what the bundle holds: another
build of the same version (other series, same ``__version__``) never reuses a stale copy."""

from __future__ import annotations

import shutil
import zipfile

from vllm_patch import locate
from vllm_patch.series import load_series


def zipped(series_dir, archive):
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(p for p in series_dir.rglob("*") if p.is_file()):
            zf.write(path, f"vllm_patch/_lines/{path.relative_to(series_dir)}")
    return zipfile.Path(archive, "vllm_patch/_lines/")


def test_another_build_of_the_same_version_gets_its_own_copy(two_patch_series, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_PATCH_CACHE", str(tmp_path / "cache"))
    first = locate._extracted(zipped(two_patch_series, tmp_path / "a.zip"))
    other = tmp_path / "other"
    shutil.copytree(two_patch_series, other)
    patch = next((other / "patches").glob("0002-*.patch"))
    patch.write_bytes(patch.read_bytes().replace(b"Why this change.", b"Why this change, said otherwise."))
    second = locate._extracted(zipped(other, tmp_path / "b.zip"))
    assert load_series(second).digest == load_series(other).digest != load_series(first).digest
    assert load_series(first).digest == load_series(two_patch_series).digest  # the first copy is left as it was
    assert locate._extracted(zipped(other, tmp_path / "c.zip")) == second  # the same bundle: the same copy
