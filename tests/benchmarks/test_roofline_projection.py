"""The roofline projection counts what the verify kernel does: slot bytes as the presets define them and as the H100
benchmark counted them, the planner's tiles, dot FLOPs at the padded BLOCK_M, bounds that follow the peak rates,
the precision budget; and the instruction-mix tool finds and classifies a compiled loop. CPU only, no Triton."""

from __future__ import annotations

import dataclasses
import json

import pytest
import roofline_projection as rp
import roofline_sass_mix as mix

from references import TQ_PRESETS, TQLayout

SHAPE = rp.Shape()
H100, RTX_3090, MI300X = rp.CARD["H100 SXM5"], rp.CARD["RTX 3090"], rp.CARD["MI300X"]


@pytest.mark.parametrize("preset", sorted(rp.PRESET))
def test_slot_bytes_are_the_presets(preset):
    """Each slot is the preset's (the project's mirror of vLLM's TurboQuantConfig), and the cache bytes are
    slot x tokens x KV heads x batch."""
    p, lay = rp.PRESET[preset], TQLayout.from_preset(preset, SHAPE.head_dim)
    assert (p.key_bits, p.value_bits, p.norm_correction) == TQ_PRESETS[f"turboquant_{preset}"]
    assert p.slot_size(256) == lay.slot_size and p.slot_size_aligned(256) == lay.slot_size_aligned
    kernels = rp.count(H100, p, SHAPE, "tf32x3")
    split = next(k for k in kernels if k.name == "split")
    assert split.bytes["cache slots"] == lay.slot_size * SHAPE.context * SHAPE.kv_heads * SHAPE.batch


def test_slot_sizes_at_head_dim_256():
    assert {n: p.slot_size(256) for n, p in rp.PRESET.items()} == {
        "k8v4": 388,
        "4bit_nc": 262,
        "k3v4_nc": 230,
        "3bit_nc": 198,
    }


def test_h100_check_matches_the_reports():
    """Every row of the H100 reports: the same cache bytes and tiles as the benchmark, and a measured time above
    the projection (a roofline is a floor: a ratio below 1 means the count or a peak rate is wrong)."""
    rows = rp.h100_check()
    assert len(rows) == 32 and {r["preset"] for r in rows} == {"k8v4", "4bit_nc"}
    for r in rows:
        assert r["cache_mb_projected"] == pytest.approx(r["cache_mb_measured"], abs=0.06)
        assert r["tiles_projected"] == r["tiles_measured"]
        assert r["ratio"] > 1.0 and r["stream_ratio"] > 1.0


def test_parse_report_takes_the_line_column(tmp_path):
    report = tmp_path / "r.txt"
    report.write_text(
        "device-to-device copy: 3023 GB/s (read + write)\n"
        "preset     D    ctx   B K1 Hq/Hk         tiles spl      MB              kernel us %copy  in L2 us "
        "stream us %copy dequant us  k/L2 k/str deq/str     new tiles                 new us %copy\n"
        "4bit_nc  256   8192   8  4  24/4   32x1 n64 w4  17    68.7    621.0 [617.2-625.1]    4%    "
        "587.0 [583.7-594.4]    105.3 [104.5-105.9]   22%    154.5 [153.1-162.1]  1.06  5.90    1.47   "
        "32x1 n32 w4    404.1 [403.3-406.1]    6%  1.54x  2.4e-04\n"
    )
    (m,) = rp.parse_report(report)
    assert (m.preset, m.head_dim, m.context, m.batch, m.q_heads, m.kv_heads) == ("4bit_nc", 256, 8192, 8, 24, 4)
    assert (m.tiles, m.cache_mb, m.line_us, m.stream_us, m.copy_gbs) == ("32x1 n32", 68.7, 404.1, 105.3, 3023.0)


def test_tiles_follow_the_shared_memory_limit():
    """tf32x3 stages 128 KiB at 32 x 256 with 3-bit keys: the 99 KiB cards take two 16-row tiles; bf16x3 stages
    half and keeps one 32-row tile; 4-bit keys fit 32 x 32 in 96 KiB everywhere on CUDA."""
    k3 = rp.PRESET["k3v4_nc"]
    assert rp.staged_bytes(32, 32, 256, k3, "tf32x3") == 131072
    assert rp.staged_bytes(32, 32, 256, rp.PRESET["4bit_nc"], "tf32x3") == 98304
    assert str(rp.plan_tiles(RTX_3090, k3, SHAPE, "tf32x3")) == "16x2 n32"
    assert str(rp.plan_tiles(RTX_3090, k3, SHAPE, "bf16x3")) == "32x1 n32"
    assert str(rp.plan_tiles(H100, k3, SHAPE, "tf32x3")) == "32x1 n32"
    assert str(rp.plan_tiles(RTX_3090, rp.PRESET["4bit_nc"], SHAPE, "tf32x3")) == "32x1 n32"
    assert str(rp.plan_tiles(MI300X, rp.PRESET["4bit_nc"], SHAPE, "ieee")) == "32x1 n64"
    assert str(rp.plan_tiles(H100, rp.PRESET["k8v4"], SHAPE, "tf32x3")) == "32x1 n64"


