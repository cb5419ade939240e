"""The run-time variants of a tiling (the verify kernel with one KV split and with several, and the merge of the
partials) in the planner's fits, the route record, the checker and the table: fast, with canned compile results
in place of Triton's (nothing compiles)."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import fitmatrix
import pytest
from fitmatrix import TARGET, VARIANTS, Config, check_route, worst_variant, write_table


@dataclasses.dataclass(frozen=True)
class _Tiles:
    block_m: int
    m_tiles: int
    block_n: int
    precision: str = "tf32x3"
    num_warps: int = 4
    num_stages: int = 3

    def describe(self) -> str:
        return f"BLOCK_M {self.block_m} x {self.m_tiles}, BLOCK_N {self.block_n}"


WIDE, NARROW = _Tiles(32, 1, 64), _Tiles(32, 1, 32)


def _fake_kernel_module() -> types.ModuleType:
    """A kernel file's planner as the current line's has it (a SPLIT constexpr, a merge kernel), over two tilings."""
    mod = types.ModuleType("fake_verify")
    mod._LOG2E = 1.4426950408889634
    mod._tq_mq_verify_fwd = types.SimpleNamespace(arg_names=["Q_ptr", "SPLIT", "NORM_CORRECTION"])
    mod._tq_mq_verify_reduce = types.SimpleNamespace(arg_names=["Mid_ptr"])
    mod.TQMQLimits = lambda max_shared, capability, hip: (max_shared, capability, hip)

    def candidates(k1, group, head_dim, mse_bits, key_fp8, limits):
        return [WIDE, NARROW]

    def select(k1, group, head_dim, mse_bits, key_fp8, limits, fits):
        refused = []
        for tiles in candidates(k1, group, head_dim, mse_bits, key_fp8, limits):
            why = fits(tiles)
            if why is None:
                return tiles, refused
            refused.append(f"{tiles.describe()}: {why}")
        return None, refused

    mod.tq_mq_verify_candidates, mod.tq_mq_verify_select = candidates, select
    return mod


# sm_86 (101376 B): the wide tiling's unsplit kernel fits, its split one does not; the narrow one fits in every
# variant, the split one the largest and spilling the most.
CANNED = {
    ("_tq_mq_verify_fwd", 64, False): {"shared": 90112, "regs": 255, "spill": 0},
    ("_tq_mq_verify_fwd", 64, True): {"shared": 110592, "regs": 255, "spill": 0},
    ("_tq_mq_verify_fwd", 32, False): {"shared": 61440, "regs": 250, "spill": 96},
    ("_tq_mq_verify_fwd", 32, True): {"shared": 73728, "regs": 255, "spill": 5120},
    ("_tq_mq_verify_reduce", 64, None): {"shared": 0, "regs": 40},
    ("_tq_mq_verify_reduce", 32, None): {"shared": 0, "regs": 38},
}


@pytest.fixture
def canned(monkeypatch):
    compiled = []

    def compile_kernel(mod, fn_name, target, args, num_warps, num_stages):
        compiled.append((fn_name, args["BLOCK_N"], args.get("SPLIT"), args.get("NORM_CORRECTION")))
        return dict(CANNED[fn_name, args["BLOCK_N"], args.get("SPLIT")])

    monkeypatch.setattr(fitmatrix, "compile_kernel", compile_kernel)
    return compiled


CFG = Config("sm_86", "3bit_nc", "bf16", 16, 4, "Qwen3.6-27B TP1")


def test_a_split_variant_over_the_limit_refuses_the_tiling_and_the_table_shows_it(canned, tmp_path: Path):
    """The split kernel needs more than the unsplit one: the planner must refuse the wide tiling (its split variant
    is over sm_86's limit, though its unsplit one fits), and the cell must give the narrow tiling's split
    variant's shared memory and spill, naming it; the unsplit variant's figures alone would hide both."""
    rec = fitmatrix.plan(_fake_kernel_module(), CFG)
    assert rec["route"] == "multi-query"
    assert rec["tiles"]["block_n"] == 32, rec
    assert rec["refused"] and "110592" in rec["refused"][0]
    assert set(rec["variants"]) == set(VARIANTS)
    assert (rec["shared"], rec["shared_variant"], rec["spill"], rec["spill_variant"]) == (73728, "split", 5120, "split")
    assert rec["regs"] == 255
    # The preset's norm correction in every verify launch (3bit_nc has it); the wide tiling's merge never compiled.
    assert {nc for fn, _, _, nc in canned if fn == "_tq_mq_verify_fwd"} == {1}
    assert ("_tq_mq_verify_reduce", 64, None, None) not in canned
    assert check_route(rec) == []
    cell = fitmatrix._cell(rec, fitmatrix.SPILL_THRESHOLD)
    assert cell == "32x1 n32 tf32x3: 73728 B split, r255, spill 5120 B split **SPILL** (after 1 refused)", cell
    table = tmp_path / "t.md"
    write_table(table, [rec], [], "3.8.0", "test", "0" * 64, 1, set_name="reduced")
    text = table.read_text()
    assert cell in text
    assert "Reduced set" in text and "`split`" in text
    assert "1 configurations, marked **SPILL**" in text


def test_worst_variant_names_the_largest_shared_memory_and_the_largest_spill_apart():
    variants = {"unsplit": {"shared": 65536, "regs": 255, "spill": 4400},
                "split": {"shared": 81920, "regs": 240, "spill": 12},
                "merge": {"shared": 0, "regs": 40}}
    worst = worst_variant(variants)
    assert (worst["shared"], worst["shared_variant"]) == (81920, "split")
    assert (worst["spill"], worst["spill_variant"]) == (4400, "unsplit")
    assert worst["regs"] == 255
    rec = {"config": dataclasses.asdict(CFG), "route": "multi-query", "attempts": [{}], "refused": [],
           "tiles": dataclasses.asdict(NARROW), "limit": TARGET["sm_86"].max_shared, "variants": variants, **worst}
    cell = fitmatrix._cell(rec, fitmatrix.SPILL_THRESHOLD)
    assert cell == "32x1 n32 tf32x3: 81920 B split, r255, spill 4400 B unsplit **SPILL**", cell
    # No spill anywhere: none shown. Equal shared memory: the earlier variant (the probe's first launch) is named.
    calm = worst_variant({"unsplit": {"shared": 100, "spill": 0}, "split": {"shared": 100}, "merge": {"shared": 0}})
    assert calm["shared_variant"] == "unsplit" and "spill" not in calm and "spill_variant" not in calm
    # An error in any variant is the record's error.
    broken = worst_variant({"unsplit": {"shared": 100}, "split": {"error": "CompilationError: boom"}})
    assert broken == {"error": "CompilationError: boom", "error_variant": "split"}


def test_the_checker_looks_at_every_variant_of_the_chosen_tiling():
    base = {"config": dataclasses.asdict(CFG), "route": "multi-query", "tiles": dataclasses.asdict(NARROW),
            "limit": 101376, "shared": 73728}
    ok = {"unsplit": {"shared": 61440}, "split": {"shared": 73728}, "merge": {"shared": 0}}
    assert check_route({**base, "variants": ok}) == []
    over = {**ok, "merge": {"shared": 102400}}
    [problem] = check_route({**base, "variants": over})
    assert "merge variant needs 102400 B" in problem
    [problem] = check_route({**base, "variants": {**ok, "split": {"error": "OutOfResources: x"}}})
    assert "split variant does not compile" in problem
    [problem] = check_route({**base, "variants": {"unsplit": ok["unsplit"]}})
    assert "lacks variants" in problem


def test_the_current_kernel_has_the_variants_and_line_v020s_has_not(kernel_current: Path, kernel_v020: Path):
    """The tables of the current line's kernel compile its variants; line v0.20's (its split count a constexpr)
    keeps the probe's first launch."""
    assert fitmatrix.has_variants(fitmatrix.load_kernel(kernel_current))
    assert not fitmatrix.has_variants(fitmatrix.load_kernel(kernel_v020))
