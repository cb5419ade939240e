"""The pure naming helpers of ``authoring`` (the commands themselves run in tests/integration/test_authoring.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_patch.lifecycle.authoring import next_name, patch_file_name


@pytest.mark.parametrize(("given", "stored"), [
    ("0006-gdn-fix", "0006-gdn-fix.patch"),
    ("0006-gdn-fix.patch", "0006-gdn-fix.patch"),
    ("0006-gdn.fix", "0006-gdn.fix.patch"),
])
def test_patch_file_name_ends_in_patch(given, stored):
    assert patch_file_name(given) == stored


def test_next_name_numbers_after_the_series():
    series = SimpleNamespace(patches=("0001-a.patch", "0002-b.patch"))
    assert next_name(series, "GDN: a new field!") == "0003-GDN-a-new-field.patch"