def _dot_flops(preset: str, **shape) -> float:
    return rp.project(H100, rp.PRESET[preset], dataclasses.replace(SHAPE, **shape), "tf32x3").tensor_flops


def test_flops_at_the_padded_block_m():
    """Two float16 dots of 2 x BLOCK_M x D per token: 24 rows count as 32; K1 = 5 (30 rows) pads to the same 32,
    K1 = 2 (12 rows) to 16, K1 = 8 (48 rows) takes two M tiles of 32."""
    programs, tokens = SHAPE.batch * SHAPE.kv_heads, SHAPE.context
    assert _dot_flops("k8v4") == 2 * (2 * 32 * 256 * tokens * programs)
    assert _dot_flops("k8v4", k1=5) == _dot_flops("k8v4")
    assert _dot_flops("k8v4", k1=2) == _dot_flops("k8v4") / 2
    assert _dot_flops("k8v4", k1=8) == 2 * _dot_flops("k8v4")
    assert _dot_flops("k8v4", batch=16) == 2 * _dot_flops("k8v4")


def test_score_passes():
    """tf32x3 is three TF32 passes of the score dot, bf16x3 three BF16 passes, P x V one float16 pass."""
    p = rp.PRESET["4bit_nc"]
    fwd = {prec: next(k for k in rp.count(H100, p, SHAPE, prec) if k.name == "split") for prec in ("tf32x3", "bf16x3")}
    one = fwd["tf32x3"].tensor_flops["fp16"]
    assert fwd["tf32x3"].tensor_flops == {"fp16": one, "tf32": 3 * one}
    assert fwd["bf16x3"].tensor_flops == {"fp16": one, "bf16": 3 * one}


def test_ieee_dots_run_on_cuda_cores_or_matrix_cores():
    """On NVIDIA the ieee score dot's FMAs join the ALU count; on CDNA3 they are FP32 matrix FLOPs."""
    p = rp.PRESET["4bit_nc"]
    nv = next(k for k in rp.count(RTX_3090, p, SHAPE, "ieee") if k.name == "split")
    amd = next(k for k in rp.count(MI300X, p, SHAPE, "ieee") if k.name == "split")
    assert set(nv.tensor_flops) == {"fp16"} and amd.tensor_flops["fp32"] == amd.tensor_flops["fp16"]
    assert nv.alu["fp32"] - amd.alu["fp32"] >= nv.tensor_flops["fp16"] / 2


@pytest.mark.parametrize("preset", ["k8v4", "4bit_nc", "3bit_nc"])
def test_bound_follows_the_peak_rates(preset):
    """Starve one resource and it is the bound; faster memory never makes a call slower."""
    p = rp.PRESET[preset]
    slow_memory = dataclasses.replace(H100, bandwidth_gbs=H100.bandwidth_gbs / 100)
    slow_tensor = dataclasses.replace(H100, fp16_tflops=1.0, tf32_tflops=0.5, fp16_acc16_tflops=1.0)
    slow_alu = dataclasses.replace(H100, clock_mhz=H100.clock_mhz / 100)
    assert rp.project(slow_memory, p, SHAPE, "tf32x3").bound == "memory"
    assert rp.project(slow_tensor, p, SHAPE, "tf32x3").bound == "tensor"
    assert rp.project(slow_alu, p, SHAPE, "tf32x3").bound == "alu"
    times = [
        rp.project(dataclasses.replace(H100, bandwidth_gbs=bw), p, SHAPE, "tf32x3").time_us
        for bw in (500.0, 1000.0, 3350.0, 10000.0)
    ]
    assert times == sorted(times, reverse=True)


def test_budget():
    """At scores of 30 the tests' log-sum-exp tolerance holds for tf32x3, bf16x6, bf16x3 and ieee, not for one
    TF32 or BF16 pass; bf16x3 stops holding it at scores of 100."""
    assert [p for p in rp.PRECISIONS if rp.holds_budget(p, 30)] == ["tf32x3", "bf16x6", "bf16x3", "ieee"]
    assert not rp.holds_budget("bf16x3", 100) and rp.holds_budget("tf32x3", 100)
    assert not rp.eligible(RTX_3090, "ieee", 30) and rp.eligible(MI300X, "ieee", 30)


