"""``vllm-patch doctor`` on vLLM 0.33.0 with the current line applied (the sdist's tree, patched by the tool):
the route the installed planner takes under given device limits, the installed kernel checked under Triton's
interpreter against the float64 reference and the release's route, and a kernel broken on purpose (a verify
row that sees one token too many) failing the check with a non-zero exit."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from doctor_support import absolute_paths, tiny_model

from vllm_patch.cli import main
from vllm_patch.doctor.probe import check, routes, tree

pytestmark = [pytest.mark.integration, pytest.mark.kernels]

KERNEL = "vllm/v1/attention/ops/triton_turboquant_verify.py"
PRESETS = ["k8v4", "4bit_nc", "k3v4_nc", "3bit_nc"]
# Qwen3.6-27B: 24 query heads over 4 KV heads of 256 (G = 6), also per rank at TP=2.
SHAPES = [(6, 256)]


def doctor(*args: str):
    return CliRunner().invoke(main, ["doctor", *args])


def _tiles(rows: list[dict]) -> dict[tuple[str, int], tuple]:
    return {(r["preset"], r["k1"]): (r["block_m"], r["m_tiles"], r["block_n"]) if r["route"] == "multi-query"
            else r["why"] for r in rows}


def test_route_table_under_device_limits(patched_v033, monkeypatch):
    """The installed planner's tilings for an sm_86 part's 99 KiB, a 48 KiB cap and a 32 KiB one, and 24 KiB:
    MSE keys take narrower tiles as the limit falls, and the release's route (saying why) once none fits; FP8
    keys fit them all. VLLM_TURBOQUANT_ATTENTION_KERNEL=decode and head dims the kernel does not take: the
    release."""
    monkeypatch.delenv(routes.ROUTE_ENV, raising=False)
    kernel = tree.load_module(patched_v033, KERNEL)

    def table(max_shared: int) -> dict:
        return _tiles(routes.route_table(kernel, kernel.TQMQLimits(max_shared, 86), SHAPES, PRESETS, [1, 2, 3, 4]))

    rtx = table(101376)  # RTX 3090/4090/5090, A5000/A6000
    assert rtx[("k8v4", 4)] == (32, 1, 64) and rtx[("k8v4", 1)] == (16, 1, 64)
    assert rtx[("4bit_nc", 4)] == (32, 1, 32) and rtx[("4bit_nc", 2)] == (16, 1, 64)
    # 3-bit keys at 32 x 256 stage 64 KiB in fp16x3 (128 KiB in tf32x3): one M tile of 32 rows, as on the H100.
    assert rtx[("3bit_nc", 4)] == (32, 1, 32) == rtx[("k3v4_nc", 3)] and rtx[("3bit_nc", 1)] == (16, 1, 32)
    capped = table(49152)
    assert capped[("4bit_nc", 4)] == (32, 1, 32) and capped[("3bit_nc", 4)] == (16, 2, 32)
    assert capped[("k8v4", 4)] == (32, 1, 64)
    small = table(32768)
    assert small[("4bit_nc", 4)] == (16, 2, 32) and small[("3bit_nc", 4)] == (16, 2, 16)
    assert small[("k8v4", 4)] == (32, 1, 64)
    tiny = table(24576)
    assert tiny[("4bit_nc", 4)] == (16, 2, 16) and tiny[("k8v4", 4)] == (32, 1, 32)
    assert tiny[("3bit_nc", 1)] == tiny[("k3v4_nc", 4)] == \
        "no tiling's operands fit the shared memory (24576 B per block)"
    rows = routes.route_table(kernel, kernel.TQMQLimits(101376, 86), [(6, 512)], ["k8v4"], [1])
    assert rows[0]["route"] == "release" and "head dim 512" in rows[0]["why"]
    monkeypatch.setenv(routes.ROUTE_ENV, "decode")
    assert set(table(232448).values()) == {f"{routes.ROUTE_ENV}=decode"}


def test_assumed_limits_json(patched_v033):
    """--assume-limits: another GPU's route without one; the JSON keeps only the path given."""
    result = doctor("--target", str(patched_v033), "--assume-limits", "8.6:101376", "--preset", "3bit_nc", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["install"]["verdict"] == "applied" and data["install"]["kernel_installed"]
    [table] = data["routes"]
    assert table["device"] == "assumed" and table["limits"] == {"max_shared": 101376, "capability": 86, "hip": False}
    got = _tiles(table["rows"])
    assert got[("3bit_nc", 4)] == (32, 1, 32) and got[("3bit_nc", 2)] == (16, 1, 32)
    assert table["kernel_for_k"] == [{"group": 6, "head_dim": 256, "preset": "3bit_nc", "k": [0, 1, 2, 3],
                                      "of": [0, 1, 2, 3]}]
    assert data["check"]["results"] == [] and data["timing"] == []
    assert set(absolute_paths(data)) == {str(patched_v033)}


def test_kernel_check_under_the_interpreter(patched_v033, tmp_path):
    """--interpret at a tiny geometry: FP8 and 3-bit MSE keys, each against the float64 reference and the
    release's decode route; rows that see nothing are 0."""
    model = tiny_model(tmp_path / "tiny")
    result = doctor("--target", str(patched_v033), "--model", str(model), "--tp", "1", "--interpret",
                    "--preset", "k8v4", "--preset", "3bit_nc", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    results = {c["preset"]: c for c in data["check"]["results"]}
    assert set(results) == {"k8v4", "3bit_nc"} and data["check"]["ok"] is True
    for c in results.values():
        assert c["ok"] and c["kernel_ok"] and c["agrees_with_release"] and c["zero_rows_ok"], c
        assert c["kernel_error"] < check.ATOL and c["heads"] == [4, 2, 16] and c["device"] == "cpu"
    assert data["routes"][0]["device"] == "cpu"
    assert set(absolute_paths(data)) == {str(patched_v033), str(model)}


def test_broken_kernel_fails_the_check(patched_v033, tmp_path):
    """The installed kernel edited so each verify row sees one token more than its causal length: the check
    finds it (against the reference and the release's route) and the exit is non-zero."""
    broken = tmp_path / "broken"
    shutil.copytree(patched_v033 / "vllm", broken / "vllm")
    path = broken / KERNEL
    source = path.read_text()
    good = "visible = tl.where(m_valid, seq_len - K1 + 1 + q_idx, 0)"
    assert source.count(good) == 1
    path.write_text(source.replace(good, good.replace("K1 + 1", "K1 + 2")))
    result = doctor("--target", str(broken), "--model", str(tiny_model(tmp_path / "tiny")), "--tp", "1",
                    "--interpret", "--preset", "k8v4", "--json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    [c] = data["check"]["results"]
    assert c["release_ok"] and not c["kernel_ok"] and not c["agrees_with_release"] and not c["ok"]
    assert c["kernel_error"] > check.ATOL and data["check"]["ok"] is False
    # The edited file is no longer patch 0003's, which the install part says too.
    assert "wrong result" in data["verdict"] and data["install"]["verdict"] == "failed"
    assert data["verdict"].startswith("the line is not fully applied (failed): reinstall vLLM, then run ")
