"""The compile matrix's CI subset: every target, every route decision (the widest tiles, a shrunk tiling, the
fallback where there is one), compiled ahead of time with the line's own Triton; and the checker's own test."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from fitmatrix import GEOMETRY, PRESET, PRESETS, SPILL_THRESHOLD, TARGETS, Config, check_route, ci_matrix
from fitsupport import run_fitmatrix, triton_python

# The 99 KiB parts, the big-memory parts, and the 64 KiB ones (sm_75 and ROCm, whose MSE scores are ieee).
SMALL = {"sm_86", "sm_89", "sm_120"}
BIG = {"sm_80", "sm_90"}
FP32_SCORES = {"sm_75", "gfx90a", "gfx942", "gfx1100"}


def _run_ci(python: Path, kernel: Path, tmp_path: Path) -> dict:
    out = tmp_path / "ci.json"
    rc, err = run_fitmatrix(python, kernel, out, "--set", "ci", "--jobs", "2")
    assert out.is_file(), err[-4000:]
    doc = json.loads(out.read_text())
    assert doc["problems"] == [], "\n".join(doc["problems"])
    assert rc == 0, err[-4000:]
    return doc


def _routes(doc: dict) -> dict[tuple[str, str], dict]:
    return {(r["config"]["target"], r["config"]["preset"]): r for r in doc["results"]}


def _assert_ci_routes(doc: dict, precision: str = "tf32x3") -> None:
    """Zero crashing configurations, and the decisions the planner must make on each target; ``precision`` is the
    kernel's MSE score precision on CUDA from sm_80 (line v0.20's tf32x3, the current line's fp16x3)."""
    routes = _routes(doc)
    assert {t for t, _ in routes} == {t.name for t in TARGETS}
    assert len(doc["results"]) == len(ci_matrix())
    for r in doc["results"]:
        assert check_route(r) == []
        assert r["route"] == "multi-query", r
        assert r["shared"] <= r["limit"]
    for t in TARGETS:
        fp8 = routes[(t.name, "k8v4")]
        mse = routes[(t.name, "3bit_nc")]
        assert mse["tiles"]["precision"] == ("ieee" if t.name in FP32_SCORES else precision)
        if t.name == "sm_75":
            # The estimate lets the widest FP8 tiling through; its compiled kernel needs more than 64 KiB,
            # so the compiled check refuses it and the planner shrinks BLOCK_N.
            assert not fp8["widest"] and fp8["attempts"][0]["shared"] > t.max_shared, fp8
        else:
            assert fp8["widest"], fp8
        if precision == "fp16x3" and t.name in BIG | SMALL:
            # 32 x 256 rows x head dim in float16 hi/lo parts: 64 KiB, within every sm_80+ part's shared memory.
            assert mse["widest"] and mse["shared"] == 65536, mse
        elif t.name in BIG:
            # 32 x 256 rows x head dim in tf32x3: 128 KiB, within A100's and H100's shared memory.
            assert mse["widest"] and mse["shared"] == 131072, mse
        elif t.name in SMALL:
            # Over 99 KiB at the widest: the planner must shrink, and the shrunk kernel fits.
            assert not mse["widest"], mse
    # 64 rows of 4-bit keys at D=128: BLOCK_N 64 on sm_80, whose widest step spills 4-5 KB per thread there;
    # the widest on sm_90. Neither spills more than the table's threshold.
    a100, h100 = routes[("sm_80", "4bit_nc")], routes[("sm_90", "4bit_nc")]
    assert (a100["tiles"]["block_m"], a100["tiles"]["block_n"]) == (64, 64), a100
    assert h100["widest"] and h100["tiles"]["block_n"] == 128, h100
    assert max(a100["spill"], h100["spill"]) <= SPILL_THRESHOLD, (a100, h100)
    for h in doc["helpers"]:
        assert "error" not in h, h
        assert h["shared"] <= h["limit"], h


@pytest.mark.slow
def test_ci_subset_triton36_line_v020(kernel_v020: Path, tmp_path: Path):
    """Line v0.20 with Triton 3.6.0 (the project's own venv)."""
    python = triton_python("3.6.0")
    _assert_ci_routes(_run_ci(python, kernel_v020, tmp_path))


@pytest.mark.integration
@pytest.mark.slow
def test_ci_subset_triton38_current_line(kernel_current: Path, triton38_python: Path, tmp_path: Path):
    """The current line with Triton 3.8.0 (a venv of its own: PyPI)."""
    _assert_ci_routes(_run_ci(triton38_python, kernel_current, tmp_path), "fp16x3")


def test_checker_flags_a_plan_blind_to_the_device(kernel_v020: Path, tmp_path: Path):
    """The check can fail: a planner that takes the widest tiles from shapes alone and a fits() that accepts
    any compiled kernel put the MSE kernel at D=256, K+1=4 (32 rows) on sm_86 at 128 KiB, over its 99 KiB."""
    out = tmp_path / "blind.json"
    rc, err = run_fitmatrix(sys.executable, kernel_v020, out, "--set", "ci", "--blind", "sm_86:3bit_nc")
    doc = json.loads(out.read_text())
    assert rc == 1, err[-4000:]
    [rec] = doc["results"]
    assert rec["route"] == "multi-query" and rec["tiles"]["block_m"] == 32 and rec["tiles"]["m_tiles"] == 1
    assert rec["shared"] == 131072
    [problem] = doc["problems"]
    assert "needs 131072 B of shared memory, the limit is 101376 B" in problem
    # The same record passes the check once the route is the fallback, and fails with no route at all.
    assert check_route({**rec, "route": "fallback"}) == []
    assert check_route({k: v for k, v in rec.items() if k not in ("route", "tiles")})
    # A chosen tiling that did not compile is a failure too.
    assert check_route({**rec, "error": "CompilationError: boom"})


def test_presets_match_the_reference_layouts():
    """fitmatrix's slot layout per preset is the one the kernel tests' reference builds."""
    references = pytest.importorskip("references")
    for p in PRESETS:
        for d in (128, 256):
            lay = references.TQLayout.from_preset(p.name, d)
            assert (lay.key_fp8, lay.mse_bits, lay.value_bits, lay.norm_correction) == (
                p.key_fp8, p.mse_bits, p.value_bits, p.norm_correction)
            assert lay.key_packed_size == p.key_packed_size(d)


def test_ci_subset_covers_every_target_and_decision():
    cfgs = ci_matrix()
    assert {c.target for c in cfgs} == {t.name for t in TARGETS}
    for t in TARGETS:
        mine = [c for c in cfgs if c.target == t.name]
        assert {PRESET[c.preset].key_fp8 for c in mine} == {True, False}
        assert any(GEOMETRY[c.geometry].head_dim == 256 and c.k1 * GEOMETRY[c.geometry].group > 16 for c in mine)
    assert Config("sm_86", "3bit_nc", "bf16", 16, 4, "Qwen3.6-27B TP1") in cfgs