def test_recommendation_and_availability():
    """No tf32x3 on gfx942; a card compute-bound on its TF32 passes should take bf16x3; ties go to the exact."""
    assert "tf32x3" not in rp.project_all(MI300X, rp.PRESET["4bit_nc"], SHAPE)
    projs = rp.project_all(RTX_3090, rp.PRESET["4bit_nc"], SHAPE)
    assert projs["tf32x3"].bound == "tensor" and rp.recommend(RTX_3090, projs, 30) == "bf16x3"
    h100 = rp.project_all(H100, rp.PRESET["3bit_nc"], SHAPE)
    assert rp.recommend(H100, h100, 30) == "tf32x3"
    assert rp.recommend(H100, rp.project_all(H100, rp.PRESET["k8v4"], SHAPE), 30) == "fp16"


def test_split_partials_and_splits():
    """Four programs per SM: 17 splits on the H100 at batch 8, 16 of them holding 512 tokens each; the
    partials are written and read once each."""
    tiles = rp.plan_tiles(H100, rp.PRESET["k8v4"], SHAPE, "tf32x3")
    assert rp.num_splits(H100, SHAPE, tiles) == 17
    assert rp.split_tokens(SHAPE, tiles, 17) == (8192, 16)
    kernels = {k.name: k for k in rp.count(H100, rp.PRESET["k8v4"], SHAPE, "tf32x3")}
    assert (
        kernels["split"].bytes["partials written"]
        == kernels["reduce"].bytes["partials read"]
        == SHAPE.batch * SHAPE.k1 * SHAPE.q_heads * 16 * 257 * 4
    )


def test_cli_json():
    out = rp.as_json(SHAPE, list(rp.CARDS), list(rp.PRESETS), 30.0, [])
    json.dumps(out)
    recommended = [p for p in out["projections"] if p["recommended"]]
    assert len(recommended) == len(rp.CARDS) * len(rp.PRESETS)
    assert all(p["holds_budget"] for p in recommended)


SASS = """\
        /*0100*/                   LDG.E.U16 R4, desc[UR4][R2.64] ;
.L_x_3:
        /*0110*/                   LOP3.LUT R5, R4, 0xf, RZ, 0xc0, !PT ;
        /*0120*/                   HMMA.1688.F32.TF32 R8, R12, R16, R8 ;
        /*0130*/                   LDS.64 R20, [R3] ;
        /*0140*/                   LDSM.16.M88.4 R24, [R3+0x100] ;
        /*0150*/              @!P0 FFMA R6, R5, R6, R7 ;
        /*0160*/                   SHFL.IDX PT, R9, R9, R10, 0x1f ;
        /*0170*/                   STL.64 [R1], R8 ;
        /*0180*/                   BRA.U !UP0, `(.L_x_3) ;
.L_x_4:
        /*0190*/                   BRA `(.L_x_4);
"""

AMDGCN = """\
\tv_mov_b32_e32 v1, 0
.LBB0_2:
\tv_mfma_f32_32x32x8_f16 a[0:15], v[2:3], v[4:5], a[0:15]
\tds_read_b128 v[6:9], v10
\tv_exp_f32_e32 v11, v11
\tv_and_b32_e32 v12, 15, v12
\ts_add_i32 s4, s4, 1
\ts_cbranch_scc1 .LBB0_2
"""


def test_instruction_mix_of_a_loop():
    """The widest backward branch is the loop; opcodes fall in their classes; LDS.64 is two wavefronts and
    LDSM .x4 four."""
    counts, smem = mix.loop_mix_nvidia(SASS)
    assert counts == {"int": 1, "tensor": 1, "smem": 2, "fp32": 1, "shfl": 1, "local": 1, "control": 1}
    assert smem == 2 + 4
    counts, smem = mix.loop_mix_amd(AMDGCN)
    assert counts == {"tensor": 1, "smem": 1, "mufu": 1, "int": 1, "scalar": 1, "control": 1}
    assert smem == 8


def test_floors_of_a_compiled_loop():
    """The issue floor is every warp instruction of the call's token steps at four a clock per SM; the
    shared-memory floor one 128-byte wavefront a clock; both against the H100's own token count."""
    row = dict(
        target="sm_90",
        preset="4bit_nc",
        block_m=32,
        m_tiles=1,
        block_n=32,
        precision="tf32x3",
        num_warps=4,
        warp=32,
        loop={"int": 100, "fp32": 50, "tensor": 14},
        smem_cycles=300,
    )
    f = mix.floors(row)
    token_programs = SHAPE.context * SHAPE.batch * SHAPE.kv_heads
    clock = H100.sms * H100.clock_mhz * 1e6
    assert mix.per_token(row)["int"] == 100 * 4 / 32
    assert f["issue_us"] == pytest.approx(1e6 * 164 * 4 / 32 * token_programs / (4 * clock))
    assert f["smem_us"] == pytest.approx(1e6 * 300 * 4 / 32 * token_programs / clock)
    assert f["compiled_alu_lanes"] == (100 + 50) * 4 / 32 * 32
    assert f["analytic_alu_lanes"] > 0
